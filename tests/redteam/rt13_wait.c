// Round 13: a blocking waitpid(pid) in a process that holds an SMC connection (the library's
// lifecycle::wait_child: SIGCHLD blocked during the wait, a pidfd of its own), against TCP.
// gcc -O2 -o rt13_wait rt13_wait.c -lpthread
// usage: rt13_wait PORT SCENARIO [N]   (the process first makes a connection to itself)
//   killer     a SIGCHLD handler (SA_RESTART) that kills the long child A when the short child B
//              ends; the main thread waits for A (a supervisor: "when the helper dies, stop the
//              worker"). alarm(3) bounds it.
//   eintr      a SIGCHLD handler without SA_RESTART; waitpid(A) while B ends: TCP gives EINTR.
//   longjmp    N times: waitpid(child) left by siglongjmp from a SIGALRM handler (a timeout);
//              then the process's fd count and whether SIGCHLD is blocked.
//   longjmp0   the same with sigsetjmp(env, 0) (the mask not saved: SIGALRM stays blocked as
//              over TCP; is SIGCHLD blocked too?).
//   cancel     N threads each cancelled inside waitpid(child); fd count after.
//   waitid     waitid(P_PID, WEXITED|WNOWAIT) then with a NULL siginfo, WSTOPPED/WCONTINUED stops,
//              P_ALL with a NULL siginfo, P_PIDFD; the results printed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int cfd = -1, sfd = -1;
static double t0;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9 - t0;
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
static int nfds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;
}
static int chld_blocked(void) {
  sigset_t s;
  sigprocmask(SIG_SETMASK, 0, &s);
  return sigismember(&s, SIGCHLD);
}
static pid_t child_sleep(double s) {
  pid_t p = fork();
  if (!p) { close(cfd); close(sfd); usleep(s * 1e6); _exit(7); }
  return p;
}
static volatile pid_t A, B;
static volatile sig_atomic_t chld_hits, alrm_hits;
static void on_chld_kill(int s) {
  (void)s;
  int e = errno, st;
  chld_hits++;
  if (B > 0 && waitpid(B, &st, WNOHANG) == B) { B = -1; kill(A, SIGTERM); }
  errno = e;
}
static void on_chld(int s) { (void)s; chld_hits++; }
static void on_alrm(int s) { (void)s; alrm_hits++; }
static sigjmp_buf jb;
static void on_alrm_jump(int s) { (void)s; siglongjmp(jb, 1); }
static void inst(int sig, void (*f)(int), int flags) {
  struct sigaction sa = {0};
  sa.sa_handler = f;
  sa.sa_flags = flags;
  sigaction(sig, &sa, 0);
}
static void *canc(void *a) {
  int st;
  waitpid(*(pid_t *)a, &st, 0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage\n"); return 2; }
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t0 = t.tv_sec + t.tv_nsec / 1e9;
  conn(atoi(argv[1]));
  const char *sc = argv[2];
  int n = argc > 3 ? atoi(argv[3]) : 50;
  int st = 0;
  if (!strcmp(sc, "killer") || !strcmp(sc, "eintr")) {
    inst(SIGCHLD, !strcmp(sc, "killer") ? on_chld_kill : on_chld, !strcmp(sc, "killer") ? SA_RESTART : 0);
    inst(SIGALRM, on_alrm, 0);
    A = child_sleep(1000);
    B = child_sleep(0.2);
    alarm(3);
    pid_t r = waitpid(A, &st, 0);
    int e = errno;
    double el = now();
    printf("%s: waitpid(A) = %s errno=%s status=%s after %.1f s; SIGCHLD handler ran %d, SIGALRM %d\n", sc,
           r == A ? "A" : r == -1 ? "-1" : "?", r < 0 ? strerror(e) : "-",
           r == A ? (WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "exit") : "-", el, chld_hits, alrm_hits);
    kill(A, SIGKILL);
    while (wait(&st) > 0) {}
    return 0;
  }
  if (!strcmp(sc, "longjmp") || !strcmp(sc, "longjmp0")) {
    int save = !strcmp(sc, "longjmp");
    int f0 = nfds(), jumps = 0;
    inst(SIGALRM, on_alrm_jump, 0);
    for (int i = 0; i < n; i++) {
      pid_t p = child_sleep(1000);
      if (sigsetjmp(jb, save) == 0) {
        struct itimerval it = {{0, 0}, {0, 5000}};
        setitimer(ITIMER_REAL, &it, 0);
        waitpid(p, &st, 0);
      } else
        jumps++;
      if (!save) {  // unblock SIGALRM as a program using setjmp/longjmp must
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGALRM);
        sigprocmask(SIG_UNBLOCK, &s, 0);
      }
      kill(p, SIGKILL);
      waitpid(p, &st, WNOHANG) == p || waitpid(p, &st, 0);
    }
    printf("%s: %d waits left by siglongjmp: fds %d -> %d, SIGCHLD blocked after: %s\n", sc, jumps, f0, nfds(),
           chld_blocked() ? "yes" : "no");
    return 0;
  }
  if (!strcmp(sc, "cancel")) {
    int f0 = nfds();
    for (int i = 0; i < n; i++) {
      pid_t p = child_sleep(1000);
      pthread_t th;
      pthread_create(&th, 0, canc, &p);
      usleep(3000);
      pthread_cancel(th);
      pthread_join(th, 0);
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
    }
    printf("cancel: %d threads cancelled in waitpid: fds %d -> %d\n", n, f0, nfds());
    return 0;
  }
  if (!strcmp(sc, "waitid")) {
    siginfo_t si;
    pid_t p = child_sleep(0.05);
    memset(&si, 0, sizeof si);
    int r = waitid(P_PID, p, &si, WEXITED | WNOWAIT);
    printf("WNOWAIT: r=%d pid_ok=%d code=%d status=%d\n", r, si.si_pid == p, si.si_code, si.si_status);
    errno = 0;
    r = waitid(P_PID, p, NULL, WEXITED);
    printf("NULL siginfo: r=%d errno=%d\n", r, errno);
    r = waitpid(p, &st, WNOHANG);
    printf("after: waitpid=%d errno=%s\n", r, r < 0 ? strerror(errno) : "-");
    p = fork();
    if (!p) { close(cfd); close(sfd); raise(SIGSTOP); usleep(50000); _exit(3); }
    memset(&si, 0, sizeof si);
    r = waitid(P_PID, p, &si, WSTOPPED);
    printf("WSTOPPED: r=%d code=%s status=%d\n", r, si.si_code == CLD_STOPPED ? "CLD_STOPPED" : "other", si.si_status);
    kill(p, SIGCONT);
    memset(&si, 0, sizeof si);
    r = waitid(P_PID, p, &si, WCONTINUED);
    printf("WCONTINUED: r=%d code=%s\n", r, si.si_code == CLD_CONTINUED ? "CLD_CONTINUED" : "other");
    memset(&si, 0, sizeof si);
    r = waitid(P_PID, p, &si, WEXITED | WSTOPPED);
    printf("WEXITED|WSTOPPED: r=%d code=%s status=%d\n", r, si.si_code == CLD_EXITED ? "CLD_EXITED" : "other", si.si_status);
    p = child_sleep(0.05);
    r = waitid(P_ALL, 0, NULL, WEXITED);
    printf("P_ALL NULL: r=%d\n", r);
    p = child_sleep(0.05);
    int pfd = syscall(SYS_pidfd_open, p, 0);
    memset(&si, 0, sizeof si);
    r = waitid(P_PIDFD, pfd, &si, WEXITED);
    printf("P_PIDFD: r=%d pid_ok=%d status=%d\n", r, si.si_pid == p, si.si_status);
    close(pfd);
    // a SIGCHLD handler that reaps, then a waitid(P_PID) already blocked when the child ends
    struct sigaction sa = {0};
    sa.sa_handler = on_chld;
    sigaction(SIGCHLD, &sa, 0);
    p = child_sleep(0.05);
    memset(&si, 0, sizeof si);
    r = waitid(P_PID, p, &si, WEXITED);
    printf("waitid + SIGCHLD handler (no SA_RESTART): r=%d errno=%s pid_ok=%d handler ran %d\n", r, r < 0 ? strerror(errno) : "-", si.si_pid == p, chld_hits);
    return 0;
  }
  fprintf(stderr, "unknown scenario\n");
  return 2;
}
