// rt8_spawn: an SMC connection handed to a program WITHOUT the library as its stdin/stdout by
// posix_spawn file actions (the socket close-on-exec), system(), popen(); the program is `wc -c`:
// the server sends N bytes and shuts its writing; it reads the count back.
// gcc -O2 -o /tmp/rt8/rt8_spawn rt8_spawn.c ; world.sh smc|tcp /tmp/rt8/rt8_spawn MODE [N]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern char **environ;
#define P(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

int main(int argc, char **argv) {
  const char *m = argv[1];
  long N = argc > 2 ? atol(argv[2]) : 100000;
  double T0 = now();
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, port;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  bind(l, (void *)&a, sizeof a); listen(l, 4);
  socklen_t al = sizeof a; getsockname(l, (void *)&a, &al); port = ntohs(a.sin_port);
  pid_t sp = fork();
  if (sp == 0) {
    int c = accept(l, 0, 0);
    send(c, "!", 1, 0);
    usleep(300000);
    char b[8192]; memset(b, 'x', sizeof b);
    long s = 0;
    while (s < N) { long r = send(c, b, N - s < (long)sizeof b ? N - s : (long)sizeof b, MSG_NOSIGNAL); if (r <= 0) { P("SERVER send: %s after %ld", strerror(errno), s); break; } s += r; }
    shutdown(c, SHUT_WR);
    struct pollfd p = {c, POLLIN, 0};
    static char rep[1 << 20]; long n = 0, nonx = 0;
    while (poll(&p, 1, 8000) > 0) { int r = recv(c, rep + n, sizeof rep - 1 - n, 0); if (r <= 0) { if (r < 0) P("SERVER recv: %s", strerror(errno)); break; } n += r; }
    rep[n] = 0;
    for (long i = 0; i < n; i++) if (rep[i] != 'x' && rep[i] != 'y') nonx++;
    if (n > 64) { P("SERVER got %ld bytes back, %ld not x/y", n, nonx); n = 0; rep[0] = 0; }
    P("SERVER reply (%ld bytes) '%s' at %.1fs", n, strtok(rep, "\n") ? rep : "", now() - T0);
    _exit(0);
  }
  close(l);
  int c = socket(AF_INET, SOCK_STREAM | (strstr(m, "cloexec") ? SOCK_CLOEXEC : 0), 0);
  a.sin_port = htons(port);
  connect(c, (void *)&a, sizeof a);
  char x; recv(c, &x, 1, 0);  // established
  char *nolib[] = {"PATH=/usr/bin:/bin", NULL};
  char *wc[8] = {"wc", "-c", NULL};
  if (getenv("PROG")) { int i = 0; char *t = strtok(strdup(getenv("PROG")), " "); while (t && i < 7) { wc[i++] = t; t = strtok(NULL, " "); } wc[i] = NULL; }
  char wcpath[256]; snprintf(wcpath, sizeof wcpath, "/usr/bin/%s", wc[0]);
  pid_t k = -1;
  if (!strncmp(m, "spawn", 5)) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, c, 0);
    posix_spawn_file_actions_adddup2(&fa, c, 1);
    int r = posix_spawnp(&k, wc[0], &fa, NULL, wc, strstr(m, "nolib") ? nolib : environ);
    if (r) P("posix_spawn %s", strerror(r));
    close(c);
  } else if (!strcmp(m, "system_lib") || !strcmp(m, "system_nolib")) {
    if (c != 3) { dup2(c, 3); close(c); }
    int r = system(!strcmp(m, "system_lib") ? "wc -c <&3 >&3" : "env -u LD_PRELOAD wc -c <&3 >&3");
    P("system -> %d", r);
    close(3);
  } else if (!strcmp(m, "popen_nolib")) {
    if (c != 3) { dup2(c, 3); close(c); }
    FILE *f = popen("env -u LD_PRELOAD wc -c <&3 >&3", "r");
    if (getenv("DELAY_MS")) usleep(atoi(getenv("DELAY_MS")) * 1000);
    close(3);
    char b[64]; while (fgets(b, sizeof b, f)) P("popen out %s", b);
    P("pclose %d", pclose(f));
  } else if (!strcmp(m, "fork_closerange_cloexec")) {
    k = fork();
    if (k == 0) {
      dup2(c, 0); dup2(c, 1);
      close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
      execve(wcpath, wc, nolib);
      _exit(127);
    }
    close(c);
  } else if (!strcmp(m, "fork_dup3_cloexec")) {
    // the socket moved to 0/1, the original number made close-on-exec with dup3 onto itself
    k = fork();
    if (k == 0) {
      int d = dup3(c, 10, O_CLOEXEC);
      close(c);
      dup2(d, 0); dup2(d, 1);
      execve(wcpath, wc, nolib);
      _exit(127);
    }
    close(c);
  } else if (!strcmp(m, "vfork_nolib")) {
    k = vfork();
    if (k == 0) {
      dup2(c, 0); dup2(c, 1);
      execve(wcpath, wc, nolib);
      _exit(127);
    }
    close(c);
  }
  int st;
  if (k > 0) { waitpid(k, &st, 0); P("child status %d", WEXITSTATUS(st)); }
  waitpid(sp, &st, 0);
  P("END %.1fs", now() - T0);
  return 0;
}
