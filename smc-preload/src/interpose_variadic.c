// dprintf(3), vdprintf(3) and their _FORTIFY_SOURCE forms (__dprintf_chk, __vdprintf_chk).
//
// glibc's vdprintf formats into a FILE on the fd and flushes it through its internal write,
// which the interposition never sees: on an SMC connection the bytes would go into the TCP
// socket, which carries only doorbells (the peer resets the connection). dprintf is variadic,
// so it cannot be defined in stable Rust: these four are defined here, and interpose.rs
// exports them (a Rust `#[no_mangle]` jump to each: rustc's version script keeps a C symbol
// of the cdylib local). smc-preload/build.rs compiles this file into the library.
//
// An fd whose bytes the library handles (smc_preload_fd_emulated: the fds `write` sends
// through the library) is served here: the output is formatted in memory (vasprintf, or
// __vasprintf_chk for the fortified forms, so %n keeps its fortify check) and written with
// the library's own `write`, looping on short writes as glibc's FILE flush does
// (_IO_new_file_write). Any other fd goes to libc's function, unchanged.
//
// What glibc's vdprintf returns, this returns: the number of bytes formatted when all were
// written; -1 with errno when formatting failed (EOVERFLOW, ENOMEM, EILSEQ: nothing written,
// where glibc may have flushed the first 4 KiB blocks already) or a write failed (its errno;
// the bytes before it are written, as with glibc). A failed write is not tried again, as in
// glibc: EINTR (a handler without SA_RESTART) and EAGAIN (a non-blocking socket whose send
// buffer is full, here the peer's ring) end the call with -1, after a part of the output may
// have gone out.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define HIDDEN __attribute__((visibility("hidden")))

// The Rust side (interpose.rs).
extern int smc_preload_fd_emulated(int fd);
extern int smc_preload_write_all(int fd, const char *buf, size_t len);

// glibc's fortified formatting (glibc 2.8).
extern int __vasprintf_chk(char **out, int flag, const char *fmt, va_list ap);

typedef int (*vdprintf_fn)(int, const char *, va_list);
typedef int (*vdprintf_chk_fn)(int, int, const char *, va_list);

static void *real_vdprintf;
static void *real_vdprintf_chk;

// libc's definition of `name` (the next object after this library), cached.
static void *real_fn(void **slot, const char *name) {
  void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (p == NULL) {
    p = dlsym(RTLD_NEXT, name);
    __atomic_store_n(slot, p, __ATOMIC_RELEASE);
  }
  return p;
}

// Whether the library handles the bytes of fd. errno is left as it was: %m prints it.
static int emulated(int fd) {
  int e = errno;
  int r = smc_preload_fd_emulated(fd);
  errno = e;
  return r;
}

// Writes the `n` formatted bytes of `buf` (from vasprintf: `n` < 0 is its failure, errno
// set) and frees it. glibc's return value: `n`, or -1 with errno.
static int put(int fd, char *buf, int n) {
  if (n < 0) {
    return -1;
  }
  int r = smc_preload_write_all(fd, buf, (size_t)n);
  int e = errno;
  free(buf);
  errno = e;
  return r < 0 ? -1 : n;
}

HIDDEN int smc_preload_c_vdprintf(int fd, const char *fmt, va_list ap) {
  if (!emulated(fd)) {
    vdprintf_fn real = (vdprintf_fn)real_fn(&real_vdprintf, "vdprintf");
    if (real == NULL) {
      errno = ENOSYS;
      return -1;
    }
    return real(fd, fmt, ap);
  }
  char *buf = NULL;
  int n = vasprintf(&buf, fmt, ap);
  return put(fd, buf, n);
}

HIDDEN int smc_preload_c_vdprintf_chk(int fd, int flag, const char *fmt, va_list ap) {
  if (!emulated(fd)) {
    vdprintf_chk_fn real = (vdprintf_chk_fn)real_fn(&real_vdprintf_chk, "__vdprintf_chk");
    if (real == NULL) {
      errno = ENOSYS;
      return -1;
    }
    return real(fd, flag, fmt, ap);
  }
  char *buf = NULL;
  int n = __vasprintf_chk(&buf, flag, fmt, ap);
  return put(fd, buf, n);
}

HIDDEN int smc_preload_c_dprintf(int fd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = smc_preload_c_vdprintf(fd, fmt, ap);
  va_end(ap);
  return r;
}

HIDDEN int smc_preload_c_dprintf_chk(int fd, int flag, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = smc_preload_c_vdprintf_chk(fd, flag, fmt, ap);
  va_end(ap);
  return r;
}

// execl(3), execlp(3), execle(3): glibc builds the argument array and calls its internal
// execve, past the interposition, so an SMC connection would reach the new image unswitched
// (an image without the library reads EOF, its writes are lost, the peer is reset). These
// build the array as glibc does (on the stack, one pass to count) and call the library's own
// execv, execvp and execve, which switch what must be switched first.

extern int execv(const char *path, char *const argv[]);
extern int execvp(const char *file, char *const argv[]);
extern int execve(const char *path, char *const argv[], char *const envp[]);

// The arguments after `arg0` up to the terminating NULL, counted (with `arg0`), so that the
// caller can size its array.
#define COUNT_ARGS(arg0, n)                                                                     \
  do {                                                                                          \
    va_list c;                                                                                  \
    va_start(c, arg0);                                                                          \
    n = 1;                                                                                      \
    if (arg0 != NULL) {                                                                         \
      while (va_arg(c, const char *) != NULL) {                                                 \
        n++;                                                                                    \
      }                                                                                         \
    }                                                                                           \
    va_end(c);                                                                                  \
  } while (0)

// In a function `(name, arg0, ...)`: `argv` (on the stack, as glibc builds it) holds `arg0`
// and the arguments after it, NULL-terminated; `ap` is left after the terminating NULL (for
// execle's environment), the caller's to `va_end`.
#define ARGV_FROM_VARARGS(arg0)                                                                 \
  size_t n;                                                                                     \
  COUNT_ARGS(arg0, n);                                                                          \
  if (n > 65536) {                                                                              \
    errno = E2BIG;                                                                              \
    return -1;                                                                                  \
  }                                                                                             \
  const char *argv[n + 1];                                                                      \
  va_list ap;                                                                                   \
  va_start(ap, arg0);                                                                           \
  argv[0] = arg0;                                                                               \
  for (size_t i = 1; i <= n; i++) {                                                             \
    argv[i] = i < n ? va_arg(ap, const char *) : NULL;                                          \
  }                                                                                             \
  if (arg0 != NULL) {                                                                           \
    (void)va_arg(ap, const char *); /* the terminating NULL (arg0 is it when NULL) */           \
  }

HIDDEN int smc_preload_c_execl(const char *path, const char *arg0, ...) {
  ARGV_FROM_VARARGS(arg0);
  va_end(ap);
  return execv(path, (char *const *)argv);
}

HIDDEN int smc_preload_c_execlp(const char *file, const char *arg0, ...) {
  ARGV_FROM_VARARGS(arg0);
  va_end(ap);
  return execvp(file, (char *const *)argv);
}

// execle: the environment follows the terminating NULL.
HIDDEN int smc_preload_c_execle(const char *path, const char *arg0, ...) {
  ARGV_FROM_VARARGS(arg0);
  char *const *envp = va_arg(ap, char *const *);
  va_end(ap);
  return execve(path, (char *const *)argv, envp);
}
