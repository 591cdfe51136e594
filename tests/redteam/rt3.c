// red3: differential probes of smc-preload's signal trampoline (and a few data-path races).
// gcc -O2 -o rt3 rt3.c -lpthread ; run with and without LD_PRELOAD (or world.sh smc|tcp) and diff.
// Every scenario prints observations only (no timings, no addresses), so outputs must be equal.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

#define P(...) (printf(__VA_ARGS__), printf("\n"), fflush(stdout))
static void ms(int m) { usleep(m * 1000); }
typedef void (*sh_t)(int);
extern sh_t bsd_signal(int, sh_t);
extern sh_t sysv_signal(int, sh_t);
extern sh_t __sysv_signal(int, sh_t);
static volatile int n1, n2, n3;
static void h1(int s) { (void)s; n1++; }
static void h2(int s) { (void)s; n2++; }
static void h3(int s, siginfo_t *i, void *c) { (void)s; (void)c; n3 += i->si_value.sival_int; }
static const char *nm(void *p) { return p == (void *)h1 ? "h1" : p == (void *)h2 ? "h2" : p == (void *)h3 ? "h3" : p == SIG_DFL ? "DFL" : p == SIG_IGN ? "IGN" : p == SIG_ERR ? "ERR" : "OTHER"; }
static void show(int sig) { struct sigaction o; sigaction(sig, 0, &o); P("  sig%d: %s flags=%x", sig, nm((void *)o.sa_sigaction), o.sa_flags & ~SA_RESTORER); }

static void s_bsd_signal_old(void) { signal(SIGUSR1, h1); sh_t o = bsd_signal(SIGUSR1, h2); P("bsd_signal old=%s", nm(o)); raise(SIGUSR1); P("n1=%d n2=%d", n1, n2); show(SIGUSR1); }
static void s_sysv_signal_old(void) { signal(SIGUSR1, h1); sh_t o = sysv_signal(SIGUSR1, h2); P("sysv_signal old=%s", nm(o)); show(SIGUSR1); }
static void s_sigset_old(void) { struct sigaction a = {0}; a.sa_handler = h1; sigaction(SIGUSR1, &a, 0); sh_t o = sigset(SIGUSR1, h2); P("sigset old=%s", nm(o)); show(SIGUSR1); }
// a library saves the handler with one API and restores it with another
static void s_restore_mixed(void) { signal(SIGUSR1, h1); sh_t o = sysv_signal(SIGUSR1, SIG_IGN); signal(SIGUSR1, o); raise(SIGUSR1); P("n1=%d", n1); show(SIGUSR1); }
static void s_restore_sigset(void) { signal(SIGUSR1, h1); sh_t o = sigset(SIGUSR1, SIG_HOLD); struct sigaction a = {0}; a.sa_handler = o; sigaction(SIGUSR1, &a, 0); sigset(SIGUSR1, o); sigrelse(SIGUSR1); raise(SIGUSR1); P("n1=%d", n1); }
static void s_signal_sig_err(void) { errno = 0; sh_t r = signal(SIGUSR1, SIG_ERR); P("signal(SIG_ERR)=%s errno=%d", nm(r), errno); show(SIGUSR1); }
static int pfd[2];
static void hw(int s) { (void)s; if (++n1 == 3) write(pfd[1], "x", 1); }
static void s_siginterrupt_then_signal(void) { // glibc remembers siginterrupt for later signal() calls
  pipe(pfd); siginterrupt(SIGALRM, 1); signal(SIGALRM, hw); struct itimerval it = {{0, 100000}, {0, 100000}}; setitimer(ITIMER_REAL, &it, 0);
  char b; long r = read(pfd[0], &b, 1); P("read=%ld errno=%s n1=%d", r, r < 0 && errno == EINTR ? "EINTR" : "-", n1 > 1 ? 1 : n1); show(SIGALRM); }
static void s_flags_roundtrip(void) {
  struct sigaction a = {0}; a.sa_handler = h1; a.sa_flags = SA_RESTART | SA_NODEFER | SA_RESETHAND | SA_ONSTACK; sigaddset(&a.sa_mask, SIGUSR2); sigaddset(&a.sa_mask, SIGINT);
  sigaction(SIGUSR1, &a, 0); struct sigaction o; sigaction(SIGUSR1, 0, &o); P("mask usr2=%d int=%d term=%d", sigismember(&o.sa_mask, SIGUSR2), sigismember(&o.sa_mask, SIGINT), sigismember(&o.sa_mask, SIGTERM)); show(SIGUSR1);
  a.sa_sigaction = h3; a.sa_flags = SA_SIGINFO; struct sigaction old; sigaction(SIGUSR1, &a, &old); P("old=%s flags=%x", nm((void *)old.sa_sigaction), old.sa_flags & ~SA_RESTORER); show(SIGUSR1);
  sigaction(SIGUSR1, &a, &a); P("same-ptr old=%s flags=%x", nm((void *)a.sa_sigaction), a.sa_flags & ~SA_RESTORER);
  sh_t r = signal(SIGUSR1, SIG_DFL); P("signal old=%s", nm(r)); show(SIGUSR1); }
static void s_resethand(void) { struct sigaction a = {0}; a.sa_handler = h1; a.sa_flags = SA_RESETHAND; sigaction(SIGUSR1, &a, 0); raise(SIGUSR1); P("n1=%d", n1); show(SIGUSR1);
  pid_t p = fork(); if (!p) { raise(SIGUSR1); _exit(7); } int st; waitpid(p, &st, 0); P("child sig=%d", WIFSIGNALED(st) ? WTERMSIG(st) : -WEXITSTATUS(st)); }
static int depth, maxd, calls; static void hnd(int s) { depth++; calls++; if (depth > maxd) maxd = depth; if (calls < 5) raise(s); depth--; }
static void s_nodefer(void) { struct sigaction a = {0}; a.sa_handler = hnd; a.sa_flags = SA_NODEFER; sigaction(SIGUSR1, &a, 0); raise(SIGUSR1); P("maxd=%d", maxd);
  maxd = 0; calls = 0; a.sa_flags = 0; sigaction(SIGUSR1, &a, 0); raise(SIGUSR1); P("defer maxd=%d", maxd); }
static char *alt; static volatile int onalt;
static void hon(int s) { (void)s; char x; onalt = (&x > alt && &x < alt + 65536); }
static void s_onstack(void) { alt = malloc(65536); stack_t ss = {.ss_sp = alt, .ss_size = 65536}; sigaltstack(&ss, 0); struct sigaction a = {0}; a.sa_handler = hon; a.sa_flags = SA_ONSTACK; sigaction(SIGUSR1, &a, 0);
  raise(SIGUSR1); P("onalt=%d", onalt); stack_t cur; sigaltstack(0, &cur); P("ss_flags=%d", cur.ss_flags); }
static void hsmall(int s) { (void)s; n1++; }
static void s_small_altstack(void) { // MINSIGSTKSZ-ish alt stack (kernel frame + handler must fit)
  long sz = 6144; alt = malloc(sz); stack_t ss = {.ss_sp = alt, .ss_size = sz}; int r = sigaltstack(&ss, 0); struct sigaction a = {0}; a.sa_handler = hsmall; a.sa_flags = SA_ONSTACK; sigaction(SIGUSR1, &a, 0);
  pid_t p = fork(); if (!p) { for (int i = 0; i < 100; i++) raise(SIGUSR1); _exit(n1 == 100 ? 0 : 1); } int st; waitpid(p, &st, 0); P("sigaltstack=%d status=%x", r, st); }
static sigjmp_buf jb; static void hjmp(int s) { siglongjmp(jb, s); }
static void s_longjmp(void) { struct sigaction a = {0}; a.sa_handler = hjmp; sigaction(SIGUSR1, &a, 0); int k = 0;
  for (int i = 0; i < 10000; i++) if (!sigsetjmp(jb, 1)) raise(SIGUSR1); else k++;
  sigset_t m; sigprocmask(0, 0, &m); P("jumps=%d blocked=%d", k, sigismember(&m, SIGUSR1));
  // after longjmp out of the handler a blocking read with SA_RESTART handler still restarts
  pipe(pfd); signal(SIGALRM, hw); struct itimerval it = {{0, 50000}, {0, 50000}}; setitimer(ITIMER_REAL, &it, 0); char b; long r = read(pfd[0], &b, 1); P("read=%ld", r); }
static void s_siginfo_value(void) { struct sigaction a = {0}; a.sa_sigaction = h3; a.sa_flags = SA_SIGINFO; sigaction(SIGRTMIN + 1, &a, 0);
  union sigval v = {.sival_int = 42}; sigqueue(getpid(), SIGRTMIN + 1, v); P("n3=%d", n3);
  a.sa_handler = h1; a.sa_flags = 0; sigaction(SIGRTMAX, &a, 0); raise(SIGRTMAX); P("rtmax n1=%d", n1); show(SIGRTMAX); show(SIGRTMIN + 1); }
static void *thr_inst(void *p) { (void)p; signal(SIGUSR2, h2); return 0; }
static volatile int got; static void *thr_wait(void *p) { (void)p; while (!n2) ms(1); got = 1; return 0; }
static void s_thread_install(void) { pthread_t t; pthread_create(&t, 0, thr_inst, 0); pthread_join(t, 0); pthread_t w; pthread_create(&w, 0, thr_wait, 0); pthread_kill(w, SIGUSR2); pthread_join(w, 0); P("n2=%d got=%d", n2, got); show(SIGUSR2); }
static void s_fork_exec(void) { signal(SIGUSR1, h1); signal(SIGUSR2, SIG_IGN); pid_t p = fork(); if (!p) { show(SIGUSR1); raise(SIGUSR1); P("child n1=%d", n1);
    execl("/bin/sh", "sh", "-c", "trap -p; kill -USR2 $$; echo alive", (char *)0); _exit(1); } int st; waitpid(p, &st, 0); P("st=%x", st);
  p = vfork(); if (!p) { signal(SIGUSR1, SIG_DFL); execl("/bin/true", "true", (char *)0); _exit(1); } waitpid(p, &st, 0); show(SIGUSR1); raise(SIGUSR1); P("after vfork n1=%d", n1); }
static void s_raw_fork_query(void) { // a child made without the fork hooks (glibc _Fork / syscall)
  signal(SIGUSR1, h1); pid_t p = syscall(57); if (!p) { show(SIGUSR1); struct sigaction o; sigaction(SIGUSR1, 0, &o); sigaction(SIGUSR1, &o, 0); raise(SIGUSR1); P("raw child n1=%d", n1); _exit(0); } int st; waitpid(p, &st, 0); P("st=%x", st); }
static void s_chain(void) { // a runtime chains: saves old, installs its own, calls old
  static struct sigaction old; signal(SIGUSR1, h1); struct sigaction a = {0}; a.sa_sigaction = h3; a.sa_flags = SA_SIGINFO; sigaction(SIGUSR1, &a, &old);
  P("saved=%s siginfo=%d", nm((void *)old.sa_sigaction), !!(old.sa_flags & SA_SIGINFO)); sigaction(SIGUSR1, &old, 0); raise(SIGUSR1); P("n1=%d", n1); show(SIGUSR1); }
static int L; static struct sockaddr_in A;
static void *conn_thr(void *p) { int c = socket(AF_INET, SOCK_STREAM, 0); if (connect(c, (void *)&A, sizeof A)) perror("connect"); *(int *)p = c; return 0; }
static void mkpair(int *c, int *s) {
  if (!L) { L = socket(AF_INET, SOCK_STREAM, 0); int one = 1; setsockopt(L, SOL_SOCKET, SO_REUSEADDR, &one, 4);
    A.sin_family = AF_INET; A.sin_addr.s_addr = htonl(INADDR_LOOPBACK); bind(L, (void *)&A, sizeof A); listen(L, 64);
    socklen_t al = sizeof A; getsockname(L, (void *)&A, &al); }
  pthread_t t; pthread_create(&t, 0, conn_thr, c); *s = accept(L, 0, 0); pthread_join(t, 0);
  char b; write(*c, "x", 1); read(*s, &b, 1); write(*s, "y", 1); read(*c, &b, 1);
}
// socket: a -std=c99 program's signal() is __sysv_signal (no SA_RESTART): alarm breaks a recv
static void s_sysv_alarm_recv(void) {
  int c, s; mkpair(&c, &s); char b[8];
  __sysv_signal(SIGALRM, h1); struct itimerval it = {{0, 0}, {0, 200000}}; setitimer(ITIMER_REAL, &it, 0);
  pid_t p = fork(); if (!p) { ms(1500); write(c, "late", 4); _exit(0); }
  long r = recv(s, b, 8, 0); P("recv=%ld errno=%s n1=%d", r, r < 0 && errno == EINTR ? "EINTR" : "-", n1); waitpid(p, 0, 0); }

// the classic timeout: a handler siglongjmps out of a blocking call; the socket must still work
static void s_longjmp_recv(void) { int c, s; mkpair(&c, &s); struct sigaction a = {0}; a.sa_handler = hjmp; sigaction(SIGALRM, &a, 0); char b[64];
  for (int i = 0; i < 3; i++) { if (!sigsetjmp(jb, 1)) { struct itimerval it = {{0, 0}, {0, 100000}}; setitimer(ITIMER_REAL, &it, 0); long r = recv(s, b, 64, 0); P("recv=%ld", r); } else P("timeout %d", i); }
  write(c, "hello", 5); struct itimerval it = {{0, 0}, {2, 0}}; if (!sigsetjmp(jb, 1)) { setitimer(ITIMER_REAL, &it, 0); long r = recv(s, b, 64, 0); P("after: recv=%ld", r); } else P("after: timeout (data lost or hang)");
  write(s, "back", 4); if (!sigsetjmp(jb, 1)) { setitimer(ITIMER_REAL, &it, 0); long r = recv(c, b, 64, 0); P("reverse recv=%ld", r); } else P("reverse: timeout"); }
static void s_longjmp_send(void) { int c, s; mkpair(&c, &s); struct sigaction a = {0}; a.sa_handler = hjmp; sigaction(SIGALRM, &a, 0); static char b[1 << 20]; long tot = 0;
  int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); long r; while ((r = write(c, b, sizeof b)) > 0) tot += r; fcntl(c, F_SETFL, fl);
  if (!sigsetjmp(jb, 1)) { struct itimerval it = {{0, 0}, {0, 100000}}; setitimer(ITIMER_REAL, &it, 0); r = write(c, b, 1000); P("write=%ld", r); } else P("write timeout");
  long got = 0; fcntl(s, F_SETFL, O_NONBLOCK); for (int i = 0; i < 200; i++) { r = read(s, b, sizeof b); if (r > 0) got += r; else ms(5); }
  P("drained=%d", got == tot); struct itimerval it = {{0, 0}, {2, 0}};
  if (!sigsetjmp(jb, 1)) { setitimer(ITIMER_REAL, &it, 0); r = write(c, "zz", 2); P("write after=%ld", r); ms(50); r = read(s, b, 10); P("read after=%ld", r); } else P("write after: timeout"); }
static void s_longjmp_poll(void) { int c, s; mkpair(&c, &s); struct sigaction a = {0}; a.sa_handler = hjmp; sigaction(SIGALRM, &a, 0);
  for (int i = 0; i < 20; i++) if (!sigsetjmp(jb, 1)) { struct itimerval it = {{0, 0}, {0, 20000}}; setitimer(ITIMER_REAL, &it, 0); struct pollfd p = {s, POLLIN, 0}; poll(&p, 1, -1); }
  write(c, "x", 1); struct pollfd p = {s, POLLIN, 0}; int r = poll(&p, 1, 2000); P("poll after jumps=%d", r); char b; P("recv=%ld", recv(s, &b, 1, 0)); }

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *wlater(void *p) { ms(300); write((int)(long)p, "abc", 3); return 0; }
static void s_poll_timeout(void) { // a poll over the 200 ms tick still times out when asked; select updates its timeval
  int c, s; mkpair(&c, &s); struct pollfd p[3] = {{s, POLLIN, 0}, {-1, POLLIN, 0}, {s, POLLOUT, 0}}; double t0 = now(); int r = poll(p, 1, 700); double d = now() - t0; P("poll=%d in_0.6_1.5=%d", r, d > 0.6 && d < 1.5);
  t0 = now(); r = poll(p, 3, 700); P("dup entries poll=%d re=%x %x %x", r, p[0].revents, p[1].revents, p[2].revents);
  struct pollfd q = {s, 0, 0}; r = poll(&q, 1, 300); P("events=0 poll=%d re=%x", r, q.revents);
  fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs); struct timeval tv = {0, 700000}; t0 = now(); r = select(s + 1, &rs, 0, 0, &tv); d = now() - t0; P("select=%d tv=%ld.%06ld in_0.6_1.5=%d", r, (long)tv.tv_sec, (long)tv.tv_usec, d > 0.6 && d < 1.5);
  pthread_t t; pthread_create(&t, 0, wlater, (void *)(long)c); FD_ZERO(&rs); FD_SET(s, &rs); tv.tv_sec = 2; tv.tv_usec = 0; r = select(s + 1, &rs, 0, 0, &tv); pthread_join(t, 0);
  P("select=%d isset=%d tv_left_1_to_2=%d", r, FD_ISSET(s, &rs), tv.tv_sec == 1); char b[8]; recv(s, b, 8, 0);
  struct timespec ts = {0, 700000000}; struct pollfd pp = {s, POLLIN, 0}; t0 = now(); r = ppoll(&pp, 1, &ts, 0); d = now() - t0; P("ppoll=%d ts=%ld.%09ld in=%d", r, (long)ts.tv_sec, ts.tv_nsec, d > 0.6 && d < 1.5);
  close(c); ms(50); pp.events = POLLIN | POLLRDHUP; r = poll(&pp, 1, 1000); P("after peer close poll=%d re=%x", r, pp.revents);
  int d2 = dup(s); close(s); struct pollfd pn = {s, POLLIN, 0}; r = poll(&pn, 1, 100); P("closed fd poll=%d re=%x", r, pn.revents); (void)d2; }
static volatile int got1; static void hg(int x) { (void)x; got1++; }
static void *kill_later(void *p) { ms(300); kill(getpid(), SIGUSR1); (void)p; return 0; }
static void s_ppoll_mask(void) { // SIGUSR1 blocked except inside ppoll/epoll_pwait: it interrupts there and only there
  int c, s; mkpair(&c, &s); signal(SIGUSR1, hg); sigset_t b, old; sigemptyset(&b); sigaddset(&b, SIGUSR1); sigprocmask(SIG_BLOCK, &b, &old);
  pthread_t t; pthread_create(&t, 0, kill_later, 0); struct pollfd p = {s, POLLIN, 0}; struct timespec ts = {3, 0}; double t0 = now(); errno = 0; int r = ppoll(&p, 1, &ts, &old); int e = errno;
  P("ppoll=%d eintr=%d got=%d early=%d", r, e == EINTR, got1, now() - t0 < 2); pthread_join(t, 0);
  int ep = epoll_create1(0); struct epoll_event ev = {EPOLLIN, {.fd = s}}, o; epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev); pthread_create(&t, 0, kill_later, 0);
  t0 = now(); errno = 0; r = epoll_pwait(ep, &o, 1, 3000, &old); e = errno; P("epoll_pwait=%d eintr=%d got=%d early=%d", r, e == EINTR, got1, now() - t0 < 2); pthread_join(t, 0);
  pthread_create(&t, 0, kill_later, 0); t0 = now(); r = poll(&p, 1, 1000); P("plain poll=%d got=%d (blocked)", r, got1); pthread_join(t, 0);
  sigset_t pend; sigpending(&pend); P("pending=%d", sigismember(&pend, SIGUSR1)); }

// a peer sends the switch marker on purpose (raw syscall under the library): only its own
// connection may suffer; a second connection of the same processes carries on byte-exact
static void *rd_thr(void *p) { int fd = *(int *)p; char b[4096]; long tot = 0, r; int bad = 0;
  while ((r = read(fd, b, sizeof b)) > 0) { for (long i = 0; i < r; i++) if (b[i] != (char)('a' + (tot + i) % 26)) bad++; tot += r; }
  P("reader fd: total=%ld bad=%d end=%s", tot, bad, r < 0 ? strerror(errno) : "eof"); return 0; }
static void s_marker_on_purpose(void) { int c1, s1, c2, s2; mkpair(&c1, &s1); mkpair(&c2, &s2);
  char b[100000]; for (int i = 0; i < (int)sizeof b; i++) b[i] = 'a' + i % 26;
  write(s1, b, 5000); // unread by c1 when the marker goes
  long r = syscall(SYS_sendto, c1, "\x02", 1, MSG_DONTWAIT, 0, 0); P("raw marker sent=%ld", r);
  ms(100); pthread_t t; pthread_create(&t, 0, rd_thr, &s2); long w = write(c2, b, sizeof b); shutdown(c2, SHUT_WR); pthread_join(t, 0); P("conn2 wrote %ld", w);
  // connection 1: what each end sees now (may fail: only this connection)
  struct itimerval it = {{0, 0}, {3, 0}}; setitimer(ITIMER_REAL, &it, 0); signal(SIGALRM, h1); siginterrupt(SIGALRM, 1);
  long a = write(s1, b, 100); long x = read(c1, b, sizeof b); P("conn1: server write=%ld client read=%ld (%s)", a, x, x < 0 ? strerror(errno) : "-"); }

static struct { const char *n; void (*f)(void); } S[] = {
#define X(n) {#n, s_##n}
  X(bsd_signal_old), X(sysv_signal_old), X(sigset_old), X(restore_mixed), X(restore_sigset), X(signal_sig_err), X(siginterrupt_then_signal), X(flags_roundtrip), X(resethand), X(nodefer), X(onstack), X(small_altstack),
  X(longjmp), X(siginfo_value), X(thread_install), X(fork_exec), X(raw_fork_query), X(chain), X(sysv_alarm_recv), X(longjmp_recv), X(longjmp_send), X(longjmp_poll), X(poll_timeout), X(ppoll_mask), X(marker_on_purpose),
};
int main(int argc, char **argv) {
  int n = sizeof S / sizeof S[0];
  for (int a = 1; a < argc; a++) for (int i = 0; i < n; i++) if (!strcmp(argv[a], "all") || !strcmp(argv[a], S[i].n)) {
    printf("== %s\n", S[i].n); fflush(stdout); pid_t p = fork();
    if (!p) { alarm(getenv("RT_ALARM") ? atoi(getenv("RT_ALARM")) : 8); S[i].f(); fflush(stdout); _exit(0); }
    int st; waitpid(p, &st, 0); if (!WIFEXITED(st) || WEXITSTATUS(st)) P("!! status %x", st);
  }
  return 0;
}
