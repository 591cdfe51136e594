// Signal storm: SIGALRM every 100 us (no SA_RESTART) while a reader and a writer move a
// byte-numbered stream through one connection with blocking calls. Checks every byte, and
// that interrupted calls report EINTR only when nothing was transferred (TCP semantics).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <sys/wait.h>
static volatile long sigs;
static void h(int s) { (void)s; sigs++; }
#define TOTAL (64L << 20)
int main(void) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(l, (void *)&a, sizeof a); listen(l, 8);
  socklen_t al = sizeof a; getsockname(l, (void *)&a, &al);
  pid_t p = fork();
  if (p == 0) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) { perror("connect"); _exit(2); }
    struct sigaction sa = {.sa_handler = h}; sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 100}, {0, 100}}; setitimer(ITIMER_REAL, &it, 0);
    static unsigned char buf[200000]; long off = 0, eintr = 0;
    while (off < TOTAL) {
      size_t n = sizeof buf; if ((long)n > TOTAL - off) n = TOTAL - off;
      for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)((off + i) * 7 + ((off + i) >> 13));
      size_t done = 0;
      while (done < n) {
        ssize_t w = write(c, buf + done, n - done);
        if (w < 0) { if (errno == EINTR) { eintr++; continue; } perror("write"); _exit(3); }
        done += w;
      }
      off += n;
    }
    close(c);
    fprintf(stderr, "writer: %ld bytes, %ld EINTR, %ld signals\n", off, eintr, sigs);
    _exit(0);
  }
  int s = accept(l, 0, 0);
  struct sigaction sa = {.sa_handler = h}; sigaction(SIGALRM, &sa, 0);
  struct itimerval it = {{0, 100}, {0, 100}}; setitimer(ITIMER_REAL, &it, 0);
  static unsigned char buf[77777]; long off = 0, eintr = 0; int bad = 0;
  for (;;) {
    ssize_t r = read(s, buf, sizeof buf);
    if (r < 0) { if (errno == EINTR) { eintr++; continue; } perror("read"); return 4; }
    if (r == 0) break;
    for (ssize_t i = 0; i < r; i++) {
      unsigned char e = (unsigned char)((off + i) * 7 + ((off + i) >> 13));
      if (buf[i] != e && !bad) { fprintf(stderr, "CORRUPT at byte %ld: %02x != %02x\n", off + i, buf[i], e); bad = 1; }
    }
    off += r;
  }
  struct itimerval z = {0}; setitimer(ITIMER_REAL, &z, 0);
  int st; waitpid(p, &st, 0);
  fprintf(stderr, "reader: %ld bytes, %ld EINTR, %ld signals, writer status %d\n", off, eintr, sigs, st);
  if (bad || off != TOTAL || st != 0) { fprintf(stderr, "FAIL\n"); return 1; }
  fprintf(stderr, "OK\n"); return 0;
}
