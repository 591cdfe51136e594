/* rt30b_spawn.c: an undecided handshake handed to an image without the library at a spawn.
   usage: rt30b_spawn client|server spawn|vfork|clonevm|fork close|keep dyn|static PORT
   client: non-blocking connect (EINPROGRESS) to a server of ours (forked, library), then at
           once spawn the image with the socket as fd 0/1 (role c).
   server: non-blocking listener, accept4(SOCK_NONBLOCK) while the client (forked, library)
           holds still after its non-blocking connect, then spawn the image on it (role s).
   keep: the parent keeps its copy, and after the image exits exchanges 10000 more bytes. */
#include "rt30b_common.h"
extern char **environ;
static const char *method, *keep, *img; static int port;
static char *cargv[8]; static char **cenv; static int cfd;
static int child_fn(void *a) {
  (void)a;
  if (dup2(cfd, 0) < 0 || dup2(cfd, 1) < 0) _exit(90);
  execve(cargv[0], cargv, cenv);
  _exit(91);
}
static pid_t launch(int fd, const char *role) {
  static char tag[64]; snprintf(tag, sizeof tag, "%s-%s-%s", method, keep, img);
  int n = 0;
  if (!strcmp(img, "dyn")) { cargv[n++] = "/usr/bin/env"; cargv[n++] = "-u"; cargv[n++] = "LD_PRELOAD"; cargv[n++] = "/tmp/rt30b/img"; }
  else if (!strcmp(img, "lib")) cargv[n++] = "/tmp/rt30b/img";
  else cargv[n++] = "/tmp/rt30b/img_static";
  cargv[n++] = (char *)role; cargv[n++] = tag; cargv[n] = 0;
  cenv = environ; cfd = fd;
  pid_t pid = -1;
  if (!strcmp(method, "spawn")) {
    posix_spawn_file_actions_t fa; posix_spawn_file_actions_init(&fa);
    if (getenv("RT_FD")) { if (atoi(getenv("RT_FD")) != fd) posix_spawn_file_actions_adddup2(&fa, fd, atoi(getenv("RT_FD"))); }
    else { posix_spawn_file_actions_adddup2(&fa, fd, 0); posix_spawn_file_actions_adddup2(&fa, fd, 1); }
    int e = posix_spawn(&pid, cargv[0], &fa, 0, cargv, environ);
    if (e) { fprintf(stderr, "posix_spawn %s\n", strerror(e)); exit(6); }
  } else if (!strcmp(method, "vfork")) {
    pid = vfork();
    if (pid == 0) child_fn(0);
  } else if (!strcmp(method, "clonevm")) {
    static char stack[1 << 16];
    pid = clone(child_fn, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, 0);
  } else {
    pid = fork();
    if (pid == 0) child_fn(0);
  }
  if (pid < 0) { perror("launch"); exit(7); }
  return pid;
}
static void after(int fd, pid_t pid, int seed_out, int seed_in) {
  int st;
  if (!strcmp(keep, "close")) { close(fd); waitpid(pid, &st, 0); }
  else {
    waitpid(pid, &st, 0);
    /* parent uses its copy now */
    int fl = fcntl(fd, F_GETFL); fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    char m[160];
    long w = wr_pat(fd, seed_out, 10000);
    shutdown(fd, SHUT_WR);
    rd_pat(fd, seed_in, 10000, m, sizeof m);
    printf("parent after image: tx %ld; rx %s; then %s\n", w, m, rd_eof(fd));
    close(fd);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("image status %x\n", st);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); signal(SIGPIPE, SIG_IGN);
  const char *side = argv[1]; method = argv[2]; keep = argv[3]; img = argv[4]; port = atoi(argv[5]);
  int k = !strcmp(keep, "keep");
  if (!strcmp(side, "client")) {
    int L = mklisten(port, 0);
    pid_t sp = fork();
    if (sp == 0) { /* the server, with the library */
      int s = accept(L, 0, 0); close(L);
      char m[160];
      rd_pat(s, 20, 100000, m, sizeof m);
      long w = wr_pat(s, 21, 100000);
      char m2[160] = "none";
      if (k) { rd_pat(s, 22, 10000, m2, sizeof m2); wr_pat(s, 23, 10000); shutdown(s, SHUT_WR); }
      printf("server: rx %s; tx %ld; extra %s; then %s\n", m, w, m2, rd_eof(s));
      close(s); _exit(0);
    }
    close(L);
    int c = mkconnect(port, 1);
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = launch(c, "c");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "launch took %.3f s%s\n", dt, dt > 0.2 ? " SLOW" : "");
    after(c, pid, 22, 23);
    int st; waitpid(sp, &st, 0);
  } else {
    int L = mklisten(port, 1);
    int tk[2]; if (pipe(tk)) return 5;
    pid_t cp = fork();
    if (cp == 0) { /* the client, with the library: connect, hold still until told */
      close(L); close(tk[1]);
      int c = mkconnect(port, 1);
      char t;
      if (getenv("RT_SLOW")) usleep(atoi(getenv("RT_SLOW")) * 1000); /* a slow client: no token */
      else if (read(tk[0], &t, 1) != 1) _exit(8);
      struct pollfd p = { c, POLLOUT, 0 }; poll(&p, 1, 10000);
      int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl & ~O_NONBLOCK);
      char m[160];
      long w = wr_pat(c, 20, 100000);
      rd_pat(c, 21, 100000, m, sizeof m);
      char m2[160] = "none";
      if (k) { wr_pat(c, 22, 10000); rd_pat(c, 23, 10000, m2, sizeof m2); }
      shutdown(c, SHUT_WR);
      printf("client: tx %ld; rx %s; extra %s; then %s\n", w, m, m2, rd_eof(c));
      close(c); _exit(0);
    }
    close(tk[0]);
    struct pollfd p = { L, POLLIN, 0 }; poll(&p, 1, 10000);
    int s = accept4(L, 0, 0, SOCK_NONBLOCK);
    if (s < 0) { perror("accept4"); return 9; }
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = launch(s, "s");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "launch took %.3f s%s\n", dt, dt > 0.2 ? " SLOW" : "");
    if (write(tk[1], "g", 1) != 1) return 10;
    after(s, pid, 23, 22);
    int st; waitpid(cp, &st, 0);
  }
  printf("end\n");
  return 0;
}
