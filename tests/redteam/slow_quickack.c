/* Fault injection for lifecycle_smc's write-after-switch case: a thread that is slow right
 * after a write, as one preempted by the peer it just woke is. Loaded after the library
 * (LD_PRELOAD=lib:this), it delays by 30 ms a TCP_QUICKACK that the library sets on a socket
 * right after a sendmsg on it (the CI's `after` failure, 1 of 10 once, was such a delay).
 * Nothing else changes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

static __thread int sent_on = -1;

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real)
        real = (ssize_t(*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    if (!real)
        return -1;
    ssize_t r = real(fd, m, flags);
    sent_on = r > 0 ? fd : -1;
    return r;
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    static int (*real)(int, int, int, const void *, socklen_t);
    if (!real)
        real = (int (*)(int, int, int, const void *, socklen_t))dlsym(RTLD_NEXT, "setsockopt");
    if (!real)
        return -1;
    if (level == IPPROTO_TCP && name == TCP_QUICKACK && fd == sent_on)
        usleep(30000);
    sent_on = -1;
    return real(fd, level, name, val, len);
}
