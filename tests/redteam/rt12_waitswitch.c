// Round 12: a child execs an image without the library on one end of a connection whose
// other end its parent holds (the switch to TCP needs the parent's answer), while the parent
// waits for the child in ways other than a blocking waitpid.
// gcc -O2 -pthread -o /tmp/rt12/rt12_waitswitch rt12_waitswitch.c
// gcc -O2 -static -o /tmp/rt12/rt12_waitswitch_s rt12_waitswitch.c   (the helper image)
// usage: rt12_waitswitch PORT MODE   modes: block any wnohang sigsuspend pause_sigchld
//        thread_recv waitid vfork vfork_closefds fork_closefds
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static int helper(void) {  // plain system calls on fd 20: read the ping, answer pong
  char b[64];
  int n = read(20, b, sizeof b);
  if (n <= 0) { dprintf(2, "helper read %d errno %d\n", n, errno); return 1; }
  if (write(20, "pong\n", 5) != 5) { dprintf(2, "helper write errno %d\n", errno); return 1; }
  return 0;
}
static volatile sig_atomic_t chld;
static void onchld(int s) { (void)s; chld = 1; }
static int sfd;
static void *rd(void *a) {
  char b[64] = {0};
  int n = recv(sfd, b, sizeof b - 1, 0);
  printf("thread recv %d [%.5s]\n", n, n > 0 ? b : "");
  return a;
}
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "helper")) return helper();
  setvbuf(stdout, 0, _IOLBF, 0);
  int port = atoi(argv[1]);
  const char *m = argv[2];
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4)) { perror("listen"); return 2; }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (void *)&a, sizeof a)) { perror("connect"); return 2; }
  int s = accept(l, 0, 0);
  char x = 'x';
  if (write(c, &x, 1) != 1 || read(s, &x, 1) != 1 || write(s, &x, 1) != 1 || read(c, &x, 1) != 1) { perror("exchange"); return 2; }
  sfd = s;
  if (!strcmp(m, "sigsuspend") || !strcmp(m, "pause_sigchld")) {
    struct sigaction sa = {0};
    sa.sa_handler = onchld;
    sigaction(SIGCHLD, &sa, 0);
  }
  sigset_t blk, old;
  sigemptyset(&blk); sigaddset(&blk, SIGCHLD);
  if (!strcmp(m, "sigsuspend")) sigprocmask(SIG_BLOCK, &blk, &old);
  double t0 = now();
  pid_t p;
  if (!strncmp(m, "vfork", 5)) {
    // Python's subprocess (_posixsubprocess): the end dup'd to 20 in the parent, vfork, the
    // child closes every other fd (vfork_closefds) and execs; the parent then waits.
    dup2(c, 20);
    p = vfork();
    if (!p) {
      if (!strcmp(m, "vfork_closefds")) { close_range(3, 19, 0); close_range(21, ~0U, 0); }
      char *av[] = {"/tmp/rt12/rt12_waitswitch_s", "helper", 0};
      execv(av[0], av);
      _exit(127);
    }
    close(20);
    m = "block";
  } else if (!(p = fork())) {
    close(s); dup2(c, 20); close(c);
    if (!strcmp(m, "fork_closefds")) { close_range(3, 19, 0); close_range(21, ~0U, 0); }
    char *av[] = {"/tmp/rt12/rt12_waitswitch_s", "helper", 0};
    execv(av[0], av);
    _exit(127);
  }
  close(c);
  if (send(s, "ping\n", 5, MSG_NOSIGNAL) != 5) perror("send");
  pthread_t t;
  int st = 0;
  if (!strcmp(m, "thread_recv")) { pthread_create(&t, 0, rd, 0); usleep(10000); }
  if (!strcmp(m, "block") || !strcmp(m, "thread_recv") || !strcmp(m, "fork_closefds")) waitpid(p, &st, 0);
  else if (!strcmp(m, "any")) wait(&st);
  else if (!strcmp(m, "waitid")) { siginfo_t si; waitid(P_PID, p, &si, WEXITED); st = si.si_status << 8; }
  else if (!strcmp(m, "wnohang")) { while (waitpid(p, &st, WNOHANG) == 0) usleep(1000); }
  else if (!strcmp(m, "sigsuspend")) { while (!chld) sigsuspend(&old); waitpid(p, &st, WNOHANG); }
  else if (!strcmp(m, "pause_sigchld")) { while (!chld) pause(); waitpid(p, &st, WNOHANG); }
  else { fprintf(stderr, "mode?\n"); return 2; }
  double dt = now() - t0;
  printf("%s: helper exit %d\n", m, WEXITSTATUS(st));
  if (!strcmp(m, "thread_recv")) pthread_join(t, 0);
  else {
    struct pollfd pf = {s, POLLIN, 0};
    char b[64] = {0};
    int n = poll(&pf, 1, 2000) > 0 ? recv(s, b, sizeof b - 1, MSG_DONTWAIT) : -2;
    printf("%s: server read %d [%.5s] %s\n", m, n, n > 0 ? b : "", n < 0 && n != -2 ? strerror(errno) : "");
  }
  printf("%s: helper done %s\n", m, dt < 1 ? "within 1 s" : "after >= 1 s");
  fprintf(stderr, "%s: %.0f ms\n", m, dt * 1e3);
  return 0;
}
