// Round 12: postgres's backend shape. The server accepts, forks a child for the connection
// (the postmaster); the child adds the socket to an epoll set for EPOLLOUT, writes a greeting,
// then MODs the entry to EPOLLIN and waits (3 s) for the client's request. Counts the waits
// that end with nothing although bytes are queued (FIONREAD > 0) or that spin.
// pg: the client speaks first; the backend is non-blocking, recv first, MOD to EPOLLIN on
// EAGAIN (postgres's secure_read + ModifyWaitEvent).
// gcc -O2 -o rt12_epmod rt12_epmod.c ; usage: rt12_epmod PORT N [pg]  (run with
// SMC_CLC_TIMEOUT_MS=1 and two CPU hogs)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  int port = atoi(argv[1]), n = atoi(argv[2]), pg = argc > 3 && !strcmp(argv[3], "pg");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) { perror("listen"); return 2; }
  pid_t cl = fork();
  if (!cl) {  // clients: connect, read the greeting, send the request, read the answer
    close(l);
    int ok = 0;
    for (int i = 0; i < n; i++) {
      int c = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(c, (void *)&a, sizeof a)) { perror("connect"); continue; }
      struct timeval tv = {5, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      char b[64];
      int k;
      if (pg) {  // postgres: the client speaks first (startup), then a query
        write(c, "start!", 6);
        k = read(c, b, 6);
        if (k != 6) { printf("client %d: auth %d\n", i, k); close(c); continue; }
        usleep(2000);
        write(c, "query!", 6);
        k = read(c, b, 6);
      } else {
      k = read(c, b, 6);
      if (k != 6) { printf("client %d: greeting %d\n", i, k); close(c); continue; }
      write(c, "query!", 6);
      k = read(c, b, 6);
      }
      if (k == 6 && !memcmp(b, "answer", 6)) ok++;
      else printf("client %d: answer %d %s\n", i, k, k < 0 ? strerror(errno) : "");
      close(c);
    }
    printf("clients: %d of %d answered\n", ok, n);
    fflush(stdout);
    _exit(0);
  }
  for (int i = 0; i < n; i++) {
    int s = accept(l, 0, 0);
    pid_t b = fork();
    if (!b) {  // the backend
      close(l);
      if (pg) {
        // postgres's backend: non-blocking socket in an epoll set added for EPOLLOUT; each read
        // tries recv first, on EAGAIN MODs the entry to EPOLLIN (once) and waits.
        int fl = 1;
        ioctl(s, FIONBIO, &fl);
        int ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = 7}, out[4];
        epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
        int mask = EPOLLOUT;
        for (int step = 0; step < 2; step++) {
          char buf[16];
          for (;;) {
            int k = recv(s, buf, 6, 0);
            if (k == 6) break;
            if (k >= 0 || errno != EAGAIN) { printf("backend %d: recv %d %s\n", i, k, strerror(errno)); _exit(1); }
            if (mask != EPOLLIN) { ev.events = mask = EPOLLIN; epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev); }
            double t0 = now();
            int r = epoll_wait(ep, out, 4, 3000);
            if (r != 1 || !(out[0].events & EPOLLIN)) {
              int q = 0; ioctl(s, FIONREAD, &q);
              printf("backend %d step %d: epoll_wait %d events %#x after %.0f ms, FIONREAD %d\n", i, step, r, r > 0 ? out[0].events : 0, (now() - t0) * 1e3, q);
              if (r == 0) _exit(1);
            }
          }
          send(s, step ? "answer" : "authok", 6, 0);
        }
        _exit(0);
      }
      int ep = epoll_create1(EPOLL_CLOEXEC);
      struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = 7};
      epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
      struct epoll_event out[4];
      epoll_wait(ep, out, 4, 3000);
      write(s, "hello!", 6);
      ev.events = EPOLLIN;
      epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev);
      double t0 = now();
      int r = epoll_wait(ep, out, 4, 3000);
      double dt = now() - t0;
      int q = 0;
      ioctl(s, FIONREAD, &q);
      if (r != 1 || !(out[0].events & EPOLLIN))
        printf("backend %d: epoll_wait %d events %#x after %.0f ms, FIONREAD %d\n", i, r, r > 0 ? out[0].events : 0, dt * 1e3, q);
      char buf[16];
      if (read(s, buf, 6) == 6) write(s, "answer", 6);
      _exit(0);
    }
    close(s);
  }
  waitpid(cl, 0, 0);
  while (wait(0) > 0) ;
  return 0;
}
