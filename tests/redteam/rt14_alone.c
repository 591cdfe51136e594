/* Round 14: the switch to TCP alone (DESIGN.md *Switch to TCP*, **Alone**).
 * A connection's end leaves for an image without the library (execve with LD_PRELOAD removed
 * from the environment) while its peer writes, shuts down, closes, leaves too, or polls.
 * usage: rt14_alone PORT SCENARIO N
 *   latewrite  the server writes 200 records starting 0..4 ms after the client forks a child
 *              that execs a summing helper on the connection; the helper answers "n sum"
 *   vfork      the same with vfork
 *   scm        the same, the client passes its end with SCM_RIGHTS to a helper without the
 *              library (started before) and closes it
 *   both       both ends fork helpers that exec at once (a barrier): each writes a hello,
 *              shuts down its writing and reads to EOF
 *   both0      the same right after connect/accept (no byte exchanged first)
 *   shutfirst  the server sent "data", shut its writing and waits on a pipe; the client read
 *              "data", its helper reads to EOF
 *   shutrace   the server shuts its writing 0..4 ms after the client's fork, then waits on a
 *              pipe; the helper reads to EOF
 *   peerclosed the server sent "bye" and closed; the client read it, its helper reads to EOF
 *   closerace  the server closes 0..4 ms after the client's fork (having sent "bye" first)
 *   chain      the client's end goes through 6 images: without, with, without ... the
 *              library; each writes a line and reads the server's echo
 *   thread     a thread of the client writes records while the main thread execs the helper
 *              (which writes HELPER and shuts down); the server checks the sequence
 *   epollet    the server waits with EPOLLET for what the client's helper writes in 2 parts
 *   self       one process holds both ends; its child execs the helper on one of them while
 *              the parent writes records on the other one
 * Output: one line per distinct per-iteration result with its count (same for TCP).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static int port;
static char self_path[4096];
#define NREC 200

static char **env_filtered(int with_lib) {
  int n = 0;
  while (environ[n]) n++;
  char **e = calloc(n + 2, sizeof *e);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (strncmp(environ[i], "LD_PRELOAD=", 11)) e[k++] = environ[i];
  const char *lib = getenv("RT14_LIB");
  if (with_lib && lib && *lib) {
    char *s = malloc(strlen(lib) + 12);
    sprintf(s, "LD_PRELOAD=%s", lib);
    e[k++] = s;
  }
  return e;
}

static void exec_helper(int with_lib, char *a1, char *a2, char *a3) {
  char *argv[] = {self_path, "0", a1, a2, a3, NULL};
  execve(self_path, argv, env_filtered(with_lib));
  perror("execve");
  _exit(127);
}

static int listen_on(int p) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) { perror("listen"); exit(1); }
  return l;
}
static int connect_to(int p) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c, (void *)&a, sizeof a)) { perror("connect"); exit(1); }
  return c;
}
static int rd_full(int fd, char *b, int n) {
  int g = 0;
  while (g < n) {
    int r = read(fd, b + g, n - g);
    if (r <= 0) return r < 0 ? -1 : g;
    g += r;
  }
  return g;
}
static void wr_all(int fd, const void *b, size_t n) {
  const char *p = b;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r <= 0) return;
    p += r; n -= r;
  }
}
static long last_n;
/* reads to EOF with a deadline; "n=.. sum=.. eof|err(E)|timeout" */
static void read_to_eof(int fd, char *out, size_t outn, char *keep, size_t keepn) {
  unsigned long sum = 0; long n = 0; const char *st = "eof"; char eb[32];
  struct timespec t0; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int pr = poll(&p, 1, getenv("RT14_HTMO") ? atoi(getenv("RT14_HTMO")) : 6000);
    if (pr == 0) { st = "timeout"; break; }
    char b[4096];
    ssize_t r = read(fd, b, sizeof b);
    if (r == 0) break;
    if (r < 0) { if (errno == EINTR) continue; snprintf(eb, sizeof eb, "err(%s)", strerrorname_np(errno)); st = eb; break; }
    for (ssize_t i = 0; i < r; i++) { sum = sum * 31 + (unsigned char)b[i]; if (keep && (size_t)n + i < keepn - 1) keep[n + i] = b[i]; }
    n += r;
  }
  if (keep) keep[n < (long)keepn - 1 ? n : (long)keepn - 1] = 0;
  last_n = n;
  struct timespec t1; clock_gettime(CLOCK_MONOTONIC, &t1);
  double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  snprintf(out, outn, "n=%ld sum=%lx %s%s", n, sum, st, dt > 1.0 ? " slow(>1s)" : "");
}

/* ---- helpers (run without the library unless said), the connection on fd 3 ---- */
static int helper(int argc, char **argv) {
  const char *m = argv[2];
  if (!strcmp(m, "sum")) { /* read to EOF, answer on the connection */
    char r[128];
    read_to_eof(3, r, sizeof r, NULL, 0);
    strcat(r, "\n");
    wr_all(3, r, strlen(r));
    return 0;
  }
  if (!strcmp(m, "sumpipe")) { /* read to EOF, answer on fd 4 */
    char r[128];
    read_to_eof(3, r, sizeof r, NULL, 0);
    strcat(r, "\n");
    wr_all(4, r, strlen(r));
    return 0;
  }
  if (!strcmp(m, "hello")) { /* argv[3] = name; result on fd 4 */
    char h[64], got[256], r[512];
    snprintf(h, sizeof h, "hello from %s\n", argv[3]);
    wr_all(3, h, strlen(h));
    shutdown(3, SHUT_WR);
    read_to_eof(3, r, 128, got, sizeof got);
    char *nl = strchr(got, '\n'); if (nl) *nl = 0;
    char line[700];
    snprintf(line, sizeof line, "%s got [%s] %s\n", argv[3], got, r);
    wr_all(4, line, strlen(line));
    return 0;
  }
  if (!strcmp(m, "chain")) { /* argv[3] = stage */
    int k = atoi(argv[3]);
    char l[64], b[64];
    snprintf(l, sizeof l, "stage %d lib=%d\n", k, getenv("LD_PRELOAD") != NULL);
    wr_all(3, l, strlen(l));
    int n = rd_full(3, b, strlen(l) + 5);
    if (n != (int)strlen(l) + 5 || memcmp(b, "ECHO ", 5) || memcmp(b + 5, l, strlen(l))) {
      char r[160]; snprintf(r, sizeof r, "stage %d bad echo n=%d errno=%s\n", k, n, strerrorname_np(errno));
      wr_all(4, r, strlen(r));
      return 1;
    }
    if (k == 6) { wr_all(4, "chain ok\n", 9); return 0; }
    char s[16]; snprintf(s, sizeof s, "%d", k + 1);
    exec_helper((k + 1) % 2 == 0, "chain", s, NULL);
  }
  if (!strcmp(m, "tail")) { /* the thread scenario: write HELPER, shut, drain */
    wr_all(3, "HELPER\n", 7);
    shutdown(3, SHUT_WR);
    char r[128]; read_to_eof(3, r, sizeof r, NULL, 0);
    return 0;
  }
  if (!strcmp(m, "pingpong")) { /* both ends: 3 and 4; result on 5 */
    char b[8] = {0}, r[64];
    wr_all(3, "ping", 4); int n1 = rd_full(4, b, 4);
    wr_all(4, "pong", 4); int n2 = rd_full(3, b + 4 - 4, 4);
    snprintf(r, sizeof r, "pingpong n1=%d n2=%d last=%.4s\n", n1, n2, b);
    wr_all(5, r, strlen(r));
    return 0;
  }
  if (!strcmp(m, "hi")) { wr_all(3, "hi\n", 3); return 0; }
  if (!strcmp(m, "parts")) {
    wr_all(3, "part1", 5);
    usleep(20000);
    wr_all(3, "part2", 5);
    shutdown(3, SHUT_WR);
    char r[128]; read_to_eof(3, r, sizeof r, NULL, 0);
    return 0;
  }
  if (!strcmp(m, "scm")) { /* fd 5: unix socket; receive a connection, then "sum" on it */
    for (;;) {
      char c; struct iovec v = {&c, 1};
      char cb[CMSG_SPACE(sizeof(int))];
      struct msghdr mh = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
      if (recvmsg(5, &mh, 0) <= 0) return 0;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      if (!cm) return 1;
      int fd; memcpy(&fd, CMSG_DATA(cm), sizeof fd);
      static char keep[8192]; char r[128]; read_to_eof(fd, r, sizeof r, keep, sizeof keep);
      if (getenv("RT14_DUMP")) { static int k; char pth[256]; snprintf(pth, sizeof pth, "%s.%d", getenv("RT14_DUMP"), k++); FILE *f = fopen(pth, "w"); if (f) { fwrite(keep, 1, last_n < (long)sizeof keep ? last_n : (long)sizeof keep, f); fclose(f); } }
      strcat(r, "\n");
      wr_all(fd, r, strlen(r));
      close(fd);
    }
  }
  return 2;
}

/* ---- tallies ---- */
#define MAXK 64
static char keys[MAXK][256]; static int cnt[MAXK], nk;
static void tally(const char *k) {
  for (int i = 0; i < nk; i++) if (!strcmp(keys[i], k)) { cnt[i]++; return; }
  if (nk < MAXK) { snprintf(keys[nk], 256, "%s", k); cnt[nk++] = 1; }
}
static void report(const char *sc) { for (int i = 0; i < nk; i++) printf("%s: %d x %s\n", sc, cnt[i], keys[i]); fflush(stdout); }

static unsigned rnd(unsigned n) { return (unsigned)random() % n; }

static void records(int fd, char *expect, size_t en) {
  unsigned long sum = 0; long n = 0;
  for (int i = 0; i < NREC; i++) {
    char b[16]; int k = snprintf(b, sizeof b, "rec %06d\n", i);
    wr_all(fd, b, k);
    for (int j = 0; j < k; j++) sum = sum * 31 + (unsigned char)b[j];
    n += k;
    if (i % 20 == 0) usleep(50);
  }
  snprintf(expect, en, "n=%ld sum=%lx eof", n, sum);
}

/* server side of latewrite/vfork/scm/self: write records at a random delay, shut, read reply */
static void serve_records(int s, int delay_us, const char *sc) {
  (void)sc;
  usleep(delay_us);
  char expect[128], got[256];
  records(s, expect, sizeof expect);
  shutdown(s, SHUT_WR);
  char r[128];
  read_to_eof(s, r, sizeof r, got, sizeof got);
  char *nl = strchr(got, '\n'); if (nl) *nl = 0;
  if (!strcmp(got, expect)) tally("ok");
  else { char k[512]; snprintf(k, sizeof k, "reply [%s] (%s)", got, r); tally(k); }
}

static void greet_server(int s) { wr_all(s, "g", 1); char c; rd_full(s, &c, 1); }
static void greet_client(int c) { char x; rd_full(c, &x, 1); wr_all(c, "a", 1); }

int main(int argc, char **argv) {
  ssize_t sl = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (sl > 0) self_path[sl] = 0;
  if (argc > 2 && !strcmp(argv[1], "0")) return helper(argc, argv);
  if (argc < 4) { fprintf(stderr, "usage: %s PORT SCENARIO N\n", argv[0]); return 2; }
  if (!getenv("RT14_LIB") && getenv("LD_PRELOAD")) setenv("RT14_LIB", getenv("LD_PRELOAD"), 1);
  port = atoi(argv[1]);
  const char *sc = argv[2];
  int N = atoi(argv[3]);
  srandom(getpid());
  signal(SIGPIPE, SIG_IGN);
  int l = listen_on(port);
  int ctl[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, ctl); /* server <-> client sync */
  int res[2]; pipe(res); /* helpers' results */

  if (!strcmp(sc, "selfboth")) {
    for (int i = 0; i < N; i++) {
      int a = connect_to(port), b = accept(l, NULL, NULL);
      wr_all(b, "g", 1); greet_client(a); char g; rd_full(b, &g, 1);
      pid_t p = fork();
      if (!p) { dup2(a, 3); dup2(b, 4); dup2(res[1], 5); exec_helper(0, "pingpong", NULL, NULL); }
      close(a); close(b);
      int st; waitpid(p, &st, 0);
      char r[128] = {0}; struct pollfd pf = {res[0], POLLIN, 0};
      int n = poll(&pf, 1, 100) > 0 ? read(res[0], r, sizeof r - 1) : 0;
      if (n > 0) { char *nl = strchr(r, '\n'); if (nl) *nl = 0; } else strcpy(r, "no result");
      tally(r);
    }
    report(sc);
    return 0;
  }
  if (!strcmp(sc, "self")) {
    for (int i = 0; i < N; i++) {
      int a = connect_to(port), b = accept(l, NULL, NULL);
      wr_all(b, "g", 1); greet_client(a); char g; rd_full(b, &g, 1);
      pid_t p = fork();
      if (!p) { close(b); dup2(a, 3); exec_helper(0, "sum", NULL, NULL); }
      close(a);
      serve_records(b, rnd(4000), sc);
      close(b);
      waitpid(p, NULL, 0);
    }
    report(sc);
    return 0;
  }

  int scm_helper = -1, scm_sock[2] = {-1, -1};
  if (!strcmp(sc, "scm")) {
    socketpair(AF_UNIX, SOCK_STREAM, 0, scm_sock);
    scm_helper = fork();
    if (!scm_helper) { if (!getenv("RT14_SCM_LISTENER")) close(l); close(scm_sock[0]); dup2(scm_sock[1], 5); exec_helper(0, "scm", NULL, NULL); }
    close(scm_sock[1]);
    usleep(getenv("RT14_SCM_EARLY") ? 0 : 300000); /* the helper's exec is done before the first pass */
  }

  pid_t srv = fork();
  if (!srv) { /* ---------------- server process ---------------- */
    close(ctl[1]);
    if (scm_sock[0] >= 0) close(scm_sock[0]);
    for (int i = 0; i < N; i++) {
      int s = accept(l, NULL, NULL);
      if (!strcmp(sc, "latewrite") || !strcmp(sc, "vfork") || !strcmp(sc, "scm")) {
        greet_server(s);
        serve_records(s, rnd(4000), sc);
      } else if (!strcmp(sc, "both") || !strcmp(sc, "both0")) {
        if (!strcmp(sc, "both")) greet_server(s);
        char c; read(ctl[0], &c, 1);
        pid_t p = fork();
        if (!p) { dup2(s, 3); dup2(res[1], 4); exec_helper(0, "hello", "server", NULL); }
        close(s); s = -1;
        waitpid(p, NULL, 0);
      } else if (!strcmp(sc, "ownshut") || !strcmp(sc, "writeclose")) {
        /* ownshut: the client shut its writing before its exec: read to its EOF, then write
         * and close; writeclose: write 0-3 ms after the greeting and close */
        greet_server(s);
        char b[64]; if (!strcmp(sc, "ownshut")) while (read(s, b, sizeof b) > 0) {}
        usleep(rnd(3000));
        char expect[128]; records(s, expect, sizeof expect);
        close(s); s = -1;
      } else if (!strcmp(sc, "shutwin")) {
        /* the shutdown 0..D us after the client's fork; a look at the socket after 3 s answers
         * a two-sided switch (the helper, RT14_HTMO=2000, reports a missing EOF first) */
        greet_server(s);
        char c; read(ctl[0], &c, 1);
        int D = getenv("RT14_D") ? atoi(getenv("RT14_D")) : 3000;
        usleep(rnd(D));
        shutdown(s, SHUT_WR);
        struct pollfd pf = {ctl[0], POLLIN, 0};
        if (poll(&pf, 1, 3000) == 0) { char x; recv(s, &x, 1, MSG_DONTWAIT); }
        read(ctl[0], &c, 1);
      } else if (!strcmp(sc, "shutfirst") || !strcmp(sc, "shutrace")) {
        greet_server(s);
        if (!strcmp(sc, "shutfirst")) { wr_all(s, "data\n", 5); shutdown(s, SHUT_WR); }
        char c;
        if (!strcmp(sc, "shutrace")) { read(ctl[0], &c, 1); /* the client forks now */ usleep(rnd(4000)); shutdown(s, SHUT_WR); }
        read(ctl[0], &c, 1); /* the client's helper is done: never touched the connection */
      } else if (!strcmp(sc, "busy") || !strcmp(sc, "busyq") || !strcmp(sc, "lateread") || !strcmp(sc, "oobq")) {
        if (!strcmp(sc, "lateread")) { wr_all(s, "g", 1); usleep(50000); char a; rd_full(s, &a, 1); }
        else greet_server(s);
        if (!strcmp(sc, "busy")) wr_all(s, "data\n", 5);
        if (!strcmp(sc, "oobq")) send(s, "u", 1, MSG_OOB);
        char c; read(ctl[0], &c, 1); /* the client's helper is done */
        char r[128], got[64];
        read_to_eof(s, r, sizeof r, got, sizeof got);
        char key[256]; snprintf(key, sizeof key, "server read [%s] %s", got, r); tally(key);
      } else if (!strcmp(sc, "peerclosed") || !strcmp(sc, "closerace")) {
        greet_server(s);
        wr_all(s, "bye\n", 4);
        char c;
        if (!strcmp(sc, "closerace")) { read(ctl[0], &c, 1); usleep(rnd(4000)); }
        close(s); s = -1;
        read(ctl[0], &c, 1);
      } else if (!strcmp(sc, "chain")) {
        greet_server(s);
        for (;;) {
          char b[64]; int k = 0;
          while (k < 63 && read(s, b + k, 1) == 1 && b[k++] != '\n') {}
          if (k == 0 || b[k - 1] != '\n') break;
          wr_all(s, "ECHO ", 5); wr_all(s, b, k);
        }
      } else if (!strcmp(sc, "thread") || !strcmp(sc, "fdopen")) {
        /* records T000000.. then HELPER then EOF */
        char b[65536]; long n = 0; char *all = malloc(1 << 24); const char *st = "eof";
        for (;;) {
          struct pollfd p = {s, POLLIN, 0};
          if (poll(&p, 1, 8000) == 0) { st = "timeout"; break; }
          ssize_t r = read(s, b, sizeof b);
          if (r == 0) break;
          if (r < 0) { st = strerrorname_np(errno); break; }
          if (n + r < (1 << 24)) memcpy(all + n, b, r);
          n += r;
        }
        all[n < (1 << 24) ? n : (1 << 24) - 1] = 0;
        int k = 0, bad = 0, fd_seen = 0; char *p = all;
        while (p[0] == 'T' || (p[0] == 'F' && !strncmp(p, "FDOPEN\n", 7))) {
          if (p[0] == 'F') fd_seen++;
          else { int v = atoi(p + 1); if (v != k) bad = 1; k++; }
          p = strchr(p, '\n'); if (!p) { bad = 1; break; } p++;
        }
        char key[160];
        if (!strcmp(sc, "fdopen")) {
          if (!bad && p && !*p && fd_seen == 1) snprintf(key, sizeof key, "ok (%s)", st);
          else snprintf(key, sizeof key, "bad seq bad=%d fdopen=%d tail=[%.20s] (%s)", bad, fd_seen, p ? p : "", st);
        } else if (!bad && p && !strcmp(p, "HELPER\n")) snprintf(key, sizeof key, "ok (%s)", st);
        else snprintf(key, sizeof key, "bad seq bad=%d tail=[%.20s] (%s)", bad, p ? p : "", st);
        tally(key);
        free(all);
      } else if (!strcmp(sc, "epollet")) {
        greet_server(s);
        fcntl(s, F_SETFL, O_NONBLOCK);
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET | EPOLLRDHUP, .data.fd = s};
        epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
        char got[64]; int n = 0; const char *st = "eof";
        for (int done = 0; !done;) {
          struct epoll_event e;
          int r = epoll_wait(ep, &e, 1, 5000);
          if (r == 0) { st = "timeout"; break; }
          for (;;) {
            ssize_t k = read(s, got + n, sizeof got - 1 - n);
            if (k > 0) { n += k; continue; }
            if (k == 0) { done = 1; break; }
            if (errno != EAGAIN) { st = strerrorname_np(errno); done = 1; }
            break;
          }
        }
        got[n] = 0;
        char key[160]; snprintf(key, sizeof key, "[%s] %s", got, st); tally(key);
        close(ep);
      }
      if (s >= 0) close(s);
    }
    report(sc);
    _exit(0);
  }
  /* ---------------- client (this process) ---------------- */
  close(ctl[0]);
  for (int i = 0; i < N; i++) {
    if (!strcmp(sc, "thread")) {
      pid_t p = fork();
      if (!p) {
        int c = connect_to(port);
        pthread_t t;
        static int cfd; cfd = c;
        void *wr(void *x) { (void)x; for (int k = 0;; k++) { char b[16]; int n = snprintf(b, sizeof b, "T%06d\n", k); if (write(cfd, b, n) != n) break; } return NULL; }
        pthread_create(&t, NULL, wr, NULL);
        usleep(500 + rnd(3000));
        dup2(c, 3);
        exec_helper(0, "tail", NULL, NULL);
      }
      waitpid(p, NULL, 0);
      continue;
    }
    if (!strcmp(sc, "fdopen")) {
      pid_t p = fork();
      if (!p) {
        int c = connect_to(port);
        pthread_t t;
        static int cfd; static volatile int stop; cfd = c;
        void *wr(void *x) { (void)x; for (int k = 0; !stop; k++) { char b[16]; int n = snprintf(b, sizeof b, "T%06d\n", k); if (send(cfd, b, n, MSG_NOSIGNAL) != n) break; } return NULL; }
        pthread_create(&t, NULL, wr, NULL);
        usleep(200 + rnd(3000));
        FILE *f = fdopen(c, "r+");
        fprintf(f, "FDOPEN\n"); fflush(f);
        usleep(1000 + rnd(2000));
        stop = 1; pthread_join(t, NULL);
        shutdown(c, SHUT_WR);
        char b[64]; while (fread(b, 1, sizeof b, f) > 0) {}
        fclose(f);
        _exit(0);
      }
      waitpid(p, NULL, 0);
      continue;
    }
    int c = connect_to(port);
    if (!strcmp(sc, "latewrite") || !strcmp(sc, "vfork")) {
      greet_client(c);
      pid_t p = !strcmp(sc, "vfork") ? vfork() : fork();
      if (!p) { dup2(c, 3); exec_helper(0, "sum", NULL, NULL); }
      close(c);
      waitpid(p, NULL, 0);
    } else if (!strcmp(sc, "scm")) {
      greet_client(c);
      char x = 'x'; struct iovec v = {&x, 1};
      char cb[CMSG_SPACE(sizeof(int))] = {0};
      struct msghdr mh = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &c, sizeof c);
      sendmsg(scm_sock[0], &mh, 0);
      close(c);
      usleep(20000);
    } else if (!strcmp(sc, "both") || !strcmp(sc, "both0")) {
      if (!strcmp(sc, "both")) greet_client(c);
      wr_all(ctl[1], "b", 1);
      pid_t p = fork();
      if (!p) { dup2(c, 3); dup2(res[1], 4); exec_helper(0, "hello", "client", NULL); }
      close(c);
      waitpid(p, NULL, 0);
      char b[2048]; int n = 0;
      struct timespec t0; clock_gettime(CLOCK_MONOTONIC, &t0);
      while (1) {
        struct pollfd pf = {res[0], POLLIN, 0};
        if (poll(&pf, 1, 8000) <= 0) break;
        int r = read(res[0], b + n, sizeof b - 1 - n);
        if (r <= 0) break;
        n += r; b[n] = 0;
        int lines = 0; for (int j = 0; j < n; j++) lines += b[j] == '\n';
        if (lines >= 2) break;
      }
      b[n] = 0;
      /* sort the two lines */
      char *l1 = strtok(b, "\n"), *l2 = strtok(NULL, "\n");
      char key[700];
      if (l1 && l2 && strcmp(l1, l2) > 0) { char *t = l1; l1 = l2; l2 = t; }
      snprintf(key, sizeof key, "%s | %s", l1 ? l1 : "-", l2 ? l2 : "-");
      tally(key);
    } else if (!strcmp(sc, "shutfirst") || !strcmp(sc, "shutrace") || !strcmp(sc, "peerclosed") || !strcmp(sc, "closerace") || !strcmp(sc, "shutwin") || !strcmp(sc, "ownshut") || !strcmp(sc, "writeclose")) {
      greet_client(c);
      if (!strcmp(sc, "ownshut")) shutdown(c, SHUT_WR);
      if (!strcmp(sc, "shutfirst")) { char b[5]; rd_full(c, b, 5); }
      if (!strcmp(sc, "peerclosed")) { char b[4]; rd_full(c, b, 4); usleep(30000); }
      if (!strcmp(sc, "closerace")) { char b[4]; rd_full(c, b, 4); }
      if (!strcmp(sc, "shutrace") || !strcmp(sc, "closerace") || !strcmp(sc, "shutwin")) wr_all(ctl[1], "f", 1);
      pid_t p = fork();
      if (!p) { dup2(c, 3); dup2(res[1], 4); exec_helper(0, "sumpipe", NULL, NULL); }
      close(c);
      waitpid(p, NULL, 0);
      char b[256] = {0}; int n = read(res[0], b, sizeof b - 1);
      if (n > 0) { b[n] = 0; char *nl = strchr(b, '\n'); if (nl) *nl = 0; }
      tally(b);
      wr_all(ctl[1], "d", 1);
    } else if (!strcmp(sc, "busy") || !strcmp(sc, "busyq") || !strcmp(sc, "lateread") || !strcmp(sc, "oobq")) {
      greet_client(c);
      if (!strcmp(sc, "oobq")) { struct pollfd pf = {c, POLLPRI, 0}; poll(&pf, 1, 2000); char u = 0; if (recv(c, &u, 1, MSG_OOB) != 1) tally("no urgent byte"); }
      if (!strcmp(sc, "busy")) { char b[5]; rd_full(c, b, 5); }
      struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
      pid_t p = fork();
      if (!p) { dup2(c, 3); exec_helper(0, "hi", NULL, NULL); }
      close(c);
      waitpid(p, NULL, 0);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
      tally(dt > 1 ? "helper done after >1s" : "helper done within 1s");
      wr_all(ctl[1], "d", 1);
    } else if (!strcmp(sc, "chain")) {
      greet_client(c);
      pid_t p = fork();
      if (!p) { dup2(c, 3); dup2(res[1], 4); exec_helper(0, "chain", "1", NULL); }
      close(c);
      waitpid(p, NULL, 0);
      char b[256] = {0}; struct pollfd pf = {res[0], POLLIN, 0};
      int n = poll(&pf, 1, 100) > 0 ? read(res[0], b, sizeof b - 1) : 0;
      if (n > 0) { b[n] = 0; char *nl = strchr(b, '\n'); if (nl) *nl = 0; } else strcpy(b, "no result");
      tally(b);
    } else if (!strcmp(sc, "epollet")) {
      greet_client(c);
      pid_t p = fork();
      if (!p) { dup2(c, 3); exec_helper(0, "parts", NULL, NULL); }
      close(c);
      waitpid(p, NULL, 0);
    } else { fprintf(stderr, "unknown scenario\n"); kill(srv, 9); return 2; }
  }
  if (scm_helper > 0) { close(scm_sock[0]); waitpid(scm_helper, NULL, 0); }
  int st; waitpid(srv, &st, 0);
  report(sc);
  return 0;
}
