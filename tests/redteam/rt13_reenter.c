// Round 13: a forking server's reaper (SIGCHLD handler: while (waitpid(-1, WNOHANG) > 0)) runs
// while the main thread is inside send() of a big response on an SMC connection, and the
// client's end leaves for an image without the library (the client forks, the child execs
// `env -u LD_PRELOAD sha256sum` with the socket as stdin): the peer asks for the switch to TCP
// while the server sleeps in send; the library's waitpid(WNOHANG) answers the switches asked
// (answer_peer_switches) from inside the handler.
// gcc -O2 -o rt13_reenter rt13_reenter.c
// usage: rt13_reenter PORT MB [SIGCHLD_US [fdopen]]   (SIGCHLD_US: a stop/continue of a child every
//   N us; fdopen: the client does not exec, it fdopen()s its socket after 0.3 s and freads to EOF,
//   checking every byte: stdio taking the fd is a switch to TCP too; forks: the SIGCHLDs come from
//   children that a thread of the server forks every N us and that _exit at once)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t hits;
static void reaper(int s) {
  (void)s;
  int e = errno, st;
  hits++;
  while (waitpid(-1, &st, WNOHANG) > 0) {}
  errno = e;
}
static int fork_us;
static volatile int fork_stop;
static void *forker(void *a) {
  (void)a;
  sigset_t c;  // the SIGCHLDs go to the main thread
  sigemptyset(&c);
  sigaddset(&c, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &c, 0);
  for (int k = 0; k < 5000 && !fork_stop; k++) {  // at most 5000: a deadlocked reaper leaves zombies
    pid_t p = fork();
    if (!p) _exit(0);
    if (p < 0) break;
    usleep(fork_us);
  }
  return 0;
}
static void fill(char *b, size_t n, size_t off) {
  for (size_t i = 0; i < n; i++) b[i] = (char)((off + i) * 2654435761u >> 13);
}

int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  size_t total = (size_t)atoi(argv[2]) << 20;
  int us = argc > 3 ? atoi(argv[3]) : 300;
  // expected digest, without sockets
  int pp[2];
  pipe(pp);
  pid_t hp = fork();
  if (!hp) {
    dup2(pp[0], 0); close(pp[0]); close(pp[1]);
    execlp("env", "env", "-u", "LD_PRELOAD", "sha256sum", (char *)0);
    _exit(127);
  }
  close(pp[0]);
  static char buf[1 << 16];
  for (size_t off = 0; off < total; off += sizeof buf) { fill(buf, sizeof buf, off); write(pp[1], buf, sizeof buf); }
  close(pp[1]);
  waitpid(hp, 0, 0);
  fflush(stdout);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) { perror("listen"); return 2; }
  pid_t cl = fork();
  if (!cl) {  // the client
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) { perror("connect"); _exit(2); }
    usleep(300000);  // the server fills the ring and sleeps in send
    if (argc > 4 && !strcmp(argv[4], "fdopen")) {
      FILE *f = fdopen(c, "r");
      static char rb[1 << 16], want[1 << 16];
      size_t got = 0, n, bad = 0;
      while ((n = fread(rb, 1, sizeof rb, f)) > 0) {
        fill(want, n, got);
        if (memcmp(rb, want, n)) bad++;
        got += n;
      }
      printf("client (fdopen): %zu bytes, %zu bad blocks, %s\n", got, bad, ferror(f) ? strerror(errno) : "EOF");
      fflush(stdout);
      _exit(0);
    }
    pid_t k = fork();
    if (!k) {
      dup2(c, 0); close(c);
      execlp("env", "env", "-u", "LD_PRELOAD", "sha256sum", (char *)0);
      _exit(127);
    }
    close(c);
    int st;
    waitpid(k, &st, 0);
    _exit(0);
  }
  // the server: a sleeping child stopped and continued by another, for SIGCHLDs
  struct sigaction sa = {0};
  sa.sa_handler = reaper;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGCHLD, &sa, 0);
  int forks = argc > 4 && !strcmp(argv[4], "forks");
  pthread_t ft;
  pid_t K = -1, L = -1;
  if (forks) { fork_us = us; pthread_create(&ft, 0, forker, 0); }
  else K = fork();
  if (!K) { close(l); for (;;) pause(); }
  if (!forks) L = fork();
  if (!L) {
    close(l);
    for (;;) { kill(K, SIGSTOP); usleep(us); kill(K, SIGCONT); usleep(us); if (getppid() == 1) _exit(0); }
  }
  int s = accept(l, 0, 0);
  close(l);
  size_t sent = 0;
  while (sent < total) {
    fill(buf, sizeof buf, sent);
    size_t o = 0;
    while (o < sizeof buf) {
      ssize_t w = send(s, buf + o, sizeof buf - o, MSG_NOSIGNAL);
      if (w < 0) { if (errno == EINTR) continue; fprintf(stderr, "server send: %s after %zu\n", strerror(errno), sent + o); goto out; }
      o += w;
    }
    sent += sizeof buf;
  }
out:
  close(s);
  if (forks) { fork_stop = 1; pthread_join(ft, 0); }
  else { kill(L, SIGKILL); kill(K, SIGKILL); }
  sa.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &sa, 0);
  int st;
  waitpid(cl, &st, 0);
  while (wait(&st) > 0) {}
  fprintf(stderr, "server: sent %zu, SIGCHLD %d\n", sent, hits);
  return 0;
}
