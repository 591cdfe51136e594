#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
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
static void dumpwait(int ep, const char *what) {
  struct epoll_event out[8]; int n = epoll_wait(ep, out, 8, 0);
  printf("  %s wait -> %d:", what, n); for (int i = 0; i < n; i++) printf(" [%llu %x]", (unsigned long long)out[i].data.u64, out[i].events); printf("\n");
}
int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int c, s; mkpair(&c, &s);
  write(c, "x", 1); usleep(30000);
  struct epoll_event ev;
  /* 1: ADD with NULL event */
  int ep = epoll_create1(0);
  R("ADD s NULL", epoll_ctl(ep, EPOLL_CTL_ADD, s, NULL)); dumpwait(ep, "after NULL add");
  close(ep);
  /* 2: MOD with NULL */
  ep = epoll_create1(0); ev.events = EPOLLIN; ev.data.u64 = 7;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  R("MOD s NULL", epoll_ctl(ep, EPOLL_CTL_MOD, s, NULL)); dumpwait(ep, "after NULL mod");
  close(ep);
  /* 3: EXCLUSIVE|ONESHOT */
  ep = epoll_create1(0); ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT; ev.data.u64 = 8;
  R("ADD s EXCL|ONESHOT", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev)); dumpwait(ep, "");
  close(ep);
  /* 4: ADD EXCLUSIVE then MOD */
  ep = epoll_create1(0); ev.events = EPOLLIN | EPOLLEXCLUSIVE; ev.data.u64 = 9;
  R("ADD s EXCL", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  ev.events = EPOLLIN; ev.data.u64 = 10;
  R("MOD s (excl entry)", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev)); dumpwait(ep, "");
  ev.events = EPOLLIN|EPOLLOUT|EPOLLEXCLUSIVE;
  R("MOD s to EXCL", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  close(ep);
  /* 5: EXCLUSIVE with invalid extra bits */
  ep = epoll_create1(0); ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLRDHUP | EPOLLET; ev.data.u64 = 11;
  R("ADD s EXCL|RDHUP|ET", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  close(ep);
  ep = epoll_create1(0); ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLPRI; ev.data.u64 = 11;
  R("ADD s EXCL|PRI", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  close(ep);
  /* 6: wait with NULL events */
  ep = epoll_create1(0); ev.events = EPOLLIN; ev.data.u64 = 12;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  R("wait NULL events", epoll_wait(ep, NULL, 4, 0));
  R("wait bad ptr events", epoll_wait(ep, (void*)8, 4, 0));
  R("wait maxevents huge", epoll_wait(ep, (struct epoll_event[1]){0}, 0x7fffffff, 0));
  close(ep);
  /* 7: SMC fd >= 1024 in poll/epoll/select */
  int hi = dup2(s, 1500);
  struct pollfd pf = { hi, POLLIN, 0 };
  R("poll fd 1500", poll(&pf, 1, 100)); P("  rev=%x", pf.revents);
  ep = epoll_create1(0); ev.events = EPOLLIN; ev.data.u64 = 13;
  R("epoll ADD 1500", epoll_ctl(ep, EPOLL_CTL_ADD, hi, &ev)); dumpwait(ep, "1500");
  close(ep);
  /* select with SMC at 1500, data present (already) */
  size_t bytes = 2048/8; fd_set *r = calloc(1, bytes);
  ((unsigned long*)r)[1500/64] |= 1UL << (1500%64);
  struct timeval tv = {0, 300000};
  R("select fd 1500 (1 byte queued)", select(1501, r, NULL, NULL, &tv));
  char b[16]; R("read 1500", read(hi, b, 16));
  /* select write on 1500 */
  memset(r, 0, bytes); ((unsigned long*)r)[1500/64] |= 1UL << (1500%64);
  tv.tv_sec = 0; tv.tv_usec = 300000;
  R("select write fd 1500", select(1501, NULL, r, NULL, &tv));
  /* peer closes, select read on 1500 */
  close(c); usleep(30000);
  memset(r, 0, bytes); ((unsigned long*)r)[1500/64] |= 1UL << (1500%64);
  tv.tv_sec = 0; tv.tv_usec = 300000;
  R("select fd 1500 after peer close", select(1501, r, NULL, NULL, &tv));
  R("read 1500", read(hi, b, 16));
  return 0;
}
