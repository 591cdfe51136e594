// rt9: calls whose results a program can observe, TCP vs the library (round 9): TCP_INFO,
// socket options and their cmsgs, ioctls, shutdown/connect/listen oddities, flag matrices,
// signals in the middle of a partial transfer, SIGIO, calls the library does not interpose.
// gcc -O1 -pthread -o /tmp/rt9 rt9.c ; diff <(world.sh tcp /tmp/rt9 X) <(world.sh smc /tmp/rt9 X)
#define _GNU_SOURCE
#include <aio.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <linux/tcp.h>
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef TCP_INQ
#define TCP_INQ 36
#define TCP_CM_INQ TCP_INQ
#endif

static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }
static void msleep(int ms) { usleep(ms * 1000); }
#define P(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
static const char *en(int e) { static char b[32]; switch (e) {
#define E(x) case x: return #x;
  E(EAGAIN) E(EINTR) E(EPIPE) E(ECONNRESET) E(ENOTCONN) E(EINVAL) E(EISCONN) E(EBADF) E(EFAULT)
  E(EOPNOTSUPP) E(ENOPROTOOPT) E(ESPIPE) E(EALREADY) E(EINPROGRESS) E(ENOTSOCK) E(EMSGSIZE)
  E(ECONNREFUSED) E(ENOENT) E(ENOTTY) E(EPERM) E(ENOBUFS) E(EDESTADDRREQ) E(EAFNOSUPPORT) E(EADDRINUSE)
  default: snprintf(b, sizeof b, "errno%d", e); return b; } }
// rc line: "tag -> N" or "tag -> -1 ERR"
static long R(const char *tag, long r) { if (r < 0) P("%s -> -1 %s", tag, en(errno)); else P("%s -> %ld", tag, r); return r; }

static int listener(int *port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) die("listen");
  socklen_t al = sizeof a;
  getsockname(l, (void *)&a, &al);
  *port = ntohs(a.sin_port);
  return l;
}
static int connect_to(int s, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  return connect(s, (void *)&a, sizeof a);
}
static void set_nb(int fd, int on) { int f = fcntl(fd, F_GETFL); fcntl(fd, F_SETFL, on ? f | O_NONBLOCK : f & ~O_NONBLOCK); }
static int readable(int fd, int ms) { struct pollfd p = {fd, POLLIN, 0}; return poll(&p, 1, ms); }
// A connected pair (client c, server s), one byte each way so that the handshake is over.
static int LPORT, L = -1;
static void pair(int *c, int *s) {
  if (L < 0) L = listener(&LPORT);
  *c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect_to(*c, LPORT)) die("connect");
  *s = accept(L, 0, 0);
  if (*s < 0) die("accept");
  char b;
  if (send(*c, "h", 1, 0) != 1 || recv(*s, &b, 1, 0) != 1) die("hs1");
  if (send(*s, "i", 1, 0) != 1 || recv(*c, &b, 1, 0) != 1) die("hs2");
}
static void drain(int fd, int n) { char b[65536]; int got = 0; while (got < n) { int r = recv(fd, b, sizeof b < (size_t)(n - got) ? sizeof b : (size_t)(n - got), 0); if (r <= 0) break; got += r; } }
static void sendn(int fd, int n) { char b[65536]; memset(b, 'x', sizeof b); int d = 0; while (d < n) { int r = send(fd, b, n - d > (int)sizeof b ? (int)sizeof b : n - d, MSG_NOSIGNAL); if (r <= 0) die("sendn"); d += r; } }
static const char *stname(int s) {
  static const char *n[] = {"?", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING"};
  return s >= 0 && s < 12 ? n[s] : "??";
}
static void tinfo(const char *tag, int fd) {
  struct tcp_info t; socklen_t l = sizeof t; memset(&t, 0, sizeof t);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &t, &l)) { P("%s TCP_INFO -1 %s", tag, en(errno)); return; }
  P("%s state=%s", tag, stname(t.tcpi_state));
}
static void tinfo_bytes(const char *tag, int fd) {
  struct tcp_info t; socklen_t l = sizeof t; memset(&t, 0, sizeof t);
  getsockopt(fd, IPPROTO_TCP, TCP_INFO, &t, &l);
  P("%s state=%s bytes_acked=%llu bytes_received=%llu bytes_sent=%llu unacked=%u data_segs_in>=10:%d data_segs_out>=10:%d rtt>0:%d notsent=%u delivered>=10:%d",
    tag, stname(t.tcpi_state), (unsigned long long)t.tcpi_bytes_acked, (unsigned long long)t.tcpi_bytes_received,
    (unsigned long long)t.tcpi_bytes_sent, t.tcpi_unacked, t.tcpi_data_segs_in >= 10, t.tcpi_data_segs_out >= 10,
    t.tcpi_rtt > 0, t.tcpi_notsent_bytes, t.tcpi_delivered >= 10);
}
static const char *evs(int e) {
  static char b[200]; b[0] = 0;
  struct { int v; const char *n; } t[] = {{POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"}, {POLLHUP, "HUP"}, {POLLNVAL, "NVAL"}, {POLLRDNORM, "RDNORM"}, {POLLRDBAND, "RDBAND"}, {POLLWRNORM, "WRNORM"}, {POLLWRBAND, "WRBAND"}, {POLLRDHUP, "RDHUP"}, {POLLMSG, "MSG"}};
  for (unsigned i = 0; i < sizeof t / sizeof *t; i++) if (e & t[i].v) { strcat(b, t[i].n); strcat(b, "|"); }
  if (!b[0]) strcpy(b, "0");
  return b;
}
static void pollall(const char *tag, int fd) {
  struct pollfd p = {fd, POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLRDHUP | POLLMSG, 0};
  int r = poll(&p, 1, 0);
  P("%s poll=%d %s", tag, r, evs(p.revents));
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDNORM | EPOLLRDBAND | EPOLLWRNORM | EPOLLWRBAND | EPOLLRDHUP | EPOLLMSG, .data.fd = fd};
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
  struct epoll_event o = {0};
  r = epoll_wait(ep, &o, 1, 0);
  P("%s epoll=%d %s", tag, r, evs(r > 0 ? o.events : 0));
  close(ep);
}
static void ioc(const char *tag, int fd) {
  int a = -7, b = -7, c = -7;
  int ra = ioctl(fd, SIOCINQ, &a), rb = ioctl(fd, SIOCOUTQ, &b), rc = ioctl(fd, SIOCOUTQNSD, &c);
  P("%s INQ=%d/%d OUTQ=%d/%d OUTQNSD=%d/%d", tag, ra, a, rb, b, rc, c);
}

// ---- scenarios ----
static void s_tcpinfo(void) {
  int c, s; pair(&c, &s);
  sendn(c, 100000); drain(s, 100000);
  sendn(s, 5000); drain(c, 5000);
  msleep(50);
  tinfo_bytes("c", c); tinfo_bytes("s", s);
}
static void s_states(void) {
  int c, s; char b[10];
  pair(&c, &s);
  shutdown(c, SHUT_WR); readable(s, 2000); R("recv(s) eof", recv(s, b, 10, 0)); msleep(50);
  tinfo("after c SHUT_WR: c", c); tinfo("after c SHUT_WR: s", s);
  shutdown(s, SHUT_WR); readable(c, 2000); R("recv(c) eof", recv(c, b, 10, 0)); msleep(50);
  tinfo("after both SHUT_WR: c", c); tinfo("after both SHUT_WR: s", s);
  close(c); close(s);
  pair(&c, &s);
  close(c); readable(s, 2000); msleep(50);
  tinfo("after c close: s", s);
  R("recv(s) eof", recv(s, b, 10, 0));
  tinfo("after c close+read: s", s);
  R("send(s) after peer close", send(s, "x", 1, MSG_NOSIGNAL)); msleep(50);
  tinfo("after send to closed: s", s);
  R("send(s) again", send(s, "x", 1, MSG_NOSIGNAL));
  tinfo("after second send: s", s);
  close(s);
  pair(&c, &s);
  shutdown(s, SHUT_RD); msleep(20);
  tinfo("after s SHUT_RD: s", s); tinfo("after s SHUT_RD: c", c);
  close(c); close(s);
}
// peer closes with unread data (RST on TCP)
static void s_rst(void) {
  int c, s; char b[10];
  pair(&c, &s);
  send(s, "abc", 3, 0); msleep(20);
  close(c); msleep(50);
  tinfo("s", s);
  struct sockaddr_in a; socklen_t al = sizeof a;
  R("getpeername(s)", getpeername(s, (void *)&a, &al));
  al = sizeof a; R("getsockname(s)", getsockname(s, (void *)&a, &al));
  pollall("s", s);
  ioc("s", s);
  int e = -1; socklen_t el = 4; getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el); P("SO_ERROR peek=%s", e ? en(e) : "0");
  R("send(s,0)", send(s, b, 0, MSG_NOSIGNAL));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  R("send(s)", send(s, b, 1, MSG_NOSIGNAL));
  R("send(s)", send(s, b, 1, MSG_NOSIGNAL));
  pollall("s later", s);
  R("shutdown(s,WR)", shutdown(s, SHUT_WR));
  close(s);
}
static void s_polls(void) {
  int c, s; char b[10];
  pair(&c, &s);
  pollall("fresh", s);
  send(c, "ab", 2, 0); msleep(20); pollall("data", s);
  shutdown(c, SHUT_WR); msleep(20); pollall("data+fin", s);
  recv(s, b, 10, 0); pollall("fin only", s);
  shutdown(s, SHUT_WR); msleep(20); pollall("both shut s", s); pollall("both shut c", c);
  close(c); close(s);
  pair(&c, &s);
  shutdown(s, SHUT_RD); pollall("own SHUT_RD", s);
  shutdown(s, SHUT_WR); pollall("own SHUT_RDWR", s); pollall("peer of SHUT_RDWR", c);
  close(c); close(s);
  pair(&c, &s);
  shutdown(s, SHUT_WR); msleep(20); pollall("own SHUT_WR", s); pollall("peer of SHUT_WR", c);
  close(s); msleep(20); pollall("peer closed after SHUT_WR", c);
  close(c);
  pair(&c, &s);
  close(c); msleep(20); pollall("peer closed", s);
  R("send", send(s, "x", 1, MSG_NOSIGNAL)); msleep(20); pollall("peer closed, after send", s);
  close(s);
  // listener
  pollall("listener", L);
  int x = socket(AF_INET, SOCK_STREAM, 0); pollall("new socket", x); close(x);
}
static void s_cmsg(void) {
  int c, s, one = 1; char b[100]; char cb[512];
  pair(&c, &s);
  R("setsockopt TCP_INQ", setsockopt(s, IPPROTO_TCP, TCP_INQ, &one, 4));
  R("setsockopt SO_TIMESTAMP", setsockopt(s, SOL_SOCKET, SO_TIMESTAMP, &one, 4));
  send(c, "0123456789", 10, 0); msleep(20);
  struct iovec v = {b, 4};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb, .msg_flags = 0x7777};
  R("recvmsg(4)", recvmsg(s, &m, 0));
  P("msg_flags=%#x controllen>0=%d", m.msg_flags, m.msg_controllen > 0);
  for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level == IPPROTO_TCP && h->cmsg_type == TCP_CM_INQ) P("cmsg TCP_CM_INQ=%d", *(int *)CMSG_DATA(h));
    else P("cmsg level=%d type=%d", h->cmsg_level, h->cmsg_type);
  }
  int inq = -1; socklen_t il = 4; R("getsockopt TCP_INQ", getsockopt(s, IPPROTO_TCP, TCP_INQ, &inq, &il)); P("TCP_INQ opt=%d", inq);
  close(c); close(s);
}
static void s_zerocopy(void) {
  int c, s, one = 1; char b[100];
  pair(&c, &s);
  R("setsockopt SO_ZEROCOPY", setsockopt(c, SOL_SOCKET, SO_ZEROCOPY, &one, 4));
  static char big[20000]; memset(big, 'z', sizeof big);
  R("send MSG_ZEROCOPY", send(c, big, sizeof big, MSG_ZEROCOPY));
  drain(s, sizeof big);
  struct pollfd p = {c, 0, 0}; int pr = poll(&p, 1, 1000); P("poll(c,0) for errqueue -> %d %s", pr, evs(p.revents));
  char cb[256]; struct msghdr m = {.msg_control = cb, .msg_controllen = sizeof cb};
  struct iovec v = {b, sizeof b}; m.msg_iov = &v; m.msg_iovlen = 1;
  long r = R("recvmsg ERRQUEUE", recvmsg(c, &m, MSG_ERRQUEUE));
  if (r >= 0) for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
    struct sock_extended_err *ee = (void *)CMSG_DATA(h);
    P("cmsg level=%d type=%d origin=%d lo=%u hi=%u", h->cmsg_level, h->cmsg_type, ee->ee_origin, ee->ee_info, ee->ee_data);
  }
  close(c); close(s);
}
static void s_peekoff(void) {
  int c, s, z = 0; char b[100];
  pair(&c, &s);
  R("setsockopt SO_PEEK_OFF 0", setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &z, 4));
  send(c, "0123456789", 10, 0); msleep(20);
  long r = R("peek 3", recv(s, b, 3, MSG_PEEK)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  r = R("peek 3", recv(s, b, 3, MSG_PEEK)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  int po = -9; socklen_t pl = 4; getsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &po, &pl); P("SO_PEEK_OFF now %d", po);
  r = R("recv 2", recv(s, b, 2, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  r = R("peek 3", recv(s, b, 3, MSG_PEEK)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  r = R("recv 100", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(c); close(s);
}
static volatile int sigio_n, sigio_fd, sigio_band, sigio_code;
static void on_sigio(int sig, siginfo_t *si, void *u) { (void)sig; (void)u; sigio_n++; sigio_fd = si->si_fd; sigio_band = si->si_band; sigio_code = si->si_code; }
static void s_sigio(void) {
  int c, s; char b[100];
  struct sigaction sa = {.sa_sigaction = on_sigio, .sa_flags = SA_SIGINFO | SA_RESTART};
  sigaction(SIGIO, &sa, 0); sigaction(SIGRTMIN + 1, &sa, 0);
  pair(&c, &s);
  R("F_SETOWN", fcntl(s, F_SETOWN, getpid()));
  R("F_SETFL O_ASYNC", fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_ASYNC));
  P("F_GETFL has O_ASYNC=%d", !!(fcntl(s, F_GETFL) & O_ASYNC));
  sigio_n = 0;
  send(c, "abc", 3, 0);
  for (int i = 0; i < 50 && !sigio_n; i++) msleep(10);
  P("SIGIO on data: %s", sigio_n ? "yes" : "no");
  recv(s, b, 100, 0);
  R("F_SETSIG RTMIN+1", fcntl(s, F_SETSIG, SIGRTMIN + 1));
  sigio_n = 0;
  send(c, "abc", 3, 0);
  for (int i = 0; i < 50 && !sigio_n; i++) msleep(10);
  P("F_SETSIG on data: %s fd_ok=%d band=%s code=%d", sigio_n ? "yes" : "no", sigio_fd == s, evs(sigio_band), sigio_code);
  recv(s, b, 100, 0);
  sigio_n = 0;
  shutdown(c, SHUT_WR);
  for (int i = 0; i < 50 && !sigio_n; i++) msleep(10);
  P("F_SETSIG on FIN: %s band=%s", sigio_n ? "yes" : "no", evs(sigio_band));
  close(c); close(s);
}
static void on_alrm(int sig) { (void)sig; }
static void s_waitall_sig(void) {
  int c, s; char b[100];
  struct sigaction sa = {.sa_handler = on_alrm, .sa_flags = 0};
  sigaction(SIGALRM, &sa, 0);
  pair(&c, &s);
  send(c, "abcde", 5, 0); msleep(20);
  ualarm(200000, 0);
  R("recv(10,WAITALL) + SIGALRM", recv(s, b, 10, MSG_WAITALL));
  send(c, "abcde", 5, 0); msleep(20);
  struct timeval tv = {0, 200000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  R("recv(10,WAITALL) + RCVTIMEO", recv(s, b, 10, MSG_WAITALL));
  R("recv(10,WAITALL) empty + RCVTIMEO", recv(s, b, 10, MSG_WAITALL));
  tv.tv_usec = 0; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  send(c, "abcde", 5, 0); msleep(20);
  shutdown(c, SHUT_WR);
  R("recv(10,WAITALL) data+FIN", recv(s, b, 10, MSG_WAITALL));
  close(c); close(s);
  // readv with WAITALL-like: recvmsg WAITALL + signal
  pair(&c, &s);
  send(c, "abcde", 5, 0); msleep(20);
  ualarm(200000, 0);
  struct iovec v[2] = {{b, 4}, {b + 4, 6}}; struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
  R("recvmsg(4+6,WAITALL) + SIGALRM", recvmsg(s, &m, MSG_WAITALL));
  close(c); close(s);
}
static void s_send_sig(void) {
  int c, s;
  struct sigaction sa = {.sa_handler = on_alrm, .sa_flags = 0};
  sigaction(SIGALRM, &sa, 0);
  pair(&c, &s);
  static char big[32 << 20];
  ualarm(300000, 0);
  long r = send(c, big, sizeof big, 0);
  int e = errno;
  P("send(32MiB, peer not reading) + SIGALRM -> %s", r < 0 ? en(e) : r > 0 && r < (long)sizeof big ? "partial" : "all");
  close(c); close(s);
  pair(&c, &s);
  struct timeval tv = {0, 300000}; setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  r = send(c, big, sizeof big, 0); e = errno;
  P("send(32MiB) + SNDTIMEO -> %s", r < 0 ? en(e) : r > 0 && r < (long)sizeof big ? "partial" : "all");
  r = send(c, big, sizeof big, 0); e = errno;
  P("send(32MiB) full + SNDTIMEO -> %s", r < 0 ? en(e) : r > 0 && r < (long)sizeof big ? "partial" : "all");
  struct iovec v[2] = {{big, 16 << 20}, {big, 16 << 20}};
  r = writev(c, v, 2); e = errno;
  P("writev(32MiB) full + SNDTIMEO -> %s", r < 0 ? en(e) : r > 0 ? "partial" : "0");
  close(c); close(s);
}
static void s_disconnect(void) {
  int c, s; char b[100];
  pair(&c, &s);
  send(s, "abc", 3, 0); msleep(20);
  struct sockaddr u = {.sa_family = AF_UNSPEC};
  R("connect(c,AF_UNSPEC)", connect(c, &u, sizeof u));
  msleep(50);
  tinfo("c", c);
  R("recv(c) DONTWAIT", recv(c, b, 100, MSG_DONTWAIT));
  R("send(c)", send(c, "x", 1, MSG_NOSIGNAL));
  struct sockaddr_in a; socklen_t al = sizeof a; R("getpeername(c)", getpeername(c, (void *)&a, &al));
  pollall("c", c);
  pollall("s", s);
  R("recv(s) DONTWAIT", recv(s, b, 100, MSG_DONTWAIT));
  R("recv(s) DONTWAIT", recv(s, b, 100, MSG_DONTWAIT));
  R("send(s)", send(s, "y", 1, MSG_NOSIGNAL));
  close(s);
  // reconnect the same socket elsewhere
  int p2, l2 = listener(&p2);
  R("connect(c) again", connect_to(c, p2));
  int s2 = accept(l2, 0, 0);
  R("accept", s2 >= 0 ? 0 : -1);
  R("send(c,hello)", send(c, "hello", 5, MSG_NOSIGNAL));
  readable(s2, 2000);
  long r = R("recv(s2)", recv(s2, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("send(s2,world)", send(s2, "world", 5, MSG_NOSIGNAL));
  readable(c, 2000);
  r = R("recv(c)", recv(c, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(c); close(s2); close(l2);
}
static void *acc_thread(void *a) { int l = *(int *)a; int r = accept(l, 0, 0); int e = errno; P("blocked accept -> %d %s", r < 0 ? -1 : 0, r < 0 ? en(e) : ""); return 0; }
static void s_misuse(void) {
  int c, s; char b[100];
  pair(&c, &s);
  R("connect(c) again", connect_to(c, LPORT));
  R("connect(s) to L", connect_to(s, LPORT));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  R("bind(c) after connect", bind(c, (void *)&a, sizeof a));
  R("listen(c) connected", listen(c, 5));
  R("listen(L) again", listen(L, 32));
  R("read(L)", read(L, b, 10));
  R("recv(L) DONTWAIT", recv(L, b, 10, MSG_DONTWAIT));
  R("write(L)", send(L, b, 10, MSG_NOSIGNAL));
  R("write(L,0)", send(L, b, 0, MSG_NOSIGNAL));
  int v = -7; R("FIONREAD(L)", ioctl(L, FIONREAD, &v)); P("  v=%d", v);
  v = -7; R("SIOCOUTQ(L)", ioctl(L, SIOCOUTQ, &v)); P("  v=%d", v);
  R("shutdown(new socket)", shutdown(socket(AF_INET, SOCK_STREAM, 0), SHUT_WR));
  int so; socklen_t sl = 4;
  getsockopt(L, SOL_SOCKET, SO_ACCEPTCONN, &so, &sl); P("ACCEPTCONN L=%d", so);
  getsockopt(c, SOL_SOCKET, SO_ACCEPTCONN, &so, &sl); P("ACCEPTCONN c=%d", so);
  getsockopt(s, SOL_SOCKET, SO_TYPE, &so, &sl); P("TYPE s=%d", so);
  getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &so, &sl); P("PROTOCOL s=%d", so);
  getsockopt(s, SOL_SOCKET, SO_DOMAIN, &so, &sl); P("DOMAIN s=%d", so);
  // SHUT_WR twice, SHUT_RD twice, SHUT_RDWR after
  R("shutdown(c,WR)", shutdown(c, SHUT_WR));
  R("shutdown(c,WR) again", shutdown(c, SHUT_WR));
  R("send(c,0) after WR", send(c, b, 0, MSG_NOSIGNAL));
  R("write(c,0) after WR", write(c, b, 0));
  R("shutdown(c,RD)", shutdown(c, SHUT_RD));
  R("shutdown(c,RD) again", shutdown(c, SHUT_RD));
  R("shutdown(c,RDWR)", shutdown(c, SHUT_RDWR));
  R("shutdown(c,7)", shutdown(c, 7));
  R("shutdown(s,-1)", shutdown(s, -1));
  R("recv(c) after RD", recv(c, b, 10, MSG_DONTWAIT));
  readable(s, 1000);
  R("recv(s) eof", recv(s, b, 10, 0));
  R("send(s,0) peer shut both", send(s, b, 0, MSG_NOSIGNAL));
  R("send(s,1) peer shut both", send(s, b, 1, MSG_NOSIGNAL));
  msleep(30);
  R("send(s,1) peer shut both again", send(s, b, 1, MSG_NOSIGNAL));
  R("send(s,0) again", send(s, b, 0, MSG_NOSIGNAL));
  close(c); close(s);
  // shutdown of a listener wakes a blocked accept
  int p2, l2 = listener(&p2);
  pthread_t t; pthread_create(&t, 0, acc_thread, &l2);
  msleep(100);
  R("shutdown(listener,RDWR)", shutdown(l2, SHUT_RDWR));
  pthread_join(t, 0);
  getsockopt(l2, SOL_SOCKET, SO_ACCEPTCONN, &so, &sl); P("ACCEPTCONN after shutdown=%d", so);
  int x = socket(AF_INET, SOCK_STREAM, 0);
  R("connect to shut listener", connect_to(x, p2));
  close(x);
  R("listen again", listen(l2, 5));
  x = socket(AF_INET, SOCK_STREAM, 0);
  if (R("connect to relistened", connect_to(x, p2))) { close(x); close(l2); return; }
  int y = accept(l2, 0, 0);
  R("send", send(x, "ok", 2, 0)); readable(y, 2000);
  long r = R("recv", recv(y, b, 10, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("send back", send(y, "ko", 2, 0)); readable(x, 2000);
  r = R("recv", recv(x, b, 10, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(x); close(y); close(l2);
}
static void s_flags(void) {
  int c, s; char b[100];
  pair(&c, &s);
  for (int bit = 0; bit < 31; bit++) {
    int f = 1 << bit;
    if (f == MSG_OOB || f == MSG_WAITALL || f == MSG_ERRQUEUE) continue;
    send(c, "0123456789", 10, 0); msleep(5);
    long r = recv(s, b, 3, f | MSG_DONTWAIT); int e = errno;
    char t[64]; snprintf(t, sizeof t, "recv flag %#x", f); errno = e; R(t, r);
    drain(s, 10 - (r > 0 && !(f & MSG_PEEK) ? r : 0) - (f & MSG_TRUNC && r > 0 && !(f & MSG_PEEK) ? 0 : 0));
    int q = 0; ioctl(s, FIONREAD, &q); if (q) { drain(s, q); }
  }
  for (int bit = 0; bit < 31; bit++) {
    int f = 1 << bit;
    if (f == MSG_OOB || f == MSG_ZEROCOPY || f == MSG_FASTOPEN) continue;
    long r = send(c, "abc", 3, f | MSG_NOSIGNAL); int e = errno;
    char t[64]; snprintf(t, sizeof t, "send flag %#x", f); errno = e; R(t, r);
    msleep(5); int q = 0; ioctl(s, FIONREAD, &q); if (q) drain(s, q);
  }
  // PEEK|TRUNC, TRUNC with buffer, WAITALL|DONTWAIT
  send(c, "0123456789", 10, 0); msleep(10);
  memset(b, '.', 20);
  R("recv(4,PEEK|TRUNC)", recv(s, b, 4, MSG_PEEK | MSG_TRUNC)); P("  buf[%.4s]", b);
  R("recv(4,TRUNC)", recv(s, b, 4, MSG_TRUNC)); P("  buf[%.4s]", b);
  R("recv(100,WAITALL|DONTWAIT)", recv(s, b, 100, MSG_WAITALL | MSG_DONTWAIT));
  R("recv(100,PEEK|WAITALL|DONTWAIT) empty", recv(s, b, 100, MSG_PEEK | MSG_WAITALL | MSG_DONTWAIT));
  struct timeval tv = {0, 100000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  R("recv(PEEK) empty RCVTIMEO", recv(s, b, 10, MSG_PEEK));
  send(c, "abc", 3, 0); msleep(10);
  R("recv(10,PEEK|WAITALL) 3 avail RCVTIMEO", recv(s, b, 10, MSG_PEEK | MSG_WAITALL));
  R("recvfrom(NULL buf, 0)", recvfrom(s, NULL, 0, MSG_DONTWAIT, 0, 0));
  struct sockaddr_in a; socklen_t al = 77;
  R("recvfrom(addr)", recvfrom(s, b, 1, 0, (void *)&a, &al)); P("  alen=%u", al);
  // sendto with an address on a connected socket
  struct sockaddr_in d = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(0x7f000001)};
  R("sendto(addr) connected", sendto(c, "q", 1, MSG_NOSIGNAL, (void *)&d, sizeof d));
  R("sendto(addr,badlen) connected", sendto(c, "q", 1, MSG_NOSIGNAL, (void *)&d, 3));
  R("sendto(NULL,len) connected", sendto(c, "q", 1, MSG_NOSIGNAL, NULL, 16));
  struct msghdr m = {.msg_name = &d, .msg_namelen = sizeof d};
  struct iovec v = {"w", 1}; m.msg_iov = &v; m.msg_iovlen = 1;
  R("sendmsg(name) connected", sendmsg(c, &m, MSG_NOSIGNAL));
  char cb[CMSG_SPACE(sizeof(int))]; m.msg_name = 0; m.msg_namelen = 0; m.msg_control = cb; m.msg_controllen = sizeof cb;
  struct cmsghdr *h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int)); *(int *)CMSG_DATA(h) = 0;
  R("sendmsg(SCM_RIGHTS) on tcp", sendmsg(c, &m, MSG_NOSIGNAL));
  h->cmsg_level = 12345; h->cmsg_type = 1;
  R("sendmsg(bogus cmsg) on tcp", sendmsg(c, &m, MSG_NOSIGNAL));
  msleep(10); int q = 0; ioctl(s, FIONREAD, &q); P("s has %d", q);
  close(c); close(s);
}
static void s_iov(void) {
  int c, s; char b[100];
  pair(&c, &s);
  struct iovec z[4] = {{b, 0}, {NULL, 0}, {b, 0}, {b, 0}};
  R("writev zero-len x4", writev(c, z, 4));
  R("writev cnt 0", writev(c, z, 0));
  R("writev cnt -1", writev(c, z, -1));
  R("writev cnt IOV_MAX+1", writev(c, z, 1025));
  R("readv cnt IOV_MAX+1", readv(s, z, 1025));
  R("readv cnt -1", readv(s, z, -1));
  struct iovec big[2] = {{b, (size_t)1 << 62}, {b, (size_t)1 << 62}};
  R("writev len overflow", writev(c, big, 2));
  R("readv len overflow", readv(s, big, 2));
  struct iovec h[2] = {{(void *)1, 5}, {b, 5}};
  R("writev bad ptr first", writev(c, h, 2));
  static struct iovec many[1024]; static char mb[1024];
  for (int i = 0; i < 1024; i++) { many[i].iov_base = mb + i; many[i].iov_len = 1; }
  R("writev IOV_MAX 1-byte", writev(c, many, 1024));
  msleep(20);
  R("readv IOV_MAX 1-byte", readv(s, many, 1024));
  R("readv zero-len x4 empty DONTWAIT", (set_nb(s, 1), readv(s, z, 4)));
  set_nb(s, 0);
  R("recvmsg iovlen 0 empty", recv(s, b, 0, MSG_DONTWAIT));
  send(c, "abc", 3, 0); msleep(10);
  R("readv zero-len x4 data", readv(s, z, 4));
  struct msghdr m = {.msg_iov = z, .msg_iovlen = 0};
  R("recvmsg iovlen 0 data", recvmsg(s, &m, 0));
  m.msg_iovlen = 1025; R("recvmsg iovlen 1025", recvmsg(s, &m, 0));
  R("sendmsg iovlen 1025", sendmsg(c, &m, 0));
  m.msg_iov = NULL; m.msg_iovlen = 1; R("recvmsg iov NULL", recvmsg(s, &m, 0));
  close(c); close(s);
}
static void s_fl(void) {
  int c, s;
  pair(&c, &s);
  int f0 = fcntl(s, F_GETFL);
  R("F_SETFL APPEND|NONBLOCK|ASYNC|NOATIME|DIRECT", fcntl(s, F_SETFL, f0 | O_APPEND | O_NONBLOCK | O_ASYNC | O_DIRECT));
  P("F_GETFL = %#x", fcntl(s, F_GETFL));
  R("F_SETFL 0", fcntl(s, F_SETFL, 0)); P("F_GETFL = %#x", fcntl(s, F_GETFL));
  int n, p2, l2 = listener(&p2);
  set_nb(l2, 1);
  int x = socket(AF_INET, SOCK_STREAM, 0); connect_to(x, p2); readable(l2, 1000);
  n = accept(l2, 0, 0); P("accept from NB listener: FL=%#x FD=%d", fcntl(n, F_GETFL), fcntl(n, F_GETFD));
  send(x, "a", 1, 0); char b; readable(n, 1000); recv(n, &b, 1, 0); close(n); close(x);
  x = socket(AF_INET, SOCK_STREAM, 0); connect_to(x, p2); readable(l2, 1000);
  n = accept4(l2, 0, 0, SOCK_NONBLOCK | SOCK_CLOEXEC); P("accept4(NB|CLOEXEC): FL=%#x FD=%d", fcntl(n, F_GETFL), fcntl(n, F_GETFD));
  R("recv empty (nonblock)", recv(n, &b, 1, 0));
  send(x, "a", 1, 0); readable(n, 1000); R("recv", recv(n, &b, 1, 0));
  R("send", send(n, "a", 1, 0)); readable(x, 1000); R("recv x", recv(x, &b, 1, 0));
  int d = dup3(n, 200, O_CLOEXEC); P("dup3 CLOEXEC: FD=%d FL=%#x", fcntl(d, F_GETFD), fcntl(d, F_GETFL));
  d = fcntl(n, F_DUPFD_CLOEXEC, 300); P("F_DUPFD_CLOEXEC: fd>=300 %d FD=%d", d >= 300, fcntl(d, F_GETFD));
  close(n); close(x); close(200); close(d); close(l2);
  struct stat st; fstat(s, &st); P("fstat S_ISSOCK=%d", S_ISSOCK(st.st_mode));
  close(c); close(s);
}
static void s_ioctl(void) {
  int c, s;
  pair(&c, &s);
  ioc("fresh c", c);
  sendn(c, 1000); msleep(20);
  ioc("1000 unread: s", s); ioc("1000 unread: c", c);
  shutdown(c, SHUT_WR); msleep(20);
  ioc("+FIN: s", s);
  drain(s, 1000);
  ioc("read all: s", s);
  close(c); close(s);
  pair(&c, &s);
  set_nb(c, 1);
  long tot = 0; static char big[65536];
  for (;;) { long r = send(c, big, sizeof big, MSG_NOSIGNAL); if (r <= 0) break; tot += r; }
  P("filled: tot>0 %d", tot > 0);
  int o = -1, q = -1; ioctl(c, SIOCOUTQ, &o); ioctl(s, SIOCINQ, &q);
  P("filled: OUTQ>0 %d OUTQ+INQ==tot %d", o > 0, o + q == tot);
  ioctl(c, SIOCOUTQNSD, &o); P("filled: OUTQNSD>0 %d", o > 0);
  int sb = 0; socklen_t sl = 4; getsockopt(c, SOL_SOCKET, SO_SNDBUF, &sb, &sl);
  struct tcp_info t; socklen_t tl = sizeof t; getsockopt(c, IPPROTO_TCP, TCP_INFO, &t, &tl);
  P("filled: tcpi_notsent>0 %d unacked>0 %d", t.tcpi_notsent_bytes > 0, t.tcpi_unacked > 0);
  close(c); close(s);
}
static void s_bufs(void) {
  int c, s, v;
  socklen_t l = 4;
  // small buffers set before connect: how much can a non-blocking writer push before EAGAIN
  if (L < 0) L = listener(&LPORT);
  c = socket(AF_INET, SOCK_STREAM, 0);
  v = 4096; setsockopt(c, SOL_SOCKET, SO_SNDBUF, &v, 4);
  connect_to(c, LPORT); s = accept(L, 0, 0);
  v = 4096; setsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, 4);
  char b; send(c, "h", 1, 0); recv(s, &b, 1, 0); send(s, "i", 1, 0); recv(c, &b, 1, 0);
  getsockopt(c, SOL_SOCKET, SO_SNDBUF, &v, &l); P("SO_SNDBUF c=%d", v);
  getsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &l); P("SO_RCVBUF s=%d", v);
  set_nb(c, 1);
  long tot = 0; static char big[65536];
  for (;;) { long r = send(c, big, sizeof big, MSG_NOSIGNAL); if (r <= 0) break; tot += r; }
  P("nonblocking fill with SNDBUF=RCVBUF=4096: %s", tot < 65536 ? "<64KiB" : tot < 1 << 20 ? "<1MiB" : ">=1MiB");
  close(c); close(s);
}
static void s_cork(void) {
  int c, s, one = 1, zero = 0; char b[100];
  pair(&c, &s);
  R("TCP_CORK on", setsockopt(c, IPPROTO_TCP, TCP_CORK, &one, 4));
  send(c, "abc", 3, 0);
  P("corked 3 bytes: readable within 50ms=%d", readable(s, 50));
  R("TCP_CORK off", setsockopt(c, IPPROTO_TCP, TCP_CORK, &zero, 4));
  P("uncorked: readable=%d", readable(s, 1000));
  recv(s, b, 100, MSG_DONTWAIT);
  send(c, "abc", 3, MSG_MORE);
  P("MSG_MORE 3 bytes: readable within 50ms=%d", readable(s, 50));
  send(c, "d", 1, 0);
  P("then plain send: readable=%d n=%ld", readable(s, 1000), (msleep(10), recv(s, b, 100, MSG_DONTWAIT)));
  close(c); close(s);
}
static void s_aio(void) {
  int c, s; char b[100] = {0};
  pair(&c, &s);
  send(c, "aiodata", 7, 0); msleep(20);
  struct aiocb a = {.aio_fildes = s, .aio_buf = b, .aio_nbytes = 100};
  R("aio_read", aio_read(&a));
  for (int i = 0; i < 200 && aio_error(&a) == EINPROGRESS; i++) msleep(10);
  int e = aio_error(&a);
  if (e == EINPROGRESS) P("aio_read: still in progress after 2s");
  else { long r = aio_return(&a); errno = e; R("aio_return", e ? -1 : r); if (r > 0) P("  [%.*s]", (int)r, b); }
  struct aiocb w = {.aio_fildes = c, .aio_buf = "aiow", .aio_nbytes = 4};
  R("aio_write", aio_write(&w));
  for (int i = 0; i < 200 && aio_error(&w) == EINPROGRESS; i++) msleep(10);
  P("aio_write err=%s ret=%ld", aio_error(&w) ? en(aio_error(&w)) : "0", (long)aio_return(&w));
  readable(s, 1000); long r = R("recv after aio_write", recv(s, b, 100, MSG_DONTWAIT)); if (r > 0) P("  [%.*s]", (int)r, b);
  _exit(0);
}
static void on_alrm2(int sig) { (void)sig; }
static void arm(void) { struct sigaction sa = {.sa_handler = on_alrm2, .sa_flags = 0}; sigaction(SIGALRM, &sa, 0); alarm(2); }
static void s_splice(void) {
  int c, s, pf[2]; char b[100];
  pair(&c, &s);
  char tmpl[] = "/tmp/rt9fXXXXXX"; int f = mkstemp(tmpl); unlink(tmpl); write(f, "0123456789", 10);
  off_t off = 100;
  R("sendfile off beyond EOF", sendfile(c, f, &off, 10)); P("  off=%ld", (long)off);
  off = 5; R("sendfile count 0", sendfile(c, f, &off, 0)); P("  off=%ld", (long)off);
  off = 8; R("sendfile off 8 count 10", sendfile(c, f, &off, 10)); P("  off=%ld", (long)off);
  readable(s, 1000); msleep(10);
  long r = R("recv", recv(s, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  pipe(pf);
  send(c, "tee-me", 6, 0); msleep(20);
  R("splice(sock->pipe, NONBLOCK)", splice(s, NULL, pf[1], NULL, 100, SPLICE_F_NONBLOCK));
  int p2[2]; pipe(p2);
  R("tee(pipe->pipe)", tee(pf[0], p2[1], 100, 0));
  R("splice(pipe->sock)", splice(p2[0], NULL, c, NULL, 100, 0));
  readable(s, 1000); msleep(10);
  r = R("recv", recv(s, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  arm(); R("splice(sock->pipe) empty NONBLOCK, blocking socket (alarm 2s)", splice(s, NULL, pf[1], NULL, 100, SPLICE_F_NONBLOCK)); alarm(0);
  loff_t lo = 0; arm(); R("splice(sock->pipe, off) (alarm 2s)", splice(s, &lo, pf[1], NULL, 100, 0)); alarm(0);
  arm(); R("splice(sock->sock) (alarm 2s)", splice(s, NULL, c, NULL, 100, 0)); alarm(0);
  char vb[] = "vmsplice"; struct iovec vv = {vb, 8}; R("vmsplice", vmsplice(p2[1], &vv, 1, 0));
  R("splice(pipe->sock) MORE", splice(p2[0], NULL, c, NULL, 8, SPLICE_F_MORE));
  readable(s, 1000); msleep(10);
  r = R("recv", recv(s, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  shutdown(c, SHUT_WR); msleep(10);
  R("splice(sock->pipe) at EOF", splice(s, NULL, pf[1], NULL, 100, 0));
  close(c); close(s);
}
static void s_selectbig(void) {
  int c, s;
  pair(&c, &s);
  dup2(s, 1000); close(s); s = 1000;
  fd_set r; FD_ZERO(&r); FD_SET(s, &r);
  struct timeval tv = {0, 0};
  P("select fd1000 empty -> %d", select(s + 1, &r, 0, 0, &tv));
  send(c, "x", 1, 0); msleep(10);
  FD_ZERO(&r); FD_SET(s, &r); fd_set w; FD_ZERO(&w); FD_SET(s, &w); fd_set x; FD_ZERO(&x); FD_SET(s, &x);
  tv.tv_usec = 0;
  int n = select(s + 1, &r, &w, &x, &tv);
  P("select fd1000 data -> %d r=%d w=%d x=%d", n, FD_ISSET(s, &r), FD_ISSET(s, &w), FD_ISSET(s, &x));
  close(c); msleep(10);
  FD_ZERO(&r); FD_SET(s, &r); FD_ZERO(&x); FD_SET(s, &x); tv.tv_usec = 0;
  n = select(s + 1, &r, 0, &x, &tv);
  P("select fd1000 peer closed -> %d r=%d x=%d", n, FD_ISSET(s, &r), FD_ISSET(s, &x));
  close(s);
}
static void s_reuseport(void) {
  int one = 1, ls[2], port = 0;
  for (int i = 0; i < 2; i++) {
    ls[i] = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(ls[i], SOL_SOCKET, SO_REUSEPORT, &one, 4);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(ls[i], (void *)&a, sizeof a)) die("bind reuseport");
    listen(ls[i], 64);
    socklen_t al = sizeof a; getsockname(ls[i], (void *)&a, &al); port = ntohs(a.sin_port);
  }
  int ok = 0, both[2] = {0, 0};
  for (int k = 0; k < 20; k++) {
    int c = socket(AF_INET, SOCK_STREAM, 0); connect_to(c, port);
    struct pollfd p[2] = {{ls[0], POLLIN, 0}, {ls[1], POLLIN, 0}};
    poll(p, 2, 2000);
    int i = p[0].revents ? 0 : 1; both[i] = 1;
    int s = accept(ls[i], 0, 0);
    char b[8];
    send(c, "ping", 4, 0); readable(s, 2000);
    if (recv(s, b, 8, 0) == 4) { send(s, "pong", 4, 0); readable(c, 2000); if (recv(c, b, 8, 0) == 4) ok++; }
    close(c); close(s);
  }
  P("reuseport: %d/20 ok", ok);
  // closing one listener: queued connections
  int c = socket(AF_INET, SOCK_STREAM, 0); R("connect", connect_to(c, port));
  close(c);
}
static void s_fastopen(void) {
  int one = 1, port; char b[100];
  int l = listener(&port);
  int q = 5; R("TCP_FASTOPEN on listener", setsockopt(l, IPPROTO_TCP, TCP_FASTOPEN, &q, 4));
  int c = socket(AF_INET, SOCK_STREAM, 0);
  R("TCP_FASTOPEN_CONNECT", setsockopt(c, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &one, 4));
  R("connect", connect_to(c, port));
  R("send", send(c, "tfo1", 4, 0));
  int s = accept(l, 0, 0);
  readable(s, 2000);
  long r = R("recv(s)", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("send(s)", send(s, "back", 4, 0)); readable(c, 2000);
  r = R("recv(c)", recv(c, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(c); close(s);
  c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  R("sendto MSG_FASTOPEN", sendto(c, "tfo2", 4, MSG_FASTOPEN, (void *)&a, sizeof a));
  s = accept(l, 0, 0);
  readable(s, 2000);
  r = R("recv(s)", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("send(s)", send(s, "back", 4, 0)); readable(c, 2000);
  r = R("recv(c)", recv(c, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("send(c) more", send(c, "more", 4, 0)); readable(s, 2000);
  r = R("recv(s)", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(c); close(s); close(l);
}
static void s_opts(void) {
  int c, s, v; socklen_t l = 4; char b[10];
  pair(&c, &s);
  struct { int lvl, name, val; const char *n; } o[] = {
    {SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE"}, {IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"},
    {IPPROTO_IP, IP_TOS, 0x10, "IP_TOS"}, {IPPROTO_TCP, TCP_USER_TIMEOUT, 1234, "TCP_USER_TIMEOUT"},
    {IPPROTO_TCP, TCP_KEEPIDLE, 77, "TCP_KEEPIDLE"}, {SOL_SOCKET, SO_PRIORITY, 3, "SO_PRIORITY"},
    {SOL_SOCKET, SO_RCVLOWAT, 5, "SO_RCVLOWAT"}, {IPPROTO_TCP, TCP_NOTSENT_LOWAT, 4096, "TCP_NOTSENT_LOWAT"},
    {IPPROTO_TCP, TCP_QUICKACK, 1, "TCP_QUICKACK"}, {SOL_SOCKET, SO_MARK, 7, "SO_MARK"},
    {IPPROTO_TCP, TCP_MAXSEG, 1000, "TCP_MAXSEG"}, {IPPROTO_TCP, TCP_WINDOW_CLAMP, 10000, "TCP_WINDOW_CLAMP"},
  };
  for (unsigned i = 0; i < sizeof o / sizeof *o; i++) {
    int r = setsockopt(s, o[i].lvl, o[i].name, &o[i].val, 4);
    v = -1; l = 4; int g = getsockopt(s, o[i].lvl, o[i].name, &v, &l);
    P("%s set=%d get=%d v=%d", o[i].n, r, g, v);
  }
  struct linger lg = {1, 0}; l = sizeof lg;
  getsockopt(s, SOL_SOCKET, SO_LINGER, &lg, &l); P("SO_LINGER %d %d", lg.l_onoff, lg.l_linger);
  char cc[32] = {0}; l = sizeof cc; getsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, &l); P("TCP_CONGESTION ok=%d", cc[0] != 0);
  l = 4; v = -1; R("getsockopt SO_ERROR", getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &l)); P("  v=%d l=%u", v, l);
  l = 2; v = -1; R("getsockopt SO_ERROR len2", getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &l)); P("  l=%u", l);
  R("getsockopt SO_ERROR NULL", getsockopt(s, SOL_SOCKET, SO_ERROR, NULL, &l));
  // SO_RCVLOWAT with MSG_PEEK? and with recv size smaller
  send(c, "abc", 3, 0); msleep(10);
  struct timeval tv = {0, 100000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  R("recv(10) rcvlowat 5, 3 avail", recv(s, b, 10, 0));
  R("recv(2) rcvlowat 5, 3 avail", recv(s, b, 2, 0));
  R("recv(10,PEEK) rcvlowat 5, 1 avail", recv(s, b, 10, MSG_PEEK));
  // SO_MEMINFO rmem with unread data
  send(c, "abcdefghij", 10, 0); msleep(10);
  unsigned mi[9] = {0}; l = sizeof mi; getsockopt(s, SOL_SOCKET, SO_MEMINFO, mi, &l);
  P("SO_MEMINFO rmem_alloc>0 with unread=%d", mi[0] > 0);
  close(c); close(s);
}
static void s_linger(void) {
  int c, s; char b[10];
  // SO_LINGER {1, 2} close with peer not reading and data in flight
  pair(&c, &s);
  struct linger lg = {1, 2}; setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  send(c, "abc", 3, 0);
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  R("close(c) linger 2s, 3 bytes unread at peer", close(c));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  P("  took<1s=%d", (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 1000);
  R("recv(s)", recv(s, b, 10, 0)); R("recv(s)", recv(s, b, 10, 0));
  close(s);
  // linger 0 while unread both ways: what the peer sees in order
  pair(&c, &s);
  send(c, "abc", 3, 0); send(s, "xyz", 3, 0); msleep(20);
  lg.l_linger = 0; setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(c); msleep(20);
  R("recv(s) after peer linger0 with data both ways", recv(s, b, 10, MSG_DONTWAIT));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  close(s);
  // shutdown(SHUT_WR) then close with unread data: RST after FIN
  pair(&c, &s);
  send(s, "xyz", 3, 0); send(c, "abc", 3, 0); msleep(20);
  shutdown(c, SHUT_WR); msleep(20);
  close(c); msleep(20);
  R("recv(s) data", recv(s, b, 10, MSG_DONTWAIT));
  R("recv(s) after FIN then RST", recv(s, b, 10, MSG_DONTWAIT));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  close(s);
  // unread data then SHUT_RD then close: RST?
  pair(&c, &s);
  send(s, "xyz", 3, 0); msleep(20);
  shutdown(c, SHUT_RD); close(c); msleep(20);
  R("send(s) after peer SHUT_RD+close with unread", send(s, "q", 1, MSG_NOSIGNAL));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  close(s);
  // peer read everything then closes: no reset
  pair(&c, &s);
  send(s, "xyz", 3, 0); msleep(20); recv(c, b, 10, 0);
  close(c); msleep(20);
  R("recv(s) clean close", recv(s, b, 10, MSG_DONTWAIT));
  R("send(s)", send(s, "q", 1, MSG_NOSIGNAL)); msleep(20);
  R("send(s)", send(s, "q", 1, MSG_NOSIGNAL));
  R("recv(s)", recv(s, b, 10, MSG_DONTWAIT));
  close(s);
}
static void s_epollflags(void) {
  int c, s; char b[10];
  pair(&c, &s);
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET | EPOLLWAKEUP, .data.u64 = 42};
  R("epoll_ctl ADD IN|RDHUP|ET|WAKEUP", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
  struct epoll_event o[4];
  R("epoll_wait fresh", epoll_wait(ep, o, 4, 0));
  shutdown(c, SHUT_WR); msleep(10);
  int n = epoll_wait(ep, o, 4, 100); P("after peer SHUT_WR: %d %s", n, n > 0 ? evs(o[0].events) : "");
  n = epoll_wait(ep, o, 4, 0); P("again (ET): %d", n);
  e.events = EPOLLIN | EPOLLEXCLUSIVE;
  R("epoll_ctl MOD with EXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
  R("epoll_ctl ADD dup", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
  R("epoll_ctl DEL", epoll_ctl(ep, EPOLL_CTL_DEL, s, &e));
  R("epoll_ctl DEL again", epoll_ctl(ep, EPOLL_CTL_DEL, s, &e));
  R("epoll_ctl MOD missing", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
  e.events = 0; R("epoll_ctl ADD events 0", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
  n = epoll_wait(ep, o, 4, 0); P("events 0 with FIN: %d %s", n, n > 0 ? evs(o[0].events) : "");
  close(c); msleep(10);
  n = epoll_wait(ep, o, 4, 0); P("events 0 peer closed: %d %s", n, n > 0 ? evs(o[0].events) : "");
  recv(s, b, 10, 0);
  send(s, "x", 1, MSG_NOSIGNAL); msleep(20);
  n = epoll_wait(ep, o, 4, 0); P("events 0 after RST: %d %s", n, n > 0 ? evs(o[0].events) : "");
  close(s); close(ep);
}


static void s_bypass(void) {
  int c, s; char b[100];
  pair(&c, &s);
  send(c, "0123456789", 10, 0); msleep(20);
  struct iovec v = {b, 100};
  arm(); long r = R("preadv2(off -1)", preadv2(s, &v, 1, -1, 0)); alarm(0); if (r > 0) P("  [%.*s]", (int)r, b);
  struct iovec w = {"pwv", 3};
  R("pwritev2(off -1)", pwritev2(c, &w, 1, -1, 0));
  readable(s, 500); r = R("recv after pwritev2", recv(s, b, 100, MSG_DONTWAIT)); if (r > 0) P("  [%.*s]", (int)r, b);
  close(c); close(s);
  pair(&c, &s);
  send(c, "abcdef", 6, 0); msleep(20);
  arm(); r = R("syscall(SYS_read)", syscall(SYS_read, s, b, 100)); alarm(0); if (r > 0) P("  [%.*s]", (int)r, b);
  R("syscall(SYS_write)", syscall(SYS_write, c, "sys", 3));
  readable(s, 500); r = R("recv after SYS_write", recv(s, b, 100, MSG_DONTWAIT)); if (r > 0) P("  [%.*s]", (int)r, b);
  close(c); close(s);
  pair(&c, &s);
  send(c, "sendfile", 8, 0); msleep(20);
  int f2 = open("/tmp", O_TMPFILE | O_RDWR, 0600);
  arm(); R("sendfile(file <- sock, NULL)", sendfile(f2, s, NULL, 100)); alarm(0);
  off_t off = 0; arm(); R("sendfile(file <- sock, &off)", sendfile(f2, s, &off, 100)); alarm(0);
  r = R("recv rest", recv(s, b, 100, MSG_DONTWAIT)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  close(c); close(s);
}
static void s_zerolen(void) {
  int c, s; char b[10];
  pair(&c, &s);
  R("recv(s,0,DONTWAIT) empty", recv(s, b, 0, MSG_DONTWAIT));
  struct msghdr m = {0};
  R("recvmsg(s,iovlen 0,DONTWAIT) empty", recvmsg(s, &m, MSG_DONTWAIT));
  R("read(s,0) empty", read(s, b, 0));
  arm(); R("recv(s,0) blocking empty", recv(s, b, 0, 0)); alarm(0);
  send(c, "x", 1, 0); msleep(10);
  R("recv(s,0,DONTWAIT) data", recv(s, b, 0, MSG_DONTWAIT));
  shutdown(c, SHUT_WR); msleep(10);
  recv(s, b, 10, 0);
  R("recv(s,0,DONTWAIT) at EOF", recv(s, b, 0, MSG_DONTWAIT));
  close(c); close(s);
}
static void s_shutrdwr_send(void) {
  int c, s; char b[10];
  pair(&c, &s);
  R("shutdown(c,RDWR)", shutdown(c, SHUT_RDWR)); msleep(20);
  readable(s, 1000); R("recv(s) eof", recv(s, b, 10, 0));
  set_nb(s, 1);
  long tot = 0, r; int e = 0;
  for (int i = 0; i < 2000; i++) { r = send(s, "0123456789012345678901234567890123456789", 40, MSG_NOSIGNAL); if (r < 0) { e = errno; if (e != EAGAIN) break; msleep(1); } else tot += r; }
  P("sending to a peer that did SHUT_RDWR: %s after %s", e ? en(e) : "no error", tot <= 40 ? "<=1 send" : "more");
  pollall("s", s);
  close(c); close(s);
}
static void s_finrst(void) {
  int c, s; char b[10];
  pair(&c, &s);
  send(c, "abc", 3, 0); send(s, "xyz", 3, 0); msleep(20);
  shutdown(s, SHUT_WR); msleep(20);
  close(s); msleep(20);
  R("recv(c) data", recv(c, b, 10, MSG_DONTWAIT));
  R("recv(c) after FIN then RST", recv(c, b, 10, MSG_DONTWAIT));
  R("recv(c)", recv(c, b, 10, MSG_DONTWAIT));
  int e = -1; socklen_t el = 4; getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &el); P("SO_ERROR=%s", e ? en(e) : "0");
  R("send(c)", send(c, "q", 1, MSG_NOSIGNAL));
  R("send(c)", send(c, "q", 1, MSG_NOSIGNAL));
  close(c);
  // same, reader reads data and EOF with a blocking recv
  pair(&c, &s);
  send(c, "abc", 3, 0); send(s, "xyz", 3, 0); msleep(20);
  shutdown(s, SHUT_WR); msleep(20); close(s); msleep(20);
  R("recv(c,100) blocking", recv(c, b, 10, 0));
  R("recv(c,100) blocking", recv(c, b, 10, 0));
  close(c);
}
static void s_peekwaitall(void) {
  int c, s; char b[100];
  pair(&c, &s);
  send(c, "abc", 3, 0); msleep(10);
  struct timeval tv = {0, 200000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  R("recv(10,PEEK|WAITALL) 3 avail RCVTIMEO", recv(s, b, 10, MSG_PEEK | MSG_WAITALL));
  tv.tv_usec = 0; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  arm(); R("recv(10,PEEK|WAITALL) 3 avail SIGALRM", recv(s, b, 10, MSG_PEEK | MSG_WAITALL)); alarm(0);
  shutdown(c, SHUT_WR); msleep(10);
  R("recv(10,PEEK|WAITALL) 3 avail + FIN", recv(s, b, 10, MSG_PEEK | MSG_WAITALL));
  close(c); close(s);
}
static void s_iovmax(void) {
  int c, s; char b[10];
  pair(&c, &s);
  static struct iovec z[1025]; for (int i = 0; i < 1025; i++) { z[i].iov_base = b; z[i].iov_len = 0; }
  struct msghdr m = {.msg_iov = z, .msg_iovlen = 1025};
  R("recvmsg iovlen 1025", recvmsg(s, &m, MSG_DONTWAIT));
  R("sendmsg iovlen 1025", sendmsg(c, &m, 0));
  struct mmsghdr mm = {.msg_hdr = m};
  R("sendmmsg iovlen 1025", sendmmsg(c, &mm, 1, 0));
  R("recvmmsg iovlen 1025", recvmmsg(s, &mm, 1, MSG_DONTWAIT, 0));
  close(c); close(s);
}

static void s_early(void) {
  char b[100]; long r;
  if (L < 0) L = listener(&LPORT);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  R("connect", connect_to(c, LPORT));
  R("send(c,hello)", send(c, "hello", 5, MSG_NOSIGNAL));
  R("close(c) before accept", close(c));
  int s = accept(L, 0, 0);
  readable(s, 2000);
  r = R("recv(s)", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("recv(s)", recv(s, b, 100, 0));
  close(s);
  c = socket(AF_INET, SOCK_STREAM, 0);
  R("connect", connect_to(c, LPORT));
  R("send(c,req)", send(c, "req", 3, MSG_NOSIGNAL));
  R("shutdown(c,WR) before accept", shutdown(c, SHUT_WR));
  s = accept(L, 0, 0);
  readable(s, 2000);
  r = R("recv(s)", recv(s, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("recv(s)", recv(s, b, 100, 0));
  R("send(s,resp)", send(s, "resp", 4, MSG_NOSIGNAL));
  close(s);
  readable(c, 2000);
  r = R("recv(c)", recv(c, b, 100, 0)); P("  [%.*s]", (int)(r > 0 ? r : 0), b);
  R("recv(c)", recv(c, b, 100, 0));
  close(c);
  // peer sends and closes with our unread greeting: before accept
  c = socket(AF_INET, SOCK_STREAM, 0);
  R("connect", connect_to(c, LPORT));
  R("send(c,x)", send(c, "x", 1, MSG_NOSIGNAL));
  s = accept(L, 0, 0);
  R("send(s,greet)", send(s, "greet", 5, MSG_NOSIGNAL));
  readable(s, 2000); R("recv(s)", recv(s, b, 100, 0));
  R("close(c) with unread greeting", close(c));
  msleep(20);
  R("recv(s)", recv(s, b, 100, MSG_DONTWAIT));
  R("recv(s)", recv(s, b, 100, MSG_DONTWAIT));
  close(s);
}
struct sc { const char *n; void (*f)(void); } SC[] = {
  {"tcpinfo", s_tcpinfo}, {"states", s_states}, {"rst", s_rst}, {"polls", s_polls}, {"cmsg", s_cmsg},
  {"zerocopy", s_zerocopy}, {"peekoff", s_peekoff}, {"sigio", s_sigio}, {"waitall_sig", s_waitall_sig},
  {"send_sig", s_send_sig}, {"disconnect", s_disconnect}, {"misuse", s_misuse}, {"flags", s_flags},
  {"iov", s_iov}, {"fl", s_fl}, {"ioctl", s_ioctl}, {"bufs", s_bufs}, {"cork", s_cork},
  {"aio", s_aio}, {"splice", s_splice}, {"selectbig", s_selectbig}, {"reuseport", s_reuseport},
  {"fastopen", s_fastopen}, {"opts", s_opts}, {"linger", s_linger}, {"epollflags", s_epollflags}, {"bypass", s_bypass}, {"zerolen", s_zerolen},
  {"shutrdwr_send", s_shutrdwr_send}, {"finrst", s_finrst}, {"peekwaitall", s_peekwaitall}, {"iovmax", s_iovmax}, {"early", s_early},
};
int main(int argc, char **argv) {
  setvbuf(stdout, 0, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) { for (unsigned i = 0; i < sizeof SC / sizeof *SC; i++) printf("%s\n", SC[i].n); return 0; }
  for (unsigned i = 0; i < sizeof SC / sizeof *SC; i++)
    if (!strcmp(argv[1], SC[i].n)) { P("== %s", SC[i].n); SC[i].f(); P("== end"); return 0; }
  P("unknown %s", argv[1]);
  return 1;
}
