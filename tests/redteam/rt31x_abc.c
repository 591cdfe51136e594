// rt31x: an inetd-style handler (fork, dup2 onto 0/1, execve of an image without LD_PRELOAD)
// reads a 4-byte request, answers with three 1-byte writes "A" "B" "C" and exits with the
// client's second write ("more") unread (TCP: a reset after its bytes). The client writes its
// request DELAY_US after connect (MODE w: at once as the first call; MODE p: after a poll for
// POLLIN of 0 ms; MODE nb: non-blocking socket, EAGAIN retried after poll POLLOUT), then
// "more" 1 ms later, then reads to the end. Per connection: what it read, the end, and how
// long the first write took.
// usage: rt31x_abc MODE N PORT DELAY_US     gcc -O2 -o rt31x_abc rt31x_abc.c
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
#include <sys/wait.h>
#include <sys/time.h>
#include <sys/sendfile.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile int SIGS;
static void onalrm(int x) { (void)x; SIGS++; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "_h")) {
    char b[4]; int k = 0;
    while (k < 4) { ssize_t r = read(0, b + k, 4 - k); if (r <= 0) _exit(1); k += r; }
    if (write(1, "A", 1)) {} if (write(1, "B", 1)) {} if (write(1, "C", 1)) {}
    _exit(0);
  }
  if (argc >= 2 && !strcmp(argv[1], "_s")) {
    // streaming handler: 10 ms, then "G" every 5 ms for 300 ms, then as _h
    usleep(10000);
    for (int i = 0; i < 60; i++) { if (write(1, "G", 1)) {} usleep(5000); }
    char b[4]; int k = 0;
    while (k < 4) { ssize_t r = read(0, b + k, 4 - k); if (r <= 0) _exit(1); k += r; }
    if (write(1, "A", 1)) {} if (write(1, "B", 1)) {} if (write(1, "C", 1)) {}
    _exit(0);
  }
  const char *mode = argv[1]; int n = atoi(argv[2]), port = atoi(argv[3]), dus = atoi(argv[4]);
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_port = htons(port); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&a, sizeof a)) { perror("bind"); return 2; }
  listen(l, 128);
  pid_t srv = fork();
  if (srv == 0) {
    // environment without LD_PRELOAD for the handler
    char *env[256]; int e = 0;
    for (char **p = environ; *p && e < 255; p++) if (strncmp(*p, "LD_PRELOAD=", 11)) env[e++] = *p;
    env[e] = 0;
    signal(SIGCHLD, SIG_IGN);
    for (;;) {
      int c = accept(l, 0, 0);
      if (c < 0) continue;
      if (fork() == 0) {
        dup2(c, 0); dup2(c, 1); close(c); close(l);
        char *av[] = {"/proc/self/exe", !strcmp(mode, "stream") ? "_s" : "_h", 0};
        execve("/proc/self/exe", av, env); _exit(127);
      }
      close(c);
    }
  }
  close(l);
  if (!strcmp(mode, "many")) {
    // N connections, then DELAY_US, then one non-blocking send on each in turn (an event loop)
    int ss[256];
    for (int i = 0; i < n; i++) { ss[i] = socket(AF_INET, SOCK_STREAM, 0); if (connect(ss[i], (void *)&a, sizeof a)) printf("connect:%d\n", errno); }
    usleep(dus);
    double t0 = now(), mx = 0; int ok = 0;
    for (int i = 0; i < n; i++) { fcntl(ss[i], F_SETFL, O_NONBLOCK); double a0 = now(); if (send(ss[i], "req1", 4, 0) == 4) ok++; double d = now() - a0; if (d > mx) mx = d; }
    double t1 = now();
    int good = 0;
    for (int i = 0; i < n; i++) { fcntl(ss[i], F_SETFL, 0); char got[16] = {0}; int k = 0; struct timeval tv = {2, 0}; setsockopt(ss[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      for (;;) { ssize_t x = recv(ss[i], got + k, 15 - k, 0); if (x <= 0) break; k += x; } if (!strcmp(got, "ABC")) good++; close(ss[i]); }
    printf("many: %d sends ok, all %d sends took %s (max one %s), answers ABC %d/%d\n", ok, n, (t1 - t0) * 1000 < 10 ? "<10ms" : (t1 - t0) * 1000 < 100 ? "10-100ms" : (t1 - t0) * 1000 < 500 ? "100-500ms" : ">=500ms", mx * 1000 < 5 ? "<5ms" : mx * 1000 < 30 ? "5-30ms" : ">=30ms", good, n);
    fprintf(stderr, "total %.1f ms max %.1f ms\n", (t1 - t0) * 1000, mx * 1000);
    kill(srv, SIGKILL); waitpid(srv, 0, 0);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (void *)&a, sizeof a)) { printf("connect:%d\n", errno); continue; }
    usleep(dus);
    if (!strcmp(mode, "p")) { struct pollfd p = {s, POLLIN, 0}; poll(&p, 1, 0); }
    if (!strcmp(mode, "nb") || !strcmp(mode, "stream")) fcntl(s, F_SETFL, O_NONBLOCK);
    if (!strcmp(mode, "sig")) { struct sigaction sa = {0}; sa.sa_handler = onalrm; sigaction(SIGALRM, &sa, 0);
      struct itimerval it = {{0, 0}, {0, 5000}}; setitimer(ITIMER_REAL, &it, 0); }
    SIGS = 0;
    double t0 = now();
    ssize_t r;
    if (!strcmp(mode, "sf")) { int f = open("/tmp/rt31x/req1", O_RDONLY); r = sendfile(s, f, 0, 4); close(f); }
    else if (!strcmp(mode, "mm")) { struct iovec v = {"req1", 4}; struct mmsghdr m = {{0, 0, &v, 1, 0, 0, 0}, 0}; r = sendmmsg(s, &m, 1, 0) == 1 ? (ssize_t)m.msg_len : -1; }
    else if (!strcmp(mode, "spl")) { int pp[2]; pipe(pp); if (write(pp[1], "req1", 4)) {} r = splice(pp[0], 0, s, 0, 4, 0); close(pp[0]); close(pp[1]); }
    else if (!strcmp(mode, "dw")) r = send(s, "req1", 4, MSG_DONTWAIT);
    else r = send(s, "req1", 4, 0);
    if (!strcmp(mode, "sig")) { if (r < 0) printf("send:%s ", strerror(errno)); printf("%s ", SIGS ? "handler-ran-inside-send" : "handler-not-yet"); usleep(10000); }
    int again = 0;
    while (r < 0 && errno == EAGAIN) { again++; struct pollfd p = {s, POLLOUT, 0}; poll(&p, 1, 1000); r = send(s, "req1", 4, 0); }
    double t1 = now();
    fcntl(s, F_SETFL, 0);
    usleep(1000);
    ssize_t r2 = send(s, "more", 4, 0);
    char got[256] = {0}; int k = 0; const char *end = "?";
    struct pollfd p = {s, POLLIN, 0};
    for (;;) {
      if (poll(&p, 1, 3000) <= 0) { end = "TMO"; break; }
      ssize_t x = recv(s, got + k, sizeof got - 1 - k, 0);
      if (x == 0) { end = "EOF"; break; }
      if (x < 0) { end = errno == ECONNRESET ? "ECONNRESET" : strerror(errno); break; }
      k += x;
      if (k >= 3 && !strcmp(got + k - 3, "ABC")) fprintf(stderr, "ABC after %.1f ms\n", (now() - t0) * 1000);
    }
    double ms = (t1 - t0) * 1000; fprintf(stderr, "first write %.1f ms\n", ms);
    printf("w%zd%s w%zd got=%s %s first_write=%s\n", r, again ? "(after EAGAIN)" : "", r2, got, end,
           ms < 5 ? "<5ms" : ms < 30 ? "5-30ms" : ">=30ms");
    close(s);
  }
  kill(srv, SIGKILL); waitpid(srv, 0, 0);
  return 0;
}
