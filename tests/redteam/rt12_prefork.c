// Round 12: a prefork server whose primary accepts and passes each connection over the
// socketpair it made for each worker before the fork (Node cluster's round robin, by hand).
// With NW workers each holding NF more descriptors: time of M connections (ping/pong), and
// the slowest sendmsg of the primary. gcc -O2 -o rt12_prefork rt12_prefork.c
// usage: rt12_prefork PORT NW NF M
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
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static int sendfd(int via, int fd) {
  char b = 'x', cb[CMSG_SPACE(sizeof(int))];
  struct iovec v = {&b, 1};
  struct msghdr m = {0};
  m.msg_iov = &v; m.msg_iovlen = 1; m.msg_control = cb; m.msg_controllen = sizeof cb;
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(via, &m, 0);
}
static int recvfd(int via) {
  char b, cb[CMSG_SPACE(sizeof(int))];
  struct iovec v = {&b, 1};
  struct msghdr m = {0};
  m.msg_iov = &v; m.msg_iovlen = 1; m.msg_control = cb; m.msg_controllen = sizeof cb;
  if (recvmsg(via, &m, 0) <= 0) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (!c) return -1;
  int fd; memcpy(&fd, CMSG_DATA(c), sizeof fd); return fd;
}
int main(int argc, char **argv) {
  int port = atoi(argv[1]), nw = atoi(argv[2]), nf = atoi(argv[3]), m = atoi(argv[4]);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 128)) { perror("listen"); return 2; }
  int *pair = calloc(nw, sizeof(int));
  for (int w = 0; w < nw; w++) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    if (!fork()) {
      close(sv[0]); close(l);
      for (int i = 0; i < nf; i++) open("/dev/null", O_RDONLY);
      for (;;) {
        int c = recvfd(sv[1]);
        if (c < 0) _exit(0);
        char buf[64];
        int n = read(c, buf, sizeof buf);
        if (n > 0) { buf[1] = 'o'; if (write(c, buf, n) != n) { printf("worker: write %s\n", strerror(errno)); fflush(stdout); } }
        else { printf("worker: read %d %s\n", n, n < 0 ? strerror(errno) : ""); fflush(stdout); }
        close(c);
      }
    }
    close(sv[1]);
    pair[w] = sv[0];
  }
  pid_t cl = fork();
  if (!cl) {
    close(l);
    int ok = 0;
    for (int i = 0; i < m; i++) {
      int c = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(c, (void *)&a, sizeof a)) { perror("connect"); continue; }
      char q[32], r[32] = {0};
      int n = snprintf(q, sizeof q, "ping %d", i);
      write(c, q, n);
      struct timeval tv = {5, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      int k = read(c, r, sizeof r - 1);
      q[1] = 'o';
      int good = k == n && !memcmp(q, r, n);
      ok += good;
      if (!good) { printf("conn %d: read %d (%s) %.*s\n", i, k, k < 0 ? strerror(errno) : "-", k > 0 ? k : 0, r); fflush(stdout); }
      close(c);
    }
    printf("client: %d of %d answered\n", ok, m);
    fflush(stdout);
    _exit(0);
  }
  double t0 = now(), worst = 0;
  for (int i = 0; i < m; i++) {
    int c = accept(l, 0, 0);
    double s = now();
    sendfd(pair[i % nw], c);
    double d = now() - s;
    if (d > worst) worst = d;
    close(c);
  }
  waitpid(cl, 0, 0);
  fprintf(stderr, "prefork %d workers x %d fds: %d connections in %.0f ms, slowest sendmsg %.2f ms\n", nw, nf, m, (now() - t0) * 1e3, worst * 1e3);
  for (int w = 0; w < nw; w++) close(pair[w]);
  while (wait(0) > 0) ;
  return 0;
}
