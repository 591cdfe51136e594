#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#define R(name, expr) do { errno=0; long _r=(long)(expr); int _e=errno; printf("%-40s -> %ld %s\n", name, _r, _r<0?strerror(_e):""); } while(0)
static int pipes; static void onp(int s){(void)s;pipes++;}
int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, onp);
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) }; socklen_t al = sizeof a;
  int l = socket(AF_INET, SOCK_STREAM, 0); bind(l, (void*)&a, sizeof a); listen(l, 4); getsockname(l, (void*)&a, &al);
  int c = socket(AF_INET, SOCK_STREAM, 0); connect(c, (void*)&a, sizeof a); int s = accept(l, NULL, NULL);
  char b = 'x'; write(c, &b, 1); read(s, &b, 1); write(s, &b, 1); read(c, &b, 1);
  struct iovec z[2] = {{&b, 0}, {&b, 0}};
  shutdown(c, SHUT_WR);
  R("writev zero", writev(c, z, 2)); printf("  sigpipe=%d\n", pipes);
  R("writev iovcnt 0", writev(c, z, 0)); printf("  sigpipe=%d\n", pipes);
  R("pwritev -1 zero", pwritev(c, z, 2, -1)); printf("  sigpipe=%d\n", pipes);
  R("pwritev2 -1 zero", pwritev2(c, z, 2, -1, 0)); printf("  sigpipe=%d\n", pipes);
  R("sendmsg 2 zero iov", sendmsg(c, &(struct msghdr){.msg_iov = z, .msg_iovlen = 2}, 0)); printf("  sigpipe=%d\n", pipes);
  close(s); usleep(50000);
  R("readv zero after peer close", readv(c, z, 2));
  return 0;
}
