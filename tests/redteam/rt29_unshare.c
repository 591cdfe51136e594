#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <sched.h>
#include <pthread.h>
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
static void *idle(void *a) { (void)a; for (;;) pause(); return 0; }
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int mode = atoi(argv[1]);
  if (argc > 2) { pthread_t t; pthread_create(&t, 0, idle, 0); }
  int c, s; char b[16];
  if (mode == 7) R("close_range(3,~0,UNSHARE) at start", close_range(3, ~0U, CLOSE_RANGE_UNSHARE));
  if (mode == 8) R("unshare(CLONE_FILES) at start", unshare(CLONE_FILES));
  if (mode == 9) R("close_range(100,~0,0) at start", close_range(100, ~0U, 0));
  mkpair(&c, &s);
  printf("c=%d s=%d\n", c, s);
  if (mode == 1) { R("close_range(s,s,UNSHARE)", close_range(s, s, CLOSE_RANGE_UNSHARE)); }
  if (mode == 2) { R("close_range(s,s,0)", close_range(s, s, 0)); }
  if (mode == 3) { R("close(s)", close(s)); }
  if (mode == 4) { R("close_range(s,s,UNSHARE)", close_range(s, s, CLOSE_RANGE_UNSHARE)); R("F_DUPFD(c,s)", fcntl(c, F_DUPFD, s)); R("close s", close(s)); }
  if (mode == 5) { R("close_range(s,~0,UNSHARE)", close_range(s, ~0U, CLOSE_RANGE_UNSHARE)); }
  if (mode >= 7) close(s);
  if (mode == 6) { R("close_range(s,s,CLOEXEC)", close_range(s, s, CLOSE_RANGE_CLOEXEC)); R("close s", close(s)); }
  R("read c (EOF)", read(c, b, 16));
  R("close c", close(c));
  for (int i = 0; i < 3; i++) {
    mkpair(&c, &s);
    printf("c=%d s=%d\n", c, s);
    R("write c", write(c, "hello", 5)); usleep(20000);
    { int n = read(s, b, 16); printf("read s -> %d:", n); for (int k = 0; k < n; k++) printf(" %02x", (unsigned char)b[k]); printf("\n"); }
    R("write s", write(s, "back", 4)); usleep(20000);
    { int n = read(c, b, 16); printf("read c -> %d:", n); for (int k = 0; k < n; k++) printf(" %02x", (unsigned char)b[k]); printf("\n"); }
    close(c); close(s);
  }
  return 0;
}
