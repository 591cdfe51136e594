// Round 13: pthread_cancel of a thread blocked in recv()/send() (both cancellation points) on
// an SMC connection, then the main thread uses and closes the connection: does the peer see
// the bytes and the EOF as over TCP? N rounds on fresh connections.
// gcc -O2 -o rt13_cancel rt13_cancel.c -lpthread
// usage: rt13_cancel PORT recv|send|poll N
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
static int cfd, sfd, mode;
static char big[1 << 22];
static void *th(void *a) {
  (void)a;
  char b[100];
  if (mode == 0) recv(cfd, b, sizeof b, 0);
  else if (mode == 1) for (;;) send(cfd, big, sizeof big, MSG_NOSIGNAL);
  else { struct pollfd p = {cfd, POLLIN, 0}; poll(&p, 1, -1); }
  return 0;
}
int main(int argc, char **argv) {
  int port = atoi(argv[1]);
  mode = !strcmp(argv[2], "recv") ? 0 : !strcmp(argv[2], "send") ? 1 : 2;
  int n = atoi(argv[3]);
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) { perror("listen"); return 2; }
  int ok_data = 0, ok_eof = 0;
  for (int i = 0; i < n; i++) {
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cfd, (void *)&a, sizeof a)) { perror("connect"); return 2; }
    sfd = accept(l, 0, 0);
    pthread_t t;
    pthread_create(&t, 0, th, 0);
    usleep(20000);
    pthread_cancel(t);
    pthread_join(t, 0);
    if (mode == 1) {  // drain what the cancelled sender left
      struct timeval tv = {0, 200000};
      setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      static char d[1 << 16];
      while (recv(sfd, d, sizeof d, 0) > 0) {}
    }
    // the main thread now talks on the same connection, then closes it
    char m[16] = "after-cancel", b[16] = {0};
    struct timeval tv = {2, 0};
    setsockopt(cfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (send(sfd, m, 12, 0) == 12 && recv(cfd, b, 12, MSG_WAITALL) == 12 && !memcmp(b, m, 12)) ok_data++;
    close(cfd);
    ssize_t r = recv(sfd, b, sizeof b, 0);
    if (r == 0) ok_eof++;
    else if (i < 3) printf("round %d: peer after close: r=%zd %s\n", i, r, r < 0 ? strerror(errno) : "");
    close(sfd);
  }
  printf("%s: %d rounds: data after the cancel %d, peer EOF after close %d\n", argv[2], n, ok_data, ok_eof);
  return 0;
}
