#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <sys/sendfile.h>
#include <sys/time.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/close_range.h>
#include <sys/syscall.h>

static int sigpipes;
static void onpipe(int s){(void)s; sigpipes++;}
#define P(fmt, ...) printf(fmt "\n", ##__VA_ARGS__)
#define R(name, expr) do { errno=0; long _r=(long)(expr); int _e=errno; printf("%-40s -> %ld %s\n", name, _r, _r<0?strerror(_e):""); } while(0)
static void msleep(int ms){ usleep(ms*1000); }

static int lfd = -1;
static void mkpair(int *c, int *s) {
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
  socklen_t al = sizeof a;
  if (lfd < 0) {
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    bind(lfd, (void*)&a, sizeof a); listen(lfd, 16);
  }
  getsockname(lfd, (void*)&a, &al);
  *c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(*c, (void*)&a, sizeof a)) { perror("connect"); exit(2); }
  *s = accept(lfd, NULL, NULL);
  char b = 'x';
  if (write(*c, &b, 1) != 1 || read(*s, &b, 1) != 1 || write(*s, &b, 1) != 1 || read(*c, &b, 1) != 1) { perror("rt"); exit(2);}
}

/* ---- select with big fd sets ---- */
static void sc_selbig(void) {
  int c, s; mkpair(&c, &s);
  int N = 1600; size_t bytes = (N + 63) / 64 * 8;
  fd_set *r = calloc(1, bytes);
  int hi = dup2(s, 1500); P("dup2 -> %d", hi);
  write(c, "hello", 5); msleep(50);
  memset(r, 0, bytes); ((unsigned long*)r)[1500/64] |= 1UL << (1500%64);
  struct timeval tv = {0, 300000};
  R("select(1501, {1500}) data", select(1501, r, NULL, NULL, &tv));
  P("bit1500=%d", !!(((unsigned long*)r)[1500/64] & (1UL << (1500%64))));
  char buf[64]; R("read 1500", read(1500, buf, sizeof buf));
  memset(r, 0, bytes); ((unsigned long*)r)[1500/64] |= 1UL << (1500%64);
  tv.tv_sec = 0; tv.tv_usec = 200000;
  R("select(1501,{1500}) empty", select(1501, r, NULL, NULL, &tv));
  P("bit1500=%d", !!(((unsigned long*)r)[1500/64] & (1UL << (1500%64))));
  /* mixed: SMC fd low, pipe fd high */
  int p[2]; pipe(p); int hp = dup2(p[0], 1400); write(p[1], "z", 1);
  write(c, "again", 5); msleep(50);
  memset(r, 0, bytes);
  ((unsigned long*)r)[1400/64] |= 1UL << (1400%64);
  ((unsigned long*)r)[s/64] |= 1UL << (s%64);
  tv.tv_sec = 0; tv.tv_usec = 300000;
  R("select(1401,{s,1400})", select(hp+1, r, NULL, NULL, &tv));
  P("bit s=%d bit1400=%d", !!(((unsigned long*)r)[s/64] & (1UL << (s%64))), !!(((unsigned long*)r)[1400/64] & (1UL << (1400%64))));
  /* pipe high not ready, SMC low ready: bit1400 must be cleared */
  char z; read(1400, &z, 1);
  memset(r, 0, bytes);
  ((unsigned long*)r)[1400/64] |= 1UL << (1400%64);
  ((unsigned long*)r)[s/64] |= 1UL << (s%64);
  tv.tv_sec = 0; tv.tv_usec = 300000;
  R("select(1401,{s,1400}) pipe empty", select(hp+1, r, NULL, NULL, &tv));
  P("bit s=%d bit1400=%d", !!(((unsigned long*)r)[s/64] & (1UL << (s%64))), !!(((unsigned long*)r)[1400/64] & (1UL << (1400%64))));
  R("read s", read(s, buf, sizeof buf));
  /* closed high fd in set with SMC low -> EBADF */
  memset(r, 0, bytes);
  ((unsigned long*)r)[1300/64] |= 1UL << (1300%64);
  ((unsigned long*)r)[s/64] |= 1UL << (s%64);
  tv.tv_sec = 0; tv.tv_usec = 100000;
  R("select(1301,{s,1300 closed})", select(1301, r, NULL, NULL, &tv));
  close(1400); close(1500); close(p[0]); close(p[1]); close(c); close(s);
}

/* ---- select timeouts ---- */
static void sc_selto(void) {
  int c, s; mkpair(&c, &s);
  write(c, "hi", 2); msleep(30);
  fd_set r; struct timeval tv;
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 0; tv.tv_usec = 500;
  R("select ready tv{0,500}", select(s+1, &r, NULL, NULL, &tv));
  P("tv after: %ld %s", (long)tv.tv_sec, tv.tv_usec <= 500 ? "usec<=500" : "usec>500");
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 2; tv.tv_usec = 0;
  R("select ready tv{2,0}", select(s+1, &r, NULL, NULL, &tv));
  P("tv after: %s", (tv.tv_sec*1000000L+tv.tv_usec) <= 2000000 && (tv.tv_sec*1000000L+tv.tv_usec) > 1900000 ? "in (1.9,2.0]" : "outside");
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = -1; tv.tv_usec = 0;
  R("select tv{-1,0}", select(s+1, &r, NULL, NULL, &tv));
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 0; tv.tv_usec = -5;
  R("select tv{0,-5}", select(s+1, &r, NULL, NULL, &tv));
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 0; tv.tv_usec = 1500000;
  R("select tv{0,1500000} ready", select(s+1, &r, NULL, NULL, &tv));
  P("tv after: %s", (tv.tv_sec*1000000L+tv.tv_usec) <= 1500000 && (tv.tv_sec*1000000L+tv.tv_usec) > 1400000 ? "in (1.4,1.5]" : "outside");
  struct timespec ts = { -1, 0 };
  FD_ZERO(&r); FD_SET(s, &r);
  R("pselect ts{-1,0}", pselect(s+1, &r, NULL, NULL, &ts, NULL));
  ts.tv_sec = 0; ts.tv_nsec = 2000000000L;
  FD_ZERO(&r); FD_SET(s, &r);
  R("pselect ts{0,2e9}", pselect(s+1, &r, NULL, NULL, &ts, NULL));
  struct pollfd pf = { s, POLLIN, 0 };
  ts.tv_sec = -1; ts.tv_nsec = 0;
  R("ppoll ts{-1,0}", ppoll(&pf, 1, &ts, NULL));
  ts.tv_sec = 0; ts.tv_nsec = 2000000000L;
  R("ppoll ts{0,2e9}", ppoll(&pf, 1, &ts, NULL));
  /* not ready: timeout expiry, tv zeroed */
  char b[8]; read(s, b, sizeof b);
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 0; tv.tv_usec = 50000;
  R("select empty tv{0,50000}", select(s+1, &r, NULL, NULL, &tv));
  P("tv after: %ld %ld, bit=%d", (long)tv.tv_sec, (long)tv.tv_usec, FD_ISSET(s, &r));
  /* nfds 0 with sets */
  FD_ZERO(&r); FD_SET(s, &r); tv.tv_sec = 0; tv.tv_usec = 1000;
  R("select nfds=s (excludes s)", select(s, &r, NULL, NULL, &tv));
  P("bit=%d", FD_ISSET(s, &r));
  close(c); close(s);
}

/* ---- poll arrays ---- */
static void sc_pollx(void) {
  int c, s; mkpair(&c, &s);
  write(c, "hi", 2); msleep(30);
  int p[2]; pipe(p); close(p[1]); int closedfd = p[1];
  struct pollfd pf[6] = {
    { s, POLLIN, 0x7777 }, { s, POLLOUT, 0x7777 }, { -5, POLLIN, 0x7777 },
    { closedfd, POLLIN, 0x7777 }, { s, 0, 0x7777 }, { -s, POLLIN, 0x7777 } };
  R("poll 6 entries", poll(pf, 6, 100));
  for (int i = 0; i < 6; i++) P("  [%d] fd=%d ev=%x rev=%x", i, pf[i].fd == s ? 1000 : pf[i].fd == closedfd ? 999 : pf[i].fd == -s ? -1000 : pf[i].fd, pf[i].events, pf[i].revents);
  struct rlimit rl; getrlimit(RLIMIT_NOFILE, &rl);
  size_t n = rl.rlim_cur + 1; struct pollfd *big = calloc(n, sizeof *big);
  for (size_t i = 0; i < n; i++) { big[i].fd = -1; }
  big[0].fd = s; big[0].events = POLLIN;
  R("poll nfds=rlimit+1", poll(big, n, 0));
  P("  big[0].revents=%x", big[0].revents);
  R("poll nfds=rlimit", poll(big, n-1, 0));
  P("  big[0].revents=%x", big[0].revents);
  free(big);
  R("poll NULL,1", poll(NULL, 1, 0));
  struct pollfd pq = { s, POLLIN|POLLRDHUP|POLLPRI|POLLRDNORM|POLLRDBAND|POLLWRNORM|POLLWRBAND|POLLMSG, 0 };
  R("poll all bits", poll(&pq, 1, 0)); P("  rev=%x", pq.revents);
  shutdown(c, SHUT_WR); msleep(30);
  pq.revents = 0;
  R("poll all bits after peer SHUT_WR", poll(&pq, 1, 0)); P("  rev=%x", pq.revents);
  close(p[0]); close(c); close(s);
}

/* ---- epoll_ctl/wait errors ---- */
static void sc_epctl(void) {
  int c, s; mkpair(&c, &s);
  int ep = epoll_create1(0);
  struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 7 };
  R("ADD", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  R("ADD again", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  R("MOD c (absent)", epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev));
  R("DEL c (absent)", epoll_ctl(ep, EPOLL_CTL_DEL, c, &ev));
  R("op 99", epoll_ctl(ep, 99, s, &ev));
  R("ADD c NULL ev", epoll_ctl(ep, EPOLL_CTL_ADD, c, NULL));
  R("MOD s NULL ev", epoll_ctl(ep, EPOLL_CTL_MOD, s, NULL));
  ev.events = EPOLLIN | EPOLLEXCLUSIVE;
  R("ADD c EXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
  ev.events = EPOLLIN;
  R("MOD c (was EXCLUSIVE)", epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev));
  ev.events = EPOLLIN | EPOLLEXCLUSIVE;
  R("MOD s to EXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  R("DEL c", epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL));
  ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT;
  R("ADD c EXCL|ONESHOT", epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
  ev.events = EPOLLIN;
  R("ADD ep to itself", epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev));
  R("ctl with s as epfd", epoll_ctl(s, EPOLL_CTL_ADD, c, &ev));
  R("ADD fd 900 (closed)", epoll_ctl(ep, EPOLL_CTL_ADD, 900, &ev));
  struct epoll_event out[4];
  R("wait s as epfd", epoll_wait(s, out, 4, 0));
  R("wait maxevents 0", epoll_wait(ep, out, 0, 0));
  R("wait maxevents -1", epoll_wait(ep, out, -1, 0));
  write(c, "x", 1); msleep(30);
  R("wait events NULL", epoll_wait(ep, NULL, 4, 0));
  R("wait ok", epoll_wait(ep, out, 4, 0));
  /* dup'd fd as separate entry */
  int d = dup(s);
  ev.events = EPOLLIN; ev.data.u64 = 9;
  R("ADD dup", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev));
  int n = epoll_wait(ep, out, 4, 0); P("wait -> %d", n);
  for (int i = 0; i < n; i++) P("  data=%llu ev=%x", (unsigned long long)out[i].data.u64, out[i].events);
  R("DEL s", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
  R("DEL s again", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
  n = epoll_wait(ep, out, 4, 0); P("wait -> %d", n);
  for (int i = 0; i < n; i++) P("  data=%llu ev=%x", (unsigned long long)out[i].data.u64, out[i].events);
  /* epoll fd inside epoll with SMC */
  int ep2 = epoll_create1(0);
  ev.events = EPOLLIN; ev.data.u64 = 11;
  R("ADD ep into ep2", epoll_ctl(ep2, EPOLL_CTL_ADD, ep, &ev));
  R("ADD ep2 into ep (loop)", epoll_ctl(ep, EPOLL_CTL_ADD, ep2, &ev));
  close(ep2); close(ep); close(d); close(c); close(s);
}

/* ---- zero-length sends in odd states ---- */
static void sc_zsend(void) {
  signal(SIGPIPE, onpipe);
  int c, s; mkpair(&c, &s);
  char b[4]; struct msghdr m = {0};
  shutdown(c, SHUT_WR);
  sigpipes = 0;
  R("write(0) after SHUT_WR", write(c, b, 0)); P("  sigpipes=%d", sigpipes);
  R("send(0) after SHUT_WR", send(c, b, 0, 0)); P("  sigpipes=%d", sigpipes);
  R("send(0,NOSIGNAL) after SHUT_WR", send(c, b, 0, MSG_NOSIGNAL)); P("  sigpipes=%d", sigpipes);
  R("sendmsg(iovlen 0) after SHUT_WR", sendmsg(c, &m, 0)); P("  sigpipes=%d", sigpipes);
  struct iovec iv[2] = {{b,0},{NULL,0}};
  R("writev(0s) after SHUT_WR", writev(c, iv, 2)); P("  sigpipes=%d", sigpipes);
  R("read(0) s", read(s, b, 0));
  R("recv(0) s after FIN", recv(s, b, 0, 0));
  close(c); close(s);
  /* peer closed with unread: reset */
  mkpair(&c, &s);
  write(s, "data", 4); msleep(20);
  close(c); msleep(50);   /* c had unread -> RST to s */
  sigpipes = 0;
  R("send(0) after peer RST", send(s, b, 0, 0)); P("  sigpipes=%d", sigpipes);
  R("send(0) again", send(s, b, 0, 0)); P("  sigpipes=%d", sigpipes);
  int e; socklen_t el = sizeof e;
  R("SO_ERROR", getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el)); P("  err=%d", e);
  close(s);
  /* peer closed cleanly: first 0-len send */
  mkpair(&c, &s);
  close(c); msleep(50);
  sigpipes = 0;
  R("send(0) after peer close", send(s, b, 0, 0)); P("  sigpipes=%d", sigpipes);
  R("send(1) after peer close", send(s, b, 1, 0)); P("  sigpipes=%d", sigpipes);
  msleep(50);
  R("send(0) after RST back", send(s, b, 0, 0)); P("  sigpipes=%d", sigpipes);
  R("send(1)", send(s, b, 1, 0)); P("  sigpipes=%d", sigpipes);
  close(s);
  /* own SHUT_RD then zero-len reads */
  mkpair(&c, &s);
  shutdown(s, SHUT_RD);
  R("recv(0,DONTWAIT) after own SHUT_RD", recv(s, b, 0, MSG_DONTWAIT));
  R("recv(4,DONTWAIT) after own SHUT_RD", recv(s, b, 4, MSG_DONTWAIT));
  R("recv(4) after own SHUT_RD", recv(s, b, 4, 0));
  R("send(0,OOB)", send(c, b, 0, MSG_OOB));
  close(c); close(s);
  signal(SIGPIPE, SIG_DFL);
}

/* ---- bad args to interposed getsockopt/ioctl ---- */
static void sc_badarg(void) {
  int c, s; mkpair(&c, &s);
  write(c, "abcdef", 6); msleep(30);
  R("FIONREAD NULL", ioctl(s, FIONREAD, NULL));
  R("SIOCOUTQ NULL", ioctl(s, SIOCOUTQ, NULL));
  R("SIOCOUTQNSD NULL", ioctl(s, SIOCOUTQNSD, NULL));
  R("SIOCATMARK NULL", ioctl(s, SIOCATMARK, NULL));
  R("ioctl 0x1234", ioctl(s, 0x1234, NULL));
  R("TIOCOUTQ", ioctl(s, TIOCOUTQ, &(int){0}));
  int v = 0; socklen_t l;
  unsigned char ti[2048]; memset(ti, 0xee, sizeof ti);
  l = 8; R("TCP_INFO len 8", getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, &l)); P("  l=%u state=%d b8=%x", l, ti[0], ti[8]);
  l = 0; R("TCP_INFO len 0", getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, &l)); P("  l=%u", l);
  l = 1000; R("TCP_INFO len 1000", getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, &l)); P("  l=%u", l);
  l = (socklen_t)-1; R("TCP_INFO len -1", getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, &l)); P("  l=%d", (int)l);
  R("TCP_INFO optlen NULL", getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, NULL));
  l = sizeof ti; R("TCP_INFO optval NULL", getsockopt(s, IPPROTO_TCP, TCP_INFO, NULL, &l));
  int opts[][2] = { {SOL_SOCKET, SO_RCVLOWAT}, {SOL_SOCKET, SO_PEEK_OFF}, {SOL_SOCKET, SO_ERROR}, {IPPROTO_TCP, TCP_INQ}, {SOL_SOCKET, SO_OOBINLINE}, {SOL_SOCKET, SO_RCVTIMEO}, {SOL_SOCKET, SO_ACCEPTCONN}, {SOL_SOCKET, SO_TYPE}, {SOL_SOCKET, SO_PROTOCOL} };
  const char *on[] = {"SO_RCVLOWAT","SO_PEEK_OFF","SO_ERROR","TCP_INQ","SO_OOBINLINE","SO_RCVTIMEO","SO_ACCEPTCONN","SO_TYPE","SO_PROTOCOL"};
  for (int i = 0; i < 9; i++) {
    char nm[80]; unsigned char buf[16];
    memset(buf, 0xee, sizeof buf); l = 2; snprintf(nm, sizeof nm, "get %s len 2", on[i]);
    R(nm, getsockopt(s, opts[i][0], opts[i][1], buf, &l)); P("  l=%u %02x%02x%02x", l, buf[0], buf[1], buf[2]);
    memset(buf, 0xee, sizeof buf); l = 16; snprintf(nm, sizeof nm, "get %s len 16", on[i]);
    R(nm, getsockopt(s, opts[i][0], opts[i][1], buf, &l)); P("  l=%u", l);
    l = 4; snprintf(nm, sizeof nm, "get %s optval NULL", on[i]);
    R(nm, getsockopt(s, opts[i][0], opts[i][1], NULL, &l));
    snprintf(nm, sizeof nm, "get %s optlen NULL", on[i]);
    R(nm, getsockopt(s, opts[i][0], opts[i][1], buf, NULL));
    l = (socklen_t)-4; snprintf(nm, sizeof nm, "get %s len -4", on[i]);
    R(nm, getsockopt(s, opts[i][0], opts[i][1], buf, &l));
    v = 1; snprintf(nm, sizeof nm, "set %s len 2", on[i]);
    R(nm, setsockopt(s, opts[i][0], opts[i][1], &v, 2));
    snprintf(nm, sizeof nm, "set %s NULL", on[i]);
    R(nm, setsockopt(s, opts[i][0], opts[i][1], NULL, 4));
  }
  v = -5; R("set SO_RCVLOWAT -5", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4));
  l = 4; R("get SO_RCVLOWAT", getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, &l)); P("  v=%d", v);
  v = 0; R("set SO_RCVLOWAT 0", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4));
  l = 4; R("get SO_RCVLOWAT", getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, &l)); P("  v=%d", v);
  v = 1 << 30; R("set SO_RCVLOWAT 2^30", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4));
  l = 4; R("get SO_RCVLOWAT", getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, &l)); P("  v=%s", v == (1<<30) ? "2^30" : "capped");
  v = 1; setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &v, 4);
  v = -7; R("set SO_PEEK_OFF -7", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, 4));
  l = 4; R("get SO_PEEK_OFF", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, &l)); P("  v=%d", v);
  v = 2; R("set SO_PEEK_OFF 2", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, 4));
  char pb[8] = {0};
  R("peek 2", recv(s, pb, 2, MSG_PEEK)); P("  %.2s", pb);
  l = 4; R("get SO_PEEK_OFF", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, &l)); P("  v=%d", v);
  v = -1; R("set SO_PEEK_OFF -1", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, 4));
  R("peek 2", recv(s, pb, 2, MSG_PEEK)); P("  %.2s", pb);
  l = 4; R("get SO_PEEK_OFF", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, &l)); P("  v=%d", v);
  v = 100; R("set SO_PEEK_OFF 100", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, 4));
  R("peek DONTWAIT beyond", recv(s, pb, 2, MSG_PEEK|MSG_DONTWAIT));
  R("read", read(s, pb, 8)); P("  %.6s", pb);
  l = 4; R("get SO_PEEK_OFF", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &v, &l)); P("  v=%d", v);
  struct sockaddr_in a; socklen_t al = 4;
  R("getpeername len 4", getpeername(s, (void*)&a, &al)); P("  al=%u", al);
  R("getpeername NULL", getpeername(s, NULL, &al));
  R("getpeername len NULL", getpeername(s, (void*)&a, NULL));
  al = 0; R("getpeername len 0", getpeername(s, (void*)&a, &al)); P("  al=%u", al);
  close(c); close(s);
}

/* ---- dup2 self, close_range cloexec ---- */
static void sc_dupself(void) {
  int c, s; mkpair(&c, &s);
  char b[16];
  R("dup2(s,s)", dup2(s, s) == s);
  R("dup3(s,s,0)", dup3(s, s, 0));
  R("write after dup2 self", write(c, "abc", 3)); msleep(20);
  R("read s", read(s, b, sizeof b));
  R("close_range(s,s,CLOEXEC)", syscall(SYS_close_range, s, s, CLOSE_RANGE_CLOEXEC));
  R("F_GETFD", fcntl(s, F_GETFD));
  R("write c", write(c, "def", 3)); msleep(20);
  R("read s", read(s, b, sizeof b));
  R("close_range(s,s,CLOEXEC) libc", close_range(s, s, CLOSE_RANGE_CLOEXEC));
  R("write s", write(s, "ghi", 3)); msleep(20);
  R("read c", read(c, b, sizeof b));
  R("close_range(s,s,UNSHARE)", close_range(s, s, CLOSE_RANGE_UNSHARE));
  R("write s after close_range", write(s, "x", 1));
  R("read c (EOF?)", read(c, b, sizeof b));
  R("fcntl(c,F_DUPFD,s)", fcntl(c, F_DUPFD, s) == s);
  R("write via dup", write(s, "q", 1));
  close(c); close(s);
}

/* ---- own SHUT_RD then peer writes ---- */
static void sc_shutrd(void) {
  int c, s; mkpair(&c, &s);
  char b[256];
  R("shutdown(s,RD)", shutdown(s, SHUT_RD));
  struct pollfd pf = { s, POLLIN|POLLOUT|POLLRDHUP, 0 };
  R("poll", poll(&pf, 1, 0)); P("  rev=%x", pf.revents);
  R("write c 100", write(c, b, 100)); msleep(30);
  int n = -1; R("FIONREAD s", ioctl(s, FIONREAD, &n)); P("  n=%d", n);
  pf.revents = 0; R("poll", poll(&pf, 1, 0)); P("  rev=%x", pf.revents);
  R("read s", read(s, b, sizeof b));
  R("read s again", read(s, b, sizeof b));
  R("write c 100 more", write(c, b, 100)); msleep(30);
  R("read s", read(s, b, sizeof b));
  R("write s", write(s, "r", 1)); msleep(20);
  R("read c", read(c, b, sizeof b));
  unsigned char ti[104]; socklen_t l = sizeof ti;
  getsockopt(s, IPPROTO_TCP, TCP_INFO, ti, &l); P("tcpi_state s=%d", ti[0]);
  getsockopt(c, IPPROTO_TCP, TCP_INFO, ti, &l); P("tcpi_state c=%d", ti[0]);
  R("shutdown(s,RD) again", shutdown(s, SHUT_RD));
  R("shutdown(s,WR)", shutdown(s, SHUT_WR)); msleep(20);
  R("read c", read(c, b, sizeof b));
  pf.revents = 0; R("poll s", poll(&pf, 1, 0)); P("  rev=%x", pf.revents);
  struct pollfd pc = { c, POLLIN|POLLOUT|POLLRDHUP, 0 };
  R("poll c", poll(&pc, 1, 0)); P("  rev=%x", pc.revents);
  R("write c after s SHUT_RDWR", write(c, b, 10)); msleep(30);
  pc.revents = 0; R("poll c", poll(&pc, 1, 0)); P("  rev=%x", pc.revents);
  int e; l = sizeof e; getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &l); P("SO_ERROR c=%d", e);
  pf.revents = 0; R("poll s", poll(&pf, 1, 0)); P("  rev=%x", pf.revents);
  R("read s", read(s, b, sizeof b));
  close(c); close(s);
}

/* ---- recvmsg outputs ---- */
static void sc_rmsg(void) {
  int c, s; mkpair(&c, &s);
  char b[64], name[64], ctl[64];
  struct iovec iv = { b, 4 };
  struct msghdr m = { name, sizeof name, &iv, 1, ctl, sizeof ctl, 0x7fff };
  write(c, "0123456789", 10); msleep(20);
  R("recvmsg 4", recvmsg(s, &m, 0)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  m.msg_namelen = sizeof name; m.msg_controllen = sizeof ctl; m.msg_flags = 0x7fff;
  R("recvmsg PEEK", recvmsg(s, &m, MSG_PEEK)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  m.msg_namelen = sizeof name; m.msg_controllen = sizeof ctl; m.msg_flags = 0x7fff;
  R("recvmsg TRUNC", recvmsg(s, &m, MSG_TRUNC)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  shutdown(c, SHUT_WR);
  iv.iov_len = 64;
  m.msg_namelen = sizeof name; m.msg_controllen = sizeof ctl; m.msg_flags = 0x7fff;
  R("recvmsg WAITALL at EOF", recvmsg(s, &m, MSG_WAITALL)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  m.msg_namelen = sizeof name; m.msg_controllen = sizeof ctl; m.msg_flags = 0x7fff;
  R("recvmsg EOF", recvmsg(s, &m, 0)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  m.msg_namelen = sizeof name; m.msg_controllen = sizeof ctl; m.msg_flags = 0x7fff;
  R("recvmsg ERRQUEUE", recvmsg(s, &m, MSG_ERRQUEUE)); P("  namelen=%u controllen=%zu flags=%x", m.msg_namelen, m.msg_controllen, m.msg_flags);
  close(c); close(s);
  mkpair(&c, &s);
  write(c, "0123456789", 10); msleep(20);
  R("recv WAITALL|DONTWAIT 100", recv(s, b, 64, MSG_WAITALL|MSG_DONTWAIT));
  R("recv WAITALL|DONTWAIT empty", recv(s, b, 64, MSG_WAITALL|MSG_DONTWAIT));
  write(c, "0123456789", 10); msleep(20);
  R("recv NULL TRUNC 4", recv(s, NULL, 4, MSG_TRUNC));
  R("recv NULL TRUNC|PEEK 4", recv(s, NULL, 4, MSG_TRUNC|MSG_PEEK));
  R("recv 64", recv(s, b, 64, 0)); P("  %.6s", b);
  struct iovec z[3] = {{b,0},{NULL,0},{b+1,0}};
  write(c, "xy", 2); msleep(20);
  R("readv zero iovecs w/ data", readv(s, z, 3));
  R("readv 0 iovcnt", readv(s, z, 0));
  R("recvmsg zero iovecs w/ data", recvmsg(s, &(struct msghdr){.msg_iov=z,.msg_iovlen=3}, 0));
  R("read 64", read(s, b, 64));
  R("recvmsg zero iovecs DONTWAIT empty", recvmsg(s, &(struct msghdr){.msg_iov=z,.msg_iovlen=3}, MSG_DONTWAIT));
  R("recvmsg iovlen 0 DONTWAIT empty", recvmsg(s, &(struct msghdr){.msg_iov=NULL,.msg_iovlen=0}, MSG_DONTWAIT));
  R("readv -1 iovcnt", readv(s, z, -1));
  close(c); close(s);
}

/* ---- nonblocking stream with poll invariants, odd sizes ---- */
static void sc_stream(void) {
  int c, s; mkpair(&c, &s);
  fcntl(c, F_SETFL, O_NONBLOCK); fcntl(s, F_SETFL, O_NONBLOCK);
  size_t total = 24u << 20, sent = 0, got = 0; unsigned seed = 1, rs = 7;
  unsigned char *wb = malloc(1 << 20), *rb = malloc(1 << 20);
  unsigned long bad_out = 0, bad_in = 0, eag_w = 0; unsigned char expect = 0, wv = 0; int mism = 0;
  while (got < total) {
    struct pollfd pf[2] = { { c, sent < total ? POLLOUT : 0, 0 }, { s, POLLIN, 0 } };
    int n = poll(pf, 2, 2000);
    if (n <= 0) { P("poll stall n=%d sent=%zu got=%zu", n, sent, got); break; }
    if (pf[0].revents & POLLOUT) {
      size_t len = (rand_r(&seed) % 300000) + 1; if (len > total - sent) len = total - sent;
      for (size_t i = 0; i < len; i++) wb[i] = wv + i;
      ssize_t w = write(c, wb, len);
      if (w < 0) { if (errno == EAGAIN) { bad_out++; } else { P("write err %s", strerror(errno)); break; } }
      else { sent += w; wv += w; }
      if (sent < total) { unsigned char one = wv; ssize_t w2 = write(c, &one, 1); if (w2 < 0 && errno == EAGAIN) eag_w++; else if (w2 == 1) { sent++; wv++; } }
    }
    if (pf[1].revents & POLLIN) {
      size_t len = (rand_r(&rs) % 200003) + 1;
      ssize_t r = read(s, rb, len);
      if (r < 0) { if (errno == EAGAIN) bad_in++; else { P("read err %s", strerror(errno)); break; } }
      else { for (ssize_t i = 0; i < r; i++) if (rb[i] != (unsigned char)(expect + i)) { mism++; break; } expect += r; got += r; }
    }
  }
  P("stream: sent=%zu got=%zu mism=%d pollout_then_eagain=%lu pollin_then_eagain=%lu", sent, got, mism, bad_out, bad_in);
  close(c); close(s); free(wb); free(rb);
}

/* ---- sendfile/splice edge counts ---- */
static void sc_sfile(void) {
  int c, s; mkpair(&c, &s);
  char path[] = "/tmp/rt29/sfXXXXXX"; int f = mkstemp(path); unlink(path);
  char *buf = malloc(3 << 20); for (int i = 0; i < (3<<20); i++) buf[i] = i * 7;
  write(f, buf, 3 << 20);
  off_t off = 0;
  R("sendfile count 0", sendfile(c, f, &off, 0)); P("  off=%ld", (long)off);
  off = (3 << 20) + 10;
  R("sendfile off past EOF", sendfile(c, f, &off, 100)); P("  off=%ld", (long)off);
  off = -1;
  R("sendfile off -1", sendfile(c, f, &off, 100));
  lseek(f, (3<<20) - 5, SEEK_SET);
  R("sendfile NULL off at EOF-5", sendfile(c, f, NULL, 100)); P("  pos=%ld", (long)lseek(f, 0, SEEK_CUR));
  char b[64]; msleep(20); R("read s", read(s, b, 64));
  int p[2]; pipe(p);
  R("splice s->pipe len 0", splice(s, NULL, p[1], NULL, 0, 0));
  R("splice pipe->c len 0", splice(p[0], NULL, c, NULL, 0, 0));
  R("tee pipe->socket", tee(p[0], c, 10, 0));
  R("copy_file_range f->c", copy_file_range(f, NULL, c, NULL, 10, 0));
  R("copy_file_range s->f", copy_file_range(s, NULL, f, NULL, 10, 0));
  R("vmsplice socket", vmsplice(c, &(struct iovec){buf, 10}, 1, 0));
  /* big sendfile with slow reader in child thread-free: nonblocking */
  fcntl(c, F_SETFL, O_NONBLOCK);
  off = 0; long tot = 0; int eag = 0;
  while (off < (3 << 20)) {
    ssize_t r = sendfile(c, f, &off, (3 << 20) - off);
    if (r < 0) { if (errno != EAGAIN) { P("sendfile err %s", strerror(errno)); break; } eag++;
      char rb[65536]; ssize_t k; int ok = 1;
      while ((k = recv(s, rb, sizeof rb, MSG_DONTWAIT)) > 0) { for (int i = 0; i < k; i++) if (rb[i] != buf[tot + i]) ok = 0; tot += k; if (!ok) P("mismatch at %ld", tot); }
      continue; }
  }
  char rb[65536]; ssize_t k; 
  for (int i = 0; i < 100 && tot < (3<<20); i++) { while ((k = recv(s, rb, sizeof rb, MSG_DONTWAIT)) > 0) { if (memcmp(rb, buf + tot, k)) P("mismatch at %ld", tot); tot += k; } msleep(5); }
  P("sendfile nonblocking: off=%ld received=%ld eagain>0=%d", (long)off, tot, eag > 0);
  close(p[0]); close(p[1]); close(f); close(c); close(s); free(buf);
}

/* ---- fcntl flags across dups ---- */
static void sc_fl(void) {
  int c, s; mkpair(&c, &s);
  int d = dup(s); char b[8];
  R("F_SETFL NONBLOCK on dup", fcntl(d, F_SETFL, O_NONBLOCK));
  R("read original (EAGAIN?)", read(s, b, 8));
  R("F_GETFL orig & NONBLOCK", fcntl(s, F_GETFL) & O_NONBLOCK);
  R("F_SETFL 0 on orig", fcntl(s, F_SETFL, 0));
  R("F_GETFL dup & NONBLOCK", fcntl(d, F_GETFL) & O_NONBLOCK);
  R("F_SETFL O_APPEND", fcntl(s, F_SETFL, O_APPEND));
  R("F_GETFL & APPEND", fcntl(s, F_GETFL) & O_APPEND);
  R("write with O_APPEND", write(s, "ab", 2)); msleep(10);
  R("read c", read(c, b, 8));
  R("F_SETFL O_DIRECT", fcntl(s, F_SETFL, O_DIRECT));
  R("F_GETFL & DIRECT", (fcntl(s, F_GETFL) & O_DIRECT) != 0);
  R("write with O_DIRECT", write(s, "ab", 2)); msleep(10);
  R("read c", read(c, b, 8));
  R("F_SETFL O_NOATIME", fcntl(s, F_SETFL, O_NOATIME));
  R("lseek socket", lseek(s, 0, SEEK_CUR));
  R("pread socket", pread(s, b, 1, 0));
  R("pwrite socket", pwrite(s, b, 1, 0));
  R("pread socket off -1", pread(s, b, 1, -1));
  R("ftruncate socket", ftruncate(s, 0));
  R("fsync socket", fsync(s));
  R("fdatasync socket", fdatasync(s));
  close(d); close(c); close(s);
}


#include <sys/wait.h>
#define F(name, expr) do { fflush(stdout); pid_t _p = fork(); if (_p == 0) { errno=0; long _r=(long)(expr); int _e=errno; printf("%-40s -> %ld %s\n", name, _r, _r<0?strerror(_e):""); fflush(stdout); _exit(0);} int _st; waitpid(_p, &_st, 0); if (WIFSIGNALED(_st)) printf("%-40s -> killed by signal %d\n", name, WTERMSIG(_st)); } while(0)
static void sc_badptr(void) {
  int c, s; mkpair(&c, &s);
  write(c, "abcdef", 6); usleep(30000);
  void *bad = (void*)8; socklen_t l = 8; socklen_t *badl = (socklen_t*)8;
  F("FIONREAD bad", ioctl(s, FIONREAD, bad));
  F("SIOCOUTQ bad", ioctl(s, SIOCOUTQ, bad));
  F("SIOCOUTQNSD bad", ioctl(s, SIOCOUTQNSD, bad));
  F("SIOCATMARK bad", ioctl(s, SIOCATMARK, bad));
  F("FIONBIO bad", ioctl(s, FIONBIO, bad));
  F("FIOASYNC bad", ioctl(s, FIOASYNC, bad));
  F("TCP_INFO val bad", getsockopt(s, IPPROTO_TCP, TCP_INFO, bad, &l));
  F("TCP_INFO len bad", getsockopt(s, IPPROTO_TCP, TCP_INFO, &l, badl));
  F("SO_ERROR val bad", getsockopt(s, SOL_SOCKET, SO_ERROR, bad, &l));
  F("SO_RCVLOWAT val bad", getsockopt(s, SOL_SOCKET, SO_RCVLOWAT, bad, &l));
  F("SO_PEEK_OFF val bad", getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, bad, &l));
  F("TCP_INQ val bad", getsockopt(s, IPPROTO_TCP, TCP_INQ, bad, &l));
  F("set SO_RCVLOWAT bad", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, bad, 4));
  F("set SO_PEEK_OFF bad", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, bad, 4));
  F("set SO_OOBINLINE bad", setsockopt(s, SOL_SOCKET, SO_OOBINLINE, bad, 4));
  F("set TCP_INQ bad", setsockopt(s, IPPROTO_TCP, TCP_INQ, bad, 4));
  F("set SO_RCVTIMEO bad", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, bad, 16));
  F("getpeername bad", getpeername(s, bad, &l));
  F("getpeername len bad", getpeername(s, (void*)&l, badl));
  F("recvmsg msg bad", recvmsg(s, bad, 0));
  F("recvmsg iov bad", recvmsg(s, &(struct msghdr){.msg_iov=bad,.msg_iovlen=1}, 0));
  F("sendmsg msg bad", sendmsg(c, bad, 0));
  F("readv iov bad", readv(s, bad, 1));
  F("writev iov bad", writev(c, bad, 1));
  F("recvmmsg bad", recvmmsg(s, bad, 1, 0, NULL));
  F("sendmmsg bad", sendmmsg(c, bad, 1, 0));
  F("epoll_wait events bad", ({ int ep = epoll_create1(0); struct epoll_event ev = {EPOLLIN}; epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev); epoll_wait(ep, bad, 4, 0); }));
  F("epoll_ctl ev bad", ({ int ep = epoll_create1(0); epoll_ctl(ep, EPOLL_CTL_ADD, s, bad); }));
  F("poll fds bad", poll(bad, 1, 0));
  F("select set bad", ({ fd_set r; FD_ZERO(&r); FD_SET(s, &r); select(s+1, &r, bad, NULL, &(struct timeval){0,0}); }));
  F("select tv bad", ({ fd_set r; FD_ZERO(&r); FD_SET(s, &r); select(s+1, &r, NULL, NULL, bad); }));
  F("ppoll ts bad", ({ struct pollfd pf = {s, POLLIN, 0}; ppoll(&pf, 1, bad, NULL); }));
  F("ppoll mask bad", ({ struct pollfd pf = {s, POLLIN, 0}; ppoll(&pf, 1, NULL, bad); }));
  F("sendfile off bad", ({ int f = open("/etc/hostname", O_RDONLY); sendfile(c, f, bad, 10); }));
  F("splice off bad", ({ int p[2]; pipe(p); splice(s, bad, p[1], NULL, 4, 0); }));
  F("recvfrom addr bad", recvfrom(s, &l, 1, MSG_PEEK, bad, &l));
  F("recvfrom alen bad", recvfrom(s, &l, 1, MSG_PEEK, (void*)&l, badl));
  F("accept on conn bad", accept(s, bad, badl));
  close(c); close(s);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct { const char *n; void (*f)(void); } sc[] = {
    {"selbig", sc_selbig}, {"selto", sc_selto}, {"pollx", sc_pollx}, {"epctl", sc_epctl},
    {"zsend", sc_zsend}, {"badarg", sc_badarg}, {"dupself", sc_dupself}, {"shutrd", sc_shutrd},
    {"rmsg", sc_rmsg}, {"stream", sc_stream}, {"sfile", sc_sfile}, {"fl", sc_fl}, {"badptr", sc_badptr} };
  int ns = sizeof sc / sizeof sc[0];
  for (int a = 1; a < argc; a++)
    for (int i = 0; i < ns; i++)
      if (!strcmp(argv[a], "all") || !strcmp(argv[a], sc[i].n)) { P("== %s", sc[i].n); sc[i].f(); }
  return 0;
}
