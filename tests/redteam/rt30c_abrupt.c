// rt30c: abrupt and short connections, compared with plain TCP.
// usage: rt30c_abrupt SCEN N PORT   (run under world.sh smc|tcp); prints one line per
// connection "S[...] C[...]" (server's and client's observations); aggregate with sort|uniq -c.
// gcc -O2 -o rt30c_abrupt rt30c_abrupt.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int PORT; static int KMAX = 3000;
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
  case EINPROGRESS: return "EINPROGRESS"; case ETIMEDOUT: return "ETIMEDOUT"; case EBADF: return "EBADF";
  case EALREADY: return "EALREADY"; case EISCONN: return "EISCONN"; case EINVAL: return "EINVAL";
  case 0: return "0";
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
static int prev(int fd, int ev, int tmo) {
  struct pollfd p = {fd, ev, 0};
  int r = poll(&p, 1, tmo);
  return r <= 0 ? 0 : p.revents;
}
static void addpoll(int fd, int tmo) { add("p%s", rev(prev(fd, POLLIN | POLLOUT | POLLRDHUP, tmo))); }
static void addpollin(int fd, int tmo) { add("pi%s", rev(prev(fd, POLLIN | POLLRDHUP, tmo))); }
static int serr(int fd) { int e = 0; socklen_t l = sizeof e; getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l); return e; }

static long woff;  // pattern offset of the bytes this side wrote
static long roff;
static void wr(int fd, int n) {
  char b[65536];
  for (int i = 0; i < n && i < (int)sizeof b; i++) b[i] = 'a' + (woff + i) % 26;
  ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
  if (r < 0) add("w:%s", en(errno)); else { add("w%zd", r); woff += r; }
}
// read until EOF/error/timeout; "rN+END", BAD if a byte is not the pattern
static void drain(int fd, int tmo) {
  char b[65536]; long n = 0; int bad = 0; const char *end;
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, tmo) == 0) { end = "TMO"; break; }
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r == 0) { end = "EOF"; break; }
    if (r < 0) { if (errno == EAGAIN) continue; end = en(errno); break; }
    for (ssize_t i = 0; i < r; i++) if (b[i] != 'a' + (roff + i) % 26) { if (!bad) add("BAD@%ld:%02x%02x%02x", n + i, (unsigned char)b[i], (unsigned char)b[i+1], (unsigned char)b[i+2]); bad = 1; }
    n += r; roff += r;
  }
  add("r%ld+%s", n, end);
}
static void rd1(int fd) {  // one non-blocking read
  char b[4096]; ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
  if (r < 0) add("rn:%s", en(errno)); else add("rn%zd", r);
}
static struct sockaddr_in sa(int port) {
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); return a;
}
static int mklisten(int port, int backlog) {
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = sa(port);
  if (bind(s, (void *)&a, sizeof a)) { perror("bind"); exit(2); }
  listen(s, backlog); fcntl(s, F_SETFL, O_NONBLOCK); return s;
}
static int conn(int nb) {
  int s = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
  struct sockaddr_in a = sa(PORT);
  int r = connect(s, (void *)&a, sizeof a);
  if (r < 0) add("c:%s", en(errno)); else add("c0");
  return s;
}
static int acc(int l, int tmo) {
  struct pollfd p = {l, POLLIN, 0};
  if (poll(&p, 1, tmo) <= 0) { add("a:TMO"); return -1; }
  int s = accept4(l, 0, 0, 0);
  if (s < 0 && errno == EAGAIN) { if (poll(&p, 1, tmo) <= 0) { add("a:TMO2"); return -1; } s = accept4(l, 0, 0, 0); }
  if (s < 0) add("a:%s", en(errno));
  return s;
}
static void linger0(int s) { struct linger l = {1, 0}; setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l); }
static int sp[2], cp[2];  // sync pipes: server->client, client->server
static void tell(int fd) { char c = 1; if (write(fd, &c, 1) != 1) {} }
static int hear(int fd, int tmo) { struct pollfd p = {fd, POLLIN, 0}; char c; if (poll(&p, 1, tmo) <= 0) return 0; return read(fd, &c, 1) == 1; }
static void msleep(int ms) { usleep(ms * 1000); }

// ---- per-connection scenarios: client(fd) runs in a forked child, server() in the parent ----
typedef struct { const char *name; void (*cli)(void); void (*srv)(int l); } scen;

#define C(n) static void c_##n(void)
#define S(n) static void s_##n(int l)
#define SR(n) static void s_##n(int l)

// cclose: client closes right after connect (blocking)
C(cclose) { int s = conn(0); close(s); }
S(cclose) { int s = acc(l, 3000); if (s < 0) return; drain(s, 3000); wr(s, 5); msleep(20); addpoll(s, 0); wr(s, 5); close(s); }
// cnbclose: non-blocking connect, closed at once
C(cnbclose) { int s = conn(1); close(s); }
S(cnbclose) { s_cclose(l); }
// cnbpclose: non-blocking connect, poll writable, close
C(cnbpclose) { int s = conn(1); addpoll(s, 2000); add("se:%s", en(serr(s))); close(s); }
S(cnbpclose) { s_cclose(l); }
// cwclose: connect, write, close
C(cwclose) { int s = conn(0); wr(s, 100); close(s); }
S(cwclose) { s_cclose(l); }
// cnbwnow: non-blocking connect, write at once (EAGAIN allowed), then poll+write, close
C(cnbwnow) { int s = conn(1); wr(s, 100); if (woff == 0) { addpoll(s, 2000); wr(s, 100); } close(s); }
S(cnbwnow) { s_cclose(l); }
// cshutwr: client SHUT_WR right after connect, then reads the server's answer
C(cshutwr) { int s = conn(0); add("sh%d", shutdown(s, SHUT_WR)); drain(s, 3000); close(s); }
S(cshutwr) { int s = acc(l, 3000); if (s < 0) return; drain(s, 3000); wr(s, 100); close(s); }
// cshutrd: client SHUT_RD then writes; the server writes too
C(cshutrd) { int s = conn(0); add("sh%d", shutdown(s, SHUT_RD)); rd1(s); wr(s, 100); tell(cp[1]); hear(sp[0], 3000); rd1(s); addpoll(s, 0); close(s); }
S(cshutrd) { int s = acc(l, 3000); if (s < 0) return; hear(cp[0], 3000); wr(s, 100); msleep(20); tell(sp[1]); drain(s, 3000); addpoll(s, 0); wr(s, 5); close(s); }
// cshutrdwr: client SHUT_RDWR right after connect, closes when told
C(cshutrdwr) { int s = conn(0); add("sh%d", shutdown(s, SHUT_RDWR)); hear(sp[0], 3000); rd1(s); addpoll(s, 0); wr(s, 5); close(s); }
S(cshutrdwr) { int s = acc(l, 3000); if (s < 0) return; drain(s, 3000); wr(s, 100); msleep(30); addpoll(s, 0); wr(s, 100); rd1(s); tell(sp[1]); close(s); }
// crst0: client linger-0 close right after connect
C(crst0) { int s = conn(0); linger0(s); close(s); }
S(crst0) { int s = acc(l, 3000); if (s < 0) return; msleep(20); addpoll(s, 0); drain(s, 3000); wr(s, 5); close(s); }
// crstnb: non-blocking connect then linger-0 close at once
C(crstnb) { int s = conn(1); linger0(s); close(s); }
S(crstnb) { s_crst0(l); }
// crstw: client writes then linger-0 close
C(crstw) { int s = conn(0); wr(s, 100); linger0(s); close(s); }
S(crstw) { s_crst0(l); }
// crsts: server wrote, client (not reading) linger-0 closes
C(crsts) { int s = conn(0); hear(sp[0], 3000); linger0(s); close(s); }
S(crsts) { int s = acc(l, 3000); if (s < 0) return; wr(s, 100); tell(sp[1]); msleep(20); addpoll(s, 0); drain(s, 3000); wr(s, 5); close(s); }
// crstunread: server wrote, client closes normally without reading (TCP: RST)
C(crstunread) { int s = conn(0); hear(sp[0], 3000); close(s); }
S(crstunread) { s_crsts(l); }
// srst0: server linger-0 close right after accept; client reads, writes
C(srst0) { int s = conn(0); hear(sp[0], 3000); msleep(10); addpoll(s, 0); drain(s, 3000); wr(s, 5); wr(s, 5); close(s); }
S(srst0) { int s = acc(l, 3000); if (s < 0) return; linger0(s); close(s); tell(sp[1]); }
// srstw: server writes 100 then linger-0 close
C(srstw) { c_srst0(); }
S(srstw) { int s = acc(l, 3000); if (s < 0) return; wr(s, 100); linger0(s); close(s); tell(sp[1]); }
// srstwc: server writes, client writes (server has unread), server linger-0
C(srstwc) { int s = conn(0); wr(s, 100); tell(cp[1]); hear(sp[0], 3000); msleep(10); addpoll(s, 0); drain(s, 3000); wr(s, 5); close(s); }
S(srstwc) { int s = acc(l, 3000); if (s < 0) return; wr(s, 100); hear(cp[0], 3000); msleep(5); linger0(s); close(s); tell(sp[1]); }
// sclose: server closes right after accept
C(sclose) { int s = conn(0); hear(sp[0], 3000); msleep(10); addpoll(s, 0); drain(s, 3000); wr(s, 5); msleep(20); addpoll(s, 0); wr(s, 5); close(s); }
S(sclose) { int s = acc(l, 3000); if (s < 0) return; close(s); tell(sp[1]); }
// sclosew: server writes then closes at once
C(sclosew) { c_sclose(); }
S(sclosew) { int s = acc(l, 3000); if (s < 0) return; wr(s, 100); close(s); tell(sp[1]); }
// sclosenow: server closes right after accept, client writes immediately after connect and reads
C(sclosenow) { int s = conn(0); wr(s, 100); drain(s, 3000); wr(s, 5); close(s); }
S(sclosenow) { int s = acc(l, 3000); if (s < 0) return; close(s); }
// sshutwr: server SHUT_WR right after accept, then reads the client
C(sshutwr) { int s = conn(0); drain(s, 3000); wr(s, 100); close(s); }
S(sshutwr) { int s = acc(l, 3000); if (s < 0) return; add("sh%d", shutdown(s, SHUT_WR)); drain(s, 3000); close(s); }
// sshutrdwr: server SHUT_RDWR right after accept; client reads, writes
C(sshutrdwr) { int s = conn(0); drain(s, 3000); wr(s, 100); msleep(20); addpoll(s, 0); wr(s, 5); rd1(s); close(s); tell(cp[1]); }
S(sshutrdwr) { int s = acc(l, 3000); if (s < 0) return; add("sh%d", shutdown(s, SHUT_RDWR)); hear(cp[0], 3000); rd1(s); addpoll(s, 0); close(s); }
// sshutrd: server SHUT_RD after accept; client writes; server writes
C(sshutrd) { int s = conn(0); wr(s, 100); drain(s, 3000); close(s); }
S(sshutrd) { int s = acc(l, 3000); if (s < 0) return; add("sh%d", shutdown(s, SHUT_RD)); msleep(10); rd1(s); wr(s, 100); close(s); }
// cork / nodelay
C(cork) { int s = conn(0), one = 1; setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one); wr(s, 10); wr(s, 10); wr(s, 10); close(s); }
S(cork) { int s = acc(l, 3000); if (s < 0) return; drain(s, 3000); close(s); }
C(corkpre) { int s = socket(AF_INET, SOCK_STREAM, 0), one = 1; setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one); setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); struct sockaddr_in a = sa(PORT); add("c%d", connect(s, (void *)&a, sizeof a)); wr(s, 10); wr(s, 10); drain(s, 3000); close(s); }
S(corkpre) { int s = acc(l, 3000); if (s < 0) return; int one = 1; setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one); wr(s, 7); shutdown(s, SHUT_WR); drain(s, 3000); close(s); }
// sndtimeo: client SO_SNDTIMEO 1 ms, blocking connect to a server that accepts 200 ms late
C(sndtimeo) { int s = socket(AF_INET, SOCK_STREAM, 0); struct timeval tv = {0, 1000}; setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); struct sockaddr_in a = sa(PORT); int r = connect(s, (void *)&a, sizeof a); add("c:%s", r ? en(errno) : "0"); if (r) { addpoll(s, 2000); add("se:%s", en(serr(s))); } wr(s, 100); drain(s, 3000); close(s); }
S(sndtimeo) { msleep(200); int s = acc(l, 3000); if (s < 0) return; drain(s, 300); wr(s, 50); shutdown(s, SHUT_WR); drain(s, 3000); close(s); }
// rcvtimeo: SO_RCVTIMEO 1 ms on client, server accepts late
C(rcvtimeo) { int s = socket(AF_INET, SOCK_STREAM, 0); struct timeval tv = {0, 1000}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); struct sockaddr_in a = sa(PORT); int r = connect(s, (void *)&a, sizeof a); add("c:%s", r ? en(errno) : "0"); char b[10]; ssize_t n = recv(s, b, 10, 0); add("rb:%s", n < 0 ? en(errno) : "x"); wr(s, 100); drain(s, 3000); close(s); }
S(rcvtimeo) { s_sndtimeo(l); }
// deferaccept: server has TCP_DEFER_ACCEPT; client writes 150 ms after connect
C(defer) { int s = conn(0); msleep(150); wr(s, 100); drain(s, 3000); close(s); }
S(defer) { struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0); int s = acc(l, 3000); if (s < 0) return; clock_gettime(CLOCK_MONOTONIC, &t1); long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000; add("acc%s", ms >= 100 ? "late" : "early"); rd1(s); shutdown(s, SHUT_WR); drain(s, 3000); close(s); }
// fastopen: MSG_FASTOPEN sendto
C(tfo) { int s = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = sa(PORT); char b[100]; for (int i = 0; i < 100; i++) b[i] = 'a' + i % 26; ssize_t r = sendto(s, b, 100, MSG_FASTOPEN, (void *)&a, sizeof a); add("tfo:%s", r < 0 ? en(errno) : "ok"); if (r > 0) woff += r; wr(s, 10); shutdown(s, SHUT_WR); drain(s, 3000); close(s); }
S(tfo) { int s = acc(l, 3000); if (s < 0) return; drain(s, 3000); wr(s, 20); close(s); }
C(tfoc) { int s = socket(AF_INET, SOCK_STREAM, 0), one = 1; add("so%d", setsockopt(s, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &one, sizeof one)); struct sockaddr_in a = sa(PORT); int r = connect(s, (void *)&a, sizeof a); add("c:%s", r ? en(errno) : "0"); wr(s, 100); shutdown(s, SHUT_WR); drain(s, 3000); close(s); }
S(tfoc) { s_tfo(l); }
C(tfoclose) { int s = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = sa(PORT); char b[100]; for (int i = 0; i < 100; i++) b[i] = 'a' + i % 26; ssize_t r = sendto(s, b, 100, MSG_FASTOPEN, (void *)&a, sizeof a); add("tfo:%s", r < 0 ? en(errno) : "ok"); if (r > 0) woff += r; close(s); }
S(tfoclose) { s_cclose(l); }
// kill: client killed with SIGKILL at a random moment (parent kills); client writes forever
C(killw) { tell(cp[1]); int s = conn(0); for (;;) { char b[1000]; for (int i = 0; i < 1000; i++) b[i] = 'a' + (woff + i) % 26; ssize_t r = send(s, b, 1000, MSG_NOSIGNAL); if (r > 0) woff += r; else pause(); } }
S(killw) { int s = acc(l, 1000); if (s < 0) return; drain(s, 3000); wr(s, 5); close(s); }
C(killr) { tell(cp[1]); int s = conn(0); (void)s; pause(); }
S(killr) { int s = acc(l, 1000); if (s < 0) return; wr(s, 100); drain(s, 3000); wr(s, 5); msleep(10); wr(s, 5); close(s); }
C(killnb) { tell(cp[1]); int s = conn(1); (void)s; pause(); }
S(killnb) { s_killr(l); }
C(killnbw) { tell(cp[1]); int s = conn(1); addpoll(s, 100); wr(s, 100); pause(); }
S(killnbw) { s_killr(l); }

// cnbgreet: client non-blocking connect then close; server greets with write() and SIGPIPE at its default
C(cnbgreet) { int s = conn(1); close(s); }
S(cnbgreet) { int s = acc(l, 3000); if (s < 0) return; msleep(5); signal(SIGPIPE, SIG_DFL); ssize_t r = write(s, "hello", 5); add("greet:%s", r < 0 ? en(errno) : "ok"); signal(SIGPIPE, SIG_IGN); drain(s, 3000); close(s); }
C(cgreet) { int s = conn(0); close(s); }
S(cgreet) { s_cnbgreet(l); }
C(ckgreet) { tell(cp[1]); int s = conn(0); (void)s; pause(); }
S(ckgreet) { s_cnbgreet(l); }
// kstream: established connection (accepted), client streams, killed mid-stream; kstreamr: server wrote first (unread at the kill)
static pid_t CHILD;
C(kstream) { int s = conn(0); tell(cp[1]); for (;;) { char b[1000]; for (int i = 0; i < 1000; i++) b[i] = 'a' + (woff + i) % 26; ssize_t r = send(s, b, 1000, MSG_NOSIGNAL); if (r > 0) woff += r; else pause(); } }
S(kstream) { int s = acc(l, 3000); if (s < 0) return; hear(cp[0], 3000); usleep(rand() % KMAX); kill(CHILD, SIGKILL); drain(s, 3000); wr(s, 5); msleep(10); wr(s, 5); close(s); }
C(kstreamr) { c_kstream(); }
S(kstreamr) { int s = acc(l, 3000); if (s < 0) return; wr(s, 100); hear(cp[0], 3000); usleep(rand() % KMAX); kill(CHILD, SIGKILL); drain(s, 3000); wr(s, 5); msleep(10); wr(s, 5); close(s); }
static scen scens[] = {
  {"kstream", c_kstream, s_kstream}, {"kstreamr", c_kstreamr, s_kstreamr},
  {"cnbgreet", c_cnbgreet, s_cnbgreet}, {"cgreet", c_cgreet, s_cgreet}, {"killgreet", c_ckgreet, s_ckgreet},
#define E(n) {#n, c_##n, s_##n}
  E(cclose), E(cnbclose), E(cnbpclose), E(cwclose), E(cnbwnow), E(cshutwr), E(cshutrd), E(cshutrdwr),
  E(crst0), E(crstnb), E(crstw), E(crsts), E(crstunread), E(srst0), E(srstw), E(srstwc), E(sclose), E(sclosew),
  E(sclosenow), E(sshutwr), E(sshutrdwr), E(sshutrd), E(cork), E(corkpre), E(sndtimeo), E(rcvtimeo), E(defer),
  E(tfo), E(tfoc), E(tfoclose), E(killw), E(killr), E(killnb), E(killnbw),
};

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: SCEN N PORT\n"); return 2; }
  const char *name = argv[1]; int n = atoi(argv[2]); PORT = atoi(argv[3]);
  signal(SIGPIPE, SIG_IGN);
  srand(getpid()); if (getenv("KMAX")) KMAX = atoi(getenv("KMAX"));
  scen *sc = 0;
  for (size_t i = 0; i < sizeof scens / sizeof *scens; i++) if (!strcmp(scens[i].name, name)) sc = &scens[i];
  if (!sc) { fprintf(stderr, "no scenario %s\n", name); return 2; }
  int l = mklisten(PORT, 128);
  if (!strcmp(name, "defer")) { int t = 5; setsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &t, sizeof t); }
  if (!strncmp(name, "tfo", 3)) { int q = 16; setsockopt(l, IPPROTO_TCP, TCP_FASTOPEN, &q, sizeof q); }
  int killer = !strncmp(name, "kill", 4); int ks = !strncmp(name, "kstream", 7);
  for (int it = 0; it < n; it++) {
    pipe(sp); pipe(cp);
    int op[2]; pipe(op);
    pid_t pid = fork();
    if (pid == 0) {
      close(l); close(op[0]);
      obs[0] = 0; woff = roff = 0;
      if (killer) { sc->cli(); _exit(0); }
      sc->cli();
      if (write(op[1], obs, strlen(obs)) < 0) {}
      _exit(0);
    }
    close(op[1]); CHILD = pid;
    obs[0] = 0; woff = roff = 0;
    if (killer) {
      hear(cp[0], 3000);
      int d = rand() % KMAX;  // us
      usleep(d);
      kill(pid, SIGKILL);
    }
    sc->srv(l);
    char sobs[4096]; strcpy(sobs, obs);
    char cobs[4096] = ""; int k = 0, r;
    struct pollfd p = {op[0], POLLIN, 0};
    while (k < (int)sizeof cobs - 1 && poll(&p, 1, 8000) > 0 && (r = read(op[0], cobs + k, sizeof cobs - 1 - k)) > 0) k += r;
    cobs[k] = 0;
    int st; waitpid(pid, &st, 0);
    if (!killer && !ks && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) strcat(cobs, " DIED");
    printf("S[%s] C[%s]\n", sobs, cobs);
    fflush(stdout);
    close(op[0]); close(sp[0]); close(sp[1]); close(cp[0]); close(cp[1]);
  }
  close(l);
  return 0;
}
