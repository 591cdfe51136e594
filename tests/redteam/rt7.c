// rt7: a number closed (and reused) while another thread's call drives its CLC handshake.
// gcc -O2 -pthread -o /tmp/rt7/rt7 rt7.c ; world.sh smc|tcp /tmp/rt7/rt7 SCENARIO ; diff.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }
static void msleep(int ms) { usleep(ms * 1000); }
#define P(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

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
static void set_nb(int fd, int on) {
  int f = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? f | O_NONBLOCK : f & ~O_NONBLOCK);
}
// Client whose handshake is under way: non-blocking connect to our own listener, nobody accepts.
static int hs_client(int port) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  set_nb(c, 1);
  int r = connect_to(c, port);
  if (r && errno != EINPROGRESS) die("connect");
  struct pollfd p = {c, POLLOUT, 0};
  poll(&p, 1, 300);
  set_nb(c, 0);
  return c;
}
static int fdcount(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    int dm = 0; socklen_t dl = 4;
    if (getsockopt(atoi(e->d_name), SOL_SOCKET, SO_DOMAIN, &dm, &dl) == 0 && dm == AF_UNIX) continue;  // the library's daemon connection
    n++;
  }
  closedir(d);
  return n - 1;
}
static void fdlist(const char *tag) {
  char b[4096] = "", l[512], path[64];
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int dfd = dirfd(d);
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dfd) continue;
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, l, sizeof l - 1);
    l[n > 0 ? n : 0] = 0;
    if (strncmp(l, "socket:", 7) == 0) { int dm = 0; socklen_t dl = 4; getsockopt(atoi(e->d_name), SOL_SOCKET, SO_DOMAIN, &dm, &dl); strcpy(l, dm == AF_UNIX ? "unix" : "inet"); }
    if (strncmp(l, "pipe:", 5) == 0) strcpy(l, "pipe");
    if (strncmp(l, "anon_inode:", 11) == 0) strcpy(l, l + 11);
    snprintf(b + strlen(b), sizeof b - strlen(b), " %s=%s", e->d_name, l);
  }
  closedir(d);
  P("%s fds:%s", tag, b);
}

// The highest-numbered inet socket above 100 (the library's private duplicate), or -1.
static int find_priv(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int best = -1;
  while ((e = readdir(d))) {
    int f = atoi(e->d_name), dm = 0;
    socklen_t dl = 4;
    if (f > 100 && f != 251 && getsockopt(f, SOL_SOCKET, SO_DOMAIN, &dm, &dl) == 0 && dm == AF_INET && f > best) best = f;
  }
  closedir(d);
  return best;
}
static int privp = -1, privw = -1;
// PRIV=early|late: dup2 a pipe onto that number (TCP: no such number, so onto 300 instead).
static void priv_dup2(const char *when) {
  const char *e = getenv("PRIV");
  if (!e || strcmp(e, when)) return;
  int p = find_priv();
  P("private dup present: %s", p >= 0 ? "yes" : "no");
  if (p < 0) p = 300;
  int q[2]; pipe(q);
  int r = dup2(q[0], p);
  close(q[0]);
  privp = p; privw = q[1];
  write(privw, "priv data", 9);
  P("dup2(pipe, private number) = %s", r == p ? "ok" : strerror(errno));
}
// FORK=early|late: fork there; the child lists its fds, sleeps 2 s and exits.
static pid_t forked;
static void fork_at(const char *when) {
  const char *e = getenv("FORK");
  if (!e || strcmp(e, when)) return;
  forked = fork();
  if (forked == 0) {
    fdlist("child");
    msleep(2000);
    _exit(0);
  }
}
static volatile int tid;
static int tstate(void) {
  char p[64], b[256];
  snprintf(p, sizeof p, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(p, "r");
  if (!f) return 'X';
  size_t n = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[n] = 0;
  char *q = strrchr(b, ')');
  return q ? q[2] : '?';
}
static volatile int tdone;
// Waits until the thread sleeps (3 samples in a row, 20 ms apart) or returned.
static void wait_sleep(void) {
  int k = 0;
  for (int i = 0; i < 300 && k < 3; i++) {
    msleep(20);
    if (tdone) break;
    k = tstate() == 'S' ? k + 1 : 0;
  }
  P("thread %s", tdone ? "returned already" : "sleeps");
  if (getenv("STATES")) {
    char st[64] = ""; for (int i = 0; i < 40 && !tdone; i++) { st[i] = tstate(); msleep(10); }
    P("states: %s", st);
  }
}

static int C;  // the client number
static char tres[512];
static int T_op;
enum { OP_RECV, OP_READ, OP_READV, OP_RECVMSG, OP_SEND, OP_WRITE, OP_WRITEV, OP_SENDMSG, OP_SENDFILE, OP_SPLICE_IN, OP_SPLICE_OUT, OP_SHUTDOWN, OP_FIONREAD, OP_POLL, OP_EPOLL, OP_SENDMMSG, OP_RECVMMSG };
static int src_fd;  // sendfile source / splice pipe
static int ep_fd;
static void *worker(void *x) {
  (void)x;
  tid = syscall(SYS_gettid);
  char b[256];
  ssize_t r = -1;
  int e = 0;
  struct iovec v = {b, sizeof b};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
  switch (T_op) {
  case OP_RECV: r = recv(C, b, sizeof b, 0); break;
  case OP_READ: r = read(C, b, sizeof b); break;
  case OP_READV: r = readv(C, &v, 1); break;
  case OP_RECVMSG: r = recvmsg(C, &m, 0); break;
  case OP_SEND: r = send(C, "SENDDATA", 8, 0); break;
  case OP_WRITE: r = write(C, "WRITDATA", 8); break;
  case OP_WRITEV: v.iov_base = "WRTVDATA"; v.iov_len = 8; r = writev(C, &v, 1); break;
  case OP_SENDMSG: v.iov_base = "SMSGDATA"; v.iov_len = 8; r = sendmsg(C, &m, 0); break;
  case OP_SENDFILE: r = sendfile(C, src_fd, NULL, 8); break;
  case OP_SPLICE_IN: r = splice(src_fd, NULL, C, NULL, 8, 0); break;
  case OP_SPLICE_OUT: r = splice(C, NULL, src_fd, NULL, 64, 0); break;
  case OP_SENDMMSG: { struct iovec w = {"MMSGDATA", 8}; struct mmsghdr mm = {.msg_hdr = {.msg_iov = &w, .msg_iovlen = 1}}; r = sendmmsg(C, &mm, 1, 0); break; }
  case OP_RECVMMSG: { struct mmsghdr mm = {.msg_hdr = {.msg_iov = &v, .msg_iovlen = 1}}; r = recvmmsg(C, &mm, 1, 0, NULL); if (r > 0) r = mm.msg_len; break; }
  case OP_SHUTDOWN: r = shutdown(C, SHUT_WR); break;
  case OP_FIONREAD: { int q = -7; r = ioctl(C, FIONREAD, &q); e = errno; snprintf(tres, sizeof tres, "ioctl=%zd q=%d e=%s", r, q, r < 0 ? strerror(e) : "-"); tdone = 1; return NULL; }
  case OP_POLL: { struct pollfd p = {C, POLLIN, 0}; r = poll(&p, 1, 3000); snprintf(tres, sizeof tres, "poll=%zd revents=%x", r, p.revents); tdone = 1; return NULL; }
  case OP_EPOLL: { struct epoll_event ev; r = epoll_wait(ep_fd, &ev, 1, 3000); snprintf(tres, sizeof tres, "epoll_wait=%zd ev=%x", r, r > 0 ? ev.events : 0); tdone = 1; return NULL; }
  }
  e = errno;
  int n = snprintf(tres, sizeof tres, "r=%zd", r);
  if (r < 0) snprintf(tres + n, sizeof tres - n, " e=%s", strerror(e));
  else if (T_op <= OP_RECVMSG || T_op == OP_SPLICE_OUT || T_op == OP_RECVMMSG) snprintf(tres + n, sizeof tres - n, " [%.*s]", (int)(r > 0 ? r : 0), b);
  tdone = 1;
  return NULL;
}

static void hexfile(const char *tag, int fd) {
  unsigned char b[2048];
  ssize_t n = pread(fd, b, sizeof b, 0);
  char s[5000] = "";
  for (ssize_t i = 0; i < n && i < 64; i++) sprintf(s + strlen(s), "%02x", b[i]);
  P("%s: %zd bytes %s", tag, n, s);
}
static void drain(const char *tag, int fd, int ms) {
  char b[4096];
  struct pollfd p = {fd, POLLIN, 0};
  int tot = 0;
  char s[300] = "";
  for (;;) {
    int r = poll(&p, 1, ms);
    if (r <= 0) { P("%s: %d bytes then %s [%s]", tag, tot, r == 0 ? "timeout" : "pollerr", s); return; }
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n <= 0) { P("%s: %d bytes then %s [%s]", tag, tot, n == 0 ? "EOF" : strerror(errno), s); return; }
    for (ssize_t i = 0; i < n && strlen(s) < 200; i++) sprintf(s + strlen(s), (b[i] >= 32 && b[i] < 127) ? "%c" : "\\x%02x", (unsigned char)b[i]);
    tot += n;
  }
}

// reuse kinds
enum { RU_PIPE, RU_FILE, RU_SOCK, RU_EPOLL, RU_NONE, RU_DUP2PIPE, RU_KEEP, RU_CRANGE };
static int put_at(int want, int f) {
  if (f == want) return f;
  int r = dup2(f, want);
  close(f);
  return r;
}

// SERVER=1: the number is an accepted socket whose handshake waits for its client (a child
// process that stays silent for 1.5 s, then writes "late" and reads until EOF).
static int main_server(int ru) {
  int n0 = fdcount();
  int port, port2;
  int l = listener(&port), l2 = listener(&port2);
  char tmpl[] = "/tmp/rt7/srcXXXXXX";
  int pfd[2] = {-1, -1};
  if (T_op == OP_SENDFILE) { src_fd = mkstemp(tmpl); unlink(tmpl); write(src_fd, "FILEDATA", 8); lseek(src_fd, 0, SEEK_SET); }
  if (T_op == OP_SPLICE_IN) { pipe(pfd); write(pfd[1], "PIPEDATA", 8); src_fd = pfd[0]; }
  if (T_op == OP_SPLICE_OUT) { pipe(pfd); src_fd = pfd[1]; }
  pid_t ch = fork();
  if (ch == 0) {
    close(l); close(l2);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    set_nb(c, 1);
    connect_to(c, port);
    msleep(1500);
    set_nb(c, 0);
    write(c, "late", 4);
    drain("client reads", c, 2000);
    _exit(0);
  }
  set_nb(l, 1);
  struct pollfd pl = {l, POLLIN, 0};
  poll(&pl, 1, 2000);
  C = accept4(l, 0, 0, SOCK_NONBLOCK);
  set_nb(C, 0);
  P("accepted fd %d", C);
  if (T_op == OP_EPOLL) { ep_fd = epoll_create1(0); struct epoll_event ev = {.events = EPOLLIN, .data.fd = C}; epoll_ctl(ep_fd, EPOLL_CTL_ADD, C, &ev); }
  pthread_t th;
  pthread_create(&th, 0, worker, 0);
  wait_sleep();
  int other = -1, n2 = -1, s2 = -1;
  char ftmpl[] = "/tmp/rt7/fileXXXXXX";
  if (ru == RU_DUP2PIPE) {
    int q[2]; pipe(q);
    P("dup2(pipe, c) = %d", dup2(q[0], C));
    close(q[0]); other = q[1]; write(other, "pipe data", 9);
  } else if (ru == RU_CRANGE) {
    P("close_range(c, ~0) = %d", close_range(C, ~0U, 0));
    int q[2]; pipe(q); n2 = put_at(C, q[0]); other = q[1]; write(other, "pipe data", 9);
    P("reused at c: %d", n2);
  } else if (ru != RU_KEEP) {
    P("close(c) = %d", close(C));
    if (ru == RU_PIPE) { int q[2]; pipe(q); n2 = put_at(C, q[0]); other = q[1]; write(other, "pipe data", 9); }
    if (ru == RU_FILE) { int f = mkstemp(ftmpl); unlink(ftmpl); n2 = put_at(C, f); }
    if (ru == RU_SOCK) { int s = socket(AF_INET, SOCK_STREAM, 0); n2 = put_at(C, s); set_nb(n2, 1); connect_to(n2, port2); set_nb(n2, 0); }
    P("reused at c: %d", n2);
  }
  if (ru == RU_SOCK) { s2 = accept(l2, 0, 0); }
  for (int i = 0; i < 500 && !tdone; i++) msleep(10);
  if (!tdone) { P("thread HANGS"); fdlist("hang"); kill(ch, 9); _exit(3); }
  pthread_join(th, 0);
  P("thread: %s", tres);
  int st; waitpid(ch, &st, 0);
  if (ru == RU_PIPE || ru == RU_DUP2PIPE) { char b[64]; set_nb(C, 1); ssize_t r = read(C, b, sizeof b); P("read(reused pipe) = %zd [%.*s]", r, (int)(r > 0 ? r : 0), b); }
  if (ru == RU_FILE) hexfile("file at c", C);
  if (ru == RU_SOCK) { drain("s2 reads", s2, 300); close(s2); }
  if (T_op == OP_SPLICE_OUT) { char b[64]; set_nb(pfd[0], 1); ssize_t r = read(pfd[0], b, sizeof b); P("pipe got %zd [%.*s]", r, (int)(r > 0 ? r : 0), b); }
  if (n2 >= 0) close(n2); else close(C);
  if (other >= 0) close(other);
  if (pfd[0] >= 0) { close(pfd[0]); close(pfd[1]); }
  if (T_op == OP_SENDFILE) close(src_fd);
  if (ep_fd) close(ep_fd);
  close(l); close(l2);
  msleep(300);
  int n1 = fdcount();
  P("fd count before %d after %d", n0, n1);
  if (n1 != n0) fdlist("after");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) { P("usage: rt7 OP REUSE"); return 1; }
  signal(SIGPIPE, SIG_IGN);
  const char *ops[] = {"recv", "read", "readv", "recvmsg", "send", "write", "writev", "sendmsg", "sendfile", "splice_in", "splice_out", "shutdown", "fionread", "poll", "epoll", "sendmmsg", "recvmmsg", 0};
  const char *rus[] = {"pipe", "file", "sock", "epoll", "none", "dup2pipe", "keep", "crange", 0};
  T_op = -1;
  for (int i = 0; ops[i]; i++) if (!strcmp(ops[i], argv[1])) T_op = i;
  int ru = -1;
  for (int i = 0; rus[i]; i++) if (!strcmp(rus[i], argv[2])) ru = i;
  if (T_op < 0 || ru < 0) { P("bad args"); return 1; }
  if (getenv("SERVER")) return main_server(ru);
  int n0 = fdcount();
  int port, port2;
  int l = listener(&port), l2 = listener(&port2);
  // sources
  char tmpl[] = "/tmp/rt7/srcXXXXXX";
  int pfd[2] = {-1, -1};
  if (T_op == OP_SENDFILE) { src_fd = mkstemp(tmpl); unlink(tmpl); write(src_fd, "FILEDATA", 8); lseek(src_fd, 0, SEEK_SET); }
  if (T_op == OP_SPLICE_IN) { pipe(pfd); write(pfd[1], "PIPEDATA", 8); src_fd = pfd[0]; }
  if (T_op == OP_SPLICE_OUT) { pipe(pfd); src_fd = pfd[1]; }
  C = hs_client(port);
  if (T_op == OP_EPOLL) { ep_fd = epoll_create1(0); struct epoll_event ev = {.events = EPOLLIN, .data.fd = C}; epoll_ctl(ep_fd, EPOLL_CTL_ADD, C, &ev); }
  P("client fd %d", C);
  pthread_t th;
  pthread_create(&th, 0, worker, 0);
  wait_sleep();
  fdlist("during");
  // reuse the number
  int other = -1, n2 = -1, s2 = -1;
  char ftmpl[] = "/tmp/rt7/fileXXXXXX";
  if (ru == RU_DUP2PIPE) {
    int q[2]; pipe(q);
    P("dup2(pipe, c) = %d", dup2(q[0], C));
    close(q[0]);
    other = q[1];
    write(other, "pipe data", 9);
  } else if (ru == RU_CRANGE) {
    P("close_range(c, ~0) = %d", close_range(C, ~0U, 0));
    int q[2]; pipe(q); n2 = put_at(C, q[0]); other = q[1]; write(other, "pipe data", 9);
    P("reused at c: %d", n2);
  } else if (ru != RU_KEEP) {
    P("close(c) = %d", close(C));
    if (ru == RU_PIPE) { int q[2]; pipe(q); n2 = put_at(C, q[0]); other = q[1]; write(other, "pipe data", 9); }
    if (ru == RU_FILE) { int f = mkstemp(ftmpl); unlink(ftmpl); n2 = put_at(C, f); }
    if (ru == RU_SOCK) { int s = socket(AF_INET, SOCK_STREAM, 0); n2 = put_at(C, s); set_nb(n2, 1); connect_to(n2, port2); set_nb(n2, 0); }
    if (ru == RU_EPOLL) { n2 = put_at(C, epoll_create1(0)); }
    P("reused at c: %d", n2);
  }
  priv_dup2("early");
  fork_at("early");
  msleep(100);
  int s = accept(l, 0, 0);
  P("accept s=%d", s);
  if (ru == RU_SOCK) { s2 = accept(l2, 0, 0); P("accept s2=%d", s2); }
  msleep(300);
  priv_dup2("late");
  fork_at("late");
  write(s, "late", 4);
  // peer view
  if (forked) { for (int i = 0; i < 100 && !tdone; i++) msleep(10); drain("peer s reads (child alive)", s, 500); }
  drain("peer s reads", s, 1000);
  for (int i = 0; i < 300 && !tdone; i++) msleep(10);
  if (!tdone) {
    P("thread still blocked after 3s: closing peer");
    shutdown(s, SHUT_RDWR);
    for (int i = 0; i < 300 && !tdone; i++) msleep(10);
  }
  if (!tdone) { P("thread HANGS"); fdlist("hang"); _exit(3); }
  pthread_join(th, 0);
  P("thread: %s", tres);
  // what the reused number sees
  if (ru == RU_PIPE || ru == RU_DUP2PIPE) {
    char b[64]; set_nb(C, 1); ssize_t r = read(C, b, sizeof b);
    P("read(reused pipe) = %zd [%.*s]", r, (int)(r > 0 ? r : 0), b);
  }
  if (ru == RU_FILE) hexfile("file at c", C);
  if (ru == RU_SOCK) {
    int w = send(n2, "N2", 2, MSG_NOSIGNAL);
    P("send(new sock)=%d %s", w, w < 0 ? strerror(errno) : "");
    drain("s2 reads", s2, 300);
    write(s2, "S2", 2);
    char b[16]; struct pollfd p = {n2, POLLIN, 0}; poll(&p, 1, 500);
    ssize_t r = recv(n2, b, sizeof b, MSG_DONTWAIT);
    P("recv(new sock)=%zd %s [%.*s]", r, r < 0 ? strerror(errno) : "", (int)(r > 0 ? r : 0), b);
  }
  if (ru == RU_EPOLL) { struct epoll_event ev; P("epoll_wait(reused)=%d", epoll_wait(C, &ev, 1, 0)); }
  if (T_op == OP_SPLICE_OUT) { char b[64]; set_nb(pfd[0], 1); ssize_t r = read(pfd[0], b, sizeof b); P("pipe got %zd [%.*s]", r, (int)(r > 0 ? r : 0), b); }
  if (T_op == OP_SENDFILE) P("sendfile src offset %ld", (long)lseek(src_fd, 0, SEEK_CUR));
  if (T_op == OP_SPLICE_IN) { char b[64]; set_nb(pfd[0], 1); ssize_t r = read(pfd[0], b, sizeof b); P("splice src pipe left %zd", r); }
  if (privp >= 0) {
    char b[64]; set_nb(privp, 1); ssize_t r = read(privp, b, sizeof b);
    P("read(pipe at private number) = %zd [%.*s]", r, (int)(r > 0 ? r : 0), b);
    P("close(it) = %d", close(privp)); close(privw);
  }
  // peer end: write and close
  drain("peer s reads (2)", s, 200);
  if (forked > 0) {
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    int st; waitpid(forked, &st, 0); forked = -1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    P("child exited (%ld ms later)", (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000);
    drain("peer s reads after the child exited", s, 500);
  }
  close(s);
  if (s2 >= 0) close(s2);
  if (n2 >= 0) close(n2); else close(C);
  if (other >= 0) close(other);
  if (pfd[0] >= 0) { close(pfd[0]); close(pfd[1]); }
  if (T_op == OP_SENDFILE) close(src_fd);
  if (ep_fd) close(ep_fd);
  close(l); close(l2);
  msleep(300);
  int n1 = fdcount();
  P("fd count before %d after %d", n0, n1);
  if (n1 != n0) fdlist("after");
  return 0;
}
