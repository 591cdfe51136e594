// Red team round 30: an accept loop hands each connection to `cat` (an image without the
// library) at once, before the connection's handshake is decided: `accept4(SOCK_NONBLOCK |
// SOCK_CLOEXEC)` (an event loop's accept) and then `vfork` + `dup2` + `execve` (CPython's
// `subprocess`, inetd), the same through `clone(CLONE_VM | CLONE_VFORK)`, or `posix_spawn` with
// `adddup2` file actions. A forked client sends one
// line, shuts down its writing side and must read exactly that line back. The image is
// `tee -a LOG` (a `cat` that keeps what it read): it must have read exactly the lines.
// `rt30_vfork_undecided PORT vfork|clonevm|spawn ROUNDS LOG`; prints "MODE: K of N echoed", what the
// images read and, for each failure, what the client read.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

// The environment without LD_PRELOAD: `cat` runs without the library.
static char **plain_env(void) {
    static char *e[256];
    int n = 0;
    for (char **p = environ; *p && n < 255; p++)
        if (strncmp(*p, "LD_PRELOAD=", 11)) e[n++] = *p;
    e[n] = 0;
    return e;
}

static int child_fd;
static char **child_argv;

// The child of `vfork` or `clone(CLONE_VM | CLONE_VFORK)`: `tee` on the connection.
static int child(void *unused) {
    (void)unused;
    // `tee` reads blocking (the raw call: nothing of the parent's to touch here).
    syscall(SYS_fcntl, child_fd, F_SETFL, 0);
    dup2(child_fd, 0);
    dup2(child_fd, 1);
    execve("/usr/bin/tee", child_argv, plain_env());
    _exit(127);
}

static int client(struct sockaddr_in *a, int r) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)a, sizeof *a)) return perror("connect"), 3;
    char msg[64], buf[512];
    int n = snprintf(msg, sizeof msg, "hello %d\n", r), got = 0, k = 0;
    if (write(c, msg, n) != n) return perror("write"), 4;
    shutdown(c, SHUT_WR);
    struct pollfd p = {c, POLLIN, 0};
    while (poll(&p, 1, 5000) > 0 && (k = read(c, buf + got, sizeof buf - got)) > 0) got += k;
    if (got == n && !memcmp(buf, msg, n)) return 0;
    printf("round %d: the client read %d bytes (last read %d, errno %d):", r, got, k, errno);
    for (int i = 0; i < got && i < 16; i++) printf(" %02x", (unsigned char)buf[i]);
    printf("\n");
    fflush(stdout);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) return fprintf(stderr, "usage: %s PORT vfork|clonevm|spawn ROUNDS LOG\n", argv[0]), 2;
    int port = atoi(argv[1]), rounds = atoi(argv[3]), ok = 0, one = 1;
    const char *mode = argv[2];
    signal(SIGPIPE, SIG_IGN);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) return perror("bind/listen"), 2;
    for (int r = 0; r < rounds; r++) {
        pid_t cpid = fork();
        if (cpid == 0) {
            close(l);
            _exit(client(&a, r));
        }
        struct pollfd p = {l, POLLIN, 0};
        poll(&p, 1, 5000);
        int s = accept4(l, 0, 0, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0) return perror("accept4"), 2;
        char *cargv[] = {"tee", "-a", argv[4], 0};
        pid_t h;
        child_fd = s;
        child_argv = cargv;
        if (!strcmp(mode, "vfork")) {
            h = vfork();
            if (h == 0) child(0);
        } else if (!strcmp(mode, "clonevm")) {
            static char stack[1 << 16];
            h = clone(child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, 0);
        } else {
            syscall(SYS_fcntl, s, F_SETFL, 0);
            posix_spawn_file_actions_t fa;
            posix_spawn_file_actions_init(&fa);
            posix_spawn_file_actions_adddup2(&fa, s, 0);
            posix_spawn_file_actions_adddup2(&fa, s, 1);
            if (posix_spawn(&h, "/usr/bin/tee", &fa, 0, cargv, plain_env())) return perror("spawn"), 2;
            posix_spawn_file_actions_destroy(&fa);
        }
        close(s);
        int st;
        waitpid(cpid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
        // `tee` ends at the client's EOF (or when its reset ends the read).
        waitpid(h, 0, 0);
    }
    printf("%s: %d of %d echoed\n", mode, ok, rounds);
    char want[64 * 1024], got[64 * 1024];
    int wn = 0, gn = 0, k;
    for (int r = 0; r < rounds && wn < (int)sizeof want - 64; r++)
        wn += snprintf(want + wn, sizeof want - wn, "hello %d\n", r);
    int f = open(argv[4], O_RDONLY);
    while (f >= 0 && gn < (int)sizeof got && (k = read(f, got + gn, sizeof got - gn)) > 0) gn += k;
    if (gn == wn && !memcmp(got, want, wn)) {
        printf("the images read exactly the lines\n");
    } else {
        int i = 0;
        while (i < gn && i < wn && got[i] == want[i]) i++;
        printf("the images read %d bytes, not %d; from byte %d:", gn, wn, i);
        for (int j = i; j < gn && j < i + 16; j++) printf(" %02x", (unsigned char)got[j]);
        printf("\n");
    }
    return ok == rounds && gn == wn ? 0 : 1;
}
