/* rt30b_thr.c: threads with a descriptor table of their own (unshare(CLONE_FILES))
   accepting on / connecting to the process's listener. usage: rt30b_thr SCENARIO PORT */
#include "rt30b_common.h"
static int L, L2, port, go[2], done[2];
static const char *sc;
static void tok(int *p) { char c = 1; if (write(p[1], &c, 1) != 1) perror("tok"); }
static void wtok(int *p) { char c; if (read(p[0], &c, 1) != 1) perror("wtok"); }
static void *t_main(void *arg) {
  (void)arg;
  if (unshare(CLONE_FILES)) { perror("unshare"); exit(4); }
  tok(go);
  if (!strcmp(sc, "acc") || !strcmp(sc, "acc2") || !strcmp(sc, "collide") || !strcmp(sc, "acc_then_main_conn") || !strcmp(sc, "accnb")) {
    if (!strcmp(sc, "collide")) wtok(done);
    int s;
    if (!strcmp(sc, "accnb")) {
      struct pollfd p = { L, POLLIN, 0 };
      do { poll(&p, 1, -1); s = accept4(L, 0, 0, SOCK_NONBLOCK); } while (s < 0 && errno == EAGAIN);
    } else s = accept(L, 0, 0);
    fprintf(stderr, "T accepted fd %d\n", s);
    if (!strcmp(sc, "acc_then_main_conn")) { tok(go); wtok(done); }
    serve(s, "T", -1, 0, MB);
  } else if (!strcmp(sc, "tconn")) {
    int c = mkconnect(port, 0);
    client(c, "T", 3, 4, MB);
  } else if (!strcmp(sc, "tboth")) {
    int c = mkconnect(port, 0);
    int s = accept(L, 0, 0);
    fprintf(stderr, "T c=%d s=%d\n", c, s);
    /* small exchange both ways in one thread */
    char m[160];
    long w = wr_pat(c, 5, 60000); rd_pat(s, 5, 60000, m, sizeof m); printf("T s rx %s (c tx %ld)\n", m, w);
    w = wr_pat(s, 6, 60000); rd_pat(c, 6, 60000, m, sizeof m); printf("T c rx %s (s tx %ld)\n", m, w);
    close(c); printf("T s then %s\n", rd_eof(s)); close(s);
  }
  return 0;
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); signal(SIGPIPE, SIG_IGN);
  sc = argv[1]; port = atoi(argv[2]);
  L = mklisten(port, !strcmp(sc, "accnb"));
  L2 = mklisten(port + 1, 0);
  if (pipe(go) || pipe(done)) return 5;
  /* client processes, forked before any thread */
  int nclients = !strcmp(sc, "acc2") ? 2 : (!strcmp(sc, "tconn") || !strcmp(sc, "tboth")) ? 0 : 1;
  for (int i = 0; i < nclients; i++) {
    if (fork() == 0) {
      close(L); close(L2);
      int c = mkconnect(port, 0);
      char tag[16]; snprintf(tag, sizeof tag, "C%d", i);
      client(c, tag, 10 + i, 11 + i, MB);
      _exit(0);
    }
  }
  int peer2 = !strcmp(sc, "collide") || !strcmp(sc, "acc_then_main_conn");
  if (peer2 && fork() == 0) { /* serves main's outgoing connection */
    close(L);
    int s = accept(L2, 0, 0);
    serve(s, "P", 7, 8, MB);
    _exit(0);
  }
  close(L2);
  pthread_t t; pthread_create(&t, 0, t_main, 0);
  wtok(go);
  if (!strcmp(sc, "acc2") || !strcmp(sc, "tconn")) {
    int s = accept(L, 0, 0);
    fprintf(stderr, "main accepted fd %d\n", s);
    if (!strcmp(sc, "tconn")) serve(s, "M", 3, 4, MB); else serve(s, "M", -1, 0, MB);
  } else if (!strcmp(sc, "collide")) {
    int c = mkconnect(port + 1, 0);
    fprintf(stderr, "main connected fd %d\n", c);
    tok(done);
    client(c, "M", 7, 8, MB);
  } else if (!strcmp(sc, "acc_then_main_conn")) {
    wtok(go);
    int c = mkconnect(port + 1, 0);
    fprintf(stderr, "main connected fd %d\n", c);
    tok(done);
    client(c, "M", 7, 8, MB);
  }
  pthread_join(t, 0);
  int st; while (wait(&st) > 0) if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("child status %x\n", st);
  printf("end\n");
  return 0;
}
