// rt31 (red team round 31, rt31x_lost.c): calls on a client connection whose server was killed (its listener's queue reset)
// while the client's handshake was under way (waiting for the Accept), compared with TCP.
// usage: rt31_lost SCEN N PORT   (under world-priv.sh smc|tcp); one line per client, counted.
// A server process listens and never accepts; N clients connect (non-blocking unless the
// scenario says b*), report "connected"; the parent kills the server (SIGKILL), waits 30 ms,
// and tells the clients to go; each client makes the scenario's calls.
// Scenarios with "kw" (bconn, nbforkw): the kill comes 20 ms after the clients connected,
// while a call of theirs (a blocking connect, a fork) may still wait for the handshake.
// gcc -O2 -pthread -o rt31_lost rt31_lost.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static int PORT;
static char obs[4096];
static void add(const char *fmt, ...) {
  va_list ap; va_start(ap, fmt);
  size_t l = strlen(obs);
  if (l) obs[l++] = ' ';
  vsnprintf(obs + l, sizeof obs - l, fmt, ap);
  va_end(ap);
}
static const char *en(int e) {
  switch (e) {
  case EAGAIN: return "EAGAIN"; case ECONNRESET: return "ECONNRESET"; case EPIPE: return "EPIPE";
  case ENOTCONN: return "ENOTCONN"; case ECONNREFUSED: return "ECONNREFUSED";
  case EINPROGRESS: return "EINPROGRESS"; case EBADF: return "EBADF"; case EINVAL: return "EINVAL";
  case EINTR: return "EINTR"; case 0: return "0";
  default: { static char b[16]; snprintf(b, 16, "E%d", e); return b; }
  }
}
static const char *rev(int r) {
  static char b[64]; b[0] = 0;
  if (r & POLLIN) strcat(b, "I"); if (r & POLLOUT) strcat(b, "O"); if (r & POLLERR) strcat(b, "E");
  if (r & POLLHUP) strcat(b, "H"); if (r & POLLRDHUP) strcat(b, "R"); if (r & POLLNVAL) strcat(b, "N");
  if (!b[0]) strcat(b, "-");
  return b;
}
static void R(const char *t, ssize_t r) { if (r < 0) add("%s:%s", t, en(errno)); else add("%s%zd", t, r); }
static char buf[65536];
static void rd(int s, int fl) { R("r", recv(s, buf, sizeof buf, fl)); }
static void wr(int s, int fl) { R("w", send(s, "hello", 5, fl | MSG_NOSIGNAL)); }
static int soerr(int s) { int e = 0; socklen_t l = sizeof e; getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l); return e; }
static struct sockaddr_in sa(void) {
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(PORT);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); return a;
}
static void *thr_rd(void *p) { int s = *(int *)p; ssize_t r = recv(s, buf + 100, 100, 0); return (void *)(r < 0 ? (long)-errno : (long)r); }
static char **ARGV;
static const char *SC;

static void client(int up, int go, int out) {
  int nb = SC[0] != 'b';
  int s = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
  struct sockaddr_in a = sa();
  if (write(up, "s", 1)) {}
  int r = connect(s, (void *)&a, sizeof a);
  add("c:%s", r ? en(errno) : "0");
  if (nb) { int fl = fcntl(s, F_GETFL); fcntl(s, F_SETFL, fl & ~O_NONBLOCK); }
  pid_t fk = -1;
  if (!strcmp(SC, "nbforkw")) { fk = fork(); if (fk == 0) { pause(); _exit(0); } }
  int ep0 = -1;
  if (!strncmp(SC, "pre", 3)) {
    // epoll (pre-et: edge triggered, pre-lt: level) set up before the reset
    ep0 = epoll_create1(0);
    struct epoll_event ev = {EPOLLIN | EPOLLOUT | EPOLLRDHUP | (!strcmp(SC, "pre-et") ? EPOLLET : 0), {.fd = s}};
    epoll_ctl(ep0, EPOLL_CTL_ADD, s, &ev);
  }
  if (write(up, "x", 1)) {}
  char c; if (read(go, &c, 1)) {}
  if (ep0 >= 0) {
    for (int i = 0; i < 2; i++) { struct epoll_event e = {0}; int n = epoll_wait(ep0, &e, 1, 200);
      add("e%d%s", n, n > 0 ? rev(e.events) : ""); }
    rd(s, 0); rd(s, 0);
  }
  if (fk > 0) { kill(fk, SIGKILL); waitpid(fk, 0, 0); }
  if (!strcmp(SC, "rd") || !strcmp(SC, "bconnr")) { rd(s, 0); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "wr") || !strcmp(SC, "bconn") || !strcmp(SC, "nbforkw")) { wr(s, 0); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "poll")) {
    struct pollfd p = {s, POLLIN | POLLOUT | POLLRDHUP, 0}; int n = poll(&p, 1, 0); add("p%d%s", n, rev(p.revents));
    rd(s, 0); rd(s, 0);
  } else if (!strcmp(SC, "poll2")) {
    struct pollfd p = {s, POLLIN | POLLOUT | POLLRDHUP, 0}; int n = poll(&p, 1, 0); add("p%d%s", n, rev(p.revents));
    n = poll(&p, 1, 0); add("p%d%s", n, rev(p.revents)); rd(s, 0); n = poll(&p, 1, 0); add("p%d%s", n, rev(p.revents));
  } else if (!strncmp(SC, "ep", 2)) {
    int ep = epoll_create1(0);
    struct epoll_event ev = {EPOLLIN | EPOLLOUT | EPOLLRDHUP | (!strcmp(SC, "epet") ? EPOLLET : 0), {.fd = s}};
    add("ctl%d", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    for (int i = 0; i < 2; i++) { struct epoll_event e = {0}; int n = epoll_wait(ep, &e, 1, 50);
      add("e%d%s", n, n > 0 ? rev(e.events) : ""); }
    rd(s, 0); rd(s, 0);
  } else if (!strcmp(SC, "sel")) {
    fd_set r1, w1, x1; FD_ZERO(&r1); FD_ZERO(&w1); FD_ZERO(&x1); FD_SET(s, &r1); FD_SET(s, &w1); FD_SET(s, &x1);
    struct timeval tv = {0, 0}; int n = select(s + 1, &r1, &w1, &x1, &tv);
    add("sel%d:%d%d%d", n, FD_ISSET(s, &r1), FD_ISSET(s, &w1), FD_ISSET(s, &x1)); rd(s, 0); rd(s, 0);
  } else if (!strcmp(SC, "soerr")) { add("so:%s", en(soerr(s))); add("so:%s", en(soerr(s))); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "peek")) { rd(s, MSG_PEEK); rd(s, MSG_PEEK); rd(s, 0); }
  else if (!strcmp(SC, "dontwait")) { rd(s, MSG_DONTWAIT); rd(s, MSG_DONTWAIT); wr(s, MSG_DONTWAIT); }
  else if (!strcmp(SC, "rmmsg")) {
    struct iovec v = {buf, 100}; struct mmsghdr m = {{0, 0, &v, 1, 0, 0, 0}, 0};
    int n = recvmmsg(s, &m, 1, 0, 0); if (n < 0) add("rm:%s", en(errno)); else add("rm%d/%u", n, m.msg_len);
    rd(s, 0); wr(s, 0);
  } else if (!strcmp(SC, "smmsg")) {
    struct iovec v = {"hello", 5}; struct mmsghdr m = {{0, 0, &v, 1, 0, 0, 0}, 0};
    int n = sendmmsg(s, &m, 1, MSG_NOSIGNAL); if (n < 0) add("sm:%s", en(errno)); else add("sm%d/%u", n, m.msg_len);
    rd(s, 0); wr(s, 0);
  } else if (!strcmp(SC, "rmsg")) {
    struct iovec v = {buf, 100}; struct msghdr m = {0, 0, &v, 1, 0, 0, 0}; R("rmsg", recvmsg(s, &m, 0)); rd(s, 0);
  } else if (!strcmp(SC, "smsg")) {
    struct iovec v = {"hello", 5}; struct msghdr m = {0, 0, &v, 1, 0, 0, 0}; R("smsg", sendmsg(s, &m, MSG_NOSIGNAL)); rd(s, 0);
  } else if (!strcmp(SC, "rv")) { struct iovec v = {buf, 100}; R("rv", readv(s, &v, 1)); R("rd", read(s, buf, 10)); }
  else if (!strcmp(SC, "wv")) { signal(SIGPIPE, SIG_IGN); struct iovec v = {"hello", 5}; R("wv", writev(s, &v, 1)); R("wv", writev(s, &v, 1)); }
  else if (!strcmp(SC, "sendfile")) {
    int f = open("/etc/hostname", O_RDONLY); signal(SIGPIPE, SIG_IGN);
    R("sf", sendfile(s, f, 0, 5)); R("sf", sendfile(s, f, 0, 5)); rd(s, 0);
  } else if (!strcmp(SC, "splice")) {
    int p[2]; pipe(p); R("sp", splice(s, 0, p[1], 0, 100, 0)); R("sp", splice(s, 0, p[1], 0, 100, 0)); wr(s, 0);
  } else if (!strcmp(SC, "splicew")) {
    int p[2]; pipe(p); if (write(p[1], "hellohello", 10)) {} signal(SIGPIPE, SIG_IGN);
    R("spw", splice(p[0], 0, s, 0, 5, 0)); R("spw", splice(p[0], 0, s, 0, 5, 0)); rd(s, 0);
  } else if (!strcmp(SC, "dup")) { int d = dup(s); rd(d, 0); rd(s, 0); rd(d, 0); }
  else if (!strcmp(SC, "dup2")) { int d = dup(s); wr(d, 0); add("so:%s", en(soerr(s))); rd(s, 0); }
  else if (!strcmp(SC, "fork") || !strcmp(SC, "forkw")) {
    // the child calls first, then the parent
    int w = !strcmp(SC, "forkw");
    int pp[2]; pipe(pp);
    pid_t k = fork();
    if (k == 0) { obs[0] = 0; if (w) wr(s, 0); else rd(s, 0); if (write(pp[1], obs, strlen(obs))) {} _exit(0); }
    waitpid(k, 0, 0); char cb[256] = {0}; if (read(pp[0], cb, 255)) {} add("child[%s]", cb);
    if (w) wr(s, 0); else rd(s, 0); rd(s, 0);
  } else if (!strcmp(SC, "forkp")) {
    // fork, the parent calls first, then the child
    int pp[2], gg[2]; pipe(pp); pipe(gg);
    pid_t k = fork();
    if (k == 0) { obs[0] = 0; char c2; if (read(gg[0], &c2, 1)) {} rd(s, 0); if (write(pp[1], obs, strlen(obs))) {} _exit(0); }
    rd(s, 0); if (write(gg[1], "g", 1)) {}
    waitpid(k, 0, 0); char cb[256] = {0}; if (read(pp[0], cb, 255)) {} add("child[%s]", cb);
  } else if (!strcmp(SC, "exec") || !strcmp(SC, "execlib")) {
    // exec an image that reads fd s: without the library (exec) or with it (execlib)
    int pp[2]; pipe(pp);
    pid_t k = fork();
    if (k == 0) {
      char fs[16], ps[16]; snprintf(fs, 16, "%d", s); snprintf(ps, 16, "%d", pp[1]);
      if (!strcmp(SC, "exec")) unsetenv("LD_PRELOAD");
      execl("/proc/self/exe", "rt31x_lost", "_reader", fs, ps, (char *)0); _exit(127);
    }
    close(pp[1]); waitpid(k, 0, 0); char cb[256] = {0}; if (read(pp[0], cb, 255)) {} add("img[%s]", cb);
    rd(s, 0);
  } else if (!strcmp(SC, "scm")) {
    // the socket passed to a child over a unix socket (SCM_RIGHTS) and closed here; the child reads
    int u[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, u);
    int pp[2]; pipe(pp);
    pid_t k = fork();
    if (k == 0) {
      close(u[0]); obs[0] = 0;
      char cb[CMSG_SPACE(sizeof(int))]; char d; struct iovec v = {&d, 1};
      struct msghdr m = {0, 0, &v, 1, cb, sizeof cb, 0};
      if (recvmsg(u[1], &m, 0) != 1) { add("norecv"); } else {
        int r; memcpy(&r, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof r); rd(r, 0); rd(r, 0); }
      if (write(pp[1], obs, strlen(obs))) {} _exit(0);
    }
    close(u[1]); close(pp[1]);
    char cb[CMSG_SPACE(sizeof(int))] = {0}; struct iovec v = {"x", 1};
    struct msghdr m = {0, 0, &v, 1, cb, sizeof cb, 0};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m); c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &s, sizeof s);
    R("scm", sendmsg(u[0], &m, 0)); close(s);
    waitpid(k, 0, 0); char rb[256] = {0}; if (read(pp[0], rb, 255)) {} add("recvr[%s]", rb);
  } else if (!strcmp(SC, "scmkeep")) {
    // as scm, but the sender keeps it and reads after the receiver
    int u[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, u);
    int pp[2]; pipe(pp);
    pid_t k = fork();
    if (k == 0) {
      close(u[0]); obs[0] = 0;
      char cb[CMSG_SPACE(sizeof(int))]; char d; struct iovec v = {&d, 1};
      struct msghdr m = {0, 0, &v, 1, cb, sizeof cb, 0};
      if (recvmsg(u[1], &m, 0) != 1) { add("norecv"); } else {
        int r; memcpy(&r, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof r); rd(r, 0); }
      if (write(pp[1], obs, strlen(obs))) {} _exit(0);
    }
    close(u[1]); close(pp[1]);
    char cb[CMSG_SPACE(sizeof(int))] = {0}; struct iovec v = {"x", 1};
    struct msghdr m = {0, 0, &v, 1, cb, sizeof cb, 0};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m); c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &s, sizeof s);
    R("scm", sendmsg(u[0], &m, 0));
    waitpid(k, 0, 0); char rb[256] = {0}; if (read(pp[0], rb, 255)) {} add("recvr[%s]", rb); rd(s, 0);
  } else if (!strcmp(SC, "zw")) { R("w0", write(s, "", 0)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "zs")) { R("s0", send(s, "", 0, MSG_NOSIGNAL)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "zv")) { struct iovec v = {buf, 0}; R("v0", writev(s, &v, 1)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "zr")) { R("r0len", recv(s, buf, 0, 0)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "zrd")) { R("read0", read(s, buf, 0)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "oob")) { R("oob", recv(s, buf, 1, MSG_OOB)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "woob")) { R("woob", send(s, "x", 1, MSG_OOB | MSG_NOSIGNAL)); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "shut")) { R("sh", shutdown(s, SHUT_RDWR)); rd(s, 0); rd(s, 0); wr(s, 0); }
  else if (!strcmp(SC, "thr")) {
    pthread_t t1, t2; void *r1, *r2;
    pthread_create(&t1, 0, thr_rd, &s); pthread_create(&t2, 0, thr_rd, &s);
    pthread_join(t1, &r1); pthread_join(t2, &r2);
    long a1 = (long)r1, a2 = (long)r2; if (a1 > a2) { long t = a1; a1 = a2; a2 = t; }
    add("t:%s,%s", a1 < 0 ? en(-a1) : (a1 ? "n" : "0"), a2 < 0 ? en(-a2) : (a2 ? "n" : "0"));
  } else if (!strcmp(SC, "sigpipe")) {
    signal(SIGPIPE, SIG_DFL);
    ssize_t r1 = send(s, "hello", 5, 0); add("w:%s\n", r1 < 0 ? en(errno) : "ok");
    if (write(out, obs, strlen(obs))) {}
    obs[0] = 0;
    ssize_t r2 = send(s, "hello", 5, 0); add("|w:%s", r2 < 0 ? en(errno) : "ok");
  } else if (!strcmp(SC, "close")) { add("cl%d", close(s)); }
  else if (ep0 < 0) add("?");
  add("\n");
  if (write(out, obs, strlen(obs))) {}
}

int main(int argc, char **argv) {
  ARGV = argv;
  if (argc >= 4 && !strcmp(argv[1], "_reader")) {
    int s = atoi(argv[2]), o = atoi(argv[3]);
    rd(s, 0); rd(s, 0);
    if (write(o, obs, strlen(obs))) {}
    return 0;
  }
  if (argc < 4) { fprintf(stderr, "usage: SCEN N PORT\n"); return 2; }
  SC = argv[1]; int n = atoi(argv[2]); PORT = atoi(argv[3]);
  signal(SIGPIPE, SIG_IGN);
  int kw = !strcmp(SC, "bconn") || !strcmp(SC, "bconnr") || !strcmp(SC, "nbforkw");
  int rp[2]; pipe(rp);
  pid_t srv = fork();
  if (srv == 0) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = sa();
    if (bind(l, (void *)&a, sizeof a)) { perror("bind"); _exit(2); }
    listen(l, 128);
    if (write(rp[1], "x", 1)) {}
    pause(); _exit(0);
  }
  char c; if (read(rp[0], &c, 1)) {}
  int up[2], go[2], out[2]; pipe(up); pipe(go); pipe(out);
  pid_t kids[256];
  for (int i = 0; i < n; i++) {
    kids[i] = fork();
    if (kids[i] == 0) { close(out[0]); client(up[1], go[0], out[1]); _exit(0); }
  }
  close(out[1]);
  // every client says "s" before its connect, "x" after it
  int xs = 0, ss = 0;
  while (ss < n || (!kw && xs < n)) { if (read(up[0], &c, 1) != 1) break; if (c == 's') ss++; else xs++; }
  usleep(20000);
  kill(srv, SIGKILL); waitpid(srv, 0, 0);
  while (xs < n) { if (read(up[0], &c, 1) != 1) break; xs++; }
  usleep(30000);
  for (int i = 0; i < n; i++) if (write(go[1], "g", 1)) {}
  static char all[1 << 16]; int k = 0, r;
  while ((r = read(out[0], all + k, sizeof all - 1 - k)) > 0) k += r;
  all[k] = 0;
  for (int i = 0; i < n; i++) {
    int st; waitpid(kids[i], &st, 0);
    if (WIFSIGNALED(st)) { char b[32]; snprintf(b, 32, "KILLED:%d\n", WTERMSIG(st)); strcat(all, b); }
  }
  fputs(all, stdout);
  return 0;
}
