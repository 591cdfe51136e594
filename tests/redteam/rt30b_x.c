/* rt30b_x.c: fork / SCM_RIGHTS across a thread with its own descriptor table.
   usage: rt30b_x fork_own|scm_own|scm_own_nb PORT */
#include "rt30b_common.h"
static int port, sp[2], go[2], conn = -1;
static const char *sc;
static void *t_main(void *a) {
  (void)a;
  if (unshare(CLONE_FILES)) { perror("unshare"); exit(4); }
  char c = 1;
  if (!strncmp(sc, "fork_own", 8)) {
    /* conn (the main thread's client connection) is in this table too: close it here and put a pipe there */
    int p[2];
    if (!strcmp(sc, "fork_own_w")) { if (pipe(p) || dup2(p[1], conn) != conn) exit(5); close(p[1]); p[1] = conn; }
    else { close(conn); if (pipe(p)) exit(5); }
    fprintf(stderr, "T pipe %d %d (conn was %d)\n", p[0], p[1], conn);
    if (p[1] != conn && p[0] != conn) { fprintf(stderr, "numbers differ\n"); }
    int wfd = p[0] == conn ? p[0] : p[1];
    pid_t pid = fork();
    if (pid == 0) {
      /* writes "PIPEDATA" to whichever pipe end sits at conn's number (if it is the read end it fails EBADF as TCP would on pipe) */
      long r = write(wfd, "PIPEDATA", 8);
      fprintf(stderr, "child write(%d) -> %ld %s\n", wfd, r, r < 0 ? strerror(errno) : "");
      _exit(0);
    }
    int st; waitpid(pid, &st, 0);
    close(p[1]);
    char b[64]; long n = read(p[0], b, 8);
    printf("T pipe read %ld%s\n", n, n == 8 && !memcmp(b, "PIPEDATA", 8) ? " PIPEDATA" : "");
    if (write(go[1], &c, 1) != 1) exit(5);
  } else {
    if (write(go[1], &c, 1) != 1) exit(5);
    char d; struct iovec io = { &d, 1 };
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } u;
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
    if (recvmsg(sp[1], &m, 0) != 1) { perror("recvmsg"); exit(6); }
    int fd; memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    fprintf(stderr, "T received fd %d\n", fd);
    if (!strcmp(sc, "scm_own_nb")) { int fl = fcntl(fd, F_GETFL); fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); }
    serve(fd, "T", 1, 2, MB);
  }
  return 0;
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); signal(SIGPIPE, SIG_IGN);
  sc = argv[1]; port = atoi(argv[2]);
  int L = mklisten(port, 0);
  if (pipe(go) || socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) return 5;
  if (fork() == 0) {
    if (!strncmp(sc, "fork_own", 8)) { /* server for main's connection */
      int s = accept(L, 0, 0); close(L);
      serve(s, "P", 7, 8, 100000); _exit(0);
    }
    close(L);
    int c = mkconnect(port, 0);
    client(c, "C", 1, 2, MB); _exit(0);
  }
  if (!strncmp(sc, "fork_own", 8)) { close(L); conn = mkconnect(port, 0); char x = 0; if (write(conn, "", 0)) {} (void)x; }
  pthread_t t;
  if (!strncmp(sc, "fork_own", 8)) {
    /* make the connection SMC (decided) before the thread unshares */
    struct pollfd p = { conn, POLLOUT, 0 }; poll(&p, 1, 2000);
    pthread_create(&t, 0, t_main, 0);
    char c; if (read(go[0], &c, 1) != 1) return 6;
    client(conn, "M", 7, 8, 100000);
  } else {
    pthread_create(&t, 0, t_main, 0);
    char c; if (read(go[0], &c, 1) != 1) return 6;
    int s = !strcmp(sc, "scm_own_nb") ? ({ struct pollfd p = { L, POLLIN, 0 }; poll(&p, 1, -1); accept4(L, 0, 0, SOCK_NONBLOCK); }) : accept(L, 0, 0);
    char d = 'x'; struct iovec io = { &d, 1 };
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } u;
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
    struct cmsghdr *h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &s, sizeof s);
    if (sendmsg(sp[0], &m, 0) != 1) { perror("sendmsg"); return 7; }
    close(s);
  }
  pthread_join(t, 0);
  int st; while (wait(&st) > 0) if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("child status %x\n", st);
  printf("end\n");
  return 0;
}
