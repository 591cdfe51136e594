// sigsafe PORT SCEN K US: K connections to a server process forked first; a SIGALRM every US µs runs a
// handler that acts on the next one (SCEN: close, write, read, shut, dup2, crange, sendonly, none,
// exec, execonly, execnolib, execnolibonly, exit) while the main code churns malloc/free.
// env MT=1: an idle extra thread; BUSY=1: main also sends on a busy connection; NB=1: non-blocking
// connects (NBX=1: not waited for: the handler's call drives the handshake); RECVTHREADS=1: a
// thread blocked in recv on each connection (the server answers 2 s after the last accept);
// EPOLL=1: main also epoll_waits (timeout 0) on them each turn (POLL=1: and polls them);
// CONNLOOP=1: main also makes connections to a listener of its own (port + 500) back to back.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <pthread.h>
#include <time.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
#include <linux/close_range.h>

#define MAXC 200
static int port, K, US;
static const char *scen;
static int fds[MAXC];
static volatile int next_i;
static volatile int hdone;
static int devnull;
static char *const envnolib[] = {"PATH=/bin:/usr/bin", NULL};
static char **envkeep;
static pid_t kids[MAXC];
static volatile int nkids;
static volatile long hbad;

static void server(int lfd, int n) {
  struct pollfd p[MAXC + 2];
  long got[MAXC + 2]; char tail[MAXC + 2][8]; int np = 0, eof = 0, accepted = 0;
  memset(got, 0, sizeof got); memset(tail, 0, sizeof tail);
  p[0].fd = lfd; p[0].events = POLLIN; np = 1;
  int total = n + (getenv("BUSY") ? 1 : 0);
  while (eof < total) {
    int r = poll(p, np, 30000);
    if (r <= 0) { fprintf(stderr, "server: poll timeout eof=%d/%d\n", eof, total); break; }
    if (p[0].revents & POLLIN && accepted < total) {
      int c = accept(lfd, 0, 0);
      if (c >= 0) { write(c, "hello", 5); p[np].fd = c; p[np].events = POLLIN; np++; accepted++; }
      if (accepted == total && getenv("RECVTHREADS")) { sleep(2); for (int i = 1; i < np; i++) write(p[i].fd, "ok", 2); }
    }
    for (int i = 1; i < np; i++) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char b[65536];
      ssize_t m = read(p[i].fd, b, sizeof b);
      if (m > 0) {
        got[i] += m;
        if (m >= 4) memcpy(tail[i], b + m - 4, 4);
        else { memmove(tail[i], tail[i] + m, 4 - m); memcpy(tail[i] + 4 - m, b, m); }
      } else {
        if (m < 0) fprintf(stderr, "server conn %d: %s\n", i, strerror(errno));
        close(p[i].fd); p[i].fd = -1; eof++;
      }
    }
  }
  int bye = 0, exact = 0;
  for (int i = 1; i < np; i++) { if (!memcmp(tail[i], "BYE\n", 4)) bye++; if (got[i] == 4) exact++; }
  printf("server: accepted=%d eof=%d bye=%d exactly4=%d\n", accepted, eof, bye, exact);
}

static void handler(int sig) {
  (void)sig;
  int e = errno;
  int i = __sync_fetch_and_add(&next_i, 1);
  if (i >= K) { next_i = K; errno = e; return; }
  int fd = fds[i];
  if (!strcmp(scen, "read")) {
    char b[5]; ssize_t m = read(fd, b, 5);
    if (m != 5) hbad++;
  }
  if (strcmp(scen, "none")) {
    ssize_t m = strcmp(scen, "write") ? send(fd, "BYE\n", 4, MSG_NOSIGNAL) : write(fd, "BYE\n", 4);
    if (m != 4) hbad++;
  }
  if (!strcmp(scen, "close") || !strcmp(scen, "write") || !strcmp(scen, "read")) { if (close(fd)) hbad++; fds[i] = -1; }
  else if (!strcmp(scen, "shut")) { if (shutdown(fd, SHUT_WR)) hbad++; }
  else if (!strcmp(scen, "dup2")) { if (dup2(devnull, fd) != fd) hbad++; }
  else if (!strcmp(scen, "crange")) { if (syscall(SYS_close_range, fd, fd, 0)) hbad++; fds[i] = -1; }
  else if (!strncmp(scen, "exec", 4)) {
    pid_t p = fork();
    if (p == 0) {
      char *av[] = {"/bin/true", NULL};
      execve("/bin/true", av, strstr(scen, "nolib") ? envnolib : envkeep);
      _exit(99);
    }
    if (p > 0) kids[nkids++] = p; else hbad++;
    if (!strstr(scen, "only")) { if (close(fd)) hbad++; fds[i] = -1; }
  } else if (!strcmp(scen, "exit")) {
    for (int j = i + 1; j < K; j++) send(fds[j], "BYE\n", 4, MSG_NOSIGNAL);
    _exit(0);
  }
  errno = e;
}

static void *idle(void *a) { (void)a; for (;;) pause(); return 0; }
static volatile int readers_ok;
static void *reader(void *a) { char b[2]; sigset_t m; sigemptyset(&m); sigaddset(&m, SIGALRM); pthread_sigmask(SIG_BLOCK, &m, 0);
  if (recv((int)(long)a, b, 2, MSG_WAITALL) == 2) __sync_fetch_and_add(&readers_ok, 1); return 0; }

int main(int argc, char **argv, char **envp) {
  if (argc < 5) { fprintf(stderr, "usage\n"); return 2; }
  port = atoi(argv[1]); scen = argv[2]; K = atoi(argv[3]); US = atoi(argv[4]);
  envkeep = envp;
  if (K > MAXC - 2) K = MAXC - 2;
  setvbuf(stdout, 0, _IONBF, 0);
  devnull = open("/dev/null", O_RDWR);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1; setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(lfd, (void *)&a, sizeof a) || listen(lfd, 256)) { perror("bind/listen"); return 2; }
  pid_t sp = fork();
  if (sp == 0) { server(lfd, K); _exit(0); }
  close(lfd);
  for (int i = 0; i < K; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (getenv("NB")) fcntl(fds[i], F_SETFL, O_NONBLOCK);
    if (connect(fds[i], (void *)&a, sizeof a) && errno != EINPROGRESS) { perror("connect"); return 2; }
    if (getenv("NB") && !getenv("NBX")) { struct pollfd q = {fds[i], POLLOUT, 0}; poll(&q, 1, 1000); }
    if (getenv("NB")) fcntl(fds[i], F_SETFL, 0);
  }
  int busy = -1;
  if (getenv("BUSY")) { busy = socket(AF_INET, SOCK_STREAM, 0); if (connect(busy, (void *)&a, sizeof a)) { perror("connect"); return 2; } }
  // make sure the handshakes are done: each conn reads its hello (except for "read", which reads in the handler)
  if (strcmp(scen, "read") && !getenv("NB")) for (int i = 0; i < K; i++) { char b[5]; if (recv(fds[i], b, 5, MSG_WAITALL) != 5) { fprintf(stderr, "hello %d\n", i); } }
  if (busy >= 0) { char b[5]; recv(busy, b, 5, MSG_WAITALL); }
  pthread_t th;
  if (getenv("MT")) pthread_create(&th, 0, idle, 0);
  static pthread_t rt[MAXC];
  if (getenv("RECVTHREADS")) { for (int i = 0; i < K; i++) pthread_create(&rt[i], 0, reader, (void *)(long)fds[i]); usleep(200000); }
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = handler; sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, 0);
  struct itimerval it = {{0, US}, {0, US}};
  setitimer(ITIMER_REAL, &it, 0);
  static void *slots[256];
  unsigned r = 12345; long iters = 0;
  time_t t0 = time(0);
  char sb[1000]; memset(sb, 'x', sizeof sb);
  int ep = -1;
  if (getenv("EPOLL")) { ep = epoll_create1(0); for (int i = 0; i < K; i++) { struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fds[i]}; epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev); } }
  long evs = 0;
  int l2 = -1; struct sockaddr_in a2 = a; a2.sin_port = htons(port + 500); long conns2 = 0, bad2 = 0;
  if (getenv("CONNLOOP")) { l2 = socket(AF_INET, SOCK_STREAM, 0); setsockopt(l2, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); if (bind(l2, (void *)&a2, sizeof a2) || listen(l2, 16)) { perror("l2"); return 2; } }
  while (next_i < K && time(0) - t0 < 20) {
    if (l2 >= 0) { int c = socket(AF_INET, SOCK_STREAM, 0); if (connect(c, (void *)&a2, sizeof a2)) bad2++; else { int s2 = accept(l2, 0, 0); char b4[4]; if (s2 < 0 || send(c, "ping", 4, 0) != 4 || recv(s2, b4, 4, MSG_WAITALL) != 4 || memcmp(b4, "ping", 4)) bad2++; else conns2++; if (s2 >= 0) close(s2); } close(c); }
    if (ep >= 0) { struct epoll_event o[16]; int n = epoll_wait(ep, o, 16, 0); if (n > 0) evs += n; if (getenv("POLL")) { struct pollfd q[MAXC]; int m = 0; for (int i = 0; i < K; i++) if (fds[i] >= 0) { q[m].fd = fds[i]; q[m].events = POLLIN; m++; } poll(q, m, 0); } }
    r = r * 1103515245 + 12345;
    int j = (r >> 8) % 256;
    free(slots[j]);
    size_t sz = (r >> 16) % 3 == 0 ? ((r >> 4) % 200000) + 1 : ((r >> 4) % 2000) + 1;
    slots[j] = malloc(sz);
    if (slots[j]) ((char *)slots[j])[0] = 1;
    if (busy >= 0 && (iters & 15) == 0) { if (send(busy, sb, sizeof sb, MSG_NOSIGNAL) < 0) { perror("busy send"); busy = -2; } }
    iters++;
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, 0);
  for (int j = 0; j < 256; j++) free(slots[j]);
  if (getenv("RECVTHREADS")) { for (int i = 0; i < K; i++) pthread_join(rt[i], 0); printf("client: readers_ok=%d\n", readers_ok); }
  for (int i = 0; i < K; i++) if (fds[i] >= 0) close(fds[i]);
  if (busy >= 0) close(busy);
  int badkids = 0;
  for (int i = 0; i < nkids; i++) { int st; if (waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) badkids++; }
  int st; waitpid(sp, &st, 0);
  printf("client: handled=%d hbad=%ld kids=%d badkids=%d server_status=%d\n", next_i, hbad, nkids, badkids, st);
  if (ep >= 0) printf("client: epoll events %s\n", evs ? "some" : "none");
  if (l2 >= 0) printf("client: loop conns %s bad=%ld\n", conns2 ? "some" : "none", bad2);
  return 0;
}
