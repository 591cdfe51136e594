/* rt30a_static.c: static echo server for rt30a_group.py (kind execstatic):
 * rt30a_static TAG READYFD FD[,FD...]: serves the inherited listeners; each connection: read to
 * '\n', answer "TAG:" + what it read, close. Built with gcc -static (no PT_INTERP: the library
 * cannot load into it). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *tag = argv[1];
    int rfd = atoi(argv[2]);
    struct pollfd p[16]; int n = 0;
    for (char *s = strtok(argv[3], ","); s && n < 16; s = strtok(NULL, ","))
        p[n].fd = atoi(s), p[n].events = POLLIN, n++;
    write(rfd, "r", 1); close(rfd);
    for (;;) {
        if (poll(p, n, -1) < 0) continue;
        for (int i = 0; i < n; i++) {
            if (!(p[i].revents & POLLIN)) continue;
            int c = accept(p[i].fd, NULL, NULL);
            if (c < 0) continue;
            struct timeval tv = {8, 0};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            char b[8192]; size_t len = 0;
            while (len < sizeof b) {
                ssize_t r = read(c, b + len, sizeof b - len);
                if (r <= 0) break;
                len += r;
                if (b[len - 1] == '\n') break;
            }
            char o[8300]; int k = snprintf(o, sizeof o, "%s:", tag);
            memcpy(o + k, b, len);
            write(c, o, k + len);
            close(c);
        }
    }
}
