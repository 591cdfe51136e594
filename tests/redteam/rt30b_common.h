/* rt30b: shared helpers for round 30b probes. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#define MB (1 << 20)
static __thread int last_seed;
static inline unsigned char pat(int seed, long off) { return (unsigned char)(off * 131 + seed * 7 + (off >> 9)); }
static int mklisten(int port, int nb) {
  int l = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
  int one = 1; setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001) };
  if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) { perror("listen"); exit(3); }
  return l;
}
static int mkconnect(int port, int nb) {
  int c = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001) };
  int r = connect(c, (void *)&a, sizeof a);
  if (r && !(nb && errno == EINPROGRESS)) { perror("connect"); exit(3); }
  return c;
}
static int is_clc(const unsigned char *b, long n) {
  return (n >= 4 && b[0] == 0xe2 && b[1] == 0xd4 && b[2] == 0xc3) || (n >= 3 && b[0] == 0xd4 && b[1] == 0xc3 && b[2] == 0xc4);
}
/* write n bytes of pattern seed; returns bytes written or -errno */
static long wr_pat(int fd, int seed, long n) {
  static __thread unsigned char buf[65536];
  long off = 0;
  while (off < n) {
    long k = n - off < (long)sizeof buf ? n - off : (long)sizeof buf;
    for (long i = 0; i < k; i++) buf[i] = pat(seed, off + i);
    long w = write(fd, buf, k);
    if (w < 0) { if (errno == EINTR) continue; if (errno == EAGAIN) { struct pollfd p = { fd, POLLOUT, 0 }; poll(&p, 1, -1); continue; } return -errno; }
    off += w;
  }
  return off;
}
/* read exactly n bytes, check pattern; fills msg */
static long rd_pat(int fd, int seed, long n, char *msg, size_t ml) {
  static __thread unsigned char buf[65536];
  long off = 0, bad = -1; unsigned char first[8] = {0}; int fn = 0;
  while (off < n) {
    long k = n - off < (long)sizeof buf ? n - off : (long)sizeof buf;
    long r = read(fd, buf, k);
    if (r < 0) { if (errno == EINTR) continue; if (errno == EAGAIN) { struct pollfd p = { fd, POLLIN, 0 }; poll(&p, 1, -1); continue; }
      snprintf(msg, ml, "read err %s after %ld%s", strerror(errno), off, bad >= 0 ? " BAD" : ""); return -errno; }
    if (r == 0) break;
    if (off == 0) { fn = r < 8 ? r : 8; memcpy(first, buf, fn); if (seed < 0) seed = buf[0] / 7; }
    for (long i = 0; i < r && bad < 0; i++) if (buf[i] != pat(seed, off + i)) bad = off + i;
    off += r;
  }
  if (bad >= 0) snprintf(msg, ml, "got %ld BAD at %ld first=%02x%02x%02x%02x%s", off, bad, first[0], first[1], first[2], first[3], is_clc(first, fn) ? " CLC!" : "");
  else snprintf(msg, ml, "got %ld ok", off);
  last_seed = seed;
  return off;
}
static const char *rd_eof(int fd) {
  char b[16]; int r;
  do r = read(fd, b, sizeof b); while (r < 0 && errno == EINTR);
  static __thread char m[64];
  if (r == 0) return "eof";
  if (r < 0) { snprintf(m, sizeof m, "err %s", strerror(errno)); return m; }
  snprintf(m, sizeof m, "extra %d bytes %02x%02x%02x", r, (unsigned char)b[0], (unsigned char)b[1], (unsigned char)b[2]); return m;
}
/* server: read n seed a, write n seed b, shutdown wr, read eof, close */
static void serve(int fd, const char *tag, int a, int b, long n) {
  char m[160];
  rd_pat(fd, a, n, m, sizeof m);
  if (a < 0) { b = last_seed + 1; }
  long w = wr_pat(fd, b, n);
  shutdown(fd, SHUT_WR);
  const char *e = rd_eof(fd);
  if (a < 0) printf("%s server: rx %s (seed %d); tx %ld; then %s\n", tag, m, last_seed, w, e);
  else printf("%s server: rx %s; tx %ld; then %s\n", tag, m, w, e);
  close(fd);
}
static void client(int fd, const char *tag, int a, int b, long n) {
  char m[160];
  long w = wr_pat(fd, a, n);
  shutdown(fd, SHUT_WR);
  rd_pat(fd, b, n, m, sizeof m);
  const char *e = rd_eof(fd);
  printf("%s client: tx %ld; rx %s; then %s\n", tag, w, m, e);
  close(fd);
}
