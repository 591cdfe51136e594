// Round 13: signal-driven I/O on one connection: the main thread streams MB megabytes with
// blocking send() to an echo server (a child process), and a SIGIO handler (O_ASYNC, F_SETOWN)
// reads the echo with recv(MSG_DONTWAIT), checking every byte. The handler interrupts the
// main thread's send on the same connection.
// gcc -O2 -o rt13_sigio rt13_sigio.c
// usage: rt13_sigio PORT MB [late]   (late: a 1-byte round trip first, so the handshake is over
//   before O_ASYNC is set; the echo server's first byte is skipped by the check)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int c;
static volatile size_t got, bad;
static void fill(char *b, size_t n, size_t off) {
  for (size_t i = 0; i < n; i++) b[i] = (char)((off + i) * 2654435761u >> 13);
}
static void on_io(int s) {
  (void)s;
  int e = errno;
  static char b[1 << 16], w[1 << 16];
  ssize_t r;
  while ((r = recv(c, b, sizeof b, MSG_DONTWAIT)) > 0) {
    fill(w, r, got);
    if (memcmp(b, w, r)) bad++;
    got += r;
  }
  errno = e;
}
int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  size_t total = (size_t)atoi(argv[2]) << 20;
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) { perror("listen"); return 2; }
  pid_t srv = fork();
  if (!srv) {
    int s = accept(l, 0, 0);
    static char b[1 << 16];
    ssize_t r;
    while ((r = read(s, b, sizeof b)) > 0)
      for (ssize_t o = 0; o < r;) { ssize_t w = write(s, b + o, r - o); if (w <= 0) _exit(1); o += w; }
    _exit(0);
  }
  close(l);
  c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (void *)&a, sizeof a)) { perror("connect"); return 2; }
  if (argc > 3 && !strcmp(argv[3], "late")) {
    char x = (char)(0 * 2654435761u >> 13);  // the stream's first byte
    fill(&x, 1, 0);
    if (send(c, &x, 1, 0) != 1 || recv(c, &x, 1, MSG_WAITALL) != 1) { perror("round trip"); return 1; }
    got = 1;  // the echo of the stream restarts at offset 1 below
  }
  struct sigaction sa = {0};
  sa.sa_handler = on_io;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGIO, &sa, 0);
  fcntl(c, F_SETOWN, getpid());
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_ASYNC);
  static char buf[1 << 16];
  size_t sent = got;  // 1 after the round trip
  total += got;
  while (sent < total) {
    size_t len = total - sent < sizeof buf ? total - sent : sizeof buf;
    fill(buf, len, sent);
    for (size_t o = 0; o < len;) {
      ssize_t w = send(c, buf + o, len - o, MSG_NOSIGNAL);
      if (w < 0) { if (errno == EINTR) continue; perror("send"); return 1; }
      o += w;
    }
    sent += len;
  }
  shutdown(c, SHUT_WR);
  sigset_t blk, old;
  sigemptyset(&blk);
  sigaddset(&blk, SIGIO);
  for (int i = 0; i < 500 && got < total; i++) {  // wait for the rest (a SIGIO may be needed)
    sigprocmask(SIG_BLOCK, &blk, &old);
    on_io(0);
    sigprocmask(SIG_SETMASK, &old, 0);
    usleep(10000);
  }
  printf("sigio: sent %zu, echoed back %zu, bad blocks %zu\n", sent, (size_t)got, (size_t)bad);
  kill(srv, SIGKILL);
  waitpid(srv, 0, 0);
  return 0;
}
