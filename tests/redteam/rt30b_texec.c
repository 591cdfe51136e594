/* rt30b_texec.c: exec (main thread) of an image without the library while another thread
   sits in accept() on the non-close-on-exec listener, with clients connecting all the time.
   usage: rt30b_texec PORT [NCLIENT_PROCS] [CONNS_EACH]
   The image (/tmp/rt30b/echoimg_static, rt30b_texec.c built with -DIMG -static) echoes on the
   listener and on every inherited connection; every client checks its echo. */
#include "rt30b_common.h"
#include <stdatomic.h>
#include <dirent.h>
#include <sys/stat.h>
#ifdef IMG
int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); signal(SIGPIPE, SIG_IGN);
  struct pollfd p[1024]; int n = 0, inh = 0, clc = 0, clci = 0; char inhf[1024] = {0};
  for (int fd = 3; fd < 1024; fd++) {
    struct stat st; if (fstat(fd, &st) || !S_ISSOCK(st.st_mode)) continue;
    int acc = 0; socklen_t l = sizeof acc; getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l);
    if (!acc) { inh++; inhf[fd] = 1; }
    fcntl(fd, F_SETFL, O_NONBLOCK); p[n].fd = fd; p[n].events = POLLIN; p[n++].revents = acc ? 1 : 0;
  }
  /* revents field reused at setup as "is listener" flag */
  char isl[1024] = {0}; char first[1024] = {0};
  for (int i = 0; i < n; i++) { isl[p[i].fd] = p[i].revents; p[i].revents = 0; first[p[i].fd] = 1; }
  int served = 0;
  for (;;) {
    int r = poll(p, n, 10000);
    if (r == 0) break;
    for (int i = 0; i < n; i++) {
      if (!p[i].revents) continue;
      int fd = p[i].fd;
      if (isl[fd]) { int s = accept4(fd, 0, 0, SOCK_NONBLOCK); if (s >= 0 && n < 1024) { inhf[s] = 0; p[n].fd = s; p[n].events = POLLIN; p[n].revents = 0; n++; first[s] = 1; } continue; }
      unsigned char b[65536]; long k = read(fd, b, sizeof b);
      if (k > 0) { if (first[fd] && is_clc(b, k)) { clc++; if (inhf[fd]) clci++; printf("image: fd %d (%s) first read %ld bytes %02x%02x%02x%02x%02x\n", fd, inhf[fd] ? "inherited" : "accepted", k, b[0], b[1], b[2], b[3], b[4]); } first[fd] = 0;
        long off = 0; while (off < k) { long w = write(fd, b + off, k - off); if (w < 0) { if (errno == EAGAIN) { struct pollfd q = { fd, POLLOUT, 0 }; poll(&q, 1, 1000); continue; } break; } off += w; } }
      else if (k == 0 || (k < 0 && errno != EAGAIN)) { close(fd); served++; p[i] = p[--n]; i--; }
    }
  }
  printf("image: %d inherited connections, %d CLC-looking first reads (%d on inherited)\n", inh, clc, clci);
  return 0;
}
#else
static int L; static atomic_int accepted, served; static int q[4096];
static void *acc(void *a) { (void)a; for (;;) { int s = accept(L, 0, 0); if (s >= 0) { int k = atomic_load(&accepted); q[k] = s; atomic_store(&accepted, k + 1); } } return 0; }
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); signal(SIGPIPE, SIG_IGN);
  int port = atoi(argv[1]), np = argc > 2 ? atoi(argv[2]) : 4, each = argc > 3 ? atoi(argv[3]) : 25;
  L = mklisten(port, 0);
  for (int i = 0; i < np; i++) if (fork() == 0) {
    close(L);
    if (getenv("RT_WATCH") && fork() != 0) { int st; wait(&st); if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("client %d: DIED status %x\n", i, st); _exit(0); }
    int ok = 0, bad = 0; char why[200] = "";
    for (int j = 0; j < each; j++) {
      int c = mkconnect(port, 0);
      struct timeval tv = { 8, 0 }; setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      int seed = i * 50 + j + 1;
      wr_pat(c, seed, 3000); shutdown(c, SHUT_WR);
      char m[160]; long g = rd_pat(c, seed, 3000, m, sizeof m);
      const char *e = rd_eof(c);
      if (g == 3000 && !strstr(m, "BAD") && !strcmp(e, "eof")) ok++; else { bad++; if (!why[0]) snprintf(why, sizeof why, "conn %d: %s; then %s", j, m, e); }
      close(c);
    }
    printf("client %d: %d ok, %d bad %s\n", i, ok, bad, why);
    _exit(0);
  }
  pthread_t t; pthread_create(&t, 0, acc, 0);
  int target = argc > 4 ? atoi(argv[4]) : np * each / 3;
  while (served < target) {
    if (served >= atomic_load(&accepted)) { sched_yield(); continue; }
    int s = q[served++];
    unsigned char b[8192]; long tot = 0, k;
    while ((k = read(s, b, sizeof b)) > 0) { long off = 0; while (off < k) { long w = write(s, b + off, k - off); if (w <= 0) break; off += w; } tot += k; }
    close(s);
  }
  char *av[] = { "/tmp/rt30b/echoimg_static", 0 };
  execv(av[0], av);
  perror("execv"); return 1;
}
#endif
