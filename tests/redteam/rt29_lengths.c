#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <time.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#define P(fmt, ...) printf(fmt "\n", ##__VA_ARGS__)
#define R(name, expr) do { errno=0; long _r=(long)(expr); int _e=errno; printf("%-40s -> %ld %s\n", name, _r, _r<0?strerror(_e):""); } while(0)
static int lfd=-1;
static void mkpair(int *c, int *s) {
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
  socklen_t al = sizeof a;
  if (lfd < 0) { lfd = socket(AF_INET, SOCK_STREAM, 0); bind(lfd, (void*)&a, sizeof a); listen(lfd, 16); }
  getsockname(lfd, (void*)&a, &al);
  *c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(*c, (void*)&a, sizeof a)) { perror("connect"); exit(2); }
  *s = accept(lfd, NULL, NULL);
  char b = 'x';
  if (write(*c, &b, 1) != 1 || read(*s, &b, 1) != 1 || write(*s, &b, 1) != 1 || read(*c, &b, 1) != 1) { perror("rt"); exit(2);}
}
static double now(void){ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec*1e3 + t.tv_nsec/1e6; }
#define T(name, tmo, expr) do { double _t0 = now(); long _r = (long)(expr); double _d = now() - _t0; printf("%-36s -> %ld  %s\n", name, _r, _d + 0.05 < (tmo) ? "EARLY" : _d > (tmo) + 60 ? "LATE" : "ok"); if (_d + 0.05 < (tmo) || _d > (tmo)+60) fprintf(stderr, "%s took %.2f ms\n", name, _d); } while(0)
int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int c, s; mkpair(&c, &s);
  struct pollfd pf = { s, POLLIN, 0 };
  int ms[] = { 1, 3, 10, 25, 50, 120, 250 };
  for (int i = 0; i < 7; i++) {
    char nm[64];
    snprintf(nm, 64, "poll %d ms", ms[i]); T(nm, ms[i], poll(&pf, 1, ms[i]));
    snprintf(nm, 64, "ppoll %d ms", ms[i]); T(nm, ms[i], ppoll(&pf, 1, &(struct timespec){0, ms[i]*1000000L}, NULL));
    fd_set r; FD_ZERO(&r); FD_SET(s, &r);
    snprintf(nm, 64, "select %d ms", ms[i]); T(nm, ms[i], select(s+1, &r, NULL, NULL, &(struct timeval){0, ms[i]*1000}));
    int ep = epoll_create1(0); struct epoll_event ev = { EPOLLIN }, out[2]; epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    snprintf(nm, 64, "epoll_wait %d ms", ms[i]); T(nm, ms[i], epoll_wait(ep, out, 2, ms[i]));
    close(ep);
    struct timeval tv = { 0, ms[i]*1000 }; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[8];
    snprintf(nm, 64, "recv SO_RCVTIMEO %d ms", ms[i]); T(nm, ms[i], recv(s, b, 8, 0));
  }
  /* sub-ms */
  T("ppoll 300us", 0.3, ppoll(&pf, 1, &(struct timespec){0, 300000}, NULL));
  T("select 300us", 0.3, ({ fd_set r; FD_ZERO(&r); FD_SET(s, &r); select(s+1, &r, NULL, NULL, &(struct timeval){0, 300}); }));
  struct timeval tv0 = {0,0}; setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv0, sizeof tv0);
  /* huge lengths with small data */
  char buf[64];
  write(c, "0123456789", 10); usleep(20000);
  R("recv len SIZE_MAX", recv(s, buf, SIZE_MAX, MSG_PEEK));
  R("read len SIZE_MAX", read(s, buf, SIZE_MAX));
  write(c, "0123456789", 10); usleep(20000);
  R("read len 2^31", read(s, buf, 1UL<<31));
  write(c, "0123456789", 10); usleep(20000);
  struct iovec iv[2] = { { buf, 5 }, { buf + 5, (size_t)1 << 40 } };
  R("readv 5 + 2^40", readv(s, iv, 2));
  R("read rest", read(s, buf, 64));
  /* recvmmsg with timeout, sendmmsg after SHUT_WR */
  struct mmsghdr mm[3]; struct iovec mi[3]; char mb[3][8];
  for (int i = 0; i < 3; i++) { mi[i].iov_base = mb[i]; mi[i].iov_len = 8; memset(&mm[i], 0, sizeof mm[i]); mm[i].msg_hdr.msg_iov = &mi[i]; mm[i].msg_hdr.msg_iovlen = 1; }
  write(c, "abcdefghijkl", 12); usleep(20000);
  T("recvmmsg 3 timeout 100ms", 0, recvmmsg(s, mm, 3, MSG_DONTWAIT, &(struct timespec){0, 100000000}));
  P("  lens %u %u %u", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
  write(c, "abcd", 4); usleep(20000);
  for (int i = 0; i < 3; i++) mm[i].msg_len = 77;
  R("recvmmsg 3 WAITFORONE 4 bytes", recvmmsg(s, mm, 3, MSG_WAITFORONE, NULL));
  P("  lens %u %u %u", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
  signal(SIGPIPE, SIG_IGN);
  shutdown(c, SHUT_WR);
  R("sendmmsg after SHUT_WR", sendmmsg(c, mm, 3, 0));
  R("recvmmsg at EOF", recvmmsg(s, mm, 3, 0, NULL));
  P("  lens %u %u %u", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
  R("recvmmsg vlen 0", recvmmsg(s, mm, 0, 0, NULL));
  R("sendmmsg vlen 0", sendmmsg(s, mm, 0, 0));
  return 0;
}
