// rt10: process and fd boundaries, TCP vs the library (round 10): images without the library
// reached by paths the exec check does not read (a script whose interpreter is static, execl,
// a posix_spawn dup2 onto a non-standard fd with the environment cleared, a vfork child's
// exec), processes that end without a close, shutdown and reads split across fork/vfork/
// clone(CLONE_VM), io_uring after connections exist, a socket connected to itself.
// gcc -O1 -pthread -o /tmp/rt10 rt10.c ; gcc -O1 -static -o /tmp/rt10s rt10.c (the helper)
// rt10.sh runs every scenario once under world.sh tcp and once under world.sh smc and diffs.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
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
  default: snprintf(b, sizeof b, "errno%d", e); return b; } }
static long R(const char *tag, long r) { if (r < 0) P("%s -> -1 %s", tag, en(errno)); else P("%s -> %ld", tag, r); return r; }

static char SELF[512], SELFS[512];  // this program, its static build
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
static int LPORT, L = -1;
// A connected pair (client c, server s), one byte each way so that the handshake is over.
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
// What arrives on fd within ms (until EOF/error), printed escaped.
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

// ---- the helper: an image that reads and writes fd 20 (or `fd`) with plain system calls ----
static int helper(int fd) {
  char b[256]; int n = 0, r = 0, e = 0;
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

// The parent's side of a child that got c as fd 20: the server end greets and shows the answer.
static void serve_child(int s, pid_t pid) {
  R("server send", send(s, "ping\n", 5, MSG_NOSIGNAL));
  show("server", s, 4000);
  int st; waitpid(pid, &st, 0);
}

// fork, fd 20 = c, exec the image `path` with argv/env
static void fork_exec5(int c, int s, const char *path, char *const argv[], char *const envp[], int use_execl) {
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    dup2(c, 20);
    close(c);
    if (use_execl) execl(path, path, "helper", (char *)0);
    else if (envp) execve(path, argv, envp);
    else execv(path, argv);
    die("exec");
  }
  close(c);
  serve_child(s, p);
  close(s);
}

static void s_exec_static(void) {
  int c, s; pair(&c, &s);
  char *argv[] = {SELFS, "helper", 0};
  fork_exec5(c, s, SELFS, argv, 0, 0);
}
static void s_execl_static(void) {
  int c, s; pair(&c, &s);
  fork_exec5(c, s, SELFS, 0, 0, 1);
}
static void s_exec_noenv(void) {
  int c, s; pair(&c, &s);
  char *argv[] = {SELF, "helper", 0}, *envp[] = {"X=1", 0};
  fork_exec5(c, s, SELF, argv, envp, 0);
}
// a script whose interpreter is the static helper
static void s_exec_script_static(void) {
  char path[] = "/tmp/rt10script.XXXXXX";
  int f = mkstemp(path);
  dprintf(f, "#!%s\n", SELFS);
  fchmod(f, 0755); close(f);
  int c, s; pair(&c, &s);
  char *argv[] = {path, 0};
  fork_exec5(c, s, path, argv, 0, 0);
  unlink(path);
}
// env -i IMAGE: env runs the library, then execs with an empty environment
static void s_exec_env_i(void) {
  int c, s; pair(&c, &s);
  char *argv[] = {"/usr/bin/env", "-i", SELF, "helper", 0};
  fork_exec5(c, s, "/usr/bin/env", argv, 0, 0);
}
// a setgid copy of the helper (the loader drops LD_PRELOAD)
static void s_exec_setgid(void) {
  char path[] = "/tmp/rt10sgid.XXXXXX";
  int f = mkstemp(path), in = open(SELF, O_RDONLY);
  char b[65536]; int r;
  while ((r = read(in, b, sizeof b)) > 0) if (write(f, b, r) != r) die("copy");
  close(in);
  if (fchown(f, 0, 65534) || fchmod(f, 02755)) die("chmod");
  close(f);
  int c, s; pair(&c, &s);
  char *argv[] = {path, "helper", 0};
  fork_exec5(c, s, path, argv, 0, 0);
  unlink(path);
}
// one process of two holding the connection execs an image without the library (the switch
// to TCP), the other (a fork sibling with the library) goes on using it afterwards
static void s_sibling_after_nolib_exec(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t sib = fork();
  if (sib == 0) {  // the sibling: waits for the helper to be done, then talks
    close(s);
    usleep(1500000);
    R("sibling send", send(c, "fromC\n", 6, MSG_NOSIGNAL));
    show("sibling", c, 2000);
    _exit(0);
  }
  pid_t p = fork();
  if (p == 0) {
    close(s);
    dup2(c, 20);
    close(c);
    char *argv[] = {SELFS, "helper", 0};
    execv(SELFS, argv);
    _exit(127);
  }
  close(c);
  R("server send", send(s, "ping\n", 5, MSG_NOSIGNAL));
  show("server (helper's answer, the sibling's)", s, 2500);
  R("server send", send(s, "toC", 3, MSG_NOSIGNAL));
  int st; waitpid(p, &st, 0);
  waitpid(sib, &st, 0);
  close(s);
}
// the same shape where the peer end's process waits for the exec'd child before it reads
// (DESIGN's residual: the switch waits for the peer's next call, 10 s, then resets)
static void s_exec_nolib_peer_in_waitpid(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); dup2(c, 20); close(c); char *argv[] = {SELFS, "helper", 0}; execv(SELFS, argv); _exit(127); }
  close(c);
  R("server send", send(s, "ping\n", 5, MSG_NOSIGNAL));
  int st; waitpid(p, &st, 0);
  show("server (after waitpid)", s, 500);
  close(s);
}
// chroot into a tree with the dynamic helper and libc but not the library, then exec it with
// LD_PRELOAD unchanged (containers, sandboxes): the loader cannot open the library
static void cp(const char *from, const char *to) {
  int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
  char b[65536]; int r;
  if (in < 0 || out < 0) die("cp");
  while ((r = read(in, b, sizeof b)) > 0) if (write(out, b, r) != r) die("cp write");
  close(in); close(out);
}
static void s_exec_chroot(void) {
  char root[] = "/tmp/rt10root.XXXXXX";
  if (!mkdtemp(root)) die("mkdtemp");
  char p1[600];
  snprintf(p1, sizeof p1, "%s/lib", root); mkdir(p1, 0755);
  snprintf(p1, sizeof p1, "%s/lib64", root); mkdir(p1, 0755);
  snprintf(p1, sizeof p1, "%s/lib/x86_64-linux-gnu", root); mkdir(p1, 0755);
  snprintf(p1, sizeof p1, "%s/lib/x86_64-linux-gnu/libc.so.6", root); cp("/lib/x86_64-linux-gnu/libc.so.6", p1);
  snprintf(p1, sizeof p1, "%s/lib64/ld-linux-x86-64.so.2", root); cp("/lib64/ld-linux-x86-64.so.2", p1);
  snprintf(p1, sizeof p1, "%s/rt10", root); cp(SELF, p1);
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s); dup2(c, 20); close(c);
    if (chroot(root) || chdir("/")) _exit(126);
    char *argv[] = {"/rt10", "helper", 0};
    execv("/rt10", argv);
    _exit(127);
  }
  close(c);
  serve_child(s, p);
  close(s);
  char cmd[700]; snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd)) {}
}
// posix_spawn, file action dup2(c, 20), the environment without the library
static void spawn5(int cloexec) {
  int c, s; pair(&c, &s);
  if (cloexec) fcntl(c, F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, c, 20);
  char *argv[] = {SELF, "helper", 0}, *envp[] = {"X=1", 0};
  pid_t p;
  fflush(stdout);
  R("posix_spawn", posix_spawn(&p, SELF, &fa, 0, argv, envp));
  close(c);
  serve_child(s, p);
  close(s);
}
static void s_spawn_script_static(void) {
  char path[] = "/tmp/rt10sscript.XXXXXX";
  int f = mkstemp(path);
  dprintf(f, "#!%s\n", SELFS);
  fchmod(f, 0755); close(f);
  int c, s; pair(&c, &s);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, c, 20);
  char *argv[] = {path, 0};
  pid_t p;
  fflush(stdout);
  R("posix_spawn", posix_spawn(&p, path, &fa, 0, argv, environ));
  close(c);
  serve_child(s, p);
  close(s);
  unlink(path);
}
static void s_spawn_dup5_noenv(void) { spawn5(0); }
static void s_spawn_dup5_noenv_cloexec(void) { spawn5(1); }
// vfork, dup2(c, 20), exec the static helper
static void s_vfork_exec_static(void) {
  int c, s; pair(&c, &s);
  char *argv[] = {SELFS, "helper", 0};
  fflush(stdout);
  pid_t p = vfork();
  if (p == 0) {
    dup2(c, 20);
    execve(SELFS, argv, environ);
    _exit(127);
  }
  close(c);
  serve_child(s, p);
  close(s);
}

static unsigned char pat(long i) { return (unsigned char)(i * 7 + (i >> 9)); }
static void on_alrm(int sig) { (void)sig; }
// ---- processes that end without a close ----
// The only holder of c leaves with unread bytes: TCP resets the peer.
static void end_unread(int how) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    char b;
    if (recv(c, &b, 1, 0) != 1) _exit(3);  // the first byte, the rest stays unread
    if (how == 0) _exit(0);
    for (;;) pause();
  }
  close(c);
  R("server send 100", send(s, "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", 100, 0));
  if (how == 1) { usleep(200000); kill(p, SIGKILL); }
  int st; waitpid(p, &st, 0);
  usleep(200000);
  char b[16];
  R("server recv after peer's end", recv(s, b, sizeof b, 0));
  R("server send after", send(s, "x", 1, MSG_NOSIGNAL));
  usleep(100000);
  R("server send again", send(s, "x", 1, MSG_NOSIGNAL));
  close(s);
}
static void s_exit_unread(void) { end_unread(0); }
static void s_kill9_unread(void) { end_unread(1); }
// The same with everything read: EOF, then the peer's writes
static void s_exit_read_all(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    char b[10];
    int n = 0;
    while (n < 10) { int r = recv(c, b, 10 - n, 0); if (r <= 0) _exit(3); n += r; }
    _exit(0);
  }
  close(c);
  R("server send 10", send(s, "0123456789", 10, 0));
  int st; waitpid(p, &st, 0);
  char b[16];
  R("server recv after peer's end", recv(s, b, sizeof b, 0));
  R("server send after", send(s, "x", 1, MSG_NOSIGNAL));
  usleep(100000);
  R("server send again", send(s, "x", 1, MSG_NOSIGNAL));
  close(s);
}
// The only holder is killed (nothing unread); the peer asks without waiting: poll, then recv
static void end_nb(int unread) {
  int c, s; pair(&c, &s);
  if (unread) R("server send 100", send(s, "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", 100, 0));
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); for (;;) pause(); }
  close(c);
  usleep(100000);
  kill(p, SIGKILL);
  int st; waitpid(p, &st, 0);
  usleep(300000);
  char b[16];
  R("server recv MSG_DONTWAIT (no poll before)", recv(s, b, sizeof b, MSG_DONTWAIT));
  struct pollfd q = {s, POLLIN | POLLRDHUP, 0};
  int r = poll(&q, 1, 0);
  P("server poll -> %d revents%s%s%s%s", r, q.revents & POLLIN ? " IN" : "", q.revents & POLLRDHUP ? " RDHUP" : "", q.revents & POLLHUP ? " HUP" : "", q.revents & POLLERR ? " ERR" : "");
  R("server recv MSG_DONTWAIT", recv(s, b, sizeof b, MSG_DONTWAIT));
  R("server send", send(s, "x", 1, MSG_NOSIGNAL));
  close(s);
}
static void s_kill9_nb(void) { end_nb(0); }
static void s_kill9_nb_unread(void) { end_nb(1); }
// The only holder ends (SIGKILL or _exit, nothing unread) while the peer waits in poll/epoll
static void end_wait(int use_epoll, int before) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); if (before) _exit(0); usleep(300000); _exit(0); }
  close(c);
  if (before) { int st; waitpid(p, &st, 0); usleep(100000); }
  if (use_epoll) {
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = s}, o = {0};
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    int r = epoll_wait(ep, &o, 1, 3000);
    P("server epoll_wait(3 s) -> %d events%s%s%s", r, o.events & EPOLLIN ? " IN" : "", o.events & EPOLLRDHUP ? " RDHUP" : "", o.events & EPOLLHUP ? " HUP" : "");
    close(ep);
  } else {
    struct pollfd q = {s, POLLIN | POLLRDHUP, 0};
    int r = poll(&q, 1, 3000);
    P("server poll(3 s) -> %d revents%s%s%s", r, q.revents & POLLIN ? " IN" : "", q.revents & POLLRDHUP ? " RDHUP" : "", q.revents & POLLHUP ? " HUP" : "");
  }
  char b[16];
  R("server recv MSG_DONTWAIT", recv(s, b, sizeof b, MSG_DONTWAIT));
  int st; waitpid(p, &st, 0);
  close(s);
}
static void s_exit_while_poll(void) { end_wait(0, 0); }
static void s_exit_while_epoll(void) { end_wait(1, 0); }
static void s_exit_then_poll(void) { end_wait(0, 1); }
static void s_exit_then_epoll(void) { end_wait(1, 1); }
// The same, the peer spinning with poll(0) and recv(MSG_DONTWAIT) for 3 s (a busy loop)
static void spin(int use_poll) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); _exit(0); }
  close(c);
  int st; waitpid(p, &st, 0);
  char b[16]; int r = -1, e = 0, i;
  for (i = 0; i < 300; i++) {
    if (use_poll) { struct pollfd q = {s, POLLIN, 0}; if (poll(&q, 1, 0) == 0) { usleep(10000); continue; } }
    r = recv(s, b, sizeof b, MSG_DONTWAIT); e = errno;
    if (r >= 0 || e != EAGAIN) break;
    usleep(10000);
  }
  P("after the peer's exit: %s within 3 s: recv -> %d %s", i < 300 ? "seen" : "NOT seen", r, r < 0 ? en(e) : "");
  close(s);
}
static void s_exit_spin_recv(void) { spin(0); }
static void s_exit_spin_poll0(void) { spin(1); }
// the peer's process is gone (_exit, nothing unread): epoll_wait(0) and select(0)
#include <sys/select.h>
static void s_exit_epoll0_select0(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); _exit(0); }
  close(c);
  int st; waitpid(p, &st, 0);
  usleep(300000);
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = s}, o = {0};
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  int r = epoll_wait(ep, &o, 1, 0);
  P("epoll_wait(0) -> %d events%s%s", r, o.events & EPOLLIN ? " IN" : "", o.events & EPOLLRDHUP ? " RDHUP" : "");
  fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs);
  struct timeval tv = {0, 0};
  R("select(0)", select(s + 1, &rs, 0, 0, &tv));
  close(ep); close(s);
}
// the peer's process is killed while our send waits for room (its ring full, bytes unread)
static void s_kill9_reader_blocked_writer(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(s); for (;;) pause(); }
  close(c);
  pid_t k = fork();
  if (k == 0) { usleep(700000); kill(p, SIGKILL); _exit(0); }
  static char b[1 << 20];
  long sent = 0; int w;
  struct sigaction sa = {.sa_handler = on_alrm};
  sigaction(SIGALRM, &sa, 0);
  alarm(5);
  while ((w = send(s, b, sizeof b, MSG_NOSIGNAL)) > 0) sent += w;
  int e = errno;
  alarm(0);
  P("blocked writer: send -> -1 %s (after some bytes: %d)", en(e), sent > 0);
  R("send again", send(s, b, 1, MSG_NOSIGNAL));
  int st; waitpid(p, &st, 0); waitpid(k, &st, 0);
  close(s);
}
// the writer's process ends right after its last write (no close): every byte, then EOF
static void s_exit_after_write(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    unsigned char b[100000];
    for (int k = 0; k < (int)sizeof b; k++) b[k] = pat(k);
    if (write(c, b, sizeof b) != sizeof b) _exit(3);
    _exit(0);
  }
  close(c);
  int st; waitpid(p, &st, 0);
  P("writer status %d", WEXITSTATUS(st));
  unsigned char b[50000]; long i = 0, bad = -1; int r, e = 0;
  for (;;) { r = read(s, b, sizeof b); if (r <= 0) { e = errno; break; } for (int k = 0; k < r; k++) if (bad < 0 && b[k] != pat(i + k)) bad = i + k; i += r; }
  P("reader: %ld bytes, first bad %ld, end %s", i, bad, r < 0 ? en(e) : "EOF");
  close(s);
}
// an exec whose close-on-exec fd (set with close_range) was the last holder, the data unread
static void s_exec_cloexec_last_unread(void) {
  int c, s; pair(&c, &s);
  R("server send 100", send(s, "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", 100, 0));
  usleep(50000);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    syscall(SYS_close_range, c, c, CLOSE_RANGE_CLOEXEC);
    execl("/bin/sleep", "sleep", "1", (char *)0);
    _exit(127);
  }
  close(c);
  usleep(400000);
  char b[16];
  R("server recv during the exec'd image", recv(s, b, sizeof b, MSG_DONTWAIT));
  R("server send", send(s, "x", 1, MSG_NOSIGNAL));
  int st; waitpid(p, &st, 0);
  struct sigaction sa = {.sa_handler = on_alrm};
  sigaction(SIGALRM, &sa, 0);
  alarm(3);
  R("server recv after the image exited (alarm 3 s)", recv(s, b, sizeof b, 0));
  alarm(0);
  close(s);
}
static void s_exec_cloexec_last(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    syscall(SYS_close_range, c, c, CLOSE_RANGE_CLOEXEC);
    execl("/bin/sleep", "sleep", "1", (char *)0);
    _exit(127);
  }
  close(c);
  struct pollfd q = {s, POLLIN, 0};
  R("server poll (EOF at the exec)", poll(&q, 1, 700));
  char b[16];
  R("server recv", recv(s, b, sizeof b, MSG_DONTWAIT));
  int st; waitpid(p, &st, 0);
  close(s);
}

// ---- one connection in two processes ----
#define SPLIT (2 << 20)
// the child writes, the parent reads, the server end echoes (a thread)
static void *echo_thread(void *a) {
  int s = *(int *)a; char b[65536]; long n = 0;
  for (;;) {
    int r = recv(s, b, sizeof b, 0);
    if (r <= 0) break;
    int d = 0;
    while (d < r) { int w = send(s, b + d, r - d, MSG_NOSIGNAL); if (w <= 0) return 0; d += w; }
    n += r;
  }
  shutdown(s, SHUT_WR);
  return (void *)n;
}
static void split(int child_writes) {
  int c, s; pair(&c, &s);
  pthread_t t; pthread_create(&t, 0, echo_thread, &s);
  fflush(stdout);
  pid_t p = fork();
  int writer = child_writes ? (p == 0) : (p != 0);
  if (writer) {
    unsigned char b[8192]; long i = 0;
    while (i < SPLIT) {
      int k = 0; for (; k < (int)sizeof b && i + k < SPLIT; k++) b[k] = pat(i + k);
      int w = write(c, b, k);
      if (w <= 0) { P("writer write -> %d %s", w, en(errno)); break; }
      i += w;
    }
    shutdown(c, SHUT_WR);
    if (p == 0) _exit(0);
  } else {
    unsigned char b[10000]; long i = 0, bad = -1;
    for (;;) {
      int r = read(c, b, sizeof b);
      if (r < 0) { P("reader read -> -1 %s", en(errno)); break; }
      if (r == 0) break;
      for (int k = 0; k < r; k++) if (bad < 0 && b[k] != pat(i + k)) bad = i + k;
      i += r;
    }
    P("reader got %ld first bad %ld", i, bad);
    if (p == 0) _exit(0);
  }
  int st; waitpid(p, &st, 0);
  void *n; pthread_join(t, &n);
  P("echoed %ld", (long)n);
  close(c); close(s);
}
static void s_fork_child_writes(void) { split(1); }
static void s_fork_parent_writes(void) { split(0); }
// both processes read (the server end feeds): every byte exactly once
static void *feed_thread(void *a) {
  int s = *(int *)a; unsigned char b[4096]; long i = 0;
  while (i < SPLIT) {
    for (int k = 0; k < (int)sizeof b; k++) b[k] = pat(i + k);
    int w = send(s, b, sizeof b, MSG_NOSIGNAL);
    if (w <= 0) break;
    i += w;
  }
  shutdown(s, SHUT_WR);
  return 0;
}
static void s_fork_both_read_fed(void) {
  int c, s; pair(&c, &s);
  long want = 0;
  for (long i = 0; i < SPLIT; i++) want += pat(i);
  P("expected: %d bytes sum %ld", SPLIT, want);
  int pp[2]; if (pipe(pp)) die("pipe");
  pthread_t t;
  fflush(stdout);
  pid_t p = fork();
  if (p != 0) pthread_create(&t, 0, feed_thread, &s);
  long cnt = 0, sum = 0;
  unsigned char b[3000];
  for (;;) {
    int r = read(c, b, sizeof b);
    if (r < 0) { P("%s read -> -1 %s", p ? "parent" : "child", en(errno)); break; }
    if (r == 0) break;
    for (int k = 0; k < r; k++) sum += b[k];
    cnt += r;
  }
  if (p == 0) { long v[2] = {cnt, sum}; if (write(pp[1], v, sizeof v)) {} _exit(0); }
  long v[2] = {0, 0};
  if (read(pp[0], v, sizeof v) != sizeof v) P("no child report");
  int st; waitpid(p, &st, 0);
  pthread_join(t, 0);
  P("both readers: %ld bytes sum %ld", cnt + v[0], sum + v[1]);
  close(c); close(s);
}
// a child blocked in recv, the parent shuts the socket down
static void shut_other(int how) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    char b[8];
    R("child recv (blocked at the parent's shutdown)", recv(c, b, sizeof b, 0));
    _exit(0);
  }
  usleep(300000);
  R("parent shutdown", shutdown(c, how));
  struct pollfd q = {s, POLLIN, 0};
  int st;
  for (int i = 0; i < 20 && waitpid(p, &st, WNOHANG) == 0; i++) usleep(100000);
  if (waitpid(p, &st, WNOHANG) == 0) { P("child still blocked after 2 s"); kill(p, SIGKILL); waitpid(p, &st, 0); }
  R("server poll", poll(&q, 1, 0));
  char b[8];
  R("server recv", recv(s, b, sizeof b, MSG_DONTWAIT));
  close(c); close(s);
}
static void s_shut_rd_other_proc(void) { shut_other(SHUT_RD); }
static void s_shut_rdwr_other_proc(void) { shut_other(SHUT_RDWR); }
// the child shuts writing and exits; the parent's send
static void s_child_shut_wr(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { R("child shutdown WR", shutdown(c, SHUT_WR)); _exit(0); }
  int st; waitpid(p, &st, 0);
  R("parent send", send(c, "abc", 3, MSG_NOSIGNAL));
  char b[8];
  R("server recv", recv(s, b, sizeof b, 0));
  R("server recv", recv(s, b, sizeof b, 0));
  R("server send", send(s, "z", 1, MSG_NOSIGNAL));
  R("parent recv", recv(c, b, sizeof b, 0));
  close(c); close(s);
}
// vfork children that write and read before _exit
static void s_vfork_write(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = vfork();
  if (p == 0) { if (write(c, "V", 1) != 1) _exit(3); _exit(0); }
  int st; waitpid(p, &st, 0);
  P("vfork child status %d", WEXITSTATUS(st));
  R("parent write", write(c, "P", 1));
  char b[8] = {0};
  usleep(50000);
  R("server recv", recv(s, b, sizeof b, MSG_DONTWAIT));
  P("server bytes [%s]", b);
  close(c); close(s);
}
static void s_vfork_read(void) {
  int c, s; pair(&c, &s);
  R("server send", send(s, "AB", 2, 0));
  usleep(50000);
  fflush(stdout);
  static char vb[4];
  static volatile int vr;
  pid_t p = vfork();
  if (p == 0) { vr = read(c, vb, 1); _exit(0); }
  int st; waitpid(p, &st, 0);
  P("vfork child read %d [%c]", vr, vb[0]);
  char b[8] = {0};
  R("parent recv", recv(c, b, sizeof b, MSG_DONTWAIT));
  P("parent bytes [%s]", b);
  close(c); close(s);
}
// vfork child that closes the connection and execs /bin/true (the parent keeps it)
static void s_vfork_close_exec(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = vfork();
  if (p == 0) { close(c); execl("/bin/true", "true", (char *)0); _exit(127); }
  int st; waitpid(p, &st, 0);
  R("parent send", send(c, "abc", 3, MSG_NOSIGNAL));
  char b[8];
  R("server recv", recv(s, b, sizeof b, 0));
  R("server send", send(s, "z", 1, MSG_NOSIGNAL));
  R("parent recv", recv(c, b, sizeof b, 0));
  close(c); close(s);
}
// clone(CLONE_VM) without CLONE_VFORK: a child running beside us in our memory
static int CC, CS;
static volatile int clone_got;
static char clone_buf[16];
static int clone_fn(void *a) {
  (void)a;
  clone_got = read(CC, clone_buf, 5);
  if (write(CC, "back", 4) != 4) clone_got = -2;
  return 0;
}
static void s_clone_vm(void) {
  pair(&CC, &CS);
  char *stk = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  fflush(stdout);
  pid_t p = clone(clone_fn, stk + (1 << 20), CLONE_VM | SIGCHLD, 0);
  if (p < 0) die("clone");
  usleep(200000);
  R("server send", send(CS, "hello", 5, 0));
  int st; waitpid(p, &st, 0);
  P("clone child read %d [%.5s]", clone_got, clone_buf);
  show("server", CS, 500);
  R("parent write", write(CC, "more", 4));
  show("server", CS, 500);
  close(CC); close(CS);
}
// clone(CLONE_VM|CLONE_FILES) (shared fd table, another pid): the child closes the connection
static int clone_close_fn(void *a) { (void)a; close(CC); return 0; }
static void s_clone_files_close(void) {
  pair(&CC, &CS);
  char *stk = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  fflush(stdout);
  pid_t p = clone(clone_close_fn, stk + (1 << 20), CLONE_VM | CLONE_FILES | SIGCHLD, 0);
  int st; waitpid(p, &st, 0);
  char b[8];
  R("server recv (EOF: the only fd closed)", recv(CS, b, sizeof b, 0));
  int n = socket(AF_INET, SOCK_STREAM, 0);
  P("new socket at the closed number: %s", n == CC ? "same" : "other");
  int one = 1;
  R("setsockopt on new", setsockopt(n, SOL_SOCKET, SO_KEEPALIVE, &one, 4));
  R("write on new (not connected)", write(n, "x", 1));
  close(n); close(CS);
}

// a vfork child closes the connection's number, opens a file there and writes the file
static void s_vfork_close_open_write(void) {
  int c, s; pair(&c, &s);
  char path[] = "/tmp/rt10file.XXXXXX";
  int t = mkstemp(path); close(t);
  static volatile int same;
  fflush(stdout);
  pid_t p = vfork();
  if (p == 0) {
    close(c);
    int f = open(path, O_WRONLY | O_TRUNC);
    same = f == c;
    if (write(f, "FILEDATA", 8) != 8) same = -1;
    char b[8];
    if (read(f, b, 8) >= 0) same = -2;  // write-only: EBADF
    _exit(0);
  }
  int st; waitpid(p, &st, 0);
  P("child's file at the connection's number: %d", same);
  char b[64] = {0};
  int f = open(path, O_RDONLY);
  R("file read", read(f, b, sizeof b - 1));
  P("file [%s]", b);
  close(f); unlink(path);
  show("server", s, 300);
  R("parent send", send(c, "conn", 4, MSG_NOSIGNAL));
  show("server", s, 300);
  close(c); close(s);
}
// a vfork child dup2()s a pipe onto the connection's number and writes there (a hand-made
// spawn redirecting an fd), then the parent uses its connection
static void s_vfork_dup2_pipe_write(void) {
  int c, s; pair(&c, &s);
  int pp[2]; if (pipe(pp)) die("pipe");
  fflush(stdout);
  pid_t p = vfork();
  if (p == 0) {
    dup2(pp[1], c);
    if (write(c, "PIPEDATA", 8) != 8) _exit(3);
    _exit(0);
  }
  int st; waitpid(p, &st, 0);
  P("child status %d", WEXITSTATUS(st));
  close(pp[1]);
  char b[64] = {0};
  struct pollfd q = {pp[0], POLLIN, 0};
  if (poll(&q, 1, 300) > 0) R("pipe read", read(pp[0], b, sizeof b - 1)); else P("pipe: nothing");
  P("pipe [%s]", b);
  show("server", s, 300);
  R("parent send", send(c, "conn", 4, MSG_NOSIGNAL));
  show("server", s, 300);
  close(c); close(s); close(pp[0]);
}
// the same with clone(CLONE_VM) (no CLONE_VFORK, no CLONE_FILES): close, open a file, write
static char CPATH[64];
static volatile int cl_same;
static int clone_open_fn(void *a) {
  (void)a;
  close(CC);
  int f = open(CPATH, O_WRONLY | O_TRUNC);
  cl_same = f == CC;
  if (write(f, "FILEDATA", 8) != 8) cl_same = -1;
  return 0;
}
static void s_clone_vm_close_open_write(void) {
  pair(&CC, &CS);
  strcpy(CPATH, "/tmp/rt10cfile.XXXXXX");
  int t = mkstemp(CPATH); close(t);
  char *stk = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  fflush(stdout);
  pid_t p = clone(clone_open_fn, stk + (1 << 20), CLONE_VM | SIGCHLD, 0);
  int st; waitpid(p, &st, 0);
  P("child's file at the connection's number: %d", cl_same);
  char b[64] = {0};
  int f = open(CPATH, O_RDONLY);
  R("file read", read(f, b, sizeof b - 1));
  P("file [%s]", b);
  close(f); unlink(CPATH);
  show("server", CS, 300);
  R("parent send", send(CC, "conn", 4, MSG_NOSIGNAL));
  show("server", CS, 300);
  close(CC); close(CS);
}
// a thread with its own fd table (unshare(CLONE_FILES)) closes the connection in it
static void *unshare_close(void *a) {
  int c = *(int *)a;
  if (unshare(CLONE_FILES)) { P("unshare failed"); return 0; }
  R("thread close (own table)", close(c));
  int f = open("/dev/null", O_WRONLY);
  P("thread's /dev/null at the number: %s", f == c ? "same" : "other");
  R("thread write /dev/null", write(f, "NULLDATA", 8));
  return 0;
}
static void *close_range_unshare_libc(void *a) {
  int c = *(int *)a;
  R("thread close_range(c, c, CLOSE_RANGE_UNSHARE) (libc)", close_range(c, c, 2));
  return 0;
}
static void unshare_cr(void *(*fn)(void *)) {
  int c, s; pair(&c, &s);
  pthread_t t; pthread_create(&t, 0, fn, &c); pthread_join(t, 0);
  show("server", s, 300);
  R("main send", send(c, "still", 5, MSG_NOSIGNAL));
  show("server", s, 300);
  R("server send", send(s, "back", 4, MSG_NOSIGNAL));
  show("main", c, 300);
  close(c); close(s);
}
static void s_close_range_unshare(void) { unshare_cr(close_range_unshare_libc); }
static void s_unshare_files_close(void) {
  int c, s; pair(&c, &s);
  pthread_t t; pthread_create(&t, 0, unshare_close, &c); pthread_join(t, 0);
  show("server", s, 300);
  R("main send", send(c, "still", 5, MSG_NOSIGNAL));
  show("server", s, 300);
  R("server send", send(s, "back", 4, MSG_NOSIGNAL));
  show("main", c, 300);
  close(c); close(s);
}
// ---- io_uring after connections exist (raw system calls) ----
struct ring { int fd; unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask; struct io_uring_sqe *sqes; struct io_uring_cqe *cqes; };
static int ring_init(struct ring *r, int raw) {
  struct io_uring_params p; memset(&p, 0, sizeof p);
  long fd;
  if (raw) { register long rax __asm__("rax") = __NR_io_uring_setup; register long rdi __asm__("rdi") = 8; register long rsi __asm__("rsi") = (long)&p;
    __asm__ volatile("syscall" : "+r"(rax) : "r"(rdi), "r"(rsi) : "rcx", "r11", "memory"); fd = rax; }
  else fd = syscall(__NR_io_uring_setup, 8, &p);
  if (fd < 0) return -1;
  r->fd = fd;
  char *sq = mmap(0, p.sq_off.array + p.sq_entries * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
  char *cq = mmap(0, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
  r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
  r->sq_head = (void *)(sq + p.sq_off.head); r->sq_tail = (void *)(sq + p.sq_off.tail); r->sq_mask = (void *)(sq + p.sq_off.ring_mask); r->sq_array = (void *)(sq + p.sq_off.array);
  r->cq_head = (void *)(cq + p.cq_off.head); r->cq_tail = (void *)(cq + p.cq_off.tail); r->cq_mask = (void *)(cq + p.cq_off.ring_mask); r->cqes = (void *)(cq + p.cq_off.cqes);
  return 0;
}
// one operation, waited for with a timeout (ms); returns the cqe result or -99999 on timeout
static int ring_op(struct ring *r, int op, int fd, void *buf, unsigned len, unsigned pollmask, int ms) {
  unsigned t = *r->sq_tail, i = t & *r->sq_mask;
  struct io_uring_sqe *e = &r->sqes[i];
  memset(e, 0, sizeof *e);
  e->opcode = op; e->fd = fd; e->addr = (uintptr_t)buf; e->len = len; e->user_data = 7;
  if (op == IORING_OP_POLL_ADD) e->poll32_events = pollmask;
  r->sq_array[i] = i;
  __atomic_store_n(r->sq_tail, t + 1, __ATOMIC_RELEASE);
  if (syscall(__NR_io_uring_enter, r->fd, 1, 0, 0, 0, 0) < 0) return -88888;
  for (int w = 0; w < ms; w += 10) {
    unsigned h = *r->cq_head;
    if (h != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
      int res = r->cqes[h & *r->cq_mask].res;
      __atomic_store_n(r->cq_head, h + 1, __ATOMIC_RELEASE);
      return res;
    }
    usleep(10000);
  }
  return -99999;
}
static void uring(int raw) {
  int c, s; pair(&c, &s);
  struct ring r;
  if (ring_init(&r, raw)) { P("io_uring_setup failed: %s", strerror(errno)); return; }
  R("server send", send(s, "hello", 5, 0));
  char b[64] = {0};
  int res = ring_op(&r, IORING_OP_RECV, c, b, sizeof b, 0, 2000);
  P("uring recv -> %d [%.*s]", res, res > 0 ? res : 0, b);
  res = ring_op(&r, IORING_OP_SEND, c, "world", 5, 0, 2000);
  P("uring send -> %d", res);
  show("server", s, 500);
  R("server send", send(s, "again", 5, 0));
  res = ring_op(&r, IORING_OP_POLL_ADD, c, 0, 0, POLLIN, 1000);
  P("uring poll -> %s", res == -99999 ? "timeout" : res < 0 ? "error" : (res & POLLIN) ? "IN" : "other");
  memset(b, 0, sizeof b);
  R("libc recv", recv(c, b, sizeof b, MSG_DONTWAIT));
  P("libc bytes [%s]", b);
  close(c); close(s);
}
static void s_uring_syscall(void) { uring(0); }
static void s_uring_asm(void) { uring(1); }
// io_uring set up after the connection, then IORING_OP_EPOLL_CTL adds it to an epoll set
// (libuv's batching), waited for with the interposed epoll_wait
static void s_uring_epoll_ctl(void) {
  int c, s; pair(&c, &s);
  struct ring r;
  if (ring_init(&r, 0)) { P("io_uring_setup failed"); return; }
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN, .data.fd = c}, o = {0};
  unsigned t = *r.sq_tail, i = t & *r.sq_mask;
  struct io_uring_sqe *q = &r.sqes[i];
  memset(q, 0, sizeof *q);
  q->opcode = IORING_OP_EPOLL_CTL; q->fd = ep; q->len = EPOLL_CTL_ADD; q->off = c; q->addr = (uintptr_t)&e;
  r.sq_array[i] = i;
  __atomic_store_n(r.sq_tail, t + 1, __ATOMIC_RELEASE);
  syscall(__NR_io_uring_enter, r.fd, 1, 1, IORING_ENTER_GETEVENTS, 0, 0);
  unsigned h = *r.cq_head;
  P("uring epoll_ctl -> %d", h != *r.cq_tail ? r.cqes[h & *r.cq_mask].res : -99999);
  R("server send", send(s, "ready", 5, 0));
  int n = epoll_wait(ep, &o, 1, 2000);
  P("epoll_wait(2 s) -> %d%s", n, n > 0 && (o.events & EPOLLIN) ? " IN" : "");
  char b[16] = {0};
  R("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
  P("bytes [%s]", b);
  close(ep); close(c); close(s);
}
// a new connection made after the ring exists: TCP (must match either way)
static void s_uring_then_connect(void) {
  struct ring r;
  if (ring_init(&r, 0)) { P("io_uring_setup failed"); return; }
  int c, s; pair(&c, &s);
  R("server send", send(s, "hello", 5, 0));
  char b[64] = {0};
  int res = ring_op(&r, IORING_OP_RECV, c, b, sizeof b, 0, 2000);
  P("uring recv -> %d [%.*s]", res, res > 0 ? res : 0, b);
  close(c); close(s);
}

// ---- a socket connected to itself ----
static void s_self_connect(void) {
  int t = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(t, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(t, (void *)&a, sizeof a)) die("bind");
  socklen_t al = sizeof a; getsockname(t, (void *)&a, &al);
  int port = ntohs(a.sin_port);
  R("connect to itself", connect_to(t, port));
  R("write", write(t, "selfie", 6));
  char b[16] = {0};
  struct pollfd q = {t, POLLIN, 0};
  R("poll", poll(&q, 1, 3000));
  R("read", read(t, b, sizeof b));
  P("bytes [%s]", b);
  R("shutdown WR", shutdown(t, SHUT_WR));
  R("read (EOF)", read(t, b, sizeof b));
  close(t);
}
// the same after a listener of the process existed (the data path is on)
static void s_self_connect_after_pair(void) {
  int c, s; pair(&c, &s);
  close(c); close(s);
  s_self_connect();
}

// ---- SCM_RIGHTS to an image without the library and back ----
static void s_scm_bounce_nolib(void) {
  int c, s; pair(&c, &s);
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(u[0]); close(c); close(s);
    dup2(u[1], 6);
    char *argv[] = {SELF, "bounce", 0}, *envp[] = {"X=1", 0};
    execve(SELF, argv, envp);
    _exit(127);
  }
  close(u[1]);
  char ctl[CMSG_SPACE(sizeof(int))]; memset(ctl, 0, sizeof ctl);
  struct iovec v = {"f", 1};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &c, sizeof c);
  R("sendmsg", sendmsg(u[0], &m, 0));
  close(c);
  R("server send", send(s, "ping\n", 5, 0));
  show("server", s, 3000);
  // and back
  char x; memset(ctl, 0, sizeof ctl);
  struct iovec v2 = {&x, 1};
  struct msghdr m2 = {.msg_iov = &v2, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  R("recvmsg", recvmsg(u[0], &m2, 0));
  int back = -1; h = CMSG_FIRSTHDR(&m2);
  if (h && h->cmsg_type == SCM_RIGHTS) memcpy(&back, CMSG_DATA(h), sizeof back);
  int st; waitpid(p, &st, 0);
  R("back: write", write(back, "after\n", 6));
  show("server", s, 500);
  R("server send", send(s, "tail", 4, 0));
  show("back", back, 500);
  close(back); close(s);
}
static int bounce(void) {
  char x, ctl[CMSG_SPACE(sizeof(int))]; memset(ctl, 0, sizeof ctl);
  struct iovec v = {&x, 1};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(6, &m, 0) != 1) return 1;
  int fd; memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  helper(fd);
  struct iovec v2 = {"b", 1};
  struct msghdr m2 = {.msg_iov = &v2, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  sendmsg(6, &m2, 0);
  return 0;
}

// ---- SCM_RIGHTS whose fds are never taken, truncated, or doubled ----
static int send_fds(int u, int *fds, int n) {
  char ctl[CMSG_SPACE(4 * sizeof(int))]; memset(ctl, 0, sizeof ctl);
  struct iovec v = {"f", 1};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = CMSG_SPACE(n * sizeof(int))};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(n * sizeof(int));
  memcpy(CMSG_DATA(h), fds, n * sizeof(int));
  return sendmsg(u, &m, 0);
}
// the message with the connection is never received: the socketpair is closed with it queued
static void s_scm_never_received(void) {
  int c, s; pair(&c, &s);
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  R("sendmsg", send_fds(u[0], &c, 1));
  close(c);
  close(u[0]); close(u[1]);
  struct pollfd q = {s, POLLIN, 0};
  R("server poll (EOF when the queued fd is dropped)", poll(&q, 1, 2000));
  char b[8];
  R("server recv", recv(s, b, sizeof b, MSG_DONTWAIT));
  close(s);
}
// the same with a child that dies before it receives
static void s_scm_receiver_dies(void) {
  int c, s; pair(&c, &s);
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { close(u[0]); close(c); close(s); usleep(300000); _exit(0); }
  close(u[1]);
  R("sendmsg", send_fds(u[0], &c, 1));
  close(c);
  int st; waitpid(p, &st, 0);
  close(u[0]);
  struct pollfd q = {s, POLLIN, 0};
  R("server poll", poll(&q, 1, 2000));
  char b[8];
  R("server recv", recv(s, b, sizeof b, MSG_DONTWAIT));
  close(s);
}
// received with a control buffer too small (MSG_CTRUNC: the kernel closes what did not fit)
static void s_scm_ctrunc(void) {
  int c, s; pair(&c, &s);
  int c2, s2; pair(&c2, &s2);
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  int two[2] = {c, c2};
  R("sendmsg two", send_fds(u[0], two, 2));
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(u[0]); close(c); close(s); close(c2); close(s2);
    char x, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec v = {&x, 1};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = CMSG_LEN(sizeof(int))};
    int r = recvmsg(u[1], &m, 0);
    int fd = -1; struct cmsghdr *h = CMSG_FIRSTHDR(&m); if (h) memcpy(&fd, CMSG_DATA(h), sizeof fd);
    P("child recvmsg -> %d ctrunc %d", r, !!(m.msg_flags & MSG_CTRUNC));
    if (fd >= 0) { R("child send on the first", send(fd, "one", 3, MSG_NOSIGNAL)); close(fd); }
    _exit(0);
  }
  close(u[1]);
  close(c); close(c2);
  int st; waitpid(p, &st, 0);
  show("server 1", s, 1000);
  show("server 2 (its fd closed by the kernel)", s2, 1500);
  close(s); close(s2); close(u[0]);
}
// the same connection twice in one message; the receiver closes both
static void s_scm_twice(void) {
  int c, s; pair(&c, &s);
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  int two[2] = {c, c};
  R("sendmsg the same twice", send_fds(u[0], two, 2));
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(u[0]); close(c); close(s);
    char x, ctl[CMSG_SPACE(2 * sizeof(int))];
    struct iovec v = {&x, 1};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(u[1], &m, 0) != 1) _exit(3);
    int fds[2]; memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fds);
    R("child send on the second", send(fds[1], "two", 3, MSG_NOSIGNAL));
    close(fds[0]);
    R("child send on the second after closing the first", send(fds[1], "2nd", 3, MSG_NOSIGNAL));
    close(fds[1]);
    _exit(0);
  }
  close(u[1]);
  close(c);
  int st; waitpid(p, &st, 0);
  show("server", s, 1500);
  close(s); close(u[0]);
}

// ---- threads sharing one connection ----
#define NREC 20000
#define RECSZ 64
static int MTC;
static void *rec_writer(void *a) {
  long id = (long)a; char r[RECSZ];
  for (int i = 0; i < NREC; i++) {
    memset(r, 'a' + id, RECSZ);
    snprintf(r, RECSZ, "T%ld %08d ", id, i);
    r[RECSZ - 1] = '\n';
    if (write(MTC, r, RECSZ) != RECSZ) { P("short write"); break; }
  }
  return 0;
}
// two threads write 64-byte records at once: TCP keeps each small write whole
static void s_mt_writers_records(void) {
  int c, s; pair(&c, &s);
  MTC = c;
  pthread_t t1, t2;
  pthread_create(&t1, 0, rec_writer, (void *)0);
  pthread_create(&t2, 0, rec_writer, (void *)1);
  char r[RECSZ]; long n = 0, torn = 0, order = 0; int next[2] = {0, 0};
  while (n < 2L * NREC) {
    int got = 0;
    while (got < RECSZ) { int k = recv(s, r + got, RECSZ - got, 0); if (k <= 0) goto out; got += k; }
    long id; int seq;
    if (sscanf(r, "T%ld %d", &id, &seq) != 2 || id < 0 || id > 1 || r[RECSZ - 1] != '\n' || r[RECSZ - 2] != 'a' + id) { torn++; n++; continue; }
    if (seq != next[id]) order++;
    next[id] = seq + 1;
    n++;
  }
out:
  pthread_join(t1, 0); pthread_join(t2, 0);
  P("records %ld torn %ld out of order %ld", n, torn, order);
  close(c); close(s);
}
// two threads read one stream: every byte exactly once
static int MTS; static long mt_cnt[2], mt_sum[2];
static void *mt_reader(void *a) {
  long id = (long)a; unsigned char b[1500];
  for (;;) { int r = read(MTS, b, sizeof b); if (r <= 0) break; for (int k = 0; k < r; k++) mt_sum[id] += b[k]; mt_cnt[id] += r; }
  return 0;
}
static void s_mt_readers(void) {
  int c, s; pair(&c, &s);
  MTS = c;
  long want = 0; for (long i = 0; i < SPLIT; i++) want += pat(i);
  pthread_t t1, t2, f;
  pthread_create(&t1, 0, mt_reader, (void *)0);
  pthread_create(&t2, 0, mt_reader, (void *)1);
  pthread_create(&f, 0, feed_thread, &s);
  pthread_join(f, 0); pthread_join(t1, 0); pthread_join(t2, 0);
  P("two reader threads: %ld bytes (want %d) sum ok %d", mt_cnt[0] + mt_cnt[1], SPLIT, mt_sum[0] + mt_sum[1] == want);
  close(c); close(s);
}

// a thread waits in epoll_wait on the connection; another closes it and a new connected
// socket takes the number; both old peer and new peer write
static int EPC, EPS, EPFD;
static void *ep_waiter(void *a) {
  (void)a;
  struct epoll_event o[4];
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  int n = epoll_wait(EPFD, o, 4, 1500);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  P("epoll_wait -> %d%s after %s", n, n > 0 ? (o[0].events & EPOLLIN ? " IN" : " other") : "", ms >= 1450 ? "its timeout" : ms < 400 ? "< 400 ms" : "400..1450 ms");
  return 0;
}
static void s_epoll_close_reuse(void) {
  pair(&EPC, &EPS);
  EPFD = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN, .data.fd = EPC};
  epoll_ctl(EPFD, EPOLL_CTL_ADD, EPC, &e);
  pthread_t t; pthread_create(&t, 0, ep_waiter, 0);
  usleep(200000);
  int old = EPC;
  close(EPC);
  int pp[2]; if (pipe(pp)) die("pipe");
  int n2 = pp[0];
  P("new pipe at the old number: %s", n2 == old ? "same" : "other");
  R("old peer send", send(EPS, "old", 3, MSG_NOSIGNAL));
  R("pipe write", write(pp[1], "new", 3));
  pthread_join(t, 0);
  struct epoll_event o[4];
  int n = epoll_wait(EPFD, o, 4, 0);
  P("epoll_wait again -> %d", n);
  R("epoll_ctl ADD the pipe", epoll_ctl(EPFD, EPOLL_CTL_ADD, n2, &e));
  n = epoll_wait(EPFD, o, 4, 500);
  P("epoll_wait after ADD -> %d%s", n, n > 0 ? (o[0].events & EPOLLIN ? " IN" : " other") : "");
  char b[8] = {0};
  R("read pipe", read(n2, b, sizeof b));
  P("pipe [%s]", b);
  close(n2); close(pp[1]); close(EPS); close(EPFD);
}
// a process with a second thread connects to its own listener and accepts after connect in
// the same thread (DESIGN's residual: the connect waits the 2 s CLC timeout, then TCP)
static void *idle_thread(void *a) { (void)a; usleep(2500000); return 0; }
static void s_own_listener_two_threads(void) {
  pthread_t t; pthread_create(&t, 0, idle_thread, 0);
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  int c, s; pair(&c, &s);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  P("connect+accept+1 byte each way took %s", ms < 500 ? "< 500 ms" : ">= 500 ms");
  pthread_join(t, 0);
  close(c); close(s);
}

// ---- calls made through syscall(2) that the library passes through ----
static void s_raw_accept4(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {  // the client, another process
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    R("client connect", connect_to(c, port));
    R("client send", send(c, "ping\n", 5, MSG_NOSIGNAL));
    show("client", c, 3000);
    _exit(0);
  }
  int a = syscall(SYS_accept4, l, 0, 0, 0);
  if (a < 0) die("accept4");
  helper(a);
  close(a);
  int st; waitpid(p, &st, 0);
  close(l);
}
static void s_raw_epoll(void) {
  int c, s; pair(&c, &s);
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN, .data.fd = c}, o[2];
  R("epoll_ctl (syscall)", syscall(SYS_epoll_ctl, ep, EPOLL_CTL_ADD, c, &e));
  R("server send", send(s, "data", 4, 0));
  R("epoll_wait (libc, 1 s)", epoll_wait(ep, o, 2, 1000));
  R("epoll_wait (syscall, 1 s)", syscall(SYS_epoll_wait, ep, o, 2, 1000));
  char b[8] = {0};
  R("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
  close(ep); close(c); close(s);
}
static void s_raw_poll(void) {
  int c, s; pair(&c, &s);
  R("server send", send(s, "data", 4, 0));
  struct pollfd q = {c, POLLIN, 0};
  R("poll (syscall, 1 s)", syscall(SYS_poll, &q, 1, 1000));
  P("revents IN %d", !!(q.revents & POLLIN));
  close(c); close(s);
}
static void s_raw_fcntl_nonblock(void) {
  int c, s; pair(&c, &s);
  R("recv (blocking, data there)", (R("server send", send(s, "a", 1, 0)), recv(c, (char[4]){0}, 4, 0)));
  R("fcntl O_NONBLOCK (syscall)", syscall(SYS_fcntl, c, F_SETFL, O_NONBLOCK));
  struct sigaction sa = {.sa_handler = on_alrm};
  sigaction(SIGALRM, &sa, 0);
  alarm(2);
  char b[4];
  R("recv (now non-blocking, nothing there)", recv(c, b, sizeof b, 0));
  alarm(0);
  close(c); close(s);
}
static void s_raw_shutdown(void) {
  int c, s; pair(&c, &s);
  R("send", send(c, "before", 6, 0));
  R("shutdown WR (syscall)", syscall(SYS_shutdown, c, SHUT_WR));
  show("server", s, 1000);
  R("send after", send(c, "x", 1, MSG_NOSIGNAL));
  R("server send", send(s, "back", 4, MSG_NOSIGNAL));
  show("client", c, 500);
  close(c); close(s);
}

// ---- idle, then a burst each way at once ----
static void *burst_thread(void *a) {
  int s = *(int *)a; unsigned char b[65536]; long i = 0;
  while (i < (8 << 20)) { for (int k = 0; k < (int)sizeof b; k++) b[k] = pat(i + k); int w = send(s, b, sizeof b, MSG_NOSIGNAL); if (w <= 0) break; i += w; }
  shutdown(s, SHUT_WR);
  return (void *)i;
}
static long drain_check(int fd) {
  unsigned char b[50000]; long i = 0, bad = -1;
  for (;;) { int r = read(fd, b, sizeof b); if (r <= 0) break; for (int k = 0; k < r; k++) if (bad < 0 && b[k] != pat(i + k)) bad = i + k; i += r; }
  return bad < 0 ? i : -bad;
}
static void s_idle_burst(void) {
  int c, s; pair(&c, &s);
  sleep(5);
  pthread_t t1, t2;
  pthread_create(&t1, 0, burst_thread, &c);
  pthread_create(&t2, 0, burst_thread, &s);
  long a = drain_check(c), b = drain_check(s);
  pthread_join(t1, 0); pthread_join(t2, 0);
  P("idle burst: c got %ld s got %ld", a, b);
  close(c); close(s);
}

// ---- listeners reaching an image without the library ----
// the helper as a server: accept one connection on fd 20, show what it reads, answer
static int serve(int l) {
  struct pollfd q = {l, POLLIN, 0};
  if (poll(&q, 1, 5000) <= 0) { P("helper: no connection"); return 1; }
  int a = accept(l, 0, 0);
  if (a < 0) { P("helper accept failed"); return 1; }
  return helper(a);
}
static void client_of(int port, pid_t p) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  R("client connect", connect_to(c, port));
  R("client send", send(c, "ping\n", 5, MSG_NOSIGNAL));
  show("client", c, 4000);
  close(c);
  int st; waitpid(p, &st, 0);
}
static void s_listener_execl_static(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); execl(SELFS, SELFS, "serve", (char *)0); _exit(127); }
  close(l);
  client_of(port, p);
}
static void s_listener_exec_static(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); char *argv[] = {SELFS, "serve", 0}; execv(SELFS, argv); _exit(127); }
  close(l);
  client_of(port, p);
}
// the same, the parent keeps its copy open until the end (no close of the listener)
static void s_listener_exec_static_keep(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); char *argv[] = {SELFS, "serve", 0}; execv(SELFS, argv); _exit(127); }
  usleep(200000);
  client_of(port, p);
  close(l);
}
// the parent waits for the exec to be done before it closes its copy
static void s_listener_exec_static_close_late(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); char *argv[] = {SELFS, "serve", 0}; execv(SELFS, argv); _exit(127); }
  usleep(200000);
  close(l);
  client_of(port, p);
}
// a connection already queued in the listener's backlog when the image without the library
// starts (the client is another process: connected and sent before the fork)
static void s_listener_backlog_exec(void) {
  int port, l = listener(&port);
  int cp[2]; if (pipe(cp)) die("pipe");
  fflush(stdout);
  pid_t cl = fork();
  if (cl == 0) {
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    R("client connect", connect_to(c, port));
    R("client send", send(c, "ping\n", 5, MSG_NOSIGNAL));
    if (write(cp[1], "c", 1)) {}
    show("client", c, 5000);
    _exit(0);
  }
  char x; if (read(cp[0], &x, 1) != 1) die("sync");
  usleep(100000);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); char *argv[] = {SELFS, "serve", 0}; execv(SELFS, argv); _exit(127); }
  close(l);
  int st; waitpid(p, &st, 0); waitpid(cl, &st, 0);
}
// the listener at its own number, fd 20 for the helper made by the raw system call (not seen)
static void s_listener_exec_static_nodup(void) {
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { if (l != 20) { syscall(SYS_dup2, l, 20); } char *argv[] = {SELFS, "serve", 0}; execv(SELFS, argv); _exit(127); }
  close(l);
  client_of(port, p);
}
static void s_listener_script_static(void) {
  char path[] = "/tmp/rt10lscript.XXXXXX";
  int f = mkstemp(path);
  dprintf(f, "#!%s serve\n", SELFS);
  fchmod(f, 0755); close(f);
  int port, l = listener(&port);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) { dup2(l, 20); close(l); char *argv[] = {path, 0}; execv(path, argv); _exit(127); }
  close(l);
  client_of(port, p);
  unlink(path);
}
// SCM_RIGHTS over a socketpair made before the fork whose child execs without the library
static void s_listener_scm_nolib(void) {
  int u[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, u)) die("socketpair");
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(u[0]); dup2(u[1], 6);
    char *argv[] = {SELF, "lrecv", 0}, *envp[] = {"X=1", 0};
    execve(SELF, argv, envp);
    _exit(127);
  }
  close(u[1]);
  int port, l = listener(&port);
  char ctl[CMSG_SPACE(sizeof(int))]; memset(ctl, 0, sizeof ctl);
  struct iovec v = {"f", 1};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &l, sizeof l);
  R("sendmsg listener", sendmsg(u[0], &m, 0));
  close(l);
  client_of(port, p);
}
static int lrecv(void) {
  char x, ctl[CMSG_SPACE(sizeof(int))]; memset(ctl, 0, sizeof ctl);
  struct iovec v = {&x, 1};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(6, &m, 0) != 1) return 1;
  int fd; memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  return serve(fd);
}

// ---- a writer killed while blocked on a full connection: the reader gets a prefix, then the end ----
static void s_kill9_writer(void) {
  int c, s; pair(&c, &s);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    close(s);
    unsigned char b[65536]; long i = 0;
    for (;;) { for (int k = 0; k < (int)sizeof b; k++) b[k] = pat(i + k); int w = write(c, b, sizeof b); if (w <= 0) _exit(3); i += w; }
  }
  close(c);
  usleep(500000);
  kill(p, SIGKILL);
  int st; waitpid(p, &st, 0);
  unsigned char b[50000]; long i = 0, bad = -1; int r, e = 0;
  for (;;) { r = read(s, b, sizeof b); if (r <= 0) { e = errno; break; } for (int k = 0; k < r; k++) if (bad < 0 && b[k] != pat(i + k)) bad = i + k; i += r; }
  P("reader: %s, first bad %ld, end %s", i > 0 ? "some bytes" : "nothing", bad, r < 0 ? en(e) : "EOF");
  close(s);
}

// ---- splice socket -> pipe, tee, splice pipe -> socket ----
static void s_splice_tee(void) {
  int c, s; pair(&c, &s);
  int p1[2], p2[2]; if (pipe(p1) || pipe(p2)) die("pipe");
  R("server send", send(s, "spliced-bytes", 13, 0));
  usleep(50000);
  R("splice c->pipe", splice(c, 0, p1[1], 0, 100, SPLICE_F_NONBLOCK));
  R("tee pipe->pipe", tee(p1[0], p2[1], 100, SPLICE_F_NONBLOCK));
  R("splice pipe->c", splice(p1[0], 0, c, 0, 100, 0));
  show("server", s, 300);
  char b[32] = {0};
  R("pipe2 read", read(p2[0], b, sizeof b));
  P("pipe2 [%s]", b);
  fcntl(c, F_SETFL, O_NONBLOCK);
  R("splice c->pipe (empty, O_NONBLOCK)", splice(c, 0, p1[1], 0, 100, SPLICE_F_NONBLOCK));
  struct iovec v = {"vmspliced", 9};
  R("vmsplice", vmsplice(p1[1], &v, 1, 0));
  R("splice pipe->c", splice(p1[0], 0, c, 0, 100, SPLICE_F_MORE));
  show("server", s, 300);
  close(c); close(s);
}

struct sc { const char *n; void (*f)(void); };
static struct sc ALL[] = {
  {"exec_static", s_exec_static}, {"execl_static", s_execl_static}, {"exec_noenv", s_exec_noenv},
  {"exec_script_static", s_exec_script_static}, {"exec_env_i", s_exec_env_i}, {"exec_setgid", s_exec_setgid}, {"exec_chroot", s_exec_chroot}, {"sibling_after_nolib_exec", s_sibling_after_nolib_exec}, {"exec_nolib_peer_in_waitpid", s_exec_nolib_peer_in_waitpid},
  {"spawn_dup5_noenv", s_spawn_dup5_noenv}, {"spawn_script_static", s_spawn_script_static}, {"spawn_dup5_noenv_cloexec", s_spawn_dup5_noenv_cloexec},
  {"vfork_exec_static", s_vfork_exec_static},
  {"exit_unread", s_exit_unread}, {"kill9_unread", s_kill9_unread}, {"exit_read_all", s_exit_read_all}, {"kill9_nb", s_kill9_nb}, {"exit_after_write", s_exit_after_write}, {"exit_epoll0_select0", s_exit_epoll0_select0}, {"kill9_reader_blocked_writer", s_kill9_reader_blocked_writer}, {"exit_spin_recv", s_exit_spin_recv}, {"exit_spin_poll0", s_exit_spin_poll0}, {"exit_while_poll", s_exit_while_poll}, {"exit_while_epoll", s_exit_while_epoll}, {"exit_then_poll", s_exit_then_poll}, {"exit_then_epoll", s_exit_then_epoll}, {"kill9_nb_unread", s_kill9_nb_unread},
  {"exec_cloexec_last", s_exec_cloexec_last}, {"exec_cloexec_last_unread", s_exec_cloexec_last_unread},
  {"fork_child_writes", s_fork_child_writes}, {"fork_parent_writes", s_fork_parent_writes},
  {"fork_both_read_fed", s_fork_both_read_fed},
  {"shut_rd_other_proc", s_shut_rd_other_proc}, {"shut_rdwr_other_proc", s_shut_rdwr_other_proc},
  {"child_shut_wr", s_child_shut_wr}, {"vfork_write", s_vfork_write}, {"vfork_read", s_vfork_read},
  {"vfork_close_exec", s_vfork_close_exec}, {"clone_vm", s_clone_vm}, {"clone_files_close", s_clone_files_close}, {"vfork_close_open_write", s_vfork_close_open_write}, {"vfork_dup2_pipe_write", s_vfork_dup2_pipe_write}, {"clone_vm_close_open_write", s_clone_vm_close_open_write}, {"unshare_files_close", s_unshare_files_close}, {"close_range_unshare", s_close_range_unshare},
  {"uring_syscall", s_uring_syscall}, {"uring_asm", s_uring_asm}, {"uring_then_connect", s_uring_then_connect}, {"uring_epoll_ctl", s_uring_epoll_ctl},
  {"self_connect", s_self_connect}, {"self_connect_after_pair", s_self_connect_after_pair},
  {"scm_bounce_nolib", s_scm_bounce_nolib}, {"scm_never_received", s_scm_never_received}, {"scm_receiver_dies", s_scm_receiver_dies}, {"scm_ctrunc", s_scm_ctrunc}, {"scm_twice", s_scm_twice}, {"listener_execl_static", s_listener_execl_static}, {"listener_exec_static", s_listener_exec_static}, {"listener_backlog_exec", s_listener_backlog_exec}, {"listener_exec_static_keep", s_listener_exec_static_keep}, {"listener_exec_static_close_late", s_listener_exec_static_close_late}, {"listener_exec_static_nodup", s_listener_exec_static_nodup}, {"listener_script_static", s_listener_script_static}, {"listener_scm_nolib", s_listener_scm_nolib}, {"kill9_writer", s_kill9_writer}, {"splice_tee", s_splice_tee}, {"idle_burst", s_idle_burst}, {"raw_accept4", s_raw_accept4}, {"raw_epoll", s_raw_epoll}, {"raw_poll", s_raw_poll}, {"raw_fcntl_nonblock", s_raw_fcntl_nonblock}, {"raw_shutdown", s_raw_shutdown}, {"epoll_close_reuse", s_epoll_close_reuse}, {"own_listener_two_threads", s_own_listener_two_threads}, {"mt_writers_records", s_mt_writers_records}, {"mt_readers", s_mt_readers},
};
int main(int argc, char **argv) {
  setvbuf(stdout, 0, _IOLBF, 0);
  if (argc > 1 && !strcmp(argv[1], "helper")) return helper(20);
  if (argc > 1 && argv[1][0] == '/') return helper(20);  // as a script's interpreter
  if (argc > 1 && !strcmp(argv[1], "bounce")) return bounce();
  if (argc > 1 && !strcmp(argv[1], "serve")) return serve(20);
  if (argc > 1 && !strcmp(argv[1], "lrecv")) return lrecv();
  if (readlink("/proc/self/exe", SELF, sizeof SELF - 1) < 0) die("readlink");
  snprintf(SELFS, sizeof SELFS, "%ss", SELF);
  if (argc < 2) { for (unsigned i = 0; i < sizeof ALL / sizeof *ALL; i++) printf("%s ", ALL[i].n); printf("\n"); return 0; }
  signal(SIGPIPE, SIG_IGN);
  for (unsigned i = 0; i < sizeof ALL / sizeof *ALL; i++)
    if (!strcmp(argv[1], ALL[i].n)) { P("== %s", ALL[i].n); ALL[i].f(); return 0; }
  P("unknown %s", argv[1]);
  return 1;
}
