// rt25: red team round 25, process and fd boundaries not tried before: an execve from a
// thread that is not the main one while another thread sleeps in a call on the connection,
// clone(CLONE_FILES) without CLONE_VM (a process that shares our fd table but not our memory)
// closing or replacing the connection's number, close_range(CLOSE_RANGE_CLOEXEC) before an
// exec, a tight RLIMIT_NOFILE (how many connections fit, and whether each works).
// gcc -O1 -pthread -o /tmp/rt25 rt25.c ; gcc -O1 -static -pthread -o /tmp/rt25s rt25.c
// rt25.sh [SCENARIO...] runs each under world.sh tcp and world.sh smc and diffs.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char **environ;
static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }
#define P(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
static const char *en(int e) { static char b[32]; switch (e) {
#define E(x) case x: return #x;
  E(EAGAIN) E(EINTR) E(EPIPE) E(ECONNRESET) E(ENOTCONN) E(EINVAL) E(EBADF) E(ETIMEDOUT)
  E(EMFILE) E(ENOTSOCK) E(ENFILE) E(ENOMEM) E(EPERM)
  default: snprintf(b, sizeof b, "errno%d", e); return b; } }
static long R(const char *tag, long r) { if (r < 0) P("%s -> -1 %s", tag, en(errno)); else P("%s -> %ld", tag, r); return r; }

static char SELF[512], SELFS[512];
static int listener(int *port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 128)) die("listen");
  socklen_t al = sizeof a;
  getsockname(l, (void *)&a, &al);
  *port = ntohs(a.sin_port);
  return l;
}
static int connect_to(int s, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  return connect(s, (void *)&a, sizeof a);
}
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
static int readable(int fd, int ms) { struct pollfd p = {fd, POLLIN, 0}; return poll(&p, 1, ms); }
static void show(const char *tag, int fd, int ms) {
  char b[256]; int n = 0, r = 0, e = 0;
  while (n < (int)sizeof b - 1 && readable(fd, ms) > 0) {
    r = read(fd, b + n, sizeof b - 1 - n);
    if (r <= 0) { e = errno; break; }
    n += r;
  }
  char o[1024]; int k = 0;
  for (int i = 0; i < n && k < 1000; i++) k += snprintf(o + k, sizeof o - k, (b[i] >= 32 && b[i] < 127) ? "%c" : "\\x%02x", (unsigned char)b[i]);
  o[k] = 0;
  P("%s got %d [%s] end=%s", tag, n, o, r < 0 ? en(e) : r == 0 ? "EOF" : "quiet");
}
// The image that answers on fd 20: reads a line, writes "pong\n".
static int helper(int fd) {
  char b[256]; int n = 0, r = 0, e = 0;
  if (getenv("RT25_T0")) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    double d = t.tv_sec + t.tv_nsec / 1e9 - atof(getenv("RT25_T0"));
    P("helper started %s", d < 0.3 ? "at once" : "LATE");
    fprintf(stderr, "helper started after %.3f s\n", d);
  }
  while (n < (int)sizeof b - 1 && readable(fd, 3000) > 0) {
    r = read(fd, b + n, sizeof b - 1 - n);
    if (r <= 0) { e = errno; break; }
    n += r;
    if (memchr(b, '\n', n)) break;
  }
  char o[1024]; int k = 0;
  for (int i = 0; i < n && k < 1000; i++) k += snprintf(o + k, sizeof o - k, (b[i] >= 32 && b[i] < 127) ? "%c" : "\\x%02x", (unsigned char)b[i]);
  o[k] = 0;
  P("helper read %d [%s] end=%s", n, o, r < 0 ? en(e) : r == 0 ? "EOF" : "ok");
  R("helper write", write(fd, "pong\n", 5));
  return 0;
}

// ---- execve from a thread that is not the main one ----
static int TC;
static volatile int texec_mode;  // 0 recv sleeps, 1 send sleeps (full), 2 poll sleeps
static const char *TPATH;
static void *exec_thread(void *a) {
  (void)a;
  usleep(200000);
  dup2(TC, 20);
  char *argv[] = {(char *)TPATH, "helper", 0};
  execve(TPATH, argv, environ);
  die("execve");
  return 0;
}
static void thread_exec(const char *path, int mode) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    TC = c; TPATH = path; texec_mode = mode;
    pthread_t t;
    pthread_create(&t, 0, exec_thread, 0);
    char b[4096];
    if (mode == 0) { recv(c, b, sizeof b, 0); }
    else if (mode == 1) {
      int v = 4096; (void)v;
      memset(b, 'A', sizeof b);
      for (;;) if (send(c, b, sizeof b, MSG_NOSIGNAL) < 0) break;
    } else { struct pollfd q = {c, POLLIN, 0}; poll(&q, 1, -1); }
    _exit(9);
  }
  close(c);
  if (mode == 1) {
    // the child fills the connection; drain what it wrote once the helper runs
    usleep(600000);
    char b[65536]; long n = 0, r;
    while (readable(s, 300) > 0 && (r = recv(s, b, sizeof b, 0)) > 0) n += r;
    P("server drained %s", n > 0 ? "some A" : "nothing");
  } else usleep(600000);
  R("server send", send(s, "ping\n", 5, MSG_NOSIGNAL));
  char b[256]; int n = 0, r;
  // skip the 'A's of mode 1
  while (readable(s, 4000) > 0 && (r = recv(s, b + n, sizeof b - 1 - n, 0)) > 0) {
    n += r;
    if (memchr(b, '\n', n)) break;
    if (n > 200) n = 0;
  }
  b[n] = 0;
  char *pp = strstr(b, "pong");
  P("server got pong: %s", pp ? "yes" : "no");
  int st; waitpid(p, &st, 0);
  P("child status %s %d", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  close(s);
}
static void s_texec_recv_nolib(void) { thread_exec(SELFS, 0); }
static void s_texec_send_nolib(void) { thread_exec(SELFS, 1); }
static void s_texec_poll_nolib(void) { thread_exec(SELFS, 2); }
static void s_texec_recv_lib(void) { thread_exec(SELF, 0); }
static void s_texec_send_lib(void) { thread_exec(SELF, 1); }
static void s_texec_poll_lib(void) { thread_exec(SELF, 2); }

// ---- clone(CLONE_FILES) without CLONE_VM ----
static int CC, CS, CMODE, CPIPE[2];
static char CPATH[64];
static int cf_fn(void *a) {
  (void)a;
  if (CMODE == 0) close(CC);
  else if (CMODE == 1) { close(CC); int f = open(CPATH, O_RDWR); if (f != CC) _exit(3); }
  else if (CMODE == 2) dup2(CPIPE[1], CC);
  else if (CMODE == 3) { char b[16]; int r = read(CC, b, sizeof b); _exit(r == 5 ? 0 : 4); }
  else if (CMODE == 4) { if (write(CC, "child\n", 6) != 6) _exit(5); }
  _exit(0);
}
static void clone_files(int mode) {
  pair(&CC, &CS);
  CMODE = mode;
  strcpy(CPATH, "/tmp/rt25file.XXXXXX");
  int t = mkstemp(CPATH); close(t);
  if (pipe(CPIPE)) die("pipe");
  char *stk = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  fflush(stdout);
  if (mode == 3) send(CS, "hello", 5, 0);
  pid_t p = clone(cf_fn, stk + (1 << 20), CLONE_FILES | SIGCHLD, 0);
  if (p < 0) die("clone");
  int st; waitpid(p, &st, 0);
  P("child exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
  R("parent write", write(CC, "parent\n", 7));
  show("server", CS, 500);
  char b[64];
  R("server send", send(CS, "srv", 3, MSG_NOSIGNAL));
  int r = readable(CC, 300);
  P("parent readable %d", r);
  R("parent read", read(CC, b, sizeof b));
  if (mode == 1) {
    int f = open(CPATH, O_RDONLY); int n = read(f, b, sizeof b); close(f);
    P("file has %d bytes", n);
  }
  if (mode == 2) { fcntl(CPIPE[0], F_SETFL, O_NONBLOCK); int n = read(CPIPE[0], b, sizeof b); P("pipe has %d bytes", n); }
  unlink(CPATH);
  close(CC); close(CS); close(CPIPE[0]); close(CPIPE[1]);
}
static void s_cf_close(void) { clone_files(0); }
static void s_cf_close_open(void) { clone_files(1); }
static void s_cf_dup2_pipe(void) { clone_files(2); }
static void s_cf_read(void) { clone_files(3); }
static void s_cf_write(void) { clone_files(4); }

// ---- close_range(CLOSE_RANGE_CLOEXEC) then exec ----
static void cr_exec(int keep, const char *path) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    dup2(c, 20); close(c);
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC)) die("close_range");
    if (keep) fcntl(20, F_SETFD, 0);
    char *argv[] = {(char *)path, "helper", 0};
    execve(path, argv, environ);
    die("exec");
  }
  // parent keeps its copy of c when !keep (the child's goes at its exec)
  if (keep) close(c);
  usleep(300000);
  R("server send", send(s, "ping\n", 5, MSG_NOSIGNAL));
  show("server", s, keep ? 2000 : 700);
  int st; waitpid(p, &st, 0);
  if (!keep) {
    R("parent send", send(c, "mine\n", 5, MSG_NOSIGNAL));
    show("server", s, 500);
    R("server send2", send(s, "x", 1, MSG_NOSIGNAL));
    char b[16]; R("parent recv", recv(c, b, sizeof b, 0));
    close(c);
  }
  close(s);
}
static void s_cr_cloexec_keep_nolib(void) { cr_exec(1, SELFS); }
static void s_cr_cloexec_keep_lib(void) { cr_exec(1, SELF); }
static void s_cr_cloexec_drop_nolib(void) { cr_exec(0, SELFS); }
static void s_cr_cloexec_drop_lib(void) { cr_exec(0, SELF); }

// ---- a tight RLIMIT_NOFILE: how many connections fit, does each work ----
static void nofile(int lim) {
  int port, l = listener(&port);
  int cp[2];
  if (pipe(cp)) die("pipe");
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    // echo server, unlimited
    close(cp[0]);
    int fds[4096], n = 0;
    for (;;) {
      struct pollfd q[4097]; q[0].fd = l; q[0].events = POLLIN;
      for (int i = 0; i < n; i++) { q[i + 1].fd = fds[i]; q[i + 1].events = POLLIN; }
      if (poll(q, n + 1, 5000) <= 0) _exit(0);
      if (q[0].revents) { int a = accept(l, 0, 0); if (a >= 0) fds[n++] = a; }
      for (int i = 0; i < n; i++) if (q[i + 1].revents) {
        char b[256]; int r = recv(fds[i], b, sizeof b, 0);
        if (r <= 0) { close(fds[i]); fds[i] = fds[--n]; i--; continue; }
        send(fds[i], b, r, MSG_NOSIGNAL);
      }
    }
  }
  close(l);
  // the limit: the numbers up to the highest open one, and lim more (every number below is
  // taken first by placeholders, so that exactly lim are free for the connections)
  int open_now = 0;
  for (int i = 0; i < 1024; i++) if (fcntl(i, F_GETFD) >= 0) open_now = i + 1;
  int holes = 0;
  for (int i = 0; i < open_now; i++) if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDONLY) >= 0) holes++;
  P("holes filled %d", holes > 0);
  struct rlimit rl = {open_now + lim, open_now + lim};
  if (setrlimit(RLIMIT_NOFILE, &rl)) die("setrlimit");
  int c[256], n = 0, err = 0, lost = 0;
  for (n = 0; n < 256; n++) {
    c[n] = socket(AF_INET, SOCK_STREAM, 0);
    if (c[n] < 0) { err = errno; break; }
    if (connect_to(c[n], port)) { err = errno; close(c[n]); break; }
    char b[16]; int m = snprintf(b, sizeof b, "m%d\n", n);
    if (send(c[n], b, m, MSG_NOSIGNAL) != m) { err = errno; P("send %d failed %s", n, en(errno)); n++; break; }
    char r[16]; int k = 0, x;
    while (k < m && (x = recv(c[n], r + k, sizeof r - k, 0)) > 0) k += x;
    if (k != m || memcmp(b, r, m)) { lost++; P("conn %d echo wrong (%d bytes, %s)", n, k, k < 0 ? en(errno) : ""); }
  }
  P("limit +%d: %d connections, then %s, %d wrong", lim, n, en(err), lost);
  // each still works?
  int bad = 0;
  for (int i = 0; i < n; i++) {
    if (send(c[i], "z", 1, MSG_NOSIGNAL) != 1) { bad++; continue; }
    char r; if (recv(c[i], &r, 1, 0) != 1 || r != 'z') bad++;
  }
  P("second round: %d of %d bad", bad, n);
  // after closing half, can we open a file?
  for (int i = 0; i < n; i += 2) close(c[i]);
  int f = open("/dev/null", O_RDONLY);
  P("open after closing half: %s", f >= 0 ? "ok" : en(errno));
  for (int i = 1; i < n; i += 2) close(c[i]);
  int st; kill(p, SIGKILL); waitpid(p, &st, 0);
}
static void s_nofile4(void) { nofile(4); }
static void s_nofile16(void) { nofile(16); }
static void s_nofile64(void) { nofile(64); }

// ---- an epoll set shared by fork: one process changes the set, the other waits ----
// mode 0: the parent adds the connection after the fork; 1: EPOLLONESHOT added before the fork,
// reported once to the child, re-armed by the parent (EPOLL_CTL_MOD); 2: the parent deletes it
// after the fork (the child must then see nothing); 3: the parent adds it after the fork with
// EPOLLET and the child waits twice.
static void ep_fork(int mode) {
  int c, s; pair(&c, &s);
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN | (mode == 1 ? EPOLLONESHOT : 0), .data.u64 = 7};
  if (mode == 1 || mode == 2) epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
  int go[2], back[2];
  if (pipe(go) || pipe(back)) die("pipe");
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    char x;
    for (int round = 0; round < 2; round++) {
      if (read(go[0], &x, 1) != 1) _exit(1);
      struct epoll_event o[4];
      int r = epoll_wait(ep, o, 4, 1500);
      char b[64]; int n = r > 0 ? (int)recv(c, b, sizeof b, MSG_DONTWAIT) : -9;
      P("child round %d: epoll_wait %d data %llu, read %d", round, r, r > 0 ? (unsigned long long)o[0].data.u64 : 0ULL, n);
      if (write(back[1], "k", 1) != 1) _exit(1);
    }
    _exit(0);
  }
  char x;
  // round 0
  if (mode == 0 || mode == 3) { ev.events = EPOLLIN | (mode == 3 ? EPOLLET : 0); epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev); }
  if (mode == 2) epoll_ctl(ep, EPOLL_CTL_DEL, c, &ev);
  send(s, "one", 3, 0);
  usleep(100000);
  if (write(go[1], "g", 1) != 1 || read(back[0], &x, 1) != 1) die("sync");
  // round 1
  if (mode == 1) { ev.events = EPOLLIN | EPOLLONESHOT; R("parent MOD", epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev)); }
  send(s, "two", 3, 0);
  usleep(100000);
  if (write(go[1], "g", 1) != 1 || read(back[0], &x, 1) != 1) die("sync");
  int st; waitpid(p, &st, 0);
  close(c); close(s); close(ep);
}
static void s_ep_add_after_fork(void) { ep_fork(0); }
static void s_ep_oneshot_mod_after_fork(void) { ep_fork(1); }
static void s_ep_del_after_fork(void) { ep_fork(2); }
static void s_ep_add_et_after_fork(void) { ep_fork(3); }

// ---- execve from a thread while another thread's connect waits for a stopped server's CLC ----
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static int HC = -1, HPORT;
static void *hs_connect(void *a) {
  (void)a;
  int c = socket(AF_INET, SOCK_STREAM, 0);
  HC = c;
  connect_to(c, HPORT);
  return 0;
}
static int HS_FORK;
static void s_texec_during_handshake(void) {
  int port, l = listener(&port);
  int sp[2];
  if (pipe(sp)) die("pipe");
  fflush(stdout);
  pid_t srv = fork();
  if (srv == 0) {
    close(sp[0]);
    raise(SIGSTOP);  // stopped until the parent continues it
    int s = accept(l, 0, 0);
    send(s, "ping\n", 5, MSG_NOSIGNAL);
    char b[64]; int n = 0, r;
    while (readable(s, 4000) > 0 && (r = recv(s, b + n, sizeof b - 1 - n, 0)) > 0) { n += r; if (memchr(b, '\n', n)) break; }
    b[n] = 0;
    P("server got [%s]", n > 0 && b[n - 1] == '\n' ? (b[n - 1] = 0, b) : b);
    _exit(0);
  }
  close(l);
  int st;
  waitpid(srv, &st, WUNTRACED);
  HPORT = port;
  pid_t p = fork();
  if (p == 0) {
    pthread_t t;
    pthread_create(&t, 0, hs_connect, 0);
    usleep(100000);  // the connect is under way (the server never answers while stopped)
    if (HS_FORK) {
      // the exec happens in a forked child (single-threaded); this process keeps its copy,
      // its thread's connect goes on, and it reads nothing
      fflush(stdout);
      pid_t q = fork();
      if (q > 0) { int st2; waitpid(q, &st2, 0); pthread_join(t, 0); _exit(0); }
    }
    dup2(HC, 20);
    double t0 = now();
    char tb[32]; snprintf(tb, sizeof tb, "%.6f", t0);
    setenv("RT25_T0", tb, 1);
    char *argv[] = {SELFS, "helper", 0};
    execve(SELFS, argv, environ);
    die("execve");
  }
  usleep(600000);
  kill(srv, SIGCONT);
  waitpid(srv, &st, 0);
  waitpid(p, &st, 0);
  P("child status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
}

static void s_forkexec_during_handshake(void) { HS_FORK = 1; s_texec_during_handshake(); HS_FORK = 0; }

struct sc { const char *n; void (*f)(void); };
static struct sc SC[] = {
#define S(x) {#x, s_##x},
  S(texec_recv_nolib) S(texec_send_nolib) S(texec_poll_nolib) S(texec_recv_lib) S(texec_send_lib) S(texec_poll_lib)
  S(cf_close) S(cf_close_open) S(cf_dup2_pipe) S(cf_read) S(cf_write)
  S(cr_cloexec_keep_nolib) S(cr_cloexec_keep_lib) S(cr_cloexec_drop_nolib) S(cr_cloexec_drop_lib)
  S(nofile4) S(nofile16) S(nofile64)
  S(texec_during_handshake) S(forkexec_during_handshake)
  S(ep_add_after_fork) S(ep_oneshot_mod_after_fork) S(ep_del_after_fork) S(ep_add_et_after_fork)
  {0, 0}};

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "helper")) return helper(20);
  char *d = strrchr(argv[0], '/');
  snprintf(SELF, sizeof SELF, "%s", realpath("/proc/self/exe", 0) ? realpath("/proc/self/exe", 0) : argv[0]);
  (void)d;
  snprintf(SELFS, sizeof SELFS, "%ss", SELF);
  if (SELF[strlen(SELF) - 1] == 's') { SELFS[strlen(SELFS) - 1] = 0; }
  if (argc < 2) { for (struct sc *s = SC; s->n; s++) printf("%s ", s->n); printf("\n"); return 0; }
  signal(SIGPIPE, SIG_IGN);
  for (int i = 1; i < argc; i++)
    for (struct sc *s = SC; s->n; s++)
      if (!strcmp(s->n, argv[i])) { P("== %s", s->n); s->f(); }
  return 0;
}
