// epoll edge cases on one connection, client side; the server is a forked child that
// accepts and then writes MSGS messages, one every 50 ms (it waits for "go" first in some modes).
// usage: epollx MODE
//  excl    : nonblocking connect, EPOLLIN|EPOLLEXCLUSIVE added mid-handshake, then wait for each message
//  oneshot : nonblocking connect, EPOLLOUT|EPOLLONESHOT mid-handshake; exactly one EPOLLOUT; MOD to
//            EPOLLIN|EPOLLONESHOT, one EPOLLIN per re-arm, all messages read
//  et      : nonblocking connect, EPOLLIN|EPOLLOUT|EPOLLET mid-handshake, read every message
//  forkep  : connected, EPOLLIN registered, fork: the child waits on the parent's epoll set and reads
//  dupclose: EPOLLIN registered, d = dup(fd), close(fd): the kernel keeps the registration (same file)
//  dupclose_est: the same once the connection is established (blocking connect)
//  dupclose_hs: as dupclose, then read every message through the dup (the handshake must survive)
//  dupclose_noep: nonblocking connect, d = dup(fd), close(fd) at once, read every message via d (no epoll)
//  dupreuse: A = nonblocking connect, d = dup(A), close(A), B = new connection on A's old number;
//            both streams must arrive exactly
//  dupboth : nonblocking connect, d = dup(fd) at once; read the first message via fd, the rest via d
//  scm     : a socket mid-handshake passed with SCM_RIGHTS to a child and closed in the parent;
//            the child reads every message
//  shutwr  : shutdown(SHUT_WR) right after a non-blocking connect; every message, then EOF
//  closethr: close from another thread during epoll_wait; a new connection on the number
//  lazy    : nonblocking connect, then the fd is left alone for 3 s (longer than the CLC timeout)
//  dup2over: two connections A, B in one set (data A, data B), dup2(B, A): A's old file closed
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
#include <time.h>
#include <unistd.h>
#define MSGS 5
static struct sockaddr_in a;
static int l;
static void server(int waitgo) {
  int s = accept(l, 0, 0);
  if (s < 0) _exit(2);
  char b[8];
  if (waitgo && read(s, b, 2) != 2) _exit(3);
  for (int i = 0; i < MSGS; i++) {
    usleep(50000);
    char m[16]; snprintf(m, sizeof m, "msg%d;", i);
    if (write(s, m, strlen(m)) < 0) _exit(4);
  }
  // wait for the client to close
  while (read(s, b, sizeof b) > 0) {}
  _exit(0);
}
static int conn(int nb) {
  int c = socket(AF_INET, SOCK_STREAM | (nb ? SOCK_NONBLOCK : 0), 0);
  int r = connect(c, (void *)&a, sizeof a);
  if (r && errno != EINPROGRESS) { perror("connect"); exit(2); }
  return c;
}
static int got;
static int drain(int c) { // reads what is there; returns bytes
  char b[256]; int n = 0;
  for (;;) {
    ssize_t r = read(c, b, sizeof b - 1);
    if (r > 0) { b[r] = 0; n += r; for (char *p = b; (p = strchr(p, ';')); p++) got++; continue; }
    if (r == 0) return n ? n : -1;
    if (errno == EAGAIN) return n;
    perror("read"); exit(5);
  }
}
#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "excl";
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IONBF, 0);
  l = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(l, (void *)&a, sizeof a); listen(l, 8);
  socklen_t al = sizeof a; getsockname(l, (void *)&a, &al);
  int nserv = !strcmp(mode, "dup2over") || !strcmp(mode, "dupreuse") || !strcmp(mode, "closethr") ? 2 : 1;
  pid_t sp[2];
  for (int i = 0; i < nserv; i++) if ((sp[i] = fork()) == 0) server(0);
  int ep = epoll_create1(0);
  struct epoll_event ev, out[8];
  if (!strcmp(mode, "excl") || !strcmp(mode, "et")) {
    int c = conn(1);
    ev.events = !strcmp(mode, "excl") ? (EPOLLIN | EPOLLEXCLUSIVE) : (EPOLLIN | EPOLLOUT | EPOLLET);
    ev.data.u64 = 0x1234;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev)) FAIL("ctl %s", strerror(errno));
    int spurious = 0;
    while (got < MSGS) {
      int n = epoll_wait(ep, out, 8, 3000);
      if (n == 0) FAIL("%s: no event for 3 s with %d of %d messages read", mode, got, MSGS);
      for (int i = 0; i < n; i++) {
        if (out[i].data.u64 != 0x1234) FAIL("foreign data %llx", (unsigned long long)out[i].data.u64);
        if (out[i].events & EPOLLIN) { if (drain(c) == 0) spurious++; }
      }
    }
    printf("%s: %d messages, %d spurious EPOLLIN\n", mode, got, spurious);
  } else if (!strcmp(mode, "oneshot")) {
    int c = conn(1);
    ev.events = EPOLLOUT | EPOLLONESHOT; ev.data.u64 = 7;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    int n = epoll_wait(ep, out, 8, 3000);
    if (n != 1 || !(out[0].events & EPOLLOUT)) FAIL("oneshot: connect completion n=%d ev=%x", n, n > 0 ? out[0].events : 0);
    n = epoll_wait(ep, out, 8, 300);
    if (n != 0) FAIL("oneshot: a second event (%x) without re-arm", out[0].events);
    while (got < MSGS) {
      ev.events = EPOLLIN | EPOLLONESHOT; epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev);
      n = epoll_wait(ep, out, 8, 3000);
      if (n != 1) FAIL("oneshot: n=%d with %d of %d read", n, got, MSGS);
      drain(c);
      n = epoll_wait(ep, out, 8, 0);
      if (n != 0) FAIL("oneshot: event %x while disabled", out[0].events);
    }
    printf("oneshot: %d messages\n", got);
  } else if (!strcmp(mode, "forkep")) {
    int c = conn(0);
    ev.events = EPOLLIN; ev.data.u64 = 9;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    pid_t ch = fork();
    if (ch == 0) {
      while (got < MSGS) {
        int n = epoll_wait(ep, out, 8, 3000);
        if (n <= 0) FAIL("forkep child: n=%d with %d of %d read", n, got, MSGS);
        if (out[0].data.u64 != 9) FAIL("forkep child: foreign data %llx", (unsigned long long)out[0].data.u64);
        int fl = fcntl(c, F_GETFL); fcntl(c, F_SETFL, fl | O_NONBLOCK);
        drain(c);
      }
      printf("forkep child: %d messages\n", got);
      _exit(0);
    }
    int st; waitpid(ch, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) FAIL("forkep: child status %x", st);
  } else if (!strcmp(mode, "dupclose") || !strcmp(mode, "dupclose_est") || !strcmp(mode, "dupclose_hs")) {
    int c = conn(strcmp(mode, "dupclose_est") != 0);
    if (!strcmp(mode, "dupclose_est")) fcntl(c, F_SETFL, O_NONBLOCK);
    usleep(20000);
    ev.events = EPOLLIN; ev.data.u64 = 11;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    int d = dup(c); close(c);
    int n = epoll_wait(ep, out, 8, 3000);
    int errno0 = errno;
    printf("%s: epoll_wait after close of a dup'd fd: n=%d data=%llu\n", mode, n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ULL);
    (void)errno0;
    if (n != 1 && strcmp(mode, "dupclose_hs")) FAIL("%s: the registration of the open file was dropped at the close of one of its fds", mode);
    while (got < MSGS) {
      struct pollfd p = {d, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) FAIL("dupclose poll");
      if (drain(d) < 0) FAIL("dupclose: EOF after %d of %d messages (%s)", got, MSGS, strerror(errno));
    }
  } else if (!strcmp(mode, "dupclose_noep")) {
    int c = conn(1);
    int d = dup(c); close(c);
    while (got < MSGS) {
      struct pollfd p = {d, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) FAIL("dupclose_noep poll");
      if (drain(d) < 0) FAIL("dupclose_noep: EOF after %d of %d messages (%s)", got, MSGS, strerror(errno));
    }
    printf("dupclose_noep: %d messages\n", got);
  } else if (!strcmp(mode, "dupreuse")) {
    // A's handshake under way; A moved to another number with dup + close; a new
    // connection B takes A's old number. Both streams must arrive exactly as sent.
    int A = conn(1);
    int d = dup(A); close(A);
    int B = conn(0);
    printf("dupreuse: A was %d, now %d; B is %d\n", A, d, B);
    fcntl(B, F_SETFL, O_NONBLOCK); fcntl(d, F_SETFL, O_NONBLOCK);
    char sa[256] = "", sb[256] = ""; size_t la = 0, lb = 0;
    const char *want = "msg0;msg1;msg2;msg3;msg4;";
    for (int k = 0; k < 100 && (la < strlen(want) || lb < strlen(want)); k++) {
      struct pollfd p[2] = {{d, POLLIN, 0}, {B, POLLIN, 0}};
      if (poll(p, 2, 3000) <= 0) break;
      for (int i = 0; i < 2; i++) {
        if (!p[i].revents) continue;
        char *buf = i ? sb : sa; size_t *len = i ? &lb : &la;
        ssize_t r = read(p[i].fd, buf + *len, 255 - *len);
        if (r > 0) *len += r;
        else if (r == 0 || errno != EAGAIN) { p[i].fd = -1; if (r == 0) { printf("dupreuse: EOF on %s\n", i ? "B" : "A"); } else printf("dupreuse: %s on %s\n", strerror(errno), i ? "B" : "A"); k = 100; }
      }
    }
    int okA = la == strlen(want) && !memcmp(sa, want, la), okB = lb == strlen(want) && !memcmp(sb, want, lb);
    printf("dupreuse: A got %zu bytes (%s), B got %zu bytes (%s)\n", la, okA ? "exact" : "WRONG", lb, okB ? "exact" : "WRONG");
    if (!okA || !okB) FAIL("dupreuse: a stream differs from what its server sent");
  } else if (!strcmp(mode, "dupboth")) {
    // dup while the handshake is under way; both fds stay open; the first message is read
    // through the original, the rest through the dup.
    int c = conn(1);
    int d = dup(c);
    int use = c;
    while (got < MSGS) {
      struct pollfd p = {use, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) FAIL("dupboth: no data for 3 s on fd %d after %d of %d messages", use, got, MSGS);
      if (drain(use) < 0) FAIL("dupboth: EOF on fd %d after %d of %d messages", use, got, MSGS);
      use = d;
    }
    printf("dupboth: %d messages\n", got);
  } else if (!strcmp(mode, "scm")) {
    // A socket whose handshake is under way is passed with SCM_RIGHTS to a child process
    // (which runs the library too) and closed in the parent; the child reads every message.
    int sp2[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, sp2);
    pid_t ch = fork();
    if (ch == 0) {
      close(sp2[0]);
      char x; struct iovec io = {&x, 1};
      union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } u;
      struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
      if (recvmsg(sp2[1], &mh, 0) != 1) FAIL("scm: recvmsg");
      int c; memcpy(&c, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof c);
      char all[256] = ""; size_t len = 0;
      const char *want = "msg0;msg1;msg2;msg3;msg4;";
      while (len < strlen(want)) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 3000) != 1) FAIL("scm child: no data for 3 s after %zu bytes", len);
        ssize_t r = read(c, all + len, 255 - len);
        if (r == 0) FAIL("scm child: EOF after %zu bytes", len);
        if (r < 0) { if (errno == EAGAIN) continue; FAIL("scm child: %s after %zu bytes", strerror(errno), len); }
        len += r;
      }
      if (memcmp(all, want, len)) FAIL("scm child: stream differs: %.*s", (int)len, all);
      printf("scm child: %zu bytes exact\n", len);
      _exit(0);
    }
    close(sp2[1]);
    int c = conn(1);
    char x = 'x'; struct iovec io = {&x, 1};
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &c, sizeof c);
    if (sendmsg(sp2[0], &mh, 0) != 1) FAIL("scm: sendmsg");
    close(c);
    int st; waitpid(ch, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) FAIL("scm: child status %x", st);
  } else if (!strcmp(mode, "shutwr")) {
    // shutdown(SHUT_WR) right after a non-blocking connect (handshake under way): the server
    // must see EOF and still be able to send everything; then EOF at the client.
    int c = conn(1);
    if (shutdown(c, SHUT_WR)) printf("shutwr: shutdown: %s\n", strerror(errno));
    int eof = 0;
    while (!eof) {
      struct pollfd p = {c, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) FAIL("shutwr: no data/EOF for 3 s after %d of %d messages", got, MSGS);
      if (drain(c) < 0) eof = 1;
    }
    printf("shutwr: %d messages then EOF\n", got);
    if (got != MSGS) FAIL("shutwr: %d of %d messages", got, MSGS);
  } else if (!strcmp(mode, "closethr")) {
    // close() from another thread while epoll_wait sleeps on the fd; then a new connection
    // takes the number and is registered: its data must be reported with its own data.
    int c = conn(0);
    ev.events = EPOLLIN; ev.data.u64 = 21; epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    pid_t t = fork();
    (void)t;
    if (t == 0) { _exit(0); }
    waitpid(t, 0, 0);
    struct { int fd; } arg = {c};
    pthread_t th;
    void *closer(void *a) { usleep(100000); close(((int *)a)[0]); return 0; }
    pthread_create(&th, 0, closer, &arg);
    int n = epoll_wait(ep, out, 8, 400);
    pthread_join(th, 0);
    printf("closethr: epoll_wait across the close: n=%d\n", n > 0 ? n : n);
    int c2 = conn(0);
    printf("closethr: new connection on %d (old %d)\n", c2, c);
    ev.events = EPOLLIN; ev.data.u64 = 22;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c2, &ev)) FAIL("closethr: ADD of the new fd: %s", strerror(errno));
    int seen = 0;
    while (got < MSGS) {
      n = epoll_wait(ep, out, 8, 3000);
      if (n <= 0) FAIL("closethr: no event for 3 s after %d of %d", got, MSGS);
      for (int i = 0; i < n; i++) { if (out[i].data.u64 != 22) FAIL("closethr: event with data %llu", (unsigned long long)out[i].data.u64); seen++; }
      fcntl(c2, F_SETFL, O_NONBLOCK);
      drain(c2);
    }
    printf("closethr: %d messages\n", got);
  } else if (!strcmp(mode, "lazy")) {
    int c = conn(1);
    sleep(3); // busy elsewhere: the fd is not touched for longer than the CLC timeout
    while (got < MSGS) {
      struct pollfd p = {c, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) FAIL("lazy poll");
      if (drain(c) < 0) FAIL("lazy: EOF after %d of %d messages (%s)", got, MSGS, strerror(errno));
    }
    printf("lazy: %d messages\n", got);
  } else if (!strcmp(mode, "dup2over")) {
    int A = conn(1), B = conn(1);
    ev.events = EPOLLIN; ev.data.u64 = 1; epoll_ctl(ep, EPOLL_CTL_ADD, A, &ev);
    ev.data.u64 = 2; epoll_ctl(ep, EPOLL_CTL_ADD, B, &ev);
    struct pollfd p = {A, POLLIN, 0}; poll(&p, 1, 3000);
    drain(A); 
    dup2(B, A);
    // B's data must be reported with data 2 only, never with A's data 1
    int seen1 = 0, seen2 = 0;
    for (int k = 0; k < 10; k++) {
      int n = epoll_wait(ep, out, 8, 300);
      for (int i = 0; i < n; i++) { if (out[i].data.u64 == 1) seen1++; else if (out[i].data.u64 == 2) seen2++; else FAIL("foreign data"); }
      drain(B);
    }
    printf("dup2over: events with A's data %d, with B's data %d\n", seen1, seen2);
    if (seen1) FAIL("dup2over: A's registration reported after A's file was closed");
    if (!seen2) FAIL("dup2over: B never reported");
  }
  printf("OK %s\n", mode);
  return 0;
}
