// rt31 (red team round 31, rt31x_eintr.c): a blocking call made while the handshake waits for the server's Accept (a server that
// never accepts), interrupted by SIGALRM (handler without SA_RESTART) 30 ms in; the server is
// killed at KILL_MS (0: never). Prints the call's result and its duration bucket.
// usage: rt31_eintr OP N PORT KILL_MS   OP: recv send poll   gcc -O2 -o rt31_eintr rt31_eintr.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void onalrm(int x) { (void)x; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  const char *op = argv[1]; int n = atoi(argv[2]), port = atoi(argv[3]), kms = atoi(argv[4]);
  signal(SIGPIPE, SIG_IGN); setvbuf(stdout, 0, _IOLBF, 0);
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(port); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    int rp[2]; pipe(rp);
    pid_t srv = fork();
    if (srv == 0) {
      int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
      setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(l, (void *)&a, sizeof a)) _exit(2);
      listen(l, 8); if (write(rp[1], "x", 1)) {}
      if (getenv("ACC_MS")) { usleep(atoi(getenv("ACC_MS")) * 1000); int c2 = accept(l, 0, 0); (void)c2; }
      pause(); _exit(0);
    }
    char c; if (read(rp[0], &c, 1)) {}
    close(rp[0]); close(rp[1]);
    pid_t killer = -1;
    if (kms) { killer = fork(); if (killer == 0) { usleep(kms * 1000); kill(srv, SIGKILL); _exit(0); } }
    int bc = !strcmp(op, "bconnect");
    int s = socket(AF_INET, SOCK_STREAM | (bc ? 0 : SOCK_NONBLOCK), 0);
    struct sigaction sa = {0}; sa.sa_handler = onalrm; sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 0}, {0, 30000}};
    if (bc) setitimer(ITIMER_REAL, &it, 0);
    double t0 = now(); ssize_t r; char b[10];
    int cr = connect(s, (void *)&a, sizeof a);
    if (bc) { r = cr; } else {
    fcntl(s, F_SETFL, 0);
    setitimer(ITIMER_REAL, &it, 0);
    t0 = now(); }
    if (bc) { if (cr == 0) { struct pollfd p = {s, POLLIN, 0}; poll(&p, 1, 100); } }
    else if (!strcmp(op, "recv")) r = recv(s, b, 10, 0);
    else if (!strcmp(op, "send")) r = send(s, "hello", 5, 0);
    else { struct pollfd p = {s, POLLIN, 0}; r = poll(&p, 1, 2000); }
    int e = errno; double ms = (now() - t0) * 1000;
    printf("%s=%zd%s%s t=%s", op, r, r < 0 ? ":" : "", r < 0 ? strerrorname_np(e) : "", ms < 25 ? "<25" : ms < 45 ? "25-45" : ms < 150 ? "45-150" : ">=150");
    r = recv(s, b, 10, MSG_DONTWAIT); printf(" then recv=%zd%s\n", r, r < 0 ? strerrorname_np(errno) : "");
    close(s); kill(srv, SIGKILL); waitpid(srv, 0, 0); if (killer > 0) waitpid(killer, 0, 0);
  }
  return 0;
}
