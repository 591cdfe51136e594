// red4: DMB pooling and reuse between the same two processes.
// gcc -O2 -o rt4 rt4.c -lpthread ; run with world.sh smc|tcp ./rt4 SCENARIO and diff.
//
// recvfault: a forked child's thread is inside recv (its copy-out faults on a userfaultfd page:
//   parked deterministically mid-copy, holding no fd of its own any more); the parent closes
//   the last fd; the server closes; the parent makes a second connection to the same server
//   process (the library pools and binds the same DMBs and state page again); then the
//   child's copy finishes. TCP: the child's recv returns conn1's bytes, conn2 delivers every
//   byte. Checked: what the child read, what conn2 delivered to each side.
// sendfault: the same with the child's thread inside send (its copy-in faults).
// sendstop: the child's thread waits for room in send (no userfaultfd: job control stops the
//   child while the parent closes, the server reads to the end, conn2 is made).
// rawfork: a child made with syscall(SYS_fork) (no atfork handlers, no fork() interposition)
//   closes its inherited copy of the connection; the parent then uses it, and makes a second
//   connection to the same server.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N1 700
#define N2 1000
#define SBIG 200000
static int lport;

static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }

static int listener(void) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  int rb = 16384;  // small rings: a short connection's DMBs are pooled
  setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rb, 4);
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

static int writeall(int fd, const void *b, size_t n) {
  size_t d = 0;
  while (d < n) {
    ssize_t r = write(fd, (const char *)b + d, n - d);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    d += r;
  }
  return 0;
}

// Reads until EOF or error; returns bytes, *err = errno at the end (0: EOF).
static ssize_t readall(int fd, unsigned char *b, size_t cap, int *err) {
  size_t d = 0;
  *err = 0;
  for (;;) {
    ssize_t r = read(fd, b + d, cap - d);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { *err = errno; return d; }
    if (r == 0) return d;
    d += r;
    if (d == cap) return d;
  }
}

static unsigned char pat(int conn, size_t i) { return (unsigned char)(conn * 64 + (i * 7 + i / 251) % 61); }

// Checks b[0..n) against the pattern of `conn`; prints a summary line.
static void check(const char *who, int conn, const unsigned char *b, ssize_t n, size_t want, int err) {
  size_t bad = 0, first = (size_t)-1;
  for (ssize_t i = 0; i < n; i++)
    if (b[i] != pat(conn, i)) { bad++; if (first == (size_t)-1) first = i; }
  printf("%s conn%d: %zd/%zu bytes, %zu differ", who, conn, n, want, bad);
  if (bad) printf(" (first at %zu: got %u want %u)", first, b[first], pat(conn, first));
  printf(", end %s\n", err ? strerror(err) : "EOF");
  fflush(stdout);
}

// Server process: conn1 (sends N1 bytes, reads to the end), then conn2 (sends N2 bytes, shuts
// its write side, reads to the end). Reports on `rep` after each.
static int server_go = -1;
static int waitbyte(int fd, int ms);
static void server(int l, int rep) {
  unsigned char *b = malloc(1 << 20), out[N2];
  for (int c = 1; c <= 2; c++) {
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    size_t n = c == 1 ? N1 : N2;
    for (size_t i = 0; i < n; i++) out[i] = pat(c, i);
    if (writeall(s, out, n)) printf("server conn%d: write failed: %s\n", c, strerror(errno));
    if (c == 2) shutdown(s, SHUT_WR);
    if (c == 1 && server_go >= 0) waitbyte(server_go, 10000);
    int err;
    ssize_t r = readall(s, b, 1 << 20, &err);
    if (c == 1 && server_go >= 0) {
      // sendstop: conn1 carries the child's bytes (pattern 6).
      check("server got on", 6, b, r, SBIG, err);
    } else
      check("server got on", c + 2, b, r, c == 1 ? 0 : N2, err);
    close(s);
    char k = 'a' + c;
    write(rep, &k, 1);
  }
  _exit(0);
}

static int waitbyte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? c : -1;
}

// The faulting buffer of the child.
static int uffd;
static unsigned char *region;
static int cfd;
static int child_is_send;
static ssize_t child_r;
static int child_e;

static void *child_thread(void *arg) {
  (void)arg;
  if (child_is_send) {
    // region's page is missing: the copy into the peer's ring faults.
    child_r = send(cfd, region, N1, MSG_NOSIGNAL);
  } else {
    child_r = recv(cfd, region, N1, MSG_WAITALL);
  }
  child_e = errno;
  return NULL;
}

static void uffd_setup(void) {
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
  if (uffd < 0) die("userfaultfd");
  struct uffdio_api api = {.api = UFFD_API};
  if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API");
  region = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct uffdio_register reg = {.range = {(unsigned long)region, 4096}, .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER");
}

static void uffd_resolve(void) {
  static unsigned char page[4096] __attribute__((aligned(4096)));
  for (int i = 0; i < N1; i++) page[i] = pat(5, i);
  struct uffdio_copy cp = {.dst = (unsigned long)region, .src = (unsigned long)page, .len = 4096};
  if (ioctl(uffd, UFFDIO_COPY, &cp)) die("UFFDIO_COPY");
}

// Scenario recvfault / sendfault.
static int faulting(int is_send) {
  int rep[2], toc[2], fromc[2];
  pipe(rep); pipe(toc); pipe(fromc);
  int l = listener();
  pid_t sp = fork();
  if (sp == 0) { close(rep[0]); server(l, rep[1]); }
  close(rep[1]);
  int c1 = dial();
  unsigned char *b = malloc(1 << 20);
  if (is_send) {
    // Fill nothing: the server reads to the end, the child's send copies in.
  }
  pid_t cp = fork();
  if (cp == 0) {
    cfd = c1;
    child_is_send = is_send;
    uffd_setup();
    pthread_t t;
    pthread_create(&t, NULL, child_thread, NULL);
    // Wait until the thread is parked on the fault.
    struct pollfd p = {uffd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) { printf("child: thread never faulted\n"); fflush(stdout); }
    else {
      struct uffd_msg m;
      read(uffd, &m, sizeof m);
    }
    close(c1);                 // the thread still uses the connection
    write(fromc[1], "f", 1);
    waitbyte(toc[0], 20000);   // until the parent made conn2
    uffd_resolve();
    pthread_join(t, NULL);
    if (is_send) printf("child send on conn1: %zd (%s)\n", child_r, child_r < 0 ? strerror(child_e) : "ok");
    else if (child_r < 0) printf("child recv on conn1: -1 (%s)\n", strerror(child_e));
    else check("child recv on", 1, region, child_r, N1, 0);
    fflush(stdout);
    _exit(0);
  }
  if (waitbyte(fromc[0], 6000) != 'f') printf("parent: child not ready\n");
  // What the server sent on conn1 was for the child's recv; the parent only closes.
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  close(c1);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  printf("parent: close(conn1) %s\n", ms < 1000 ? "returned at once" : "blocked until the child's copy went on (20 s)");
  // conn1 ends at the server when the child's thread lets go of it (TCP) or now (the library).
  int k = waitbyte(rep[0], 1500);
  printf("parent: server %s conn1 before conn2\n", k == 'b' ? "finished" : "had not finished");
  int c2 = dial();
  unsigned char out[N2];
  for (int i = 0; i < N2; i++) out[i] = pat(4, i);
  // Let the server's conn2 bytes arrive first (it sends at accept), then let the child go on.
  struct pollfd pp = {c2, POLLIN, 0};
  poll(&pp, 1, 3000);
  write(toc[1], "g", 1);
  int st;
  waitpid(cp, &st, 0);
  if (k != 'b') waitbyte(rep[0], 5000);
  if (writeall(c2, out, N2)) printf("parent conn2: write failed: %s\n", strerror(errno));
  shutdown(c2, SHUT_WR);
  int err;
  ssize_t r = readall(c2, b, 1 << 20, &err);
  check("parent got on", 2, b, r, N2, err);
  close(c2);
  waitbyte(rep[0], 5000);
  waitpid(sp, &st, 0);
  return 0;
}

// Scenario sendstop: the child's thread blocks in send (the server does not read yet, its
// receive buffer is small), the child closes its fd, the parent stops the child (SIGSTOP,
// job control), closes the last fd, lets the server read conn1 to its end, makes conn2, and
// continues the child.
static void *big_send(void *arg) {
  (void)arg;
  unsigned char *m = malloc(SBIG);
  for (int i = 0; i < SBIG; i++) m[i] = pat(6, i);
  child_r = send(cfd, m, SBIG, MSG_NOSIGNAL);
  child_e = errno;
  return NULL;
}

static int sendstop(void) {
  int rep[2], fromc[2], go[2];
  pipe(rep); pipe(fromc); pipe(go);
  int l = listener();
  pid_t sp = fork();
  if (sp == 0) { close(rep[0]); server_go = go[0]; server(l, rep[1]); }
  close(rep[1]);
  int c1 = dial();
  unsigned char *b = malloc(1 << 20);
  pid_t cp = fork();
  if (cp == 0) {
    cfd = c1;
    pthread_t t;
    pthread_create(&t, NULL, big_send, NULL);
    usleep(300000);            // the thread fills the ring and waits for room
    close(c1);                 // the thread still uses the connection
    write(fromc[1], "f", 1);
    pthread_join(t, NULL);
    printf("child send on conn1: %zd (%s)\n", child_r, child_r < 0 ? strerror(child_e) : "ok");
    fflush(stdout);
    _exit(0);
  }
  if (waitbyte(fromc[0], 6000) != 'f') printf("parent: child not ready\n");
  kill(cp, SIGSTOP);
  int st;
  waitpid(cp, &st, WUNTRACED);
  close(c1);
  write(go[1], "r", 1);
  int k = waitbyte(rep[0], 1500);
  printf("parent: server %s conn1 before conn2\n", k == 'b' ? "finished" : "had not finished");
  int c2 = dial();
  struct pollfd pp = {c2, POLLIN, 0};
  poll(&pp, 1, 3000);
  kill(cp, SIGCONT);
  for (int i = 0; i < 50 && waitpid(cp, &st, WNOHANG) == 0; i++) usleep(100000);
  if (waitpid(cp, &st, WNOHANG) == 0) {
    printf("child: still in send 5 s after SIGCONT\n");
    kill(cp, SIGKILL);
    waitpid(cp, &st, 0);
  }
  if (k != 'b') waitbyte(rep[0], 5000);
  unsigned char out[N2];
  for (int i = 0; i < N2; i++) out[i] = pat(4, i);
  if (writeall(c2, out, N2)) printf("parent conn2: write failed: %s\n", strerror(errno));
  shutdown(c2, SHUT_WR);
  int err;
  ssize_t r = readall(c2, b, 1 << 20, &err);
  check("parent got on", 2, b, r, N2, err);
  close(c2);
  waitbyte(rep[0], 5000);
  waitpid(sp, &st, 0);
  return 0;
}

// Scenario rawfork.
static int rawfork(void) {
  int rep[2], fromc[2];
  pipe(rep); pipe(fromc);
  int l = listener();
  pid_t sp = fork();
  if (sp == 0) { close(rep[0]); server(l, rep[1]); }
  close(rep[1]);
  int c1 = dial();
  unsigned char *b = malloc(1 << 20);
  pid_t cp = syscall(SYS_fork);
  if (cp == 0) {
    close(c1);
    // A child that then waits for something (its pending work goes out in poll).
    struct pollfd p = {fromc[0], POLLIN, 0};
    poll(&p, 1, 300);
    _exit(0);
  }
  int st;
  waitpid(cp, &st, 0);
  int err;
  // conn1: the server sent N1 bytes; we send ours and read to the end.
  unsigned char out[N2];
  for (int i = 0; i < N1; i++) out[i] = pat(3, i);
  if (writeall(c1, out, N1)) printf("parent conn1: write failed: %s\n", strerror(errno));
  shutdown(c1, SHUT_WR);
  ssize_t r = readall(c1, b, 1 << 20, &err);
  check("parent got on", 1, b, r, N1, err);
  close(c1);
  waitbyte(rep[0], 5000);
  int c2 = dial();
  for (int i = 0; i < N2; i++) out[i] = pat(4, i);
  if (writeall(c2, out, N2)) printf("parent conn2: write failed: %s\n", strerror(errno));
  shutdown(c2, SHUT_WR);
  r = readall(c2, b, 1 << 20, &err);
  check("parent got on", 2, b, r, N2, err);
  close(c2);
  waitbyte(rep[0], 5000);
  waitpid(sp, &st, 0);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  const char *s = argc > 1 ? argv[1] : "recvfault";
  if (!strcmp(s, "recvfault")) return faulting(0);
  if (!strcmp(s, "sendfault")) return faulting(1);
  if (!strcmp(s, "rawfork")) return rawfork();
  if (!strcmp(s, "sendstop")) return sendstop();
  printf("unknown scenario %s\n", s);
  return 2;
}
