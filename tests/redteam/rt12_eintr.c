// Round 12: EINTR from a blocking recv while bytes are queued. The peer writes 100 KB and
// waits; 0.5 s later we read it in 1-byte recv calls while SIGALRM (no SA_RESTART) comes
// every 50 us. TCP never says EINTR with bytes queued (tcp_recvmsg copies first).
// gcc -O2 -o rt12_eintr rt12_eintr.c ; usage: rt12_eintr PORT [nolib]  (nolib: the client
// runs without the library, so that our end falls back and stays a SOCKHASH member)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
static void h(int s) { (void)s; }
int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (argc > 2 && !strcmp(argv[2], "client")) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) { perror("connect"); return 1; }
    static char buf[100000];
    memset(buf, 'z', sizeof buf);
    if (write(c, buf, sizeof buf) != sizeof buf) perror("write");
    char x;
    read(c, &x, 1);
    return 0;
  }
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4)) { perror("listen"); return 2; }
  pid_t p = fork();
  if (!p) {
    char *env[64];
    int k = 0;
    for (char **e = environ; *e && k < 62; e++)
      if (!(argc > 2 && !strcmp(argv[2], "nolib") && !strncmp(*e, "LD_PRELOAD=", 11))) env[k++] = *e;
    env[k] = 0;
    char *av[] = {argv[0], argv[1], "client", 0};
    execve("/proc/self/exe", av, env);
    _exit(9);
  }
  int s = accept(l, 0, 0);
  usleep(500000);
  struct sigaction sa = {0};
  sa.sa_handler = h;
  sigaction(SIGALRM, &sa, 0);
  struct itimerval it = {{0, 50}, {0, 50}};
  setitimer(ITIMER_REAL, &it, 0);
  long got = 0, eintr = 0, eintr_q = 0, calls = 0;
  char buf[1];
  while (got < 100000) {
    int n = recv(s, buf, sizeof buf, 0);
    calls++;
    if (n > 0) { got += n; continue; }
    if (n < 0 && errno == EINTR) {
      eintr++;
      int q = 0;
      ioctl(s, FIONREAD, &q);
      if (q > 0) eintr_q++;
      continue;
    }
    printf("recv %d errno %d\n", n, errno);
    break;
  }
  struct itimerval z = {0};
  setitimer(ITIMER_REAL, &z, 0);
  printf("read %ld bytes; EINTR with bytes queued: %s\n", got, eintr_q ? "yes" : "no");
  fprintf(stderr, "%ld calls, %ld EINTR, %ld with bytes queued\n", calls, eintr, eintr_q);
  write(s, "x", 1);
  waitpid(p, 0, 0);
  return 0;
}
