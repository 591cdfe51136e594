/* Round 14: a hostile peer writes WAIT_ALONE / WAIT_SWITCH into the wait words of its
 * connection's DMBs (it maps both: /memfd:smc-dmb in its own /proc/self/maps, header word at
 * offset 24) and then never touches the connection again. The victim (another process) holds
 * that connection and an honest one, and then does something unrelated to either:
 *   wait   forks a child that exits after 0.2 s and waits for it (waitpid(pid, 0))
 *   nohang the same with a WNOHANG loop (10 ms sleeps)
 *   exec   forks a child that execs an image without the library (holding both connections)
 *          which exits at once; the victim waits for it
 *   honest a round trip on the honest connection, 20 times
 * usage: rt14_hostile PORT MODE K BITS   (K hostile connections; BITS: alone|switch|count)
 * Output: elapsed times rounded (TCP: no DMB, nothing scribbled). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static void on_alrm(int s) { (void)s; }
static int connect_to(int p) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c, (void *)&a, sizeof a)) { perror("connect"); exit(1); }
  return c;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static const char *rounded(double s) { return s < 0.5 ? "<0.5 s" : s < 2 ? "0.5-2 s" : s < 9 ? "2-9 s" : s < 15 ? "9-15 s" : s < 25 ? "15-25 s" : s < 35 ? "25-35 s" : ">=35 s"; }

static int scribble(uint64_t bits, int count) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512]; int n = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (!strstr(line, "memfd:smc-dmb")) continue;
    unsigned long lo, hi; sscanf(line, "%lx-%lx", &lo, &hi);
    volatile uint64_t *w = (uint64_t *)(lo + 24);
    /* only our own DMB (the ring the victim wrote its 'v' into; the victim reads its wait
     * word as its peer's) */
    if (!getenv("RT14_BOTH_DMBS") && *(volatile char *)(lo + 32) != 'v') continue;
    if (count) *w = *w + (1ULL << 32) * 5; /* five control bytes "sent" that never come */
    else __atomic_fetch_or(w, bits, __ATOMIC_SEQ_CST);
    n++;
  }
  if (f) fclose(f);
  return n;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "exit0")) return 0;
  if (argc < 5) { fprintf(stderr, "usage\n"); return 2; }
  int port = atoi(argv[1]), K = atoi(argv[3]);
  const char *mode = argv[2], *bits = argv[4];
  uint64_t b = !strcmp(bits, "alone") ? (32 | 4) : 4;
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) { perror("listen"); return 1; }
  int done[2]; pipe(done);
  int never[2]; pipe(never);
  pid_t kids[32]; int nk = 0;
  for (int i = 0; i < K; i++) {
    pid_t p = fork();
    if (!p) {
      close(l);
      int c = connect_to(port);
      char x; write(c, "h", 1); read(c, &x, 1);
      int n = scribble(b, !strcmp(bits, "count"));
      char r = n ? 's' : 'n'; write(done[1], &r, 1);
      if (getenv("RT14_BOTH_DMBS")) pause(); /* a served wait: answers its own end */
      read(never[0], &r, 1); /* never answers: a read on a pipe nobody writes (not a served wait) */
      _exit(0);
    }
    kids[nk++] = p;
  }
  int hx[32];
  for (int i = 0; i < K; i++) { hx[i] = accept(l, NULL, NULL); char x; read(hx[i], &x, 1); write(hx[i], "v", 1); }
  int scribbled = 0;
  for (int i = 0; i < K; i++) { char r; read(done[0], &r, 1); scribbled += r == 's'; }
  /* the honest peer: an echo child */
  pid_t hp = fork();
  if (!hp) { close(l); int c = connect_to(port); char buf[64]; ssize_t r; while ((r = read(c, buf, sizeof buf)) > 0) write(c, buf, r); _exit(0); }
  int h = accept(l, NULL, NULL);
  write(h, "p", 1); { char x; read(h, &x, 1); }
  usleep(50000);
  double t0 = now(), dt = 0;
  if (!strcmp(mode, "wait") || !strcmp(mode, "nohang")) {
    pid_t c = fork();
    if (!c) { usleep(200000); _exit(0); }
    if (!strcmp(mode, "wait")) waitpid(c, NULL, 0);
    else while (waitpid(c, NULL, WNOHANG) == 0) usleep(10000);
    dt = now() - t0;
  } else if (!strcmp(mode, "pause")) {
    /* a SIGALRM in 0.5 s ends a pause() (a handler that only returns) */
    struct sigaction sa = {0}; sa.sa_handler = on_alrm; sigaction(SIGALRM, &sa, NULL);
    ualarm(500000, 0);
    pause();
    dt = now() - t0;
  } else if (!strcmp(mode, "exec")) {
    pid_t c = fork();
    if (!c) {
      char *e[64]; int k = 0;
      for (int i = 0; environ[i] && k < 62; i++) if (strncmp(environ[i], "LD_PRELOAD=", 11)) e[k++] = environ[i];
      e[k] = NULL;
      char self[4096]; ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); self[n > 0 ? n : 0] = 0;
      char *av[] = {self, "exit0", NULL};
      execve(self, av, e);
      _exit(127);
    }
    waitpid(c, NULL, 0);
    dt = now() - t0;
  } else if (!strcmp(mode, "honest")) {
    for (int i = 0; i < 20; i++) { char x; write(h, "z", 1); read(h, &x, 1); }
    dt = now() - t0;
  }
  /* the honest connection afterwards */
  char buf[8] = {0};
  write(h, "after", 5);
  int got = 0; while (got < 5) { ssize_t r = read(h, buf + got, 5 - got); if (r <= 0) break; got += r; }
  fprintf(stderr, "elapsed %.2f s\n", dt);
  printf("%s K=%d %s: %s (scribbled %d of %d); honest echo [%s]\n", mode, K, bits, rounded(dt), scribbled > 0, 1, buf);
  for (int i = 0; i < nk; i++) kill(kids[i], 9);
  close(h);
  while (wait(NULL) > 0) {}
  return 0;
}
