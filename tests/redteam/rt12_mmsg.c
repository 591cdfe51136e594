// Round 12: recvmmsg's per-message name, control messages (TCP_INQ, SO_TIMESTAMPNS) and
// flags on a fallback server end (client without the library) and on SMC-D, against TCP.
// gcc -O2 -o rt12_mmsg rt12_mmsg.c ; usage: rt12_mmsg PORT [nolib]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (argc > 2 && !strcmp(argv[2], "client")) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) return 1;
    for (int i = 0; i < 6; i++) { char b[100]; memset(b, 'a' + i, 100); write(c, b, 100); usleep(30000); }
    char x; read(c, &x, 1);
    return 0;
  }
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4)) return 2;
  pid_t p = fork();
  if (!p) {
    char *env[64]; int k = 0;
    for (char **e = environ; *e && k < 62; e++)
      if (!(argc > 2 && !strcmp(argv[2], "nolib") && !strncmp(*e, "LD_PRELOAD=", 11))) env[k++] = *e;
    env[k] = 0;
    char *av[] = {argv[0], argv[1], "client", 0};
    execve("/proc/self/exe", av, env);
    _exit(9);
  }
  int s = accept(l, 0, 0);
  setsockopt(s, IPPROTO_TCP, TCP_INQ, &one, sizeof one);
  setsockopt(s, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
  usleep(400000);
  struct mmsghdr mm[3];
  char bufs[3][80], cbuf[3][128];
  struct sockaddr_in names[3];
  struct iovec iov[3];
  memset(mm, 0, sizeof mm);
  for (int i = 0; i < 3; i++) {
    iov[i].iov_base = bufs[i]; iov[i].iov_len = 80;
    mm[i].msg_hdr.msg_iov = &iov[i]; mm[i].msg_hdr.msg_iovlen = 1;
    mm[i].msg_hdr.msg_control = cbuf[i]; mm[i].msg_hdr.msg_controllen = i == 2 ? 8 : sizeof cbuf[i];
    mm[i].msg_hdr.msg_name = &names[i]; mm[i].msg_hdr.msg_namelen = sizeof names[i];
    mm[i].msg_hdr.msg_flags = 0x7777;
  }
  int n = recvmmsg(s, mm, 3, 0, 0);
  printf("recvmmsg %d\n", n);
  for (int i = 0; i < (n > 0 ? n : 0); i++) {
    struct msghdr *h = &mm[i].msg_hdr;
    printf(" msg %d len %u namelen %u flags %#x controllen %zu:", i, mm[i].msg_len, h->msg_namelen, h->msg_flags, (size_t)h->msg_controllen);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
      if (c->cmsg_level == IPPROTO_TCP && c->cmsg_type == TCP_CM_INQ) printf(" INQ=%d", *(int *)CMSG_DATA(c));
      else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
        struct timespec ts, nw; memcpy(&ts, CMSG_DATA(c), sizeof ts); clock_gettime(CLOCK_REALTIME, &nw);
        printf(" TSNS(%s)", labs(nw.tv_sec - ts.tv_sec) < 5 ? "fresh" : "stale");
      } else printf(" (%d,%d)", c->cmsg_level, c->cmsg_type);
    }
    printf("\n");
  }
  write(s, "x", 1);
  waitpid(p, 0, 0);
  return 0;
}
