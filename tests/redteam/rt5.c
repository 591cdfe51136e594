// red5: closing a number while a call is in flight; composed calls; fds behind the library.
// gcc -O2 -o rt5 rt5.c -lpthread ; run with world.sh smc|tcp ./rt5 SCENARIO and diff.
//
// sendfile_reuse: a blocking sendfile of 4 MiB into a socket whose peer reads late; another
//   thread closes the socket's number and opens a file at once (same number). TCP: the call
//   holds the socket: the peer gets every byte, the file none.
// sendmmsg_reuse: sendmmsg of three messages (4 MiB, 1000, 1000 bytes) blocked in the first;
//   another thread closes the number and connects a new socket to a second server (same
//   number). TCP: every byte to the first server, none to the second.
// splice_reuse: splice from a socket into a pipe, blocked (nothing to read); another thread
//   closes the number and connects a second socket (same number) whose server greets with
//   1000 bytes; then the first server writes 100 bytes. TCP: splice returns those 100, the
//   second socket still has its 1000 bytes, the first server reads EOF.
// recvmmsg_reuse: the same with recvmmsg (3 messages, flags 0, MSG_WAITFORONE).
// recvmmsg_wait: recvmmsg(3 messages, flags 0) on a socket whose peer writes 100 bytes, then
//   100 more 300 ms later, then closes (no close of a number: TCP blocks for each message).
// closefrom: a process that made a connection, closed it, then calls closefrom(3) (glibc,
//   which closes through its internal close_range), opens two files and connects again.
//   TCP: the files stay empty, the connection works, close() of each file succeeds.
// privfd: a thread blocked in recv, the number closed by another thread; what the program
//   sees of numbers it never opened (fcntl F_GETFD, /proc/self/fd, F_DUPFD at 512, poll,
//   read, dup2 onto it), then the peer writes and recv returns.
// exec_close: a thread blocked in recv, the number closed, the process execs itself (same
//   pid): the server must see EOF; the new image connects to the same server again and
//   exchanges checked bytes both ways.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *m) { printf("FATAL %s: %s\n", m, strerror(errno)); fflush(stdout); _exit(2); }

static int listener(int *port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  int rb = 65536;  // small rings: a big write waits for the reader
  setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rb, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) die("listen");
  socklen_t al = sizeof a;
  getsockname(l, (void *)&a, &al);
  *port = ntohs(a.sin_port);
  return l;
}

static int dial(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0), rb = 65536;
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rb, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  if (connect(s, (void *)&a, sizeof a)) die("connect");
  return s;
}

static void msleep(int ms) { usleep(ms * 1000); }

static unsigned char pat(int conn, size_t i) { return (unsigned char)(conn * 64 + (i * 7 + i / 251) % 61); }

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

// Reads until EOF, error, or `ms` without data (ms < 0: no limit); checks the pattern of `conn`.
static void readcheck(const char *who, int fd, int conn, int ms) {
  static unsigned char b[65536];
  size_t n = 0, bad = 0, first = (size_t)-1;
  int err = 0, to = 0;
  for (;;) {
    if (ms >= 0) {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, ms) == 0) { to = 1; break; }
    }
    ssize_t r = read(fd, b, sizeof b);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { err = errno; break; }
    if (r == 0) break;
    for (ssize_t i = 0; i < r; i++)
      if (b[i] != pat(conn, n + i)) { bad++; if (first == (size_t)-1) first = n + i; }
    n += r;
  }
  printf("%s: %zu bytes (pattern %d), %zu differ", who, n, conn, bad);
  if (bad) printf(" (first at %zu)", first);
  printf(", end %s\n", to ? "timeout" : err ? strerror(err) : "EOF");
  fflush(stdout);
}

static int waitbyte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? c : -1;
}

// A server process: accepts one connection on `l`, optionally waits for a byte on `go`, writes
// `greet` bytes of pattern `gp` (shut its write side if `shut`), sleeps `delay` ms, then reads
// to the end and reports the stream as pattern `rp`.
static pid_t server(int l, int go, int greet, int gp, int shut, int delay, int rp, const char *name, int ms) {
  pid_t p = fork();
  if (p) return p;
  int s = accept(l, NULL, NULL);
  if (s < 0) die("accept");
  if (go >= 0) waitbyte(go, 10000);
  if (greet) {
    unsigned char *o = malloc(greet);
    for (int i = 0; i < greet; i++) o[i] = pat(gp, i);
    if (writeall(s, o, greet)) printf("%s: greet failed: %s\n", name, strerror(errno));
  }
  if (shut) shutdown(s, SHUT_WR);
  msleep(delay);
  readcheck(name, s, rp, ms);
  close(s);
  _exit(0);
}

#define BIG (4 << 20)

// ---------------------------------------------------------------- sendfile_reuse
static int sf_c, sf_v = -1;
static void *sf_closer(void *a) {
  (void)a;
  msleep(200);
  close(sf_c);
  sf_v = memfd_create("victim", 0);
  return NULL;
}

static int sendfile_reuse(void) {
  int pa, la = listener(&pa);
  pid_t sa = server(la, -1, 0, 0, 0, 700, 1, "server A got", -1);
  close(la);
  int f = memfd_create("src", 0);
  unsigned char *b = malloc(BIG);
  for (size_t i = 0; i < BIG; i++) b[i] = pat(1, i);
  writeall(f, b, BIG);
  lseek(f, 0, SEEK_SET);
  sf_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, sf_closer, NULL);
  ssize_t r = sendfile(sf_c, f, NULL, BIG);
  int e = errno;
  pthread_join(t, NULL);
  printf("sendfile returned %zd%s%s; the file opened at the closed number (same number: %s)", r,
         r < 0 ? " " : "", r < 0 ? strerror(e) : "", sf_v == sf_c ? "yes" : "no");
  struct stat st;
  fstat(sf_v, &st);
  printf(" holds %ld bytes\n", (long)st.st_size);
  close(sf_v);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- sendmmsg_reuse
static int mm_c, mm_d = -1, mm_pb;
static void *mm_closer(void *a) {
  (void)a;
  msleep(200);
  close(mm_c);
  mm_d = dial(mm_pb);
  return NULL;
}

static int sendmmsg_reuse(void) {
  int pa, la = listener(&pa), lb = listener(&mm_pb);
  pid_t sa = server(la, -1, 0, 0, 0, 700, 1, "server A got", -1);
  pid_t sb = server(lb, -1, 0, 0, 0, 0, 2, "server B got", -1);
  close(la);
  close(lb);
  unsigned char *b = malloc(BIG + 2000);
  for (size_t i = 0; i < BIG + 2000; i++) b[i] = pat(1, i);
  struct iovec v[3] = {{b, BIG}, {b + BIG, 1000}, {b + BIG + 1000, 1000}};
  struct mmsghdr m[3];
  memset(m, 0, sizeof m);
  for (int i = 0; i < 3; i++) { m[i].msg_hdr.msg_iov = &v[i]; m[i].msg_hdr.msg_iovlen = 1; }
  mm_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, mm_closer, NULL);
  int r = sendmmsg(mm_c, m, 3, 0);
  int e = errno;
  pthread_join(t, NULL);
  printf("sendmmsg returned %d%s%s, lengths %u %u %u; new socket at the closed number: %s\n", r,
         r < 0 ? " " : "", r < 0 ? strerror(e) : "", m[0].msg_len, m[1].msg_len, m[2].msg_len,
         mm_d == mm_c ? "yes" : "no");
  close(mm_d);
  int ws;
  waitpid(sa, &ws, 0);
  waitpid(sb, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- splice_reuse / recvmmsg_reuse
static int sp_c, sp_d = -1, sp_pb, sp_go;
static void *sp_closer(void *a) {
  (void)a;
  msleep(200);
  close(sp_c);
  sp_d = dial(sp_pb);
  // Wait until the second server's greeting is there.
  struct pollfd p = {sp_d, POLLIN, 0};
  poll(&p, 1, 3000);
  msleep(50);
  write(sp_go, "g", 1);
  return NULL;
}

static int splice_reuse(int mm, int mmflags) {
  int pa, la = listener(&pa), lb = listener(&sp_pb), go[2];
  pipe(go);
  // A: after the go, writes 100 bytes, then reads to the end (reports how its stream ended).
  pid_t sa = server(la, go[0], 100, 1, 0, 0, 3, "server A read", 3000);
  // B: greets with 1000 bytes and shuts its write side.
  pid_t sb = server(lb, -1, 1000, 2, 1, 0, 4, "server B read", 3000);
  close(la);
  close(lb);
  close(go[0]);
  sp_go = go[1];
  sp_c = dial(pa);
  int p[2];
  pipe(p);
  pthread_t t;
  pthread_create(&t, NULL, sp_closer, NULL);
  static unsigned char b0[1000], b1[1000], b2[1000];
  if (!mm) {
    ssize_t r = splice(sp_c, NULL, p[1], NULL, 100, 0);
    int e = errno;
    pthread_join(t, NULL);
    int q = 0;
    ioctl(p[0], FIONREAD, &q);
    printf("splice returned %zd%s%s, the pipe holds %d bytes; new socket at the closed number: %s\n",
           r, r < 0 ? " " : "", r < 0 ? strerror(e) : "", q, sp_d == sp_c ? "yes" : "no");
  } else {
    struct iovec v[3] = {{b0, 100}, {b1, 1000}, {b2, 1000}};
    struct mmsghdr m[3];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 3; i++) { m[i].msg_hdr.msg_iov = &v[i]; m[i].msg_hdr.msg_iovlen = 1; }
    int r = recvmmsg(sp_c, m, 3, mmflags, NULL);
    int e = errno;
    pthread_join(t, NULL);
    printf("recvmmsg returned %d%s%s, lengths %u %u %u; new socket at the closed number: %s\n", r,
           r < 0 ? " " : "", r < 0 ? strerror(e) : "", m[0].msg_len, m[1].msg_len, m[2].msg_len,
           sp_d == sp_c ? "yes" : "no");
  }
  readcheck("the new socket read", sp_d, 2, 3000);
  close(sp_d);
  int ws;
  waitpid(sa, &ws, 0);
  waitpid(sb, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- recvmmsg_wait
static int recvmmsg_wait(void) {
  int pa, la = listener(&pa);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    unsigned char o[200];
    for (int i = 0; i < 200; i++) o[i] = pat(1, i);
    writeall(s, o, 100);
    msleep(300);
    writeall(s, o + 100, 100);
    msleep(300);
    close(s);
    _exit(0);
  }
  close(la);
  int c = dial(pa);
  static unsigned char b[3][1000];
  struct iovec v[3] = {{b[0], 1000}, {b[1], 1000}, {b[2], 1000}};
  struct mmsghdr m[3];
  memset(m, 0, sizeof m);
  for (int i = 0; i < 3; i++) { m[i].msg_hdr.msg_iov = &v[i]; m[i].msg_hdr.msg_iovlen = 1; }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int r = recvmmsg(c, m, 3, 0, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  printf("recvmmsg returned %d, lengths %u %u %u, after %s\n", r, m[0].msg_len, m[1].msg_len,
         m[2].msg_len, ms < 200 ? "<200 ms" : ms < 500 ? "200-500 ms" : ">=500 ms");
  close(c);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- closefrom
static int closefrom_scn(int pairs) {
  int pa, la = listener(&pa);
  pid_t sa = fork();
  if (sa == 0) {
    for (int k = 1; k <= 2; k++) {
      int s = accept(la, NULL, NULL);
      if (s < 0) die("accept");
      unsigned char o[1000];
      for (int i = 0; i < 1000; i++) o[i] = pat(k, i);
      writeall(s, o, 1000);
      shutdown(s, SHUT_WR);
      char nm[32];
      snprintf(nm, sizeof nm, "server conn%d read", k);
      readcheck(nm, s, k + 2, 3000);
      close(s);
    }
    _exit(0);
  }
  close(la);
  int c = dial(pa);
  unsigned char o[1000];
  for (int i = 0; i < 1000; i++) o[i] = pat(3, i);
  writeall(c, o, 1000);
  shutdown(c, SHUT_WR);
  readcheck("conn1 read", c, 1, 3000);
  close(c);
  closefrom(3);
  int f1, f2, f3, f4 = -1, sv[2];
  if (pairs) {
    // Unix socket pairs, as a program's own channels to its helpers: 3-4, 5-6.
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    f1 = sv[0], f2 = sv[1];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    f3 = sv[0], f4 = sv[1];
  } else {
    f1 = open("/tmp", O_TMPFILE | O_RDWR, 0600);
    f2 = open("/tmp", O_TMPFILE | O_RDWR, 0600);
    f3 = open("/tmp", O_TMPFILE | O_RDWR, 0600);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  // Through socket() and connect: the number a file may share with a descriptor we lost.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(pa), .sin_addr.s_addr = htonl(0x7f000001)};
  int cr = connect(s, (void *)&a, sizeof a);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  printf("after closefrom: files at %s, connect %s in %s\n", f1 == 3 && f2 == 4 && f3 == 5 ? "3 4 5" : "other numbers",
         cr ? strerror(errno) : "ok", ms < 500 ? "<500 ms" : ">=500 ms");
  if (cr == 0) {
    for (int i = 0; i < 1000; i++) o[i] = pat(4, i);
    if (writeall(s, o, 1000)) printf("conn2 write: %s\n", strerror(errno));
    shutdown(s, SHUT_WR);
    readcheck("conn2 read", s, 2, 3000);
  }
  int fs[4] = {f1, f2, f3, f4};
  for (int i = 0; i < 3 + pairs; i++) {
    struct stat st;
    fstat(fs[i], &st);
    long sz = st.st_size;
    if (pairs) {
      // What is waiting on this end (written at its partner), and fds passed with it.
      char buf[4096], cb[CMSG_SPACE(16 * sizeof(int))];
      struct iovec v = {buf, sizeof buf};
      struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
      ssize_t r = recvmsg(fs[i], &m, MSG_DONTWAIT);
      sz = r < 0 ? 0 : r;
      if (r > 0 && m.msg_controllen) printf("end %d received descriptors (SCM_RIGHTS)\n", i + 1);
    }
    int r = close(fs[i]);
    printf("%s %d: %ld bytes%s, close %s\n", pairs ? "socketpair end" : "file", i + 1, sz,
           pairs ? " waiting to be read" : "", r ? strerror(errno) : "ok");
  }
  close(s);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- privfd
static int pv_c;
static ssize_t pv_r;
static int pv_e;
static void *pv_reader(void *a) {
  (void)a;
  char b[100];
  pv_r = recv(pv_c, b, sizeof b, MSG_WAITALL);
  pv_e = errno;
  return NULL;
}

static int privfd(void) {
  int pa, la = listener(&pa), go[2];
  pipe(go);
  pid_t sa = server(la, go[0], 100, 1, 0, 0, 3, "server read", 3000);
  close(la);
  close(go[0]);
  // Numbers open before the connection (the library's own daemon connection opens with the
  // first connect: it shows up here too, but is not what this scenario is about).
  static char before[4096];
  for (int i = 3; i < 4096; i++) before[i] = fcntl(i, F_GETFD) >= 0;
  pv_c = dial(pa);
  for (int i = 3; i < 4096; i++) before[i] |= i != pv_c && fcntl(i, F_GETFD) >= 0;
  pthread_t t;
  pthread_create(&t, NULL, pv_reader, NULL);
  msleep(200);
  close(pv_c);
  msleep(50);
  int P = -1;
  for (int i = 3; i < 4096; i++)
    if (!before[i] && fcntl(i, F_GETFD) >= 0) {
      printf("a number the program never opened is open after the close (F_GETFD %d)\n", fcntl(i, F_GETFD));
      P = i;
    }
  int n = 0;
  DIR *dd = opendir("/proc/self/fd");
  struct dirent *de;
  while ((de = readdir(dd))) n += de->d_name[0] != '.';
  closedir(dd);
  printf("/proc/self/fd lists %d entries (the program opened 0 1 2, the pipes, the dir)\n", n);
  if (P < 0) P = 1024;
  int d = fcntl(0, F_DUPFD, P);
  printf("F_DUPFD(0, P) gave %s\n", d == P ? "P" : d > P ? ">P" : "error");
  close(d);
  struct pollfd p = {P, POLLIN, 0};
  int pr = poll(&p, 1, 0);
  printf("poll on P: %d revents %#x\n", pr, p.revents);
  char x[8];
  errno = 0;
  ssize_t rr = recv(P, x, sizeof x, MSG_DONTWAIT);
  printf("recv on P: %zd %s\n", rr, strerror(errno));
  errno = 0;
  rr = write(P, "zz", 2);
  printf("write on P: %zd %s\n", rr, strerror(errno));
  int r2 = dup2(1, P);
  printf("dup2(1, P) %s; close(P) %s\n", r2 == P ? "ok" : strerror(errno), close(P) ? strerror(errno) : "ok");
  write(go[1], "g", 1);
  pthread_join(t, NULL);
  printf("recv returned %zd%s%s\n", pv_r, pv_r < 0 ? " " : "", pv_r < 0 ? strerror(pv_e) : "");
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- exec_close
static int ex_c;
static void *ex_reader(void *a) {
  (void)a;
  char b[100];
  recv(ex_c, b, sizeof b, 0);
  return NULL;
}

static int exec_close(char *self) {
  int pa, la = listener(&pa), rep[2];
  pipe(rep);
  pid_t sa = fork();
  if (sa == 0) {
    close(rep[0]);
    int s = accept(la, NULL, NULL);
    readcheck("server conn1 read", s, 0, 3000);
    close(s);
    s = accept(la, NULL, NULL);
    unsigned char o[1000];
    for (int i = 0; i < 1000; i++) o[i] = pat(2, i);
    writeall(s, o, 1000);
    shutdown(s, SHUT_WR);
    readcheck("server conn2 read", s, 4, 3000);
    close(s);
    _exit(0);
  }
  close(la);
  close(rep[1]);
  ex_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, ex_reader, NULL);
  msleep(200);
  close(ex_c);
  char ps[16], pid[16];
  snprintf(ps, sizeof ps, "%d", pa);
  snprintf(pid, sizeof pid, "%d", sa);
  execl(self, self, "exec_close_2", ps, pid, (char *)NULL);
  die("exec");
  return 0;
}

static int exec_close_2(int pa, pid_t sa) {
  msleep(300);
  int c = dial(pa);
  unsigned char o[1000];
  for (int i = 0; i < 1000; i++) o[i] = pat(4, i);
  if (writeall(c, o, 1000)) printf("conn2 write: %s\n", strerror(errno));
  shutdown(c, SHUT_WR);
  readcheck("conn2 read", c, 2, 3000);
  close(c);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- scm_many / exec_many
// NC connections from one process, checked both ways after they moved to another process
// (SCM_RIGHTS to a child forked before they existed, or an exec of the same process). With
// DARGS="--shelve-after-ms 0" every DMB file and state page is shelved at once: the adopter's
// OP_ADOPT reopens them through the daemon's mappings; more than 16 ends: two state pages.
#define NCMAX 400
static int NC = 20;  // RT_NC=n: more connections
#define NB 3000
static unsigned char pk(int k, size_t i) { return (unsigned char)(k * 37 + i * 7 + i / 251); }

static void check_conn(const char *who, int k, int fd, int *bad) {
  static unsigned char b[NB];
  size_t n = 0;
  while (n < NB) {
    ssize_t r = read(fd, b + n, NB - n);
    if (r <= 0) break;
    n += r;
  }
  size_t diff = 0;
  for (size_t i = 0; i < n; i++) diff += b[i] != pk(k, i);
  unsigned char o[NB];
  for (int i = 0; i < NB; i++) o[i] = pk(k + 100, i);
  int w = writeall(fd, o, NB);
  shutdown(fd, SHUT_WR);
  char x;
  ssize_t e = read(fd, &x, 1);
  if (n != NB || diff || w || e != 0) {
    (*bad)++;
    printf("%s conn %d: read %zu/%d, %zu differ, write %s, end %s\n", who, k, n, NB, diff,
           w ? strerror(errno) : "ok", e == 0 ? "EOF" : e < 0 ? strerror(errno) : "data");
  }
  close(fd);
}

static pid_t many_server(int l) {
  pid_t p = fork();
  if (p) return p;
  int s[NCMAX], bad = 0;
  for (int k = 0; k < NC; k++) {
    s[k] = accept(l, NULL, NULL);
    unsigned char o[NB];
    for (int i = 0; i < NB; i++) o[i] = pk(k, i);
    writeall(s[k], o, NB);
  }
  for (int k = 0; k < NC; k++) {
    static unsigned char b[NB + 1];
    size_t n = 0, diff = 0;
    for (;;) {
      struct pollfd q = {s[k], POLLIN, 0};
      if (poll(&q, 1, 5000) <= 0) break;
      ssize_t r = read(s[k], b + n, NB + 1 - n);
      if (r <= 0) break;
      n += r;
    }
    for (size_t i = 0; i < n && i < NB; i++) diff += b[i] != pk(k + 100, i);
    if (n != NB || diff) { bad++; printf("server conn %d: got %zu/%d bytes, %zu differ\n", k, n, NB, diff); }
    close(s[k]);
  }
  printf("server: %d of %d connections bad\n", bad, NC);
  _exit(0);
}

static int many(int exec_mode, char *self) {
  int pa, la = listener(&pa), sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t srv = many_server(la);
  close(la);
  pid_t ch = -1;
  if (!exec_mode) {
    ch = fork();
    if (ch == 0) {
      close(sv[0]);
      int bad = 0, got = 0;
      for (int k = 0; k < NC; k++) {
        char c;
        struct iovec v = {&c, 1};
        char cb[CMSG_SPACE(sizeof(int))];
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
        if (recvmsg(sv[1], &m, 0) != 1) break;
        int fd;
        memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
        got++;
        check_conn("receiver", c, fd, &bad);
      }
      printf("receiver: %d of %d connections bad\n", bad + NC - got, NC);
      _exit(0);
    }
    close(sv[1]);
  }
  int c[NCMAX];
  for (int k = 0; k < NC; k++) c[k] = dial(pa);
  msleep(100);
  if (exec_mode) {
    char arg[NCMAX * 8 + 16] = "", *q = arg;
    for (int k = 0; k < NC; k++) q += sprintf(q, "%d,", c[k]);
    char sp[16];
    snprintf(sp, sizeof sp, "%d", srv);
    execl(self, self, "exec_many_2", arg, sp, (char *)NULL);
    die("exec");
  }
  for (int k = 0; k < NC; k++) {
    char x = k;
    struct iovec v = {&x, 1};
    char cb[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &c[k], sizeof(int));
    if (sendmsg(sv[0], &m, 0) != 1) die("sendmsg");
    close(c[k]);
  }
  int ws;
  waitpid(ch, &ws, 0);
  waitpid(srv, &ws, 0);
  return 0;
}

static int exec_many_2(char *arg, pid_t srv) {
  int bad = 0, k = 0;
  for (char *t = strtok(arg, ","); t; t = strtok(NULL, ","), k++) check_conn("exec image", k, atoi(t), &bad);
  printf("exec image: %d of %d connections bad\n", bad, k);
  int ws;
  waitpid(srv, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- seq_pool
// 40 short connections one after the other between the same two processes (the library pools
// the DMBs and binds them again; with DARGS="--shelve-after-ms 0" from shelved files), the
// client closing first on even ones, the server first on odd ones; checked both ways.
static int seq_pool(void) {
  int pa, la = listener(&pa);
  pid_t srv = fork();
  if (srv == 0) {
    int bad = 0;
    for (int k = 0; k < 40; k++) {
      int s = accept(la, NULL, NULL);
      unsigned char o[NB];
      for (int i = 0; i < NB; i++) o[i] = pk(k, i);
      writeall(s, o, NB);
      if (k & 1) shutdown(s, SHUT_WR);
      static unsigned char b[NB + 1];
      size_t n = 0, diff = 0;
      for (;;) {
        ssize_t r = read(s, b + n, NB + 1 - n);
        if (r <= 0) break;
        n += r;
      }
      for (size_t i = 0; i < n && i < NB; i++) diff += b[i] != pk(k + 100, i);
      if (n != NB || diff) { bad++; printf("server conn %d: got %zu/%d bytes, %zu differ\n", k, n, NB, diff); }
      close(s);
    }
    printf("server: %d of 40 bad\n", bad);
    _exit(0);
  }
  close(la);
  int bad = 0;
  for (int k = 0; k < 40; k++) {
    int c = dial(pa);
    static unsigned char b[NB];
    size_t n = 0, diff = 0;
    while (n < NB) {
      ssize_t r = read(c, b + n, NB - n);
      if (r <= 0) break;
      n += r;
    }
    for (size_t i = 0; i < n; i++) diff += b[i] != pk(k, i);
    unsigned char o[NB];
    for (int i = 0; i < NB; i++) o[i] = pk(k + 100, i);
    writeall(c, o, NB);
    shutdown(c, SHUT_WR);
    if (k & 1) { char x; read(c, &x, 1); }
    if (n != NB || diff) { bad++; printf("client conn %d: got %zu/%d bytes, %zu differ\n", k, n, NB, diff); }
    close(c);
  }
  printf("client: %d of 40 bad\n", bad);
  int ws;
  waitpid(srv, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- switch_inflight
// A thread blocked in recv; another thread closes the number and opens a file there; then the
// server execs an image without the library (env without LD_PRELOAD) on the socket, which
// switches the connection to TCP, and that image writes "hello" and reads to the end.
// TCP: recv returns "hello", the file stays empty, the image reads EOF.
// switch_blocked: the same without the close (a control).
static int sw_c, sw_f = -1;
static ssize_t sw_r;
static int sw_e;
static char sw_b[64];
static void *sw_reader(void *a) {
  (void)a;
  sw_r = recv(sw_c, sw_b, sizeof sw_b - 1, 0);
  sw_e = errno;
  return NULL;
}

static int switch_inflight(int do_close) {
  int pa, la = listener(&pa), go[2], rep[2];
  pipe(go);
  pipe(rep);
  pid_t srv = fork();
  if (srv == 0) {
    close(go[1]);
    close(rep[0]);
    int s = accept(la, NULL, NULL);
    waitbyte(go[0], 5000);
    dup2(s, 0);
    dup2(s, 1);
    dup2(rep[1], 3);
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    char *av[] = {"sh", "-c", "printf hello; n=$(cat | wc -c); echo \"image read $n bytes then EOF\" >&3", NULL};
    execve("/bin/sh", av, envp);  // (execle is variadic: not seen by the library, a residual)
    die("exec");
  }
  close(la);
  close(go[0]);
  close(rep[1]);
  sw_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, sw_reader, NULL);
  msleep(200);
  if (do_close) {
    close(sw_c);
    sw_f = memfd_create("victim", 0);
  } else
    sw_f = memfd_create("victim", 0);
  write(go[1], "g", 1);
  pthread_join(t, NULL);
  if (!do_close) close(sw_c);
  sw_b[sw_r > 0 ? sw_r : 0] = 0;
  printf("recv returned %zd%s%s \"%s\"; file at the closed number (same: %s)", sw_r, sw_r < 0 ? " " : "",
         sw_r < 0 ? strerror(sw_e) : "", sw_b, sw_f == sw_c ? "yes" : "no");
  struct stat st;
  fstat(sw_f, &st);
  printf(" holds %ld bytes\n", (long)st.st_size);
  char line[128] = "";
  struct pollfd q = {rep[0], POLLIN, 0};
  if (poll(&q, 1, 5000) > 0) {
    ssize_t n = read(rep[0], line, sizeof line - 1);
    line[n > 0 ? n : 0] = 0;
  }
  printf("%s", line[0] ? line : "the image said nothing in 5 s\n");
  int ws;
  waitpid(srv, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- close_range_inflight
// RLIMIT_NOFILE 64 (the library's private duplicate then goes at 32). A thread blocked in
// recv(MSG_WAITALL, 100); close_range(c, ~0U, 0) closes the number (and all above); the
// program opens files until one lands at 32 or above (F); then the server writes 100 bytes.
// TCP: recv returns 100, F is the program's (empty, open until it closes it, close ok).
// closeloop_inflight: the same with close() of every number from c to 63.
static int cr_c;
static ssize_t cr_r;
static int cr_e;
static void *cr_reader(void *a) {
  (void)a;
  char b[100];
  cr_r = recv(cr_c, b, sizeof b, MSG_WAITALL);
  cr_e = errno;
  return NULL;
}

static int close_range_inflight(int loop) {
  struct rlimit rl = {64, 64};
  setrlimit(RLIMIT_NOFILE, &rl);
  int pa, la = listener(&pa), go[2];
  pipe(go);
  pid_t sa = fork();
  if (sa == 0) {
    // As a server that drops a client it sees gone: before writing, is the client's end at EOF?
    int s = accept(la, NULL, NULL);
    waitbyte(go[0], 5000);
    struct pollfd q = {s, POLLIN | POLLRDHUP, 0};
    int pr = poll(&q, 1, 100);
    char x;
    ssize_t e = pr > 0 ? recv(s, &x, 1, MSG_DONTWAIT) : -1;
    printf("server before writing: %s\n", pr == 0 ? "nothing from the client" : e == 0 ? "the client's end is at EOF" : "other");
    unsigned char o[100];
    for (int i = 0; i < 100; i++) o[i] = pat(1, i);
    writeall(s, o, 100);
    readcheck("server read", s, 3, 3000);
    _exit(0);
  }
  close(la);
  close(go[0]);
  cr_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, cr_reader, NULL);
  msleep(200);
  int r = 0;
  if (loop)
    for (int i = cr_c; i < 64; i++) r |= close(i) && errno != EBADF;  // as programs that close all
  else
    r = close_range(cr_c, ~0U, 0);
  int fds[64], n = 0, F = -1;
  for (;;) {
    int f = open("/tmp", O_TMPFILE | O_RDWR, 0600);
    if (f < 0) break;
    if (f >= 32) { F = f; break; }
    fds[n++] = f;
  }
  for (int i = 0; i < n; i++) close(fds[i]);
  printf("close_range %d; the program's file F at %s\n", r, F == 32 ? "32" : F > 32 ? ">32" : "none");
  write(go[1], "g", 1);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_join(t, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  printf("recv returned %zd%s%s after %s\n", cr_r, cr_r < 0 ? " " : "", cr_r < 0 ? strerror(cr_e) : "",
         ms < 300 ? "<300 ms" : ">=300 ms");
  msleep(100);
  struct stat st;
  int fv = fstat(F, &st);
  printf("F after recv: %s, %ld bytes\n", fv ? strerror(errno) : "open", fv ? 0L : (long)st.st_size);
  printf("close(F): %s\n", close(F) ? strerror(errno) : "ok");
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- splice_in_reuse
// splice from a pipe (1000 bytes) into a socket whose send buffer / ring is full (filled with
// MSG_DONTWAIT sends), blocked; another thread closes the number and opens a file there; the
// server reads everything from 700 ms on. TCP: the server gets the fill and the 1000 bytes,
// the file none.
static int si_c, si_f = -1;
static void *si_closer(void *a) {
  (void)a;
  msleep(200);
  close(si_c);
  si_f = memfd_create("victim", 0);
  return NULL;
}

static int splice_in_reuse(void) {
  int pa, la = listener(&pa);
  pid_t sa = server(la, -1, 0, 0, 0, 700, 1, "server got", -1);
  close(la);
  si_c = dial(pa);
  static unsigned char b[1 << 16];
  size_t fill = 0;
  for (;;) {
    for (size_t i = 0; i < sizeof b; i++) b[i] = pat(1, fill + i);
    ssize_t r = send(si_c, b, sizeof b, MSG_DONTWAIT);
    if (r <= 0) break;
    fill += r;
  }
  int p[2];
  pipe(p);
  for (size_t i = 0; i < 1000; i++) b[i] = pat(1, fill + i);
  write(p[1], b, 1000);
  pthread_t t;
  pthread_create(&t, NULL, si_closer, NULL);
  ssize_t r = splice(p[0], NULL, si_c, NULL, 1000, 0);
  int e = errno;
  pthread_join(t, NULL);
  struct stat st;
  fstat(si_f, &st);
  printf("splice returned %zd%s%s; file at the closed number (same: %s) holds %ld bytes\n", r, r < 0 ? " " : "",
         r < 0 ? strerror(e) : "", si_f == si_c ? "yes" : "no", (long)st.st_size);
  printf("client: filled %s before the splice\n", fill > 0 ? "some bytes" : "nothing");
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- scm_inflight
// A thread blocked in recv(MSG_WAITALL, 100); the main thread passes the socket with
// SCM_RIGHTS to a child (forked before the connection) and closes its number. The server
// writes 100 bytes at 300 ms, 100 more at 600 ms, then reads to the end. The child reads from
// 800 ms on to EOF... after it wrote 500 bytes and shut its write side. TCP: the thread gets the
// first 100, the child the second 100, the server the child's 500 and EOF.
static int si2_c;
static ssize_t si2_r;
static unsigned char si2_b[100];
static void *si2_reader(void *a) {
  (void)a;
  si2_r = recv(si2_c, si2_b, 100, MSG_WAITALL);
  return NULL;
}

static int scm_inflight(void) {
  int pa, la = listener(&pa), sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    unsigned char o[200];
    for (int i = 0; i < 200; i++) o[i] = pat(1, i);
    msleep(300);
    writeall(s, o, 100);
    msleep(300);
    writeall(s, o + 100, 100);
    shutdown(s, SHUT_WR);
    readcheck("server read", s, 2, 5000);
    _exit(0);
  }
  close(la);
  pid_t ch = fork();
  if (ch == 0) {
    close(sv[0]);
    char c;
    struct iovec v = {&c, 1};
    char cb[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
    if (recvmsg(sv[1], &m, 0) != 1) die("recvmsg");
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    msleep(800);
    unsigned char o[500];
    for (int i = 0; i < 500; i++) o[i] = pat(2, i);
    if (writeall(fd, o, 500)) printf("child: write %s\n", strerror(errno));
    shutdown(fd, SHUT_WR);
    static unsigned char b[1000];
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd, b + n, sizeof b - n)) > 0) n += r;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != pat(1, 100 + i);
    printf("child read %zu bytes (%zu not the stream's bytes 100..), end %s\n", n, bad, r == 0 ? "EOF" : strerror(errno));
    _exit(0);
  }
  close(sv[1]);
  si2_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, si2_reader, NULL);
  msleep(100);
  char x = 1;
  struct iovec v = {&x, 1};
  char cb[CMSG_SPACE(sizeof(int))];
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &si2_c, sizeof(int));
  if (sendmsg(sv[0], &m, 0) != 1) die("sendmsg");
  close(si2_c);
  pthread_join(t, NULL);
  size_t bad = 0;
  for (int i = 0; i < (si2_r > 0 ? si2_r : 0); i++) bad += si2_b[i] != pat(1, i);
  printf("thread recv returned %zd (%zu differ)\n", si2_r, bad);
  int ws;
  waitpid(ch, &ws, 0);
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- fork_inflight
// A thread blocked in recv; the number closed; then fork: what the child sees open (numbers the
// program never opened), and the child's exit before the parent's recv gets its bytes; the
// server then sees EOF only when the parent's recv returned. TCP: nothing extra in the child.
static int fork_inflight(void) {
  int pa, la = listener(&pa), go[2];
  pipe(go);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    waitbyte(go[0], 5000);
    struct pollfd q = {s, POLLIN | POLLRDHUP, 0};
    int pr = poll(&q, 1, 100);
    printf("server before writing: %s\n", pr == 0 ? "nothing from the client" : "the client's end is readable/EOF");
    unsigned char o[100];
    for (int i = 0; i < 100; i++) o[i] = pat(1, i);
    writeall(s, o, 100);
    readcheck("server read", s, 3, 3000);
    _exit(0);
  }
  close(la);
  close(go[0]);
  static char before[4096];
  pv_c = dial(pa);
  for (int i = 3; i < 4096; i++) before[i] = i != pv_c && fcntl(i, F_GETFD) >= 0;
  pthread_t t;
  pthread_create(&t, NULL, pv_reader, NULL);
  msleep(200);
  close(pv_c);
  pid_t ch = fork();
  if (ch == 0) {
    int extra = 0;
    for (int i = 3; i < 4096; i++) extra += !before[i] && fcntl(i, F_GETFD) >= 0;
    printf("child: %d numbers open that the program never opened\n", extra);
    _exit(0);
  }
  int ws;
  waitpid(ch, &ws, 0);
  write(go[1], "g", 1);
  pthread_join(t, NULL);
  printf("recv returned %zd%s%s\n", pv_r, pv_r < 0 ? " " : "", pv_r < 0 ? strerror(pv_e) : "");
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- epoll_close_range
// An epoll registration of c (data 77) with a dup of c at a lower number; close_range(c, ~0U)
// closes c: TCP keeps the registration (the open file lives) and reports under data 77 when
// the server writes; the dup reads the bytes; then the dup closes and the server sees EOF.
static int epoll_close_range(void) {
  int pa, la = listener(&pa), go[2];
  pipe(go);
  pid_t sa = server(la, go[0], 100, 1, 0, 0, 3, "server read", 3000);
  close(la);
  close(go[0]);
  int hole = open("/dev/null", O_RDONLY);
  int ep = epoll_create1(0);
  int c = dial(pa);
  int d = dup2(c, hole);  // the dup below c
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 77};
  epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
  int r = close_range(c, ~0U, 0);
  write(go[1], "g", 1);
  struct epoll_event out[4];
  int n = epoll_wait(ep, out, 4, 2000);
  printf("close_range %d; epoll_wait %d", r, n);
  for (int i = 0; i < n; i++) printf(" [data %llu events %#x]", (unsigned long long)out[i].data.u64, out[i].events);
  printf("\n");
  char b[200];
  ssize_t k = recv(d, b, sizeof b, MSG_DONTWAIT);
  printf("the dup read %zd\n", k);
  close(d);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- shutdown_send_blocked
// A thread blocked in send (1 MiB, the ring / send buffer filled first); another thread calls
// shutdown(SHUT_WR) (or SHUT_RDWR with argv[2] "rdwr") at 200 ms; the server reads from
// 1000 ms on. TCP: shutdown returns at once, send returns early.
static int sb_c;
static ssize_t sb_r;
static int sb_e;
static long sb_ms;
static long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}
static void *sb_sender(void *a) {
  (void)a;
  static unsigned char b[1 << 20];
  sb_r = send(sb_c, b, sizeof b, MSG_NOSIGNAL);
  sb_e = errno;
  sb_ms = now_ms();
  return NULL;
}

static int shutdown_send_blocked(int how) {
  int pa, la = listener(&pa);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    msleep(1000);
    static unsigned char b[1 << 16];
    size_t n = 0;
    ssize_t r;
    while ((r = read(s, b, sizeof b)) > 0) n += r;
    printf("server read %s, end %s\n", n > 0 ? "some bytes" : "nothing", r == 0 ? "EOF" : strerror(errno));
    _exit(0);
  }
  close(la);
  sb_c = dial(pa);
  static unsigned char fb[1 << 16];
  while (send(sb_c, fb, sizeof fb, MSG_DONTWAIT) > 0) {
  }
  pthread_t t;
  pthread_create(&t, NULL, sb_sender, NULL);
  msleep(200);
  long t0 = now_ms();
  int r = shutdown(sb_c, how);
  long t1 = now_ms();
  pthread_join(t, NULL);
  printf("shutdown %d after %s; send returned %s%s, %s the shutdown returned\n", r, t1 - t0 < 100 ? "<100 ms" : ">=100 ms",
         sb_r < 0 ? "-1 " : sb_r == (1 << 20) ? "all" : "part", sb_r < 0 ? strerror(sb_e) : "",
         sb_ms - t1 < 100 ? "<100 ms after" : sb_ms - t1 < 600 ? "100-600 ms after" : ">=600 ms after (the server reads from 800 ms after)");
  close(sb_c);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- longjmp_close
// A thread blocked in recv leaves it by siglongjmp from a SIGUSR1 handler (as programs with
// a timeout or cancellation scheme do); then the connection is closed. TCP: the server reads
// EOF at once. (pthread_cancel with "cancel" as argv[2]: the thread is cancelled in recv;
// "reread": the server writes 5 bytes at 500 ms, the main thread reads them before the close.)
static sigjmp_buf lj_env;
static int lj_c;
static void lj_h(int sig) { (void)sig; siglongjmp(lj_env, 1); }
static void *lj_reader(void *a) {
  (void)a;
  char b[100];
  if (sigsetjmp(lj_env, 1) == 0) recv(lj_c, b, sizeof b, 0);
  else printf("the thread left recv by siglongjmp\n");
  pause();
  return NULL;
}

static int longjmp_close(int cancel, int reread) {
  int pa, la = listener(&pa);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    if (reread) {
      msleep(500);
      write(s, "hello", 5);
    }
    long t0 = now_ms();
    char x;
    struct pollfd q = {s, POLLIN, 0};
    int pr = poll(&q, 1, 3000);
    ssize_t r = pr > 0 ? read(s, &x, 1) : -1;
    printf("server: %s %s\n", pr == 0 ? "no EOF within 3 s" : r == 0 ? "EOF" : "other", pr == 0 ? "" : now_ms() - t0 < 600 ? "at once" : "late");
    _exit(0);
  }
  close(la);
  struct sigaction sa_ = {.sa_handler = lj_h};
  sigaction(SIGUSR1, &sa_, NULL);
  lj_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, lj_reader, NULL);
  msleep(200);
  if (cancel) {
    pthread_cancel(t);
    pthread_join(t, NULL);
    printf("the thread was cancelled in recv\n");
  } else
    pthread_kill(t, SIGUSR1);
  msleep(100);
  if (reread) {
    char b[16];
    long t0 = now_ms();
    ssize_t r = recv(lj_c, b, sizeof b, 0);
    printf("main thread's recv after that: %zd after %s\n", r, now_ms() - t0 < 1000 ? "<1 s" : ">=1 s");
  }
  close(lj_c);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- longjmp_pingpong
// As longjmp_close, then the main thread makes 10 request/response rounds on the connection
// (the server answers each after 20 ms). TCP: about 200 ms in all.
static int longjmp_pingpong(void) {
  int pa, la = listener(&pa);
  pid_t sa = fork();
  if (sa == 0) {
    int s = accept(la, NULL, NULL);
    char x;
    for (int i = 0; i < 10 && read(s, &x, 1) == 1; i++) {
      msleep(20);
      write(s, &x, 1);
    }
    _exit(0);
  }
  close(la);
  struct sigaction sa_ = {.sa_handler = lj_h};
  sigaction(SIGUSR1, &sa_, NULL);
  lj_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, lj_reader, NULL);
  msleep(200);
  pthread_kill(t, SIGUSR1);
  msleep(100);
  long t0 = now_ms();
  int ok = 0;
  for (int i = 0; i < 10; i++) {
    char x = 'a' + i, y = 0;
    write(lj_c, &x, 1);
    ok += recv(lj_c, &y, 1, 0) == 1 && y == x;
  }
  long ms = now_ms() - t0;
  printf("10 rounds: %d answered right in %s\n", ok, ms < 1000 ? "<1 s" : ms < 3000 ? "1-3 s" : ">=3 s");
  close(lj_c);
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- poll_reuse
// A thread in poll(c, POLLIN, 1000); at 200 ms another thread closes c and connects a socket at
// the same number to a server that greets with 1000 bytes. TCP: poll sleeps on the old file and
// reports the number's new socket (POLLIN) at its timeout.
static int pr_c, pr_d = -1, pr_pb;
static int pr_r;
static short pr_rev;
static long pr_ms;
static void *pr_poller(void *a) {
  (void)a;
  struct pollfd q = {pr_c, POLLIN, 0};
  long t0 = now_ms();
  pr_r = poll(&q, 1, 1000);
  pr_ms = now_ms() - t0;
  pr_rev = q.revents;
  return NULL;
}

static int poll_reuse(void) {
  int pa, la = listener(&pa), lb = listener(&pr_pb);
  pid_t sa = server(la, -1, 0, 0, 0, 0, 3, "server A read", 3000);
  pid_t sb = server(lb, -1, 1000, 2, 1, 0, 4, "server B read", 3000);
  close(la);
  close(lb);
  pr_c = dial(pa);
  pthread_t t;
  pthread_create(&t, NULL, pr_poller, NULL);
  msleep(200);
  close(pr_c);
  pr_d = dial(pr_pb);
  pthread_join(t, NULL);
  printf("poll returned %d revents %#x after %s; new socket at the number: %s\n", pr_r, pr_rev,
         pr_ms < 900 ? "<900 ms" : pr_ms < 1200 ? "900-1200 ms" : ">=1200 ms", pr_d == pr_c ? "yes" : "no");
  readcheck("the new socket read", pr_d, 2, 3000);
  close(pr_d);
  int ws;
  waitpid(sa, &ws, 0);
  waitpid(sb, &ws, 0);
  return 0;
}

// ---------------------------------------------------------------- closefrom_stale
// A connection at fd 3 whose server sent 100 bytes; closefrom(3) (glibc: its internal
// close_range, unseen); the program opens a file (fd 3 again), reads it, writes to a second
// file opened at 4. TCP: read gives the file's bytes; the write lands in the file.
static int closefrom_stale(void) {
  int pa, la = listener(&pa);
  pid_t sa = server(la, -1, 100, 1, 0, 0, 3, "server read", 2000);
  close(la);
  int c = dial(pa);
  msleep(200);
  closefrom(3);
  int f = open("/tmp", O_TMPFILE | O_RDWR, 0600);
  const char *msg = "file bytes\n";
  pwrite(f, msg, strlen(msg), 0);
  char b[200];
  ssize_t r = read(f, b, sizeof b);
  int same = r == (ssize_t)strlen(msg) && !memcmp(b, msg, r);
  printf("connection was at %d, file at %d: read %zd bytes, %s\n", c, f, r, same ? "the file's" : "NOT the file's");
  ssize_t w = write(f, "more\n", 5);
  struct stat st;
  fstat(f, &st);
  printf("write %zd; the file holds %ld bytes\n", w, (long)st.st_size);
  printf("close(file) %s\n", close(f) ? strerror(errno) : "ok");
  int ws;
  waitpid(sa, &ws, 0);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (getenv("RT_NC")) NC = atoi(getenv("RT_NC")) < NCMAX ? atoi(getenv("RT_NC")) : NCMAX;
  signal(SIGPIPE, SIG_IGN);
  const char *s = argc > 1 ? argv[1] : "";
  if (!strcmp(s, "sendfile_reuse")) return sendfile_reuse();
  if (!strcmp(s, "sendmmsg_reuse")) return sendmmsg_reuse();
  if (!strcmp(s, "splice_reuse")) return splice_reuse(0, 0);
  if (!strcmp(s, "recvmmsg_reuse")) return splice_reuse(1, MSG_WAITFORONE);
  if (!strcmp(s, "recvmmsg_wait")) return recvmmsg_wait();
  if (!strcmp(s, "closefrom")) return closefrom_scn(0);
  if (!strcmp(s, "closefrom_pair")) return closefrom_scn(1);
  if (!strcmp(s, "privfd")) return privfd();
  if (!strcmp(s, "exec_close")) return exec_close(argv[0]);
  if (!strcmp(s, "exec_close_2") && argc > 3) return exec_close_2(atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(s, "scm_many")) return many(0, argv[0]);
  if (!strcmp(s, "exec_many")) return many(1, argv[0]);
  if (!strcmp(s, "exec_many_2") && argc > 3) return exec_many_2(argv[2], atoi(argv[3]));
  if (!strcmp(s, "seq_pool")) return seq_pool();
  if (!strcmp(s, "switch_inflight")) return switch_inflight(1);
  if (!strcmp(s, "switch_blocked")) return switch_inflight(0);
  if (!strcmp(s, "close_range_inflight")) return close_range_inflight(0);
  if (!strcmp(s, "closeloop_inflight")) return close_range_inflight(1);
  if (!strcmp(s, "splice_in_reuse")) return splice_in_reuse();
  if (!strcmp(s, "scm_inflight")) return scm_inflight();
  if (!strcmp(s, "fork_inflight")) return fork_inflight();
  if (!strcmp(s, "epoll_close_range")) return epoll_close_range();
  if (!strcmp(s, "shutdown_send_blocked")) return shutdown_send_blocked(argc > 2 && !strcmp(argv[2], "rdwr") ? SHUT_RDWR : SHUT_WR);
  if (!strcmp(s, "longjmp_close")) return longjmp_close(argc > 2 && !strcmp(argv[2], "cancel"), argc > 2 && !strcmp(argv[2], "reread"));
  if (!strcmp(s, "longjmp_pingpong")) return longjmp_pingpong();
  if (!strcmp(s, "poll_reuse")) return poll_reuse();
  if (!strcmp(s, "closefrom_stale")) return closefrom_stale();
  printf("unknown scenario %s\n", s);
  return 2;
}
