// Round 12: waitpid/wait/wait4 in a process that holds an SMC connection, against TCP.
// gcc -O2 -o rt12_wait rt12_wait.c -lpthread
// usage: rt12_wait PORT SCENARIO [N]   (the process first makes a connection to itself)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int cfd = -1, sfd = -1;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}
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
  if (write(cfd, &b, 1) != 1 || read(sfd, &b, 1) != 1 || write(sfd, &b, 1) != 1 || read(cfd, &b, 1) != 1) {
    perror("exchange"); exit(2);
  }
  close(l);
}
static volatile sig_atomic_t hits;
static void h(int s) { (void)s; hits++; }
static void inst(int sig, int flags) {
  struct sigaction sa = {0};
  sa.sa_handler = h;
  sa.sa_flags = flags;
  sigaction(sig, &sa, 0);
}
static volatile sig_atomic_t reaped;
static void reaper(int sig) {
  (void)sig;
  int e = errno, st;
  while (waitpid(-1, &st, WNOHANG) > 0) reaped++;
  errno = e;
}
static pid_t sleeper(void) {
  pid_t p = fork();
  if (!p) { close(cfd); close(sfd); sleep(1000); _exit(0); }
  return p;
}
static void *canc(void *a) {
  int st;
  pid_t p = *(pid_t *)a;
  waitpid(p, &st, 0);
  return 0;
}
struct tw { pid_t p; int st; double t; };
static void *thw(void *a) {
  struct tw *w = a;
  pid_t r = waitpid(w->p, &w->st, 0);
  w->t = now();
  if (r != w->p) w->st = -1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage\n"); return 2; }
  int port = atoi(argv[1]);
  const char *s = argv[2];
  int n = argc > 3 ? atoi(argv[3]) : 100;
  conn(port);
  srand(getpid());
  if (!strcmp(s, "sigrace")) {
    // An interval timer's first SIGALRM (no SA_RESTART) must end a blocking waitpid with
    // EINTR; count the waits it did not end (ended only by the next expiry 100 ms later).
    inst(SIGALRM, 0);
    pid_t c = sleeper();
    int lost = 0, eintr = 0;
    for (int i = 0; i < n; i++) {
      struct itimerval it = {{0, 100000}, {0, 200 + rand() % 15000}};
      int before = hits;
      double t0 = now();
      setitimer(ITIMER_REAL, &it, 0);
      int st;
      pid_t r = waitpid(c, &st, 0);
      int e = errno;
      struct itimerval z = {0};
      setitimer(ITIMER_REAL, &z, 0);
      if (r == -1 && e == EINTR) eintr++;
      if (hits - before > 1) lost++;
      (void)t0;
    }
    kill(c, 9); waitpid(c, 0, 0);
    printf("sigrace: %d waits, %d EINTR, %d needed a second signal\n", n, eintr, lost);
  } else if (!strcmp(s, "sigrace_any")) {
    inst(SIGALRM, 0);
    pid_t c = sleeper();
    int lost = 0, eintr = 0;
    for (int i = 0; i < n; i++) {
      struct itimerval it = {{0, 100000}, {0, 200 + rand() % 15000}};
      int before = hits;
      setitimer(ITIMER_REAL, &it, 0);
      int st;
      pid_t r = wait(&st);
      int e = errno;
      struct itimerval z = {0};
      setitimer(ITIMER_REAL, &z, 0);
      if (r == -1 && e == EINTR) eintr++;
      if (hits - before > 1) lost++;
    }
    kill(c, 9); waitpid(c, 0, 0);
    printf("sigrace_any: %d waits, %d EINTR, %d needed a second signal\n", n, eintr, lost);
  } else if (!strcmp(s, "lat_any") || !strcmp(s, "lat_pid") || !strcmp(s, "lat_pgid") || !strcmp(s, "lat_wait4")) {
    // Children that exit at once: total time of N fork + wait.
    double t0 = now(), worst = 0;
    for (int i = 0; i < n; i++) {
      pid_t p = fork();
      if (!p) _exit(i & 0x7f);
      double a = now();
      int st = 0;
      pid_t r;
      if (s[4] == 'a') r = wait(&st);
      else if (s[4] == 'p' && s[5] == 'i') r = waitpid(p, &st, 0);
      else if (s[4] == 'p') r = waitpid(0, &st, 0);
      else { struct rusage ru; r = wait4(-1, &st, 0, &ru); }
      double d = now() - a;
      if (d > worst) worst = d;
      if (r != p || !WIFEXITED(st) || WEXITSTATUS(st) != (i & 0x7f)) { printf("%s: bad r=%d st=%x\n", s, r, st); return 1; }
    }
    double t = now() - t0;
    printf("%s: %d children ok\n", s, n);
    fprintf(stderr, "%s: %.1f ms total, %.3f ms each, worst %.2f ms\n", s, t * 1e3, t * 1e3 / n, worst * 1e3);
  } else if (!strcmp(s, "stopped")) {
    // WUNTRACED: a child stops itself N times, each continued by us.
    pid_t p = fork();
    if (!p) { for (int i = 0; i < n; i++) raise(SIGSTOP); _exit(7); }
    double t0 = now();
    int stops = 0, st;
    for (;;) {
      pid_t r = waitpid(p, &st, WUNTRACED);
      if (r != p) { printf("stopped: r=%d errno=%d\n", r, errno); return 1; }
      if (WIFSTOPPED(st)) { stops++; kill(p, SIGCONT); continue; }
      break;
    }
    printf("stopped: %d stops, exit %d\n", stops, WEXITSTATUS(st));
    fprintf(stderr, "stopped: %.3f ms each\n", (now() - t0) * 1e3 / n);
  } else if (!strcmp(s, "ptrace")) {
    // A tracer (gdbserver, strace-like) stepping a child's system calls with waitpid(pid, 0).
    pid_t p = fork();
    if (!p) {
      ptrace(PTRACE_TRACEME, 0, 0, 0);
      raise(SIGSTOP);
      for (int i = 0; i < n; i++) syscall(SYS_getppid);
      _exit(3);
    }
    int st, stops = 0;
    waitpid(p, &st, 0);
    double t0 = now();
    for (;;) {
      ptrace(PTRACE_SYSCALL, p, 0, 0);
      pid_t r = waitpid(p, &st, 0);
      if (r != p) { printf("ptrace: r=%d errno=%d\n", r, errno); return 1; }
      if (WIFEXITED(st)) break;
      stops++;
    }
    printf("ptrace: %d stops (>= %d), exit %d\n", stops >= 2 * n ? 2 * n : stops, 2 * n, WEXITSTATUS(st));
    fprintf(stderr, "ptrace: %.3f ms per stop\n", (now() - t0) * 1e3 / stops);
  } else if (!strcmp(s, "cancel")) {
    pid_t c = sleeper();
    pthread_t t;
    pthread_create(&t, 0, canc, &c);
    usleep(100000);
    pthread_cancel(t);
    void *rv;
    pthread_join(t, &rv);
    printf("cancel: thread %s\n", rv == PTHREAD_CANCELED ? "cancelled" : "returned");
    kill(c, 9); waitpid(c, 0, 0);
  } else if (!strcmp(s, "threads")) {
    // 8 threads each wait for their own child; the children exit 20 ms apart.
    struct tw w[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
      w[i].p = fork();
      if (!w[i].p) { usleep(20000 * (i + 1)); _exit(i); }
      pthread_create(&t[i], 0, thw, &w[i]);
    }
    int ok = 0;
    for (int i = 0; i < 8; i++) { pthread_join(t[i], 0); ok += w[i].st != -1 && WEXITSTATUS(w[i].st) == i; }
    printf("threads: %d of 8\n", ok);
  } else if (!strcmp(s, "errors")) {
    int st;
    errno = 0;
    pid_t r = waitpid(1, &st, 0);
    printf("waitpid(1): %d errno %d\n", r, errno);
    r = waitpid(-1, &st, 0);
    printf("waitpid(-1) no child: %d errno %d\n", r, errno);
    r = waitpid(-99999, &st, 0);
    printf("waitpid(-99999): %d errno %d\n", r, errno);
    r = waitpid(getpid(), &st, 0);
    printf("waitpid(self): %d errno %d\n", r, errno);
    r = waitpid(-1, &st, 0x40000000);
    printf("waitpid bad options: %d errno %d\n", r, errno);
    pid_t p = fork();
    if (!p) _exit(5);
    r = waitpid(p, (int *)8, 0);
    printf("waitpid bad status ptr: %s errno %d\n", r == p ? "pid" : r == -1 ? "-1" : "?", errno);
    r = waitpid(p, &st, 0);
    printf("again: %s errno %d\n", r == p ? "pid" : r == -1 ? "-1" : "?", errno);
    // SIGCHLD ignored: children are reaped by the kernel; wait blocks until all are gone, ECHILD.
    signal(SIGCHLD, SIG_IGN);
    for (int i = 0; i < 3; i++) if (!fork()) { usleep(30000 * (i + 1)); _exit(0); }
    double t0 = now();
    r = wait(&st);
    printf("SIG_IGN wait: %d errno %d after %s\n", r, errno, now() - t0 > 0.08 ? ">=90ms" : "<90ms");
    signal(SIGCHLD, SIG_DFL);
    // errno after a success
    p = fork();
    if (!p) { usleep(30000); _exit(0); }
    errno = 1234;
    inst(SIGUSR1, SA_RESTART);
    if (!fork()) { usleep(10000); kill(getppid(), SIGUSR1); _exit(0); }
    r = waitpid(p, &st, 0);
    printf("errno after success (SA_RESTART signal meanwhile): %d\n", errno);
    while (wait(0) > 0) ;
  } else if (!strcmp(s, "reaper") || !strcmp(s, "reaper_norestart")) {
    // A SIGCHLD handler that reaps every zombie (WNOHANG), and a main thread already blocked
    // in waitpid(pid, 0) when its child exits: the kernel's wait takes the child first.
    struct sigaction sa = {0};
    sa.sa_handler = reaper;
    sa.sa_flags = s[6] ? 0 : SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    int got = 0, echild = 0, eintr = 0;
    for (int i = 0; i < n; i++) {
      pid_t p = fork();
      if (!p) { usleep(20000); _exit(0); }
      int st;
      pid_t r = waitpid(p, &st, 0);
      if (r == p) got++;
      else if (errno == ECHILD) echild++;
      else if (errno == EINTR) eintr++;
      usleep(1000);
    }
    printf("%s: %d waits: pid %d, ECHILD %d, EINTR %d (handler reaped %d)\n", s, n, got, echild, eintr, (int)reaped);
  } else if (!strcmp(s, "restart")) {
    // SIGALRM with SA_RESTART: the wait goes on to the child's exit; without: EINTR.
    for (int flags = 0; flags < 2; flags++) {
      inst(SIGALRM, flags ? SA_RESTART : 0);
      pid_t p = fork();
      if (!p) { usleep(100000); _exit(9); }
      struct itimerval it = {{0, 0}, {0, 20000}};
      setitimer(ITIMER_REAL, &it, 0);
      int st;
      pid_t r = waitpid(p, &st, 0);
      printf("%s: r=%s errno=%s\n", flags ? "SA_RESTART" : "no SA_RESTART", r == p ? "pid" : "-1", r == -1 ? strerror(errno) : "-");
      if (r == -1) waitpid(p, &st, 0);
      // siginterrupt after sigaction
      inst(SIGALRM, SA_RESTART);
      siginterrupt(SIGALRM, !flags);
      p = fork();
      if (!p) { usleep(100000); _exit(9); }
      setitimer(ITIMER_REAL, &it, 0);
      r = waitpid(p, &st, 0);
      printf("siginterrupt(%d): r=%s errno=%s\n", !flags, r == p ? "pid" : "-1", r == -1 ? strerror(errno) : "-");
      if (r == -1) waitpid(p, &st, 0);
    }
  } else {
    fprintf(stderr, "unknown\n");
    return 2;
  }
  return 0;
}
