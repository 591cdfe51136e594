// red3: an SMC-D connection switched to TCP mid-stream at an exec without the library.
// gcc -O2 -o rt3x rt3x.c -lpthread ; world.sh smc|tcp ./rt3x SCEN...   (diff the outputs)
// The server reads part of the client's stream, writes part of its own, then execs itself with
// an empty environment ("img": no library) which finishes the stream; the client checks every
// byte. The pattern holds 0x01 (doorbell) and 0x02 (switch marker) bytes.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define P(...) (printf(__VA_ARGS__), printf("\n"), fflush(stdout))
static unsigned char pat(long i, int salt) { return (unsigned char)(i * 131 + (i >> 9) + salt); }
static void ms(int m) { usleep(m * 1000); }
static char *self;
struct sc { const char *n; long k1, u, w1, w2, x; int cdelay, wait, cexec, cshut_early, sexec_delay, sfork, marker, cclose, exfail, sshut; };
// wait: 0 read, 1 poll, 2 epoll
static struct sc S[] = {
  {"basic", 1000, 0, 1000, 1000, 1000, 0, 0, 0, 0, 0, 0, 0},
  {"unread_both", 1000, 5000, 7000, 3000, 2000, 400, 0, 0, 0, 0, 0, 0},
  {"client_poll", 1000, 5000, 7000, 3000, 2000, 0, 1, 0, 0, 100, 0, 0},
  {"client_epoll", 1000, 5000, 7000, 3000, 2000, 0, 2, 0, 0, 100, 0, 0},
  {"client_full_write", 1000, 3000000, 1000, 1000, 1000, 0, 0, 0, 0, 200, 0, 0},
  {"server_full_write", 1000, 1000, 3000000, 1000, 1000, 500, 0, 0, 0, 0, 0, 0},
  {"both_exec", 1000, 5000, 7000, 3000, 2000, 0, 0, 1, 0, 0, 0, 0},
  {"both_exec_big", 1000, 800000, 900000, 3000, 2000, 0, 0, 1, 0, 0, 0, 0},
  {"half_closed", 1000, 5000, 7000, 3000, 0, 0, 0, 0, 1, 100, 0, 0},
  {"fork_child_holds", 1000, 5000, 7000, 3000, 2000, 300, 0, 0, 0, 0, 1, 0},
  {"markers", 1000, 5000, 7000, 3000, 2000, 300, 0, 0, 0, 0, 0, 1},
  {"client_closed", 1000, 5000, 7000, 3000, 0, 0, 0, 0, 0, 300, 0, 0, 1},
  {"exec_fails", 1000, 5000, 7000, 3000, 2000, 300, 0, 0, 0, 0, 0, 0, 0, 1},
  {"server_half_closed", 1000, 5000, 7000, 0, 2000, 300, 0, 0, 0, 100, 0, 0, 0, 0, 1},
  {"client_writes_then_reads_late", 1000, 5000, 7000, 3000, 2000, 11000, 0, 0, 0, 0, 0, 0},
  {"fork_child_reads", 1000, 5000, 7000, 3000, 2000, 300, 0, 0, 0, 200, 2, 0},
};
static struct sc *C;
static long wr(int fd, long off, long n, int salt) { unsigned char b[65536]; long done = 0;
  while (done < n) { long m = n - done > (long)sizeof b ? (long)sizeof b : n - done; for (long i = 0; i < m; i++) b[i] = C->marker ? (i & 1 ? 2 : 1) : pat(off + done + i, salt);
    long r = write(fd, b, m); if (r <= 0) { P("write at %ld -> %s", off + done, strerror(errno)); return done; } done += r; }
  return done; }
// reads until EOF, checks; returns bytes read
static long rd_all(int fd, long off, int salt, int wait, const char *who) { unsigned char b[65536]; long tot = 0, bad = -1; int ep = -1;
  if (wait == 2) { ep = epoll_create1(0); struct epoll_event e = {EPOLLIN, {.fd = fd}}; epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e); }
  for (;;) {
    if (wait == 1) { struct pollfd p = {fd, POLLIN, 0}; if (poll(&p, 1, 20000) <= 0) { P("%s poll timeout at %ld", who, off + tot); break; } }
    if (wait == 2) { struct epoll_event o; if (epoll_wait(ep, &o, 1, 20000) <= 0) { P("%s epoll timeout at %ld", who, off + tot); break; } }
    long r = read(fd, b, sizeof b); if (r < 0 && errno == EINTR) continue;
    if (r < 0) { P("%s read at %ld -> %s", who, off + tot, strerror(errno)); break; } if (r == 0) break;
    for (long i = 0; i < r; i++) { unsigned char want = C->marker ? ((off + tot + i) & 1 ? 2 : 1) : pat(off + tot + i, salt); if (b[i] != want && bad < 0) bad = off + tot + i; }
    tot += r; }
  P("%s: read %ld first_bad=%ld", who, off + tot, bad); return tot; }
static long rd_n(int fd, long n, long off, int salt) { unsigned char b[65536]; long tot = 0; while (tot < n) { long m = n - tot > (long)sizeof b ? (long)sizeof b : n - tot; long r = read(fd, b, m);
    if (r <= 0) { P("rd_n -> %ld %s", r, strerror(errno)); break; } for (long i = 0; i < r; i++) { unsigned char want = C->marker ? ((off + tot + i) & 1 ? 2 : 1) : pat(off + tot + i, salt); if (b[i] != want) { P("rd_n bad at %ld", off + tot + i); return tot; } } tot += r; } return tot; }
static int gfd; static long goff;
static void *wthr(void *p) { (void)p; long n = wr(gfd, goff, C->w2, 1); (void)n; shutdown(gfd, SHUT_WR); return 0; }
static void img(int fd, long inoff, long outoff) { // the server's image without the library
  gfd = fd; goff = outoff; pthread_t t; pthread_create(&t, 0, wthr, 0); rd_all(fd, inoff, 0, 0, "img"); pthread_join(t, 0); }
static void *cwthr(void *p) { int fd = *(int *)p; ms(C->sexec_delay + 200); wr(fd, C->k1 + C->u, C->x, 0); shutdown(fd, SHUT_WR); return 0; }
static void cimg(int fd) { // the client's image without the library
  wr(fd, C->k1 + C->u, C->x, 0); shutdown(fd, SHUT_WR); rd_all(fd, 0, 1, 0, "cimg"); }
static void exec_img(const char *role, int fd, long a, long b) { char f[16], sa[32], sb[32]; snprintf(f, 16, "%d", fd); snprintf(sa, 32, "%ld", a); snprintf(sb, 32, "%ld", b);
  char *argv[] = {self, (char *)role, (char *)C->n, f, sa, sb, 0}; char *envp[] = {0}; execve(self, argv, envp); P("execve: %s", strerror(errno)); _exit(1); }
static void run(struct sc *c) {
  C = c; int l = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(l, (void *)&a, sizeof a); listen(l, 4); socklen_t al = sizeof a; getsockname(l, (void *)&a, &al);
  pid_t sp = fork();
  if (!sp) { int s = accept(l, 0, 0); close(l); long r = rd_n(s, c->k1, 0, 0); if (r != c->k1) P("srv short %ld", r);
    long w = c->w1; if (c->w1 > 100000) { int fl = fcntl(s, F_GETFL); fcntl(s, F_SETFL, fl | O_NONBLOCK); w = wr(s, 0, 100000, 1); long r2; unsigned char b[65536];
        for (int i = 0; i < 2000 && w < c->w1; i++) { for (long j = 0; j < (long)sizeof b; j++) b[j] = pat(w + j, 1); r2 = write(s, b, c->w1 - w < (long)sizeof b ? c->w1 - w : (long)sizeof b); if (r2 > 0) w += r2; else break; }
        fcntl(s, F_SETFL, fl); }
    else wr(s, 0, c->w1, 1);
    ms(c->sexec_delay);
    if (c->sfork == 1) { pid_t k = fork(); if (!k) { ms(2000); char b; P("fork child read=%ld", read(s, &b, 0)); _exit(0); } }
    if (c->sfork == 2) { pid_t k = fork(); if (!k) { char b[100]; long r = read(s, b, 100); P("fork child read>0=%d", r > 0); _exit(0); } ms(100); }
    if (c->sshut) shutdown(s, SHUT_WR);
    if (c->exfail) { char *argv[] = {"x", 0}; char *envp[] = {0}; execve("/nonexistent/x", argv, envp); gfd = s; goff = w; pthread_t t; pthread_create(&t, 0, wthr, 0); rd_all(s, c->k1, 0, 0, "srv after failed exec"); pthread_join(t, 0); _exit(0); }
    exec_img("img", s, c->k1, w); }
  close(l);
  pid_t cp = fork();
  if (!cp) { int fd = socket(AF_INET, SOCK_STREAM, 0); if (connect(fd, (void *)&a, sizeof a)) { P("connect: %s", strerror(errno)); _exit(1); }
    if (c->cexec) { wr(fd, 0, c->k1 + c->u, 0); exec_img("cimg", fd, 0, 0); }
    if (c->cclose) { wr(fd, 0, c->k1 + c->u, 0); shutdown(fd, SHUT_WR); ms(100); close(fd); P("cli closed"); _exit(0); }
    pthread_t t; long first = c->k1 + (c->u > 200000 ? 0 : c->u); wr(fd, 0, first, 0);
    if (c->u > 200000) { gfd = fd; pthread_t t2; struct { int fd; } *x = malloc(8); x->fd = fd; (void)t2; (void)x;
      pid_t k = fork(); if (!k) { wr(fd, c->k1, c->u, 0); _exit(0); } // blocks on a full ring while the server execs
      if (c->cshut_early) shutdown(fd, SHUT_WR);
      ms(c->cdelay); rd_all(fd, 0, 1, c->wait, "cli"); waitpid(k, 0, 0); _exit(0); }
    if (c->cshut_early) shutdown(fd, SHUT_WR); else pthread_create(&t, 0, cwthr, &fd);
    ms(c->cdelay); rd_all(fd, 0, 1, c->wait, "cli"); if (!c->cshut_early) pthread_join(t, 0); _exit(0); }
  int st; waitpid(cp, &st, 0); if (st) P("client status %x", st); waitpid(sp, &st, 0); if (st) P("server status %x", st);
}
int main(int argc, char **argv) {
  self = argv[0]; signal(SIGPIPE, SIG_IGN); int n = sizeof S / sizeof S[0];
  if (argc > 2 && (!strcmp(argv[1], "img") || !strcmp(argv[1], "cimg"))) { for (int i = 0; i < n; i++) if (!strcmp(S[i].n, argv[2])) C = &S[i];
    if (getenv("LD_PRELOAD")) P("!! image runs the library");
    if (argv[1][0] == 'i') img(atoi(argv[3]), atol(argv[4]), atol(argv[5])); else cimg(atoi(argv[3])); return 0; }
  for (int a = 1; a < argc; a++) for (int i = 0; i < n; i++) if (!strcmp(argv[a], "all") || !strcmp(argv[a], S[i].n)) { P("== %s", S[i].n); run(&S[i]); }
  return 0;
}
