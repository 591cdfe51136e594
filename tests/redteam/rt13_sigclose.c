// Round 13: a SIGALRM handler that aborts a transfer with shutdown(fd, SHUT_RDWR) (or close)
// while the main thread is inside send() on the same connection (its peer, a thread of the
// same process, reads as fast as it can). N rounds, each on a fresh connection.
// gcc -O2 -o rt13_sigclose rt13_sigclose.c -lpthread
// usage: rt13_sigclose PORT shutdown|close|rshutdown N
//   rshutdown: the main thread is inside recv() (a thread of the peer writes as fast as it can)
//   hsend: the handler sends one byte (MSG_DONTWAIT, a keepalive) every 1 ms while the main
//          thread sends 64 MB, then shuts down
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
#include <sys/time.h>
#include <unistd.h>

static int cfd, sfd, use_close, rside, hsend;
static volatile long hsent;
static void on_alrm(int s) {
  (void)s;
  int e = errno;
  if (hsend) { char k = 'k'; if (send(cfd, &k, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) hsent++; }
  else if (use_close) close(cfd); else shutdown(cfd, SHUT_RDWR);
  errno = e;
}
static void *writer(void *a) {
  (void)a;
  static char b[1 << 16];
  while (send(sfd, b, sizeof b, MSG_NOSIGNAL) > 0) {}
  return 0;
}
static void *reader(void *a) {
  (void)a;
  static char b[1 << 16];
  long tot = 0;
  ssize_t r;
  while ((r = read(sfd, b, sizeof b)) > 0) tot += r;
  return (void *)tot;
}
int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  use_close = !strcmp(argv[2], "close");
  rside = !strcmp(argv[2], "rshutdown");
  hsend = !strcmp(argv[2], "hsend");
  int n = atoi(argv[3]);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) { perror("listen"); return 2; }
  struct sigaction sa = {0};
  sa.sa_handler = on_alrm;
  sigaction(SIGALRM, &sa, 0);
  static char buf[1 << 20];
  int errs[200] = {0};
  for (int i = 0; i < n; i++) {
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cfd, (void *)&a, sizeof a)) { perror("connect"); return 2; }
    sfd = accept(l, 0, 0);
    pthread_t th;
    pthread_create(&th, 0, rside ? writer : reader, 0);
    struct itimerval it = {{0, 0}, {0, 50000 + (i % 7) * 3000}};
    if (hsend) it.it_interval.tv_usec = it.it_value.tv_usec = 1000;
    setitimer(ITIMER_REAL, &it, 0);
    ssize_t w;
    if (hsend) {
      for (int k = 0; k < 64; k++) if ((w = send(cfd, buf, sizeof buf, MSG_NOSIGNAL)) < 0 && errno != EINTR) break;
      struct itimerval z = {{0, 0}, {0, 0}};
      setitimer(ITIMER_REAL, &z, 0);
      w = 0;
      shutdown(cfd, SHUT_WR);
    } else if (rside)
      while ((w = recv(cfd, buf, sizeof buf, 0)) > 0) {}
    else
      while ((w = send(cfd, buf, sizeof buf, MSG_NOSIGNAL)) > 0) {}
    errs[w < 0 ? errno : 0]++;
    if (!use_close) close(cfd);
    shutdown(sfd, SHUT_RDWR);
    pthread_join(th, 0);
    close(sfd);
  }
  printf("%s: %d rounds; send ended with:", argv[2], n);
  for (int e = 0; e < 200; e++) if (errs[e]) printf(" %s x%d", e ? strerrorname_np(e) : "0", errs[e]);
  printf(hsend ? " (handler sent %ld)\n" : "\n", hsent);
  return 0;
}
