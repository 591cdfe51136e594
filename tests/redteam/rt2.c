// red2: differential probes of smc-preload as an unusual program.
// gcc -O2 -o rt2 rt2.c -lpthread ; world.sh smc ./rt2 SCEN ; world.sh tcp ./rt2 SCEN ; diff
// Every scenario prints observations only (no timings), so smc and tcp outputs must be equal.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define P(...) (printf(__VA_ARGS__), printf("\n"), fflush(stdout))
static void ms(int m) { usleep(m * 1000); }
static const char *en(int e) { static char b[32]; if (e == EAGAIN) return "EAGAIN"; if (e == EINTR) return "EINTR";
  if (e == ECONNRESET) return "ECONNRESET"; if (e == EPIPE) return "EPIPE"; if (e == EBADF) return "EBADF";
  if (e == ENOTCONN) return "ENOTCONN"; if (e == EINVAL) return "EINVAL"; snprintf(b, 32, "errno%d", e); return b; }
#define R(x) ({ long _r = (long)(x); _r < 0 ? (P("%s -> %s", #x, en(errno)), _r) : _r; })

static int L; static struct sockaddr_in A;
static void *conn_thr(void *p) { int c = socket(AF_INET, SOCK_STREAM, 0); if (connect(c, (void *)&A, sizeof A)) perror("connect"); *(int *)p = c; return 0; }
static void mkpair(int *c, int *s) {
  if (!L) { L = socket(AF_INET, SOCK_STREAM, 0); int one = 1; setsockopt(L, SOL_SOCKET, SO_REUSEADDR, &one, 4);
    A.sin_family = AF_INET; A.sin_addr.s_addr = htonl(INADDR_LOOPBACK); bind(L, (void *)&A, sizeof A); listen(L, 64);
    socklen_t al = sizeof A; getsockname(L, (void *)&A, &al); }
  pthread_t t; pthread_create(&t, 0, conn_thr, c); *s = accept(L, 0, 0); pthread_join(t, 0);
  // a round trip so both ends are fully decided
  char b; write(*c, "x", 1); read(*s, &b, 1); write(*s, "y", 1); read(*c, &b, 1);
}
static int pin(int fd, int ev, int t) { struct pollfd p = {fd, ev, 0}; int r = poll(&p, 1, t); return r <= 0 ? r : p.revents; }
struct wr { int fd; int delay; int n; int close_after; };
static void *wr_thr(void *p) { struct wr *w = p; ms(w->delay); char b[65536]; memset(b, 'a', sizeof b);
  if (w->n) { long r = write(w->fd, b, w->n); if (r < 0) P("delayed write -> %s", en(errno)); }
  if (w->close_after) close(w->fd); return 0; }
static pthread_t later(int fd, int delay, int n) { struct wr *w = malloc(sizeof *w); *w = (struct wr){fd, delay, n, 0}; pthread_t t; pthread_create(&t, 0, wr_thr, w); return t; }
static volatile int nsig; static void h(int s) { (void)s; nsig++; }
static void inst(int sig, int restart) { struct sigaction sa = {0}; sa.sa_handler = h; sa.sa_flags = restart ? SA_RESTART : 0; sigaction(sig, &sa, 0); }
static pthread_t mainthr;
static void *kick_thr(void *p) { ms((long)p); pthread_kill(mainthr, SIGALRM); return 0; }
static void kick(int delay) { mainthr = pthread_self(); pthread_t t; pthread_create(&t, 0, kick_thr, (void *)(long)delay); pthread_detach(t); }

static void s_sig_restart_mix(void) { // one handler without SA_RESTART (never fired), SIGALRM with SA_RESTART
  int c, s; mkpair(&c, &s); inst(SIGUSR1, 0); inst(SIGALRM, 1);
  later(c, 300, 5); kick(100); char b[100]; long r = R(recv(s, b, 100, 0)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_sig_restart_pollfree(void) { // SA_RESTART only: recv restarts
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1);
  later(c, 300, 5); kick(100); char b[100]; long r = R(recv(s, b, 100, 0)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_sig_rcvtimeo_restart(void) { // SO_RCVTIMEO set: SA_RESTART does not restart (signal(7))
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1); struct timeval tv = {3, 0}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  later(c, 400, 5); kick(100); char b[100]; long r = R(recv(s, b, 100, 0)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_sig_sndtimeo_restart(void) { // writer blocked on a full buffer, SO_SNDTIMEO, SA_RESTART
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1); struct timeval tv = {3, 0}; setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; long tot = 0, r;
  while ((r = write(c, b, sizeof b)) > 0) tot += r; fcntl(c, F_SETFL, fl);
  kick(100); r = R(write(c, b, 1000)); P("write=%ld nsig=%d", r, nsig);
}
static void s_sig_epoll_restart(void) { // epoll_wait never restarts
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1); int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.fd = s}};
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &e); later(c, 400, 5); kick(100); struct epoll_event o[4];
  int r = R(epoll_wait(ep, o, 4, 2000)); P("epoll_wait=%d nsig=%d", r, nsig);
}
static void s_sig_poll_restart(void) {
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1); later(c, 400, 5); kick(100); struct pollfd p = {s, POLLIN, 0};
  int r = R(poll(&p, 1, 2000)); P("poll=%d nsig=%d", r, nsig);
}
static void s_sig_select_restart(void) {
  int c, s; mkpair(&c, &s); inst(SIGALRM, 1); later(c, 400, 5); kick(100); fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs);
  struct timeval tv = {2, 0}; int r = R(select(s + 1, &rs, 0, 0, &tv)); P("select=%d nsig=%d", r, nsig);
}
static void s_sig_waitall(void) { // MSG_WAITALL interrupted after part: returns the part
  int c, s; mkpair(&c, &s); inst(SIGALRM, 0); write(c, "12345", 5); kick(150); char b[100];
  long r = R(recv(s, b, 100, MSG_WAITALL)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_rcvlowat_block(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  for (int i = 0; i < 5; i++) write(c, "0123456789", 10);
  P("poll(0)=%x", pin(s, POLLIN, 0)); later(c, 200, 1000); char b[4096]; long r = R(recv(s, b, sizeof b, 0)); P("recv=%ld (>=1000?)", r >= 1000 ? 1000 : r);
}
static void s_rcvlowat_small_buf(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  write(c, "0123456789", 10); char b[8]; long r = R(recv(s, b, sizeof b, 0)); P("recv=%ld", r);
}
static void s_rcvlowat_fin(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); write(c, "0123456789", 10);
  P("poll(0)=%x", pin(s, POLLIN, 0)); shutdown(c, SHUT_WR); ms(50); P("poll(0) after fin=%x", pin(s, POLLIN | POLLRDHUP, 0));
  char b[4096]; long r = R(recv(s, b, sizeof b, 0)); P("recv=%ld", r); r = R(recv(s, b, sizeof b, 0)); P("recv=%ld", r);
}
static void s_rcvlowat_timeo(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  struct timeval tv = {0, 300000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); write(c, "0123456789", 10);
  char b[4096]; long r = R(recv(s, b, sizeof b, 0)); P("recv=%ld", r); r = R(recv(s, b, sizeof b, 0)); P("recv=%ld", r);
}
static void s_rcvlowat_nonblock(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); write(c, "0123456789", 10); ms(20);
  char b[4096]; long r = R(recv(s, b, sizeof b, MSG_DONTWAIT)); P("recv=%ld", r);
  int n; ioctl(s, FIONREAD, &n); P("fionread=%d", n);
}
static void s_rcvlowat_epoll(void) {
  int c, s; mkpair(&c, &s); int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN | EPOLLET, {.fd = s}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  P("ep0=%d", epoll_wait(ep, o, 4, 0)); write(c, "0123456789", 10); P("ep small=%d", epoll_wait(ep, o, 4, 200));
  later(c, 100, 995); int r = epoll_wait(ep, o, 4, 2000); P("ep big=%d ev=%x", r, r > 0 ? o[0].events : 0);
  P("ep again(ET)=%d", epoll_wait(ep, o, 4, 100));
}
static void s_rcvlowat_lt_poll(void) { // poll with data trickling below and then above the mark
  int c, s; mkpair(&c, &s); int v = 300; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  for (int i = 0; i < 3; i++) { write(c, "0123456789", 10); P("poll %d=%x", i, pin(s, POLLIN, 100)); }
  later(c, 100, 300); P("poll wait=%x", pin(s, POLLIN, 2000));
  v = 1; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); P("lowat1 poll=%x", pin(s, POLLIN, 0));
}
static void s_rcvlowat_before_handshake(void) { // set on the listener: inherited by the accepted socket
  int v = 500; int c, s; mkpair(&c, &s); close(c); close(s); setsockopt(L, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  mkpair(&c, &s); int g = 0; socklen_t gl = 4; getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &g, &gl); P("inherited=%d", g);
  write(c, "0123456789", 10); P("poll=%x", pin(s, POLLIN, 100));
}
static void s_rcvlowat_big(void) { // larger than a ring could hold: kernel clamps
  int c, s; mkpair(&c, &s); int v = 0x7fffffff; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  int g = 0; socklen_t gl = 4; getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &g, &gl); P("lowat=%d", g);
  static char b[1 << 20]; long tot = 0; int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK);
  for (int i = 0; i < 64; i++) { long r = write(c, b, sizeof b); if (r > 0) tot += r; else break; ms(5); }
  P("wrote>=lowat? %d", tot >= g); P("poll=%x", pin(s, POLLIN, 1000));
}
static void s_siocoutq(void) {
  int c, s; mkpair(&c, &s); write(c, "0123456789", 10); ms(50); int n = -1; ioctl(c, SIOCOUTQ, &n); P("outq=%d", n);
  ioctl(s, SIOCINQ, &n); P("inq=%d", n); ioctl(c, SIOCOUTQNSD, &n); P("outqnsd=%d", n);
}
// nested epoll
static void s_nest_basic(void) {
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0);
  struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4]; epoll_ctl(in, EPOLL_CTL_ADD, s, &e); e.data.u64 = 9; epoll_ctl(out, EPOLL_CTL_ADD, in, &e);
  P("outer0=%d", epoll_wait(out, o, 4, 0)); later(c, 200, 5); int r = epoll_wait(out, o, 4, 2000); P("outer=%d data=%lu", r, r > 0 ? (unsigned long)o[0].data.u64 : 0);
  r = epoll_wait(in, o, 4, 0); P("inner=%d data=%lu", r, r > 0 ? (unsigned long)o[0].data.u64 : 0);
  P("outer LT again=%d", epoll_wait(out, o, 4, 100)); char b[10]; read(s, b, 10); P("outer after read=%d", epoll_wait(out, o, 4, 100));
  P("inner after read=%d", epoll_wait(in, o, 4, 0));
}
static void s_nest_poll(void) {
  int c, s; mkpair(&c, &s); int in = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4]; epoll_ctl(in, EPOLL_CTL_ADD, s, &e);
  P("poll0=%x", pin(in, POLLIN, 0)); later(c, 200, 5); P("poll=%x", pin(in, POLLIN, 2000)); P("inner=%d", epoll_wait(in, o, 4, 0));
  char b[10]; read(s, b, 10); P("poll after read=%x", pin(in, POLLIN, 100));
  fd_set rs; FD_ZERO(&rs); FD_SET(in, &rs); struct timeval tv = {2, 0}; later(c, 200, 3); int r = select(in + 1, &rs, 0, 0, &tv); P("select=%d", r);
}
static void s_nest_et_inner(void) {
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0);
  struct epoll_event e = {EPOLLIN | EPOLLET, {.u64 = 7}}, o[4]; epoll_ctl(in, EPOLL_CTL_ADD, s, &e); e.events = EPOLLIN; epoll_ctl(out, EPOLL_CTL_ADD, in, &e);
  write(c, "abc", 3); P("outer=%d", epoll_wait(out, o, 4, 1000)); P("inner=%d", epoll_wait(in, o, 4, 0)); P("inner again=%d", epoll_wait(in, o, 4, 0));
  P("outer after inner consumed ET=%d", epoll_wait(out, o, 4, 100));
  later(c, 100, 3); P("outer new data=%d", epoll_wait(out, o, 4, 2000)); P("inner=%d", epoll_wait(in, o, 4, 0));
}
static void s_nest_out(void) { // EPOLLOUT on inner
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0);
  struct epoll_event e = {EPOLLOUT, {.u64 = 7}}, o[4]; epoll_ctl(in, EPOLL_CTL_ADD, c, &e); e.events = EPOLLIN; epoll_ctl(out, EPOLL_CTL_ADD, in, &e);
  P("outer=%d", epoll_wait(out, o, 4, 1000));
}
static void *ep_waiter(void *p) { int ep = *(int *)p; struct epoll_event o[4]; int r = epoll_wait(ep, o, 4, 3000); P("thread outer=%d", r); return 0; }
static void s_nest_thread(void) { // outer wait in another thread before the inner entry exists
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 7}};
  epoll_ctl(out, EPOLL_CTL_ADD, in, &e); pthread_t t; pthread_create(&t, 0, ep_waiter, &out); ms(100);
  epoll_ctl(in, EPOLL_CTL_ADD, s, &e); ms(100); write(c, "abc", 3); pthread_join(t, 0);
}
static void s_nest_three(void) {
  int c, s; mkpair(&c, &s); int e1 = epoll_create1(0), e2 = epoll_create1(0), e3 = epoll_create1(0);
  struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4]; epoll_ctl(e1, EPOLL_CTL_ADD, s, &e); epoll_ctl(e2, EPOLL_CTL_ADD, e1, &e); epoll_ctl(e3, EPOLL_CTL_ADD, e2, &e);
  later(c, 200, 3); P("e3=%d", epoll_wait(e3, o, 4, 2000)); P("poll e2=%x", pin(e2, POLLIN, 0));
}
static void s_nest_fork(void) { // outer waited in a child, inner set copied by fork
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4];
  epoll_ctl(in, EPOLL_CTL_ADD, s, &e); epoll_ctl(out, EPOLL_CTL_ADD, in, &e);
  pid_t p = fork(); if (!p) { int r = epoll_wait(out, o, 4, 3000); P("child outer=%d", r); r = epoll_wait(in, o, 4, 0); P("child inner=%d", r);
    char b[10]; r = read(s, b, 10); P("child read=%d", r); _exit(0); }
  ms(200); write(c, "abc", 3); int st; waitpid(p, &st, 0); P("parent inner=%d", epoll_wait(in, o, 4, 100));
}
static void s_epoll_fork_shared(void) { // both processes wait on the same set; one reads
  int c, s; mkpair(&c, &s); int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  pid_t p = fork(); if (!p) { int r = epoll_wait(ep, o, 4, 3000); P("child=%d", r); char b[10]; r = read(s, b, 10); P("child read=%d", r);
    ms(300); r = epoll_wait(ep, o, 4, 2000); P("child 2=%d", r); r = read(s, b, 10); P("child read2=%d", r); _exit(0); }
  ms(200); write(c, "abc", 3); ms(300); P("parent after child read=%d", epoll_wait(ep, o, 4, 100)); write(c, "de", 2);
  int st; waitpid(p, &st, 0); P("parent end=%d", epoll_wait(ep, o, 4, 100));
}
static void s_epoll_many_ready(void) { // O(ready): 40 conns, maxevents 3, round robin; all reported
  int c[40], s[40]; int ep = epoll_create1(0); for (int i = 0; i < 40; i++) { mkpair(&c[i], &s[i]); struct epoll_event e = {EPOLLIN, {.u32 = i}}; epoll_ctl(ep, EPOLL_CTL_ADD, s[i], &e); }
  for (int i = 0; i < 40; i += 2) write(c[i], "z", 1); int seen[40] = {0}; struct epoll_event o[3];
  for (int k = 0; k < 20; k++) { int r = epoll_wait(ep, o, 3, 100); for (int j = 0; j < r; j++) { seen[o[j].data.u32]++; char b; read(s[o[j].data.u32], &b, 1); } }
  int n = 0, bad = 0; for (int i = 0; i < 40; i++) { if (seen[i]) n++; if ((i & 1) && seen[i]) bad++; } P("seen=%d bad=%d", n, bad);
  P("after=%d", epoll_wait(ep, o, 3, 50));
  // modify, delete, re-add, oneshot
  struct epoll_event e = {EPOLLIN | EPOLLONESHOT, {.u32 = 1}}; epoll_ctl(ep, EPOLL_CTL_MOD, s[1], &e); write(c[1], "q", 1);
  P("oneshot=%d", epoll_wait(ep, o, 3, 500)); P("oneshot again=%d", epoll_wait(ep, o, 3, 100));
  epoll_ctl(ep, EPOLL_CTL_MOD, s[1], &e); P("oneshot rearmed=%d", epoll_wait(ep, o, 3, 100));
  epoll_ctl(ep, EPOLL_CTL_DEL, s[1], 0); P("deleted=%d", epoll_wait(ep, o, 3, 100)); e.events = EPOLLIN; epoll_ctl(ep, EPOLL_CTL_ADD, s[1], &e); P("readded=%d", epoll_wait(ep, o, 3, 100));
  close(s[1]); P("closed=%d", epoll_wait(ep, o, 3, 100));
}
static void s_epoll_close_dup(void) { // fd closed but a dup keeps the description registered
  int c, s; mkpair(&c, &s); int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 77}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  int d = dup(s); close(s); write(c, "abc", 3); int r = epoll_wait(ep, o, 4, 1000); P("after close of dup'd=%d data=%lu", r, r > 0 ? (unsigned long)o[0].data.u64 : 0);
  char b[10]; P("read dup=%ld", read(d, b, 10));
}
static void *rd_block(void *p) { int fd = *(int *)p; char b[100]; long r = recv(fd, b, 100, 0); P("blocked recv=%ld %s", r, r < 0 ? en(errno) : ""); return 0; }
static void s_close_while_recv(void) {
  int c, s; mkpair(&c, &s); pthread_t t; pthread_create(&t, 0, rd_block, &s); ms(200); P("close=%d", close(s)); ms(200);
  long r = R(write(c, "hello", 5)); P("peer write=%ld", r); pthread_join(t, 0); ms(100); char b[10];
  r = R(recv(c, b, 10, MSG_DONTWAIT)); P("peer read=%ld", r);
}
static void s_shutdown_while_recv(void) {
  int c, s; mkpair(&c, &s); pthread_t t; pthread_create(&t, 0, rd_block, &s); ms(200); P("shutdown=%d", shutdown(s, SHUT_RD)); pthread_join(t, 0);
  long r = R(write(c, "hello", 5)); P("peer write=%ld", r); ms(50); char b[10]; r = R(recv(s, b, 10, MSG_DONTWAIT)); P("read after shut_rd=%ld", r);
}
static void s_shutdown_rdwr_while_recv(void) {
  int c, s; mkpair(&c, &s); pthread_t t; pthread_create(&t, 0, rd_block, &s); ms(200); P("shutdown=%d", shutdown(s, SHUT_RDWR)); pthread_join(t, 0);
  char b[10]; ms(50); long r = R(recv(c, b, 10, MSG_DONTWAIT)); P("peer read=%ld", r);
}
static void s_shut_rd_then_data(void) {
  int c, s; mkpair(&c, &s); shutdown(s, SHUT_RD); ms(20); long r = R(write(c, "hello", 5)); P("peer write=%ld", r); ms(50);
  char b[10]; r = R(recv(s, b, 10, MSG_DONTWAIT)); P("read=%ld", r); r = R(recv(s, b, 10, 0)); P("read=%ld", r);
  P("poll=%x", pin(s, POLLIN | POLLOUT | POLLRDHUP, 0)); r = R(write(s, "x", 1)); P("write=%ld", r); r = R(recv(c, b, 10, MSG_DONTWAIT)); P("peer read=%ld", r);
}
static void s_shut_wr_poll(void) {
  int c, s; mkpair(&c, &s); shutdown(c, SHUT_WR); ms(50); P("s poll=%x", pin(s, POLLIN | POLLOUT | POLLRDHUP, 0)); P("c poll=%x", pin(c, POLLIN | POLLOUT | POLLRDHUP, 0));
  long r = R(write(c, "x", 1)); P("write after shut_wr=%ld", r); r = R(write(s, "abc", 3)); P("s write=%ld", r); char b[10]; r = R(read(c, b, 10)); P("c read=%ld", r);
  shutdown(s, SHUT_WR); ms(50); P("s poll=%x", pin(s, POLLIN | POLLOUT | POLLRDHUP, 0)); P("c poll=%x", pin(c, POLLIN | POLLOUT | POLLRDHUP, 0));
}
static void s_linger0(void) {
  int c, s; mkpair(&c, &s); write(c, "0123456789", 10); struct linger lg = {1, 0}; setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg); close(c); ms(100);
  P("poll=%x", pin(s, POLLIN | POLLOUT | POLLRDHUP, 0)); char b[100]; long r = R(read(s, b, 100)); P("read=%ld", r); r = R(read(s, b, 100)); P("read=%ld", r);
  r = R(read(s, b, 100)); P("read=%ld", r); int e = 0; socklen_t el = 4; getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el); P("so_error=%s", e ? en(e) : "0");
}
static void s_linger0_empty(void) {
  int c, s; mkpair(&c, &s); struct linger lg = {1, 0}; setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg); close(c); ms(100);
  P("poll=%x", pin(s, POLLIN | POLLOUT | POLLRDHUP, 0)); char b[100]; long r = R(read(s, b, 100)); P("read=%ld", r); r = R(read(s, b, 100)); P("read=%ld", r);
  r = R(send(s, "x", 1, MSG_NOSIGNAL)); P("write=%ld", r);
}
static void s_close_unread(void) { // close with unread data: RST to peer
  int c, s; mkpair(&c, &s); write(c, "abc", 3); ms(20); close(s); ms(100); char b[10]; P("poll=%x", pin(c, POLLIN | POLLOUT | POLLRDHUP, 0));
  long r = R(send(c, "x", 1, MSG_NOSIGNAL)); P("write=%ld", r); r = R(read(c, b, 10)); P("read=%ld", r); r = R(read(c, b, 10)); P("read=%ld", r);
}
static void s_nonblock_toggle(void) {
  int c, s; mkpair(&c, &s); int fl = fcntl(s, F_GETFL); fcntl(s, F_SETFL, fl | O_NONBLOCK); char b[10]; long r = R(read(s, b, 10)); P("nb read=%ld", r);
  fcntl(s, F_SETFL, fl); later(c, 200, 3); r = R(read(s, b, 10)); P("blocking read=%ld", r);
  int on = 1; ioctl(s, FIONBIO, &on); r = R(read(s, b, 10)); P("fionbio read=%ld", r); on = 0; ioctl(s, FIONBIO, &on);
  int d = dup(s); fcntl(d, F_SETFL, fl | O_NONBLOCK); r = R(read(s, b, 10)); P("read after dup set nb=%ld", r); P("getfl nb=%d", !!(fcntl(s, F_GETFL) & O_NONBLOCK));
  fcntl(d, F_SETFL, fl); pid_t p = fork(); if (!p) { fcntl(s, F_SETFL, fl | O_NONBLOCK); _exit(0); } waitpid(p, 0, 0);
  r = R(read(s, b, 10)); P("read after child set nb=%ld", r); fcntl(s, F_SETFL, fl);
  // received with SCM_RIGHTS in another process, that process sets O_NONBLOCK
}
static void s_nonblock_other_thread(void) { // toggled to non-blocking while a read blocks: the read keeps blocking (TCP)
  int c, s; mkpair(&c, &s); pthread_t t; pthread_create(&t, 0, rd_block, &s); ms(200); int fl = fcntl(s, F_GETFL); fcntl(s, F_SETFL, fl | O_NONBLOCK); ms(200);
  write(c, "hi", 2); pthread_join(t, 0);
}
static void s_nodelay_opts(void) {
  int c, s; mkpair(&c, &s); int one = 1; P("nodelay=%d", setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, 4)); P("cork=%d", setsockopt(c, IPPROTO_TCP, TCP_CORK, &one, 4));
  write(c, "abc", 3); char b[10]; struct timeval tv = {1, 0}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); long r = R(read(s, b, 10)); P("read (corked)=%ld", r);
  one = 0; setsockopt(c, IPPROTO_TCP, TCP_CORK, &one, 4); r = R(read(s, b, 10)); P("read=%ld", r);
}
static void s_mixed_api(void) { // read + recvmsg + readv + splice + sendfile + MSG_PEEK on one stream, check bytes
  int c, s; mkpair(&c, &s); char buf[256]; for (int i = 0; i < 256; i++) buf[i] = i; int tot = 0;
  FILE *f = tmpfile(); fwrite(buf, 1, 256, f); fflush(f); int ffd = fileno(f);
  write(c, buf, 50); struct iovec iv[2] = {{buf, 25}, {buf + 25, 25}}; writev(c, iv, 2); off_t off = 100; sendfile(c, ffd, &off, 100); send(c, buf + 200, 56, 0);
  int pp[2]; pipe(pp); write(pp[1], buf, 100); splice(pp[0], 0, c, 0, 100, 0);
  unsigned char r[512]; ms(50); long n = recv(s, r, 10, MSG_PEEK); tot += 0; n = read(s, r, 10); struct iovec ri[2] = {{r + 10, 5}, {r + 15, 15}}; n += readv(s, ri, 2);
  struct msghdr mh = {0}; struct iovec mi = {r + 30, 50}; mh.msg_iov = &mi; mh.msg_iovlen = 1; n += recvmsg(s, &mh, 0);
  int q[2]; pipe(q); long sp = splice(s, 0, q[1], 0, 100, 0); n += read(q[0], r + 80, sp); n += recv(s, r + 80 + sp, 512 - 80 - sp, MSG_WAITALL | MSG_DONTWAIT);
  int ok = 1; for (int i = 0; i < 100; i++) if (r[i] != (unsigned char)(i % 100 < 50 ? i : i)) ok = 0;
  int ok2 = 1; for (int i = 0; i < 256; i++) if (r[i] != (unsigned char)i) ok2 = 0; for (int i = 0; i < 100; i++) if (r[256 + i] != (unsigned char)i) ok2 = 0;
  unsigned long hsh = 0; for (long i = 0; i < n && i < 512; i++) hsh = hsh * 131 + r[i]; P("n=%ld hash=%lx", n, hsh); (void)ok; (void)ok2; (void)tot;
}
static int sc, ss; static volatile long rsum, rcnt;
static void *race_rd(void *p) { (void)p; unsigned char b[777]; for (;;) { long r = read(ss, b, 1 + (rand() % 777)); if (r <= 0) break; for (long i = 0; i < r; i++) __sync_fetch_and_add(&rsum, b[i]); __sync_fetch_and_add(&rcnt, r); } return 0; }
static void s_race_readers(void) {
  mkpair(&sc, &ss); pthread_t t[3]; for (int i = 0; i < 3; i++) pthread_create(&t[i], 0, race_rd, 0);
  unsigned char b[10000]; long sum = 0, cnt = 0; srand(1); for (int k = 0; k < 2000; k++) { int n = 1 + rand() % 10000; for (int i = 0; i < n; i++) { b[i] = rand(); sum += b[i]; } write(sc, b, n); cnt += n; }
  shutdown(sc, SHUT_WR); for (int i = 0; i < 3; i++) pthread_join(t[i], 0); P("match=%d %d", rsum == sum, rcnt == cnt);
}
static void *race_wr(void *p) { long id = (long)p; char rec[100]; for (int k = 0; k < 5000; k++) { memset(rec, 'A' + id, 100); snprintf(rec, 20, "%ld:%d", id, k); rec[strlen(rec)] = 'A' + id; write(sc, rec, 100); } return 0; }
static void s_race_writers(void) { // small writes from 4 threads: TCP keeps each 100-byte write whole
  mkpair(&sc, &ss); pthread_t t[4]; for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, race_wr, (void *)i);
  long bad = 0, recs = 0; char rec[100]; int last[4] = {-1, -1, -1, -1};
  for (;;) { long got = recv(ss, rec, 100, MSG_WAITALL); if (got != 100) break; recs++; int id = rec[99] - 'A'; int k = -1; sscanf(rec, "%*d:%d", &k);
    if (id < 0 || id > 3 || k != last[id] + 1) bad++; else last[id] = k; for (int i = 20; i < 100; i++) if (rec[i] != rec[99]) { bad++; break; } if (recs == 20000) break; }
  for (int i = 0; i < 4; i++) pthread_join(t[i], 0); P("recs=%ld bad=%ld", recs, bad);
}
static void s_vfork_exec(void) {
  int c, s; mkpair(&c, &s); pid_t p = vfork(); if (!p) { close(s); execl("/bin/true", "true", (char *)0); _exit(9); } int st; waitpid(p, &st, 0);
  write(c, "abc", 3); char b[10]; long r = R(read(s, b, 10)); P("read after vfork=%ld", r); r = R(write(s, "de", 2)); r = R(read(c, b, 10)); P("peer read=%ld", r);
  close(c); r = R(read(s, b, 10)); P("eof=%ld", r);
}
static void s_fork_close_parent(void) { // child keeps the conn, parent closes: peer sees no EOF
  int c, s; mkpair(&c, &s); pid_t p = fork(); if (!p) { ms(300); char b[10]; long r = read(s, b, 10); P("child read=%ld", r); write(s, "fromchild", 9); _exit(0); }
  close(s); ms(100); P("peer poll=%x", pin(c, POLLIN | POLLRDHUP, 0)); write(c, "abc", 3); char b[20]; long r = R(read(c, b, 20)); P("peer read=%ld", r);
  waitpid(p, 0, 0); r = R(read(c, b, 20)); P("peer eof=%ld", r);
}
static void s_scm_pass(void) { // pass an SMC fd to a child over a unix socket; parent closes
  int c, s; mkpair(&c, &s); int sp[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, sp); pid_t p = fork();
  if (!p) { close(sp[0]); char d; struct iovec iv = {&d, 1}; char cm[CMSG_SPACE(4)]; struct msghdr mh = {0}; mh.msg_iov = &iv; mh.msg_iovlen = 1; mh.msg_control = cm; mh.msg_controllen = sizeof cm;
    // close every inherited copy so only the received one counts
    close(s); close(c); recvmsg(sp[1], &mh, 0); int fd = *(int *)CMSG_DATA(CMSG_FIRSTHDR(&mh)); char b[20]; long r = read(fd, b, 20); P("child read=%ld", r);
    write(fd, "reply", 5); close(fd); _exit(0); }
  close(sp[1]); char d = 0; struct iovec iv = {&d, 1}; char cm[CMSG_SPACE(4)]; struct msghdr mh = {0}; mh.msg_iov = &iv; mh.msg_iovlen = 1; mh.msg_control = cm; mh.msg_controllen = sizeof cm;
  struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch->cmsg_level = SOL_SOCKET; ch->cmsg_type = SCM_RIGHTS; ch->cmsg_len = CMSG_LEN(4); *(int *)CMSG_DATA(ch) = s;
  sendmsg(sp[0], &mh, 0); close(s); write(c, "hello", 5); char b[20]; long r = R(read(c, b, 20)); P("peer read=%ld", r); r = R(read(c, b, 20)); P("peer eof=%ld", r); waitpid(p, 0, 0);
}
static void s_sendfile_big(void) {
  int c, s; mkpair(&c, &s); char path[] = "/tmp/rt2XXXXXX"; int f = mkstemp(path); unlink(path); static char b[1 << 20]; for (int i = 0; i < (1 << 20); i++) b[i] = i * 7 + (i >> 12);
  for (int i = 0; i < 12; i++) write(f, b, sizeof b); off_t off = 5; pid_t p = fork();
  if (!p) { long tot = 0; while (tot < 12 * (1L << 20) - 5) { long r = sendfile(c, f, &off, 12 * (1L << 20) - off); if (r <= 0) break; tot += r; } _exit(0); }
  long tot = 0, bad = 0; static char r[70000]; int pp[2]; pipe(pp); int turn = 0;
  while (tot < 12 * (1L << 20) - 5) { long n; if (turn++ & 1) { n = splice(s, 0, pp[1], 0, 65536, 0); if (n > 0) n = read(pp[0], r, n); } else n = read(s, r, sizeof r); if (n <= 0) break;
    for (long i = 0; i < n; i++) { long o = 5 + tot + i; if (r[i] != b[o & ((1 << 20) - 1)]) bad++; } tot += n; }
  waitpid(p, 0, 0); P("tot=%ld bad=%ld", tot, bad);
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void s_nest_lt(void) {
  int c, s; mkpair(&c, &s); int in = epoll_create1(0), out = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.u64 = 7}}, o[4];
  epoll_ctl(in, EPOLL_CTL_ADD, s, &e); epoll_ctl(out, EPOLL_CTL_ADD, in, &e); write(c, "abc", 3); ms(100);
  for (int i = 0; i < 3; i++) P("outer %d=%d", i, epoll_wait(out, o, 4, 500)); for (int i = 0; i < 2; i++) P("inner %d=%d", i, epoll_wait(in, o, 4, 500));
  for (int i = 0; i < 2; i++) P("outer %d=%d", i, epoll_wait(out, o, 4, 500)); char b[10]; read(s, b, 10);
  int spur = 0; for (int i = 0; i < 5; i++) { if (epoll_wait(out, o, 4, 100) > 0) { spur++; epoll_wait(in, o, 4, 0); } } P("outer after read (spurious)=%d", spur);
}
static int lws; static void *lw_thr(void *p) { (void)p; ms(200); int v = 1; setsockopt(lws, SOL_SOCKET, SO_RCVLOWAT, &v, 4); return 0; }
static void s_rcvlowat_lower_poll(void) { // another thread lowers SO_RCVLOWAT below what is queued: poll wakes (tcp_set_rcvlowat)
  int c, s; mkpair(&c, &s); lws = s; int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); write(c, "0123456789", 10);
  pthread_t t; pthread_create(&t, 0, lw_thr, 0); double t0 = now(); int r = pin(s, POLLIN, 3000); P("poll=%x early=%d", r, now() - t0 < 2);
  pthread_join(t, 0);
}
static void s_rcvlowat_lower_epoll(void) {
  int c, s; mkpair(&c, &s); lws = s; int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); write(c, "0123456789", 10);
  int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.fd = s}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  pthread_t t; pthread_create(&t, 0, lw_thr, 0); double t0 = now(); int r = epoll_wait(ep, o, 4, 3000); P("epoll=%d early=%d", r, now() - t0 < 2);
  pthread_join(t, 0);
}
static void s_rcvlowat_raise_recv(void) { // lowat set while data queued; blocking recv with SO_RCVTIMEO
  int c, s; mkpair(&c, &s); write(c, "0123456789", 10); ms(50); int v = 100; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  P("poll=%x", pin(s, POLLIN, 0)); char b[50]; long r = R(recv(s, b, 50, MSG_PEEK | MSG_DONTWAIT)); P("peek nb=%ld", r);
  later(c, 100, 95); r = R(recv(s, b, 50, MSG_PEEK)); P("peek=%ld", r); r = R(recv(s, b, 50, 0)); P("recv=%ld", r);
}
static int cws; static volatile long wtot; static void *wr_block(void *p) { (void)p; static char b[1 << 20]; long tot = 0; for (;;) { long r = write(cws, b, sizeof b); if (r <= 0) { P("writer r=%ld %s", r, r < 0 ? en(errno) : ""); break; } tot += r; if (tot > (64L << 20)) break; } P("writer tot>0 %d", tot > 0); wtot = tot; return 0; }
static void s_close_while_write(void) {
  int c, s; mkpair(&c, &s); cws = c; pthread_t t; pthread_create(&t, 0, wr_block, 0); ms(300); P("close=%d", close(c));
  static char b[1 << 20]; long tot = 0, r; ms(200); int fl = fcntl(s, F_GETFL); (void)fl;
  struct timeval tv = {2, 0}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  while ((r = read(s, b, sizeof b)) > 0) { tot += r; if (tot > (70L << 20)) break; } pthread_join(t, 0); P("reader end r=%ld %s match=%d", r, r < 0 ? en(errno) : "", tot == wtot);
}
static void s_dup2_while_recv(void) { // dup2 another socket over an fd a thread blocks in recv on
  int c, s; mkpair(&c, &s); pthread_t t; pthread_create(&t, 0, rd_block, &s); ms(200); int x = socket(AF_INET, SOCK_STREAM, 0); P("dup2=%d", dup2(x, s) == s);
  ms(100); long r = R(write(c, "hello", 5)); P("peer write=%ld", r); pthread_join(t, 0);
}
static void s_sig_bsd_signal(void) { // glibc signal() = SA_RESTART
  int c, s; mkpair(&c, &s); signal(SIGALRM, h); later(c, 300, 5); kick(100); char b[100]; long r = R(recv(s, b, 100, 0)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_sig_siginterrupt(void) { // handler without SA_RESTART, then siginterrupt(0) turns it on
  int c, s; mkpair(&c, &s); inst(SIGALRM, 0); siginterrupt(SIGALRM, 0); later(c, 300, 5); kick(100); char b[100]; long r = R(recv(s, b, 100, 0)); P("recv=%ld nsig=%d", r, nsig);
}
static void s_sig_accept_restart(void) { // SIGUSR1 no-restart elsewhere; SA_RESTART SIGALRM during a write blocked on a full ring
  int c, s; mkpair(&c, &s); inst(SIGUSR1, 0); inst(SIGALRM, 1); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; long r;
  while ((r = write(c, b, sizeof b)) > 0) ; fcntl(c, F_SETFL, fl); kick(100); pthread_t t; struct wr w = {0}; (void)w;
  // reader drains after 400ms
  pid_t p = fork(); if (!p) { ms(400); static char rb[1 << 20]; long tot = 0; while (tot < (1 << 20)) { long k = read(s, rb, sizeof rb); if (k <= 0) break; tot += k; } ms(500); _exit(0); }
  r = R(write(c, b, 1000)); P("write=%ld nsig=%d", r, nsig); waitpid(p, 0, 0); (void)t;
}
static void *poller_thr(void *p) { int fd = *(int *)p; char b[10]; recv(fd, b, 10, 0); return 0; }
static void s_fork_poller_dies(void) { // a parent thread is the connection's poller; the parent dies; the child must still be woken
  int c, s; mkpair(&c, &s); pid_t p = fork();
  if (!p) { pthread_t t; pthread_create(&t, 0, poller_thr, &s); ms(100); pid_t q = fork(); if (!q) { ms(200); double t0 = now(); char b[10]; long r = read(s, b, 10); P("grandchild read=%ld fast=%d", r, now() - t0 < 0.4); fprintf(stderr, "grandchild waited %.0f ms\n", (now() - t0) * 1000); _exit(0); }
    ms(100); _exit(0); }
  ms(600); write(c, "hello", 5); ms(1200); (void)0; int st; waitpid(p, &st, 0); ms(1000);
}
static void s_sigpipe_thread(void) { // SIGPIPE goes to the writing thread
  int c, s; mkpair(&c, &s); close(s); ms(50); signal(SIGPIPE, h); nsig = 0; write(c, "a", 1); ms(50); long r = R(write(c, "b", 1)); P("write=%ld nsig=%d", r, nsig); r = R(write(c, "b", 1)); P("write=%ld nsig=%d", r, nsig);
  signal(SIGPIPE, SIG_IGN);
}

static int shw_fd; static void *shw_thr(void *p) { (void)p; ms(300); shutdown(shw_fd, (long)0 + SHUT_WR); return 0; }
static void s_shutwr_while_write(void) { // another thread shuts the write side while a write blocks on a full buffer
  int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; long r;
  while ((r = write(c, b, sizeof b)) > 0) ; fcntl(c, F_SETFL, fl); shw_fd = c; pthread_t t; pthread_create(&t, 0, shw_thr, 0);
  double t0 = now(); r = R(write(c, b, 1000)); P("write=%ld early=%d", r, now() - t0 < 2); pthread_join(t, 0);
}
static int shp_fd, shp_how; static void *shp_thr(void *p) { (void)p; ms(300); shutdown(shp_fd, shp_how); return 0; }
static void s_shut_while_poll(void) { // another thread shuts a socket that poll/epoll sleeps on
  for (int how = 0; how < 3; how++) { int c, s; mkpair(&c, &s); shp_fd = s; shp_how = how; pthread_t t; pthread_create(&t, 0, shp_thr, 0);
    double t0 = now(); int r = pin(s, POLLIN | POLLRDHUP, 3000); P("how=%d poll=%x early=%d", how, r, now() - t0 < 2); pthread_join(t, 0); close(c); close(s); }
  for (int how = 0; how < 3; how++) { int c, s; mkpair(&c, &s); shp_fd = s; shp_how = how; int ep = epoll_create1(0); struct epoll_event e = {EPOLLIN | EPOLLRDHUP, {.fd = s}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    pthread_t t; pthread_create(&t, 0, shp_thr, 0); double t0 = now(); int r = epoll_wait(ep, o, 4, 3000); P("how=%d epoll=%d ev=%x early=%d", how, r, r > 0 ? o[0].events : 0, now() - t0 < 2); pthread_join(t, 0); close(c); close(s); close(ep); }
  { int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; while (write(c, b, sizeof b) > 0) ;
    shp_fd = c; shp_how = SHUT_WR; pthread_t t; pthread_create(&t, 0, shp_thr, 0); double t0 = now(); int r = pin(c, POLLOUT, 3000); P("full+shutwr poll=%x early=%d", r, now() - t0 < 2); pthread_join(t, 0); }
}
static void s_peer_close_while_poll_out2(void) { // same, then poll again after a while
  int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; while (write(c, b, sizeof b) > 0) ;
  close(s); ms(300); P("poll=%x", pin(c, POLLIN | POLLOUT | POLLRDHUP, 0)); long r = R(write(c, b, 10)); P("write=%ld", r); P("poll=%x", pin(c, POLLIN | POLLOUT | POLLRDHUP, 0));
}
static void s_shutrd_poll_inf(void) { // poll(-1) in one thread, shutdown(SHUT_RD) in another: TCP wakes it at once
  int c, s; mkpair(&c, &s); shp_fd = s; shp_how = SHUT_RD; pthread_t t; pthread_create(&t, 0, shp_thr, 0); alarm(10);
  double t0 = now(); int r = pin(s, POLLIN, -1); P("poll=%x early=%d", r, now() - t0 < 5); pthread_join(t, 0);
}
static void s_shutwr_pollout_inf(void) { // full ring, poll(POLLOUT, -1), another thread shuts the write side
  int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; while (write(c, b, sizeof b) > 0) ;
  shp_fd = c; shp_how = SHUT_WR; pthread_t t; pthread_create(&t, 0, shp_thr, 0); alarm(10); double t0 = now(); int r = pin(c, POLLOUT, -1); P("poll=%x early=%d", r, now() - t0 < 5); pthread_join(t, 0);
}
static void s_rcvlowat_lower_poll_inf(void) {
  int c, s; mkpair(&c, &s); lws = s; int v = 1000; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4); write(c, "0123456789", 10);
  pthread_t t; pthread_create(&t, 0, lw_thr, 0); alarm(10); double t0 = now(); int r = pin(s, POLLIN, -1); P("poll=%x early=%d", r, now() - t0 < 5); pthread_join(t, 0);
}
static void s_shutwr_epollout_inf(void) {
  int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; while (write(c, b, sizeof b) > 0) ;
  int ep = epoll_create1(0); struct epoll_event e = {EPOLLOUT, {.fd = c}}, o[4]; epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
  shp_fd = c; shp_how = SHUT_WR; pthread_t t; pthread_create(&t, 0, shp_thr, 0); alarm(10); double t0 = now(); int r = epoll_wait(ep, o, 4, -1); P("epoll=%d early=%d", r, now() - t0 < 5); pthread_join(t, 0);
}
static void s_peer_close_while_poll_out(void) { // ring full, POLLOUT sleeper; peer closes
  int c, s; mkpair(&c, &s); int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK); static char b[1 << 20]; while (write(c, b, sizeof b) > 0) ;
  pthread_t t = later(s, 300, 0); (void)t; shp_fd = s; double t0 = now(); pid_t p = fork(); if (!p) { ms(300); _exit(0); }
  close(s); int r = pin(c, POLLOUT, 3000); P("poll=%x early=%d", r, now() - t0 < 2); waitpid(p, 0, 0);
}
static struct { const char *n; void (*f)(void); } S[] = {
#define X(n) {#n, s_##n}
  X(sig_restart_mix), X(sig_restart_pollfree), X(sig_rcvtimeo_restart), X(sig_sndtimeo_restart), X(sig_epoll_restart), X(sig_poll_restart), X(sig_select_restart), X(sig_waitall),
  X(rcvlowat_block), X(rcvlowat_small_buf), X(rcvlowat_fin), X(rcvlowat_timeo), X(rcvlowat_nonblock), X(rcvlowat_epoll), X(rcvlowat_lt_poll), X(rcvlowat_before_handshake), X(rcvlowat_big),
  X(siocoutq), X(nest_basic), X(nest_poll), X(nest_et_inner), X(nest_out), X(nest_thread), X(nest_three), X(nest_fork), X(epoll_fork_shared), X(epoll_many_ready), X(epoll_close_dup),
  X(close_while_recv), X(shutdown_while_recv), X(shutdown_rdwr_while_recv), X(shut_rd_then_data), X(shut_wr_poll), X(linger0), X(linger0_empty), X(close_unread),
  X(nonblock_toggle), X(nonblock_other_thread), X(nodelay_opts), X(mixed_api), X(race_readers), X(race_writers), X(vfork_exec), X(fork_close_parent), X(scm_pass), X(sendfile_big),
  X(nest_lt), X(rcvlowat_lower_poll), X(rcvlowat_lower_epoll), X(rcvlowat_raise_recv), X(close_while_write), X(dup2_while_recv), X(sig_bsd_signal), X(sig_siginterrupt), X(sig_accept_restart), X(fork_poller_dies), X(sigpipe_thread), X(shutwr_while_write), X(shut_while_poll), X(peer_close_while_poll_out), X(rcvlowat_lower_poll_inf), X(shutwr_epollout_inf), X(shutrd_poll_inf), X(shutwr_pollout_inf), X(peer_close_while_poll_out2),
};
int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN); int n = sizeof S / sizeof S[0];
  for (int a = 1; a < argc; a++) for (int i = 0; i < n; i++) if (!strcmp(argv[a], "all") || !strcmp(argv[a], S[i].n)) {
    printf("== %s\n", S[i].n); fflush(stdout); pid_t p = fork();
    if (!p) { alarm(getenv("RT_ALARM") ? atoi(getenv("RT_ALARM")) : 8); S[i].f(); fflush(stdout); _exit(0); }
    int st; waitpid(p, &st, 0); if (!WIFEXITED(st) || WEXITSTATUS(st)) P("!! status %x", st);
  }
  return 0;
}
