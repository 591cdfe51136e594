// rt25_seccomp: runs a command under a seccomp filter that makes some system calls fail, as a
// sandboxed program (systemd SystemCallFilter=, a container runtime's profile, Chrome's or
// Firefox's sandbox) sees them. The library, loaded after the filter, must fall back to TCP
// cleanly, never hang, reset or crash.
// gcc -O1 -o /tmp/rt25_seccomp rt25_seccomp.c
// rt25_seccomp RULE[,RULE...] CMD ARGS...   RULEs (each: the call fails with EPERM unless said):
//   memfd       memfd_create
//   mmapshared  mmap with MAP_SHARED (also MAP_SHARED_VALIDATE)
//   mmapnomem   the same, ENOMEM
//   unix        socket(AF_UNIX, ...)
//   sendmsg     sendmsg      recvmsg   recvmsg
//   pidfd       pidfd_open, pidfd_getfd, pidfd_send_signal
//   madvise     madvise      mprotect  mprotect (after the loader: risky)
//   ssopt:N     setsockopt(fd, SOL_SMC_BPF, N)    gsopt   getsockopt(fd, SOL_SMC_BPF, ...)
//   futex       futex (ENOSYS)     prctl prctl   ftruncate ftruncate   fcntl_seal F_ADD_SEALS
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static struct sock_filter F[512];
static int n;
#define ADD(...) (F[n++] = (struct sock_filter)__VA_ARGS__)
#define NR offsetof(struct seccomp_data, nr)
#define ARG(i) offsetof(struct seccomp_data, args[i])
#define RET_ERR(e) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (e))
#define RET_OK BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

// nr == x -> errno e
static void deny(int nr, int e) {
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR));
  ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
  ADD(RET_ERR(e));
}
// nr == x && (arg[i] & mask) -> e   (low 32 bits)
static void deny_bits(int nr, int i, unsigned mask, int e) {
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR));
  ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 3));
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(i)));
  ADD(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 0, 1));
  ADD(RET_ERR(e));
}
// nr == x && arg[i] == v [&& arg[j] == w] -> e
static void deny_eq(int nr, int i, unsigned v, int j, unsigned w, int e) {
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR));
  ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, j < 0 ? 3 : 5));
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(i)));
  ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v, 0, j < 0 ? 1 : 3));
  if (j >= 0) {
    ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(j)));
    ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, w, 0, 1));
  }
  ADD(RET_ERR(e));
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s RULE[,RULE] CMD...\n", argv[0]); return 2; }
  ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
  ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
  ADD(RET_OK);
  char *rules = strdup(argv[1]);
  for (char *r = strtok(rules, ","); r; r = strtok(0, ",")) {
    if (!strcmp(r, "memfd")) deny(SYS_memfd_create, EPERM);
    else if (!strcmp(r, "mmapshared")) deny_bits(SYS_mmap, 3, MAP_SHARED, EPERM);
    else if (!strcmp(r, "mmapnomem")) deny_bits(SYS_mmap, 3, MAP_SHARED, ENOMEM);
    else if (!strcmp(r, "unix")) deny_eq(SYS_socket, 0, AF_UNIX, -1, 0, EPERM);
    else if (!strcmp(r, "sendmsg")) deny(SYS_sendmsg, EPERM);
    else if (!strcmp(r, "recvmsg")) deny(SYS_recvmsg, EPERM);
    else if (!strcmp(r, "pidfd")) { deny(SYS_pidfd_open, EPERM); deny(SYS_pidfd_getfd, EPERM); deny(SYS_pidfd_send_signal, EPERM); }
    else if (!strcmp(r, "madvise")) deny(SYS_madvise, EPERM);
    else if (!strcmp(r, "mprotect")) deny(SYS_mprotect, EPERM);
    else if (!strncmp(r, "ssopt:", 6)) deny_eq(SYS_setsockopt, 1, 0x534d4300, 2, atoi(r + 6), EPERM);
    else if (!strcmp(r, "gsopt")) deny_eq(SYS_getsockopt, 1, 0x534d4300, -1, 0, EPERM);
    else if (!strcmp(r, "futex")) deny(SYS_futex, ENOSYS);
    else if (!strcmp(r, "prctl")) deny(SYS_prctl, EPERM);
    else if (!strcmp(r, "ftruncate")) deny(SYS_ftruncate, EPERM);
    else if (!strcmp(r, "fcntl_seal")) deny_eq(SYS_fcntl, 1, F_ADD_SEALS, -1, 0, EPERM);
    else if (!strcmp(r, "none")) {}
    else { fprintf(stderr, "unknown rule %s\n", r); return 2; }
  }
  ADD(RET_OK);
  struct sock_fprog prog = {.len = n, .filter = F};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
    perror("seccomp");
    return 2;
  }
  execvp(argv[2], argv + 2);
  perror("exec");
  return 2;
}
