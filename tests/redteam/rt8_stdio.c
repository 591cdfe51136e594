// rt8_stdio: stdio on SMC sockets (fdopen, dprintf, stdout/stdin after dup2), the switch to TCP
// under fdopen with the peer closed / busy / fdopen'ing too, unread bytes both ways.
// gcc -O2 -pthread -o /tmp/rt8/rt8_stdio rt8_stdio.c ; world.sh smc|tcp /tmp/rt8/rt8_stdio SCENARIO
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define P(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static double T0;
static void msleep(int ms) { usleep(ms * 1000); }
static int listener(int *port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  bind(l, (void *)&a, sizeof a); listen(l, 16);
  socklen_t al = sizeof a; getsockname(l, (void *)&a, &al);
  *port = ntohs(a.sin_port); return l;
}
static int conn(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  if (connect(s, (void *)&a, sizeof a)) { P("connect: %s", strerror(errno)); exit(2); }
  return s;
}
static void hexhead(const char *tag, const unsigned char *b, int n) {
  char o[200] = ""; int k = 0;
  for (int i = 0; i < n && i < 24; i++) k += snprintf(o + k, sizeof o - k, "%c", b[i] >= 32 && b[i] < 127 ? b[i] : '.');
  k += snprintf(o + k, sizeof o - k, " |");
  for (int i = 0; i < n && i < 12; i++) k += snprintf(o + k, sizeof o - k, " %02x", b[i]);
  P("%s n=%d [%s]", tag, n, o);
}
// read a line via recv (through the interposition), timeout ms
static int recv_line(int fd, char *buf, int cap, int ms) {
  int n = 0;
  while (n < cap - 1) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) { buf[n] = 0; return -2; }
    int r = recv(fd, buf + n, 1, 0);
    if (r <= 0) { buf[n] = 0; return r < 0 ? -errno : n; }
    n++;
    if (buf[n - 1] == '\n') break;
  }
  buf[n] = 0; return n;
}
static unsigned char pat(long i) { return (unsigned char)((i * 131 + 7) % 251); }
static long sendpat(int fd, long off, long n) {
  unsigned char b[16384]; long done = 0;
  while (done < n) {
    long k = n - done < (long)sizeof b ? n - done : (long)sizeof b;
    for (long i = 0; i < k; i++) b[i] = pat(off + done + i);
    long r = send(fd, b, k, MSG_NOSIGNAL);
    if (r <= 0) { P("sendpat: %s after %ld", strerror(errno), done); return done; }
    done += r;
  }
  return done;
}
// read up to n via fd with recv, check pattern
static long checkpat_fd(int fd, long n, const char *tag) {
  unsigned char b[16384]; long got = 0, bad = -1;
  while (got < n) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 8000) <= 0) { P("%s: TIMEOUT after %ld", tag, got); break; }
    long r = recv(fd, b, sizeof b < (size_t)(n - got) ? sizeof b : n - got, 0);
    if (r <= 0) { P("%s: recv %ld %s after %ld", tag, r, r ? strerror(errno) : "EOF", got); break; }
    for (long i = 0; i < r; i++) if (bad < 0 && b[i] != pat(got + i)) { bad = got + i; hexhead("first bad", b + i, r - i); }
    got += r;
  }
  P("%s: got %ld of %ld, first bad %ld", tag, got, n, bad);
  return got;
}
static long checkpat_file(FILE *f, long n, const char *tag) {
  unsigned char b[16384]; long got = 0, bad = -1;
  while (got < n) {
    size_t r = fread(b, 1, sizeof b < (size_t)(n - got) ? sizeof b : n - got, f);
    if (r == 0) { P("%s: fread 0 (%s) after %ld", tag, ferror(f) ? strerror(errno) : "EOF", got); break; }
    for (size_t i = 0; i < r; i++) if (bad < 0 && b[i] != pat(got + i)) { bad = got + i; hexhead("first bad", b + i, r - i); }
    got += r;
  }
  P("%s: got %ld of %ld, first bad %ld", tag, got, n, bad);
  return got;
}

static const char *S;
static int is(const char *x) { return !strcmp(S, x); }
#define BIG 300000L

static void server(int c) {
  char line[256];
  if (is("dprintf") || is("stdout") || is("fdopen_write") || is("fdopen_fork") || is("fdopen_dup")) {
    int n = recv_line(c, line, sizeof line, 8000);
    if (n > 0) hexhead("SERVER line", (unsigned char *)line, n); else P("SERVER line r=%d (%s)", n, n == -2 ? "timeout" : "");
    send(c, "ECHO\n", 5, MSG_NOSIGNAL);
    n = recv(c, line, sizeof line, 0); P("SERVER then %d", n);
  } else if (is("stdin")) {
    send(c, "first line\nsecond line\n", 23, MSG_NOSIGNAL);
    int n = recv_line(c, line, sizeof line, 8000); P("SERVER got %d %s", n, n > 0 ? line : "");
  } else if (is("fdopen_peer_closed")) {
    send(c, "bye\n", 4, MSG_NOSIGNAL);
    close(c); P("SERVER closed"); return;
  } else if (is("fdopen_peer_shut")) {
    send(c, "bye\n", 4, MSG_NOSIGNAL);
    shutdown(c, SHUT_WR);
    int n = recv_line(c, line, sizeof line, 20000); P("SERVER got %d %s at %.1f", n, n > 0 ? line : "", now() - T0);
  } else if (is("fdopen_peer_busy")) {
    send(c, "hi\n", 3, MSG_NOSIGNAL);
    msleep(12000);  // busy: not in a call on the socket
    int n = recv_line(c, line, sizeof line, 8000); P("SERVER after 12s got %d %s", n, n > 0 ? line : strerror(-n));
  } else if (is("fdopen_both")) {
    send(c, "from server\n", 12, MSG_NOSIGNAL);
    msleep(300);
    FILE *f = fdopen(c, "r+");
    char *g = fgets(line, sizeof line, f);
    P("SERVER fgets %s at %.1f", g ? line : "NULL", now() - T0);
    fputs("reply server\n", f); fflush(f);
    fclose(f); return;
  } else if (is("fdopen_unread")) {
    sendpat(c, 0, BIG);  // client does not read until it fdopens
    msleep(500);
    checkpat_fd(c, BIG, "SERVER reads client's");
  }
  close(c);
}

int main(int argc, char **argv) {
  S = argv[1]; T0 = now();
  int port, l = listener(&port);
  pid_t sp = fork();
  if (sp == 0) { int c = accept(l, 0, 0); if (getenv("HS")) send(c, "!", 1, 0); server(c); _exit(0); }
  close(l);
  int c = conn(port);
  char line[256];
  struct pollfd pw = {c, POLLOUT, 0}; poll(&pw, 1, 3000);  // drive the handshake
  if (getenv("HS")) { char x; int r = recv(c, &x, 1, 0); if (r != 1) P("HS recv %d", r); }  // HS=1: established first
  if (is("dprintf")) {
    dprintf(c, "hello %d\n", 42);
    int n = recv_line(c, line, sizeof line, 8000); P("CLIENT reply %d %s", n, n > 0 ? line : "");
  } else if (is("stdout")) {
    int save = dup(1);
    dup2(c, 1);
    printf("hello stdout\n"); fflush(stdout);
    dup2(save, 1);
    int n = recv_line(c, line, sizeof line, 8000); P("CLIENT reply %d %s", n, n > 0 ? line : "");
  } else if (is("stdin")) {
    struct pollfd p = {c, POLLIN, 0}; poll(&p, 1, 3000);
    dup2(c, 0);
    char *g = fgets(line, sizeof line, stdin);
    if (g) hexhead("CLIENT fgets(stdin)", (unsigned char *)line, strlen(line)); else P("CLIENT fgets(stdin) NULL (%s)", feof(stdin) ? "EOF" : strerror(errno));
    send(c, "thanks\n", 7, MSG_NOSIGNAL);
  } else if (is("fdopen_write")) {
    FILE *f = fdopen(c, "w");
    fprintf(f, "hello fdopen\n"); fflush(f);
    int n = recv_line(c, line, sizeof line, 8000); P("CLIENT reply %d %s", n, n > 0 ? line : "");
    fclose(f);
  } else if (is("fdopen_dup")) {
    int d = dup(c);
    FILE *f = fdopen(d, "w");
    fprintf(f, "hello dup\n"); fflush(f);
    int n = recv_line(c, line, sizeof line, 8000); P("CLIENT reply via orig %d %s", n, n > 0 ? line : "");
    fclose(f); close(c);
  } else if (is("fdopen_fork")) {
    FILE *f = fdopen(c, "r+");
    pid_t k = fork();
    if (k == 0) { fprintf(f, "hello child\n"); fflush(f); char *g = fgets(line, sizeof line, f); P("CHILD fgets %s", g ? line : "NULL"); _exit(0); }
    waitpid(k, 0, 0);
    fclose(f);
  } else if (is("fdopen_peer_closed") || is("fdopen_peer_shut")) {
    msleep(500);
    FILE *f = fdopen(c, "r+");
    char *g = fgets(line, sizeof line, f);
    P("CLIENT fgets %s (%s) at %.1f", g ? line : "NULL", g ? "" : strerror(errno), now() - T0);
    g = fgets(line, sizeof line, f);
    P("CLIENT fgets2 %s at %.1f", g ? line : "NULL(EOF/err)", now() - T0);
    if (is("fdopen_peer_shut")) { fputs("after shut\n", f); fflush(f); }
    fclose(f);
  } else if (is("fdopen_peer_busy")) {
    struct pollfd p = {c, POLLIN, 0}; poll(&p, 1, 3000);
    double t = now();
    FILE *f = fdopen(c, "r+");
    P("CLIENT fdopen took %.1fs", now() - t);
    char *g = fgets(line, sizeof line, f);
    P("CLIENT fgets %s", g ? line : "NULL");
    fputs("req\n", f); int r = fflush(f);
    P("CLIENT fflush %d %s", r, r ? strerror(errno) : "");
    fclose(f);
  } else if (is("fdopen_both")) {
    send(c, "from client\n", 12, MSG_NOSIGNAL);
    msleep(300);
    FILE *f = fdopen(c, "r+");
    char *g = fgets(line, sizeof line, f);
    P("CLIENT fgets %s at %.1f", g ? line : "NULL", now() - T0);
    g = fgets(line, sizeof line, f);
    P("CLIENT fgets2 %s at %.1f", g ? line : "NULL", now() - T0);
    fclose(f);
  } else if (is("fdopen_unread")) {
    // write BIG to the server that does not read yet, while its BIG arrives unread
    int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK);
    long sent = 0; unsigned char b[16384];
    double t = now();
    while (sent < BIG && now() - t < 2) {
      long k = BIG - sent < (long)sizeof b ? BIG - sent : (long)sizeof b;
      for (long i = 0; i < k; i++) b[i] = pat(sent + i);
      long r = send(c, b, k, MSG_NOSIGNAL);
      if (r > 0) sent += r; else msleep(10);
    }
    fcntl(c, F_SETFL, fl);
    P("CLIENT sent %ld before fdopen", sent);
    FILE *f = fdopen(c, "r+");
    if (sent < BIG) {
      for (long o = sent; o < BIG; o++) fputc(pat(o), f);
      fflush(f);
    }
    checkpat_file(f, BIG, "CLIENT reads server's via FILE");
    fclose(f);
  }
  close(c); int st; waitpid(sp, &st, 0);
  P("END %.1fs", now() - T0);
  return 0;
}
