// rt31 (red team round 31, rt31x_left.c): servers whose clients leave at once (during the handshake), compared with TCP.
// usage: rt31_left CLIENT OPS N PORT [DELAY_MS]
// CLIENT: nbclose (non-blocking connect, close), bclose (blocking connect, close),
//         rst (blocking connect, SO_LINGER{1,0}, close), nbrst (non-blocking, linger 0),
//         kill (blocking connect, then SIGKILLed by the parent), nbkill (non-blocking connect, killed)
// OPS, made by the server on the accepted socket in a child of its own, DELAY_MS after accept:
//   w write "hello" (MSG_NOSIGNAL)   W write() with SIGPIPE at its default
//   r recv (MSG_DONTWAIT)             p poll IN|OUT|RDHUP, 0 ms
//   e SO_ERROR                        s sleep 10 ms        h shutdown(SHUT_WR)
//   v writev                          f sendfile of 5 bytes   m sendmmsg
// One line per connection; a server child killed by a signal ends its line with KILLED:n.
// gcc -O2 -o rt31_left rt31_left.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static char obs[4096];
static int OUT = -1;
static void add(const char *fmt, ...) {
  va_list ap; va_start(ap, fmt);
  char b[256]; vsnprintf(b, sizeof b, fmt, ap); va_end(ap);
  strcat(obs, b); strcat(obs, " ");
  if (OUT >= 0) { if (write(OUT, b, strlen(b)) < 0 || write(OUT, " ", 1) < 0) {} }
}
static const char *en(int e) {
  switch (e) {
  case EAGAIN: return "EAGAIN"; case ECONNRESET: return "ECONNRESET"; case EPIPE: return "EPIPE";
  case ENOTCONN: return "ENOTCONN"; case 0: return "0";
  default: { static char b[16]; snprintf(b, 16, "E%d", e); return b; }
  }
}
static const char *rev(int r) {
  static char b[64]; b[0] = 0;
  if (r & POLLIN) strcat(b, "I"); if (r & POLLOUT) strcat(b, "O"); if (r & POLLERR) strcat(b, "E");
  if (r & POLLHUP) strcat(b, "H"); if (r & POLLRDHUP) strcat(b, "R");
  if (!b[0]) strcat(b, "-");
  return b;
}
static void R(const char *t, ssize_t r) { if (r < 0) add("%s:%s", t, en(errno)); else add("%s%zd", t, r); }

#include <sys/time.h>
#include <time.h>
static void onalrm(int x) { (void)x; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void ops(int s, const char *o) {
  char b[100];
  for (; *o; o++) {
    switch (*o) {
    case 'w': R("w", send(s, "hello", 5, MSG_NOSIGNAL)); break;
    case 'W': signal(SIGPIPE, SIG_DFL); R("W", write(s, "hello", 5)); signal(SIGPIPE, SIG_IGN); break;
    case 'r': R("r", recv(s, b, sizeof b, MSG_DONTWAIT)); break;
    case 'p': { struct pollfd p = {s, POLLIN | POLLOUT | POLLRDHUP, 0}; int n = poll(&p, 1, 0); add("p%d%s", n, rev(p.revents)); break; }
    case 'e': { int e = 0; socklen_t l = sizeof e; getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l); add("so:%s", en(e)); break; }
    case 's': usleep(10000); break;
    case 'F': { // a child writes once, then the parent goes on
      int pp[2]; pipe(pp); pid_t k = fork();
      if (k == 0) { ssize_t r = send(s, "hello", 5, MSG_NOSIGNAL); char b2[64]; snprintf(b2, 64, "child[%s]", r < 0 ? en(errno) : "w5");
        if (write(pp[1], b2, strlen(b2))) {} _exit(0); }
      waitpid(k, 0, 0); char b2[64] = {0}; if (read(pp[0], b2, 63)) {} add("%s", b2); close(pp[0]); close(pp[1]); break; }
    case 'B': { // blocking recv, SIGALRM (no SA_RESTART) 30 ms in
      struct sigaction sa = {0}; sa.sa_handler = onalrm; sigaction(SIGALRM, &sa, 0);
      struct itimerval it = {{0, 0}, {0, 30000}}; setitimer(ITIMER_REAL, &it, 0);
      double t0 = now(); ssize_t r = recv(s, b, sizeof b, 0); double ms = (now() - t0) * 1000;
      R("B", r); add("t=%s", ms < 25 ? "<25" : ms < 45 ? "25-45" : ms < 150 ? "45-150" : ">=150"); break; }
    case 'n': fcntl(s, F_SETFL, O_NONBLOCK); break;
    case 'P': { struct pollfd p = {s, POLLOUT, 0}; int n = poll(&p, 1, 1000); add("P%d%s", n, rev(p.revents)); break; }
    case 'h': R("sh", shutdown(s, SHUT_WR)); break;
    case 'v': { struct iovec v = {"hello", 5}; R("v", writev(s, &v, 1)); break; }
    case 'f': { int f = open("/etc/hostname", O_RDONLY); R("f", sendfile(s, f, 0, 5)); close(f); break; }
    case 'm': { struct iovec v = {"hello", 5}; struct mmsghdr m = {{0, 0, &v, 1, 0, 0, 0}, 0};
      int n = sendmmsg(s, &m, 1, MSG_NOSIGNAL); if (n < 0) add("m:%s", en(errno)); else add("m%d", n); break; }
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage\n"); return 2; }
  const char *cl = argv[1], *op = argv[2]; int n = atoi(argv[3]), port = atoi(argv[4]);
  int dms = argc > 5 ? atoi(argv[5]) : 20;
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(port); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a)) { perror("bind"); return 2; }
  listen(l, 128);
  int nb = !strncmp(cl, "nb", 2);
  for (int i = 0; i < n; i++) {
    int cp[2]; pipe(cp);
    pid_t c = fork();
    if (c == 0) {
      close(l);
      int s = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
      connect(s, (void *)&a, sizeof a);
      if (strstr(cl, "rst")) { struct linger lg = {1, 0}; setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg); }
      if (strstr(cl, "kill")) { if (write(cp[1], "x", 1)) {} pause(); }
      if (strstr(cl, "idle")) { sleep(getenv("IDLE_S") ? atoi(getenv("IDLE_S")) : 3); _exit(0); }
      close(s);
      _exit(0);
    }
    if (strstr(cl, "kill")) { char x; if (read(cp[0], &x, 1)) {} kill(c, SIGKILL); }
    double ta = now();
    if (getenv("NBACC")) { fcntl(l, F_SETFL, O_NONBLOCK); struct pollfd pl = {l, POLLIN, 0}; poll(&pl, 1, 3000); }
    int s = accept(l, 0, 0);
    if (getenv("NBACC")) fcntl(s, F_SETFL, 0);
    if (strstr(cl, "idle")) { double ms = (now() - ta) * 1000; fprintf(stderr, "accept took %.0f ms\n", ms); printf("accept:%s ", ms < 50 ? "<50ms" : ms < 1000 ? "<1s" : ">=1s"); }
    if (!strstr(cl, "idle")) waitpid(c, 0, 0);
    close(cp[0]); close(cp[1]);
    if (!strchr(op, 'W')) {
      obs[0] = 0; usleep(dms * 1000); ops(s, op); close(s); printf("%s\n", obs); fflush(stdout);
      if (strstr(cl, "idle")) { kill(c, SIGKILL); waitpid(c, 0, 0); }
      continue;
    }
    int op2[2]; pipe(op2);
    pid_t w = fork();
    if (w == 0) {
      close(op2[0]); OUT = op2[1];
      usleep(dms * 1000);
      ops(s, op);
      _exit(0);
    }
    close(op2[1]); close(s);
    int st; waitpid(w, &st, 0);
    char b[2048] = {0}; int k = 0, r;
    while ((r = read(op2[0], b + k, sizeof b - 1 - k)) > 0) k += r;
    close(op2[0]);
    printf("%s%s\n", b, WIFSIGNALED(st) ? (WTERMSIG(st) == SIGPIPE ? "KILLED:PIPE" : "KILLED") : "");
  }
  return 0;
}
