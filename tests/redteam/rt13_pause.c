// Round 13: pause()/sigsuspend() in a process that holds an SMC connection (the library's
// suspend_answering: ppoll slices of 10 ms with answer_peer_switches between them). Another
// thread sends SIGUSR1 to the main thread once it sleeps in the call, N times, and waits for
// the call to return; a signal whose handler ran between two slices leaves the call asleep.
// gcc -O2 -o rt13_pause rt13_pause.c -lpthread
// usage: rt13_pause PORT pause|sigsuspend N
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int cfd = -1, sfd = -1;
static void conn(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) { perror("listen"); exit(2); }
  cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(cfd, (void *)&a, sizeof a)) { perror("connect"); exit(2); }
  sfd = accept(l, 0, 0);
  char b = 'x';
  if (write(cfd, &b, 1) != 1 || read(sfd, &b, 1) != 1) { perror("exchange"); exit(2); }
  close(l);
}
static volatile int returns, hits, stop;
static pthread_t mainth;
static void h(int s) { (void)s; __atomic_add_fetch(&hits, 1, __ATOMIC_SEQ_CST); }
static int n, late;
static void *sender(void *a) {
  (void)a;
  unsigned seed = 1;
  for (int i = 0; i < n; i++) {
    usleep(2000 + rand_r(&seed) % 9000);  // main is asleep in the call by now
    int r0 = __atomic_load_n(&returns, __ATOMIC_SEQ_CST);
    pthread_kill(mainth, SIGUSR1);
    int w = 0;
    while (__atomic_load_n(&returns, __ATOMIC_SEQ_CST) == r0 && w < 500) { usleep(1000); w++; }
    if (w >= 500) {  // not woken in 0.5 s: wake it with another signal
      late++;
      pthread_kill(mainth, SIGUSR1);
      while (__atomic_load_n(&returns, __ATOMIC_SEQ_CST) == r0) usleep(1000);
    }
  }
  stop = 1;
  pthread_kill(mainth, SIGUSR1);
  return 0;
}
int main(int argc, char **argv) {
  conn(atoi(argv[1]));
  int susp = !strcmp(argv[2], "sigsuspend");
  n = atoi(argv[3]);
  struct sigaction sa = {0};
  sa.sa_handler = h;
  sigaction(SIGUSR1, &sa, 0);
  sigset_t blk, old;
  sigemptyset(&blk);
  sigaddset(&blk, SIGUSR1);
  if (susp) sigprocmask(SIG_BLOCK, &blk, &old);  // the sigsuspend idiom: blocked outside
  mainth = pthread_self();
  pthread_t th;
  pthread_create(&th, 0, sender, 0);
  while (!stop) {
    if (susp) sigsuspend(&old); else pause();
    __atomic_add_fetch(&returns, 1, __ATOMIC_SEQ_CST);
  }
  pthread_join(th, 0);
  printf("%s: %d signals, %d left the call asleep for 0.5 s\n", argv[2], n, late);
  return 0;
}
