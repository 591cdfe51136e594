#!/usr/bin/env python3
"""rt24: an SMC connection's fd duplicated into another process with pidfd_getfd(2)
(the sender's library never sees it leave, as SCM_RIGHTS or fork would show it).

usage: rt24_getfd.py MODE      (run under world.sh smc|tcp)
 MODE  lib      the taker runs the library (inherits LD_PRELOAD)
       nolib    the taker runs without it (env -u LD_PRELOAD)
       libglibc the taker uses glibc's pidfd_getfd wrapper instead of syscall(2)
Processes: A (server: echoes 'echo:'+line per line), B (client: connects, one round trip,
then keeps its fd and waits), C (takes B's fd with pidfd_getfd, sends 'two', reads the echo
with a 3 s timeout; then B does a round trip too). Prints one line per process."""
import ctypes, os, socket, subprocess, sys, time

SYS_pidfd_open, SYS_pidfd_getfd = 434, 438


def server(port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(8)
    print("READY", flush=True)
    c, _ = ls.accept()
    f = b""
    n = 0
    c.settimeout(8)
    try:
        while True:
            d = c.recv(4096)
            if not d:
                break
            f += d
            while b"\n" in f:
                line, f = f.split(b"\n", 1)
                n += 1
                c.sendall(b"echo:" + line + b"\n")
        print(f"A lines={n} eof", flush=True)
    except OSError as e:
        print(f"A lines={n} {type(e).__name__} {e.errno}", flush=True)


def client(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"one\n")
    r = s.recv(100)
    print(f"B first {r!r} fd={s.fileno()}", flush=True)
    sys.stdin.readline()  # C is done
    s.settimeout(3)
    try:
        s.sendall(b"three\n")
        r = s.recv(100)
        print(f"B after {r!r}", flush=True)
    except OSError as e:
        print(f"B after {type(e).__name__} {e.errno}", flush=True)
    s.close()


def taker(pid, fd, how):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pfd = os.pidfd_open(pid)
    if how == "libglibc":
        g = libc.pidfd_getfd
        nfd = g(pfd, fd, 0)
    else:
        nfd = libc.syscall(SYS_pidfd_getfd, pfd, fd, 0)
    if nfd < 0:
        print(f"C getfd errno {ctypes.get_errno()}", flush=True)
        return
    s = socket.socket(fileno=nfd)
    s.settimeout(3)
    try:
        s.sendall(b"two\n")
        r = s.recv(100)
        print(f"C read {r!r}", flush=True)
    except OSError as e:
        print(f"C {type(e).__name__} {e.errno}", flush=True)
    s.close()


def main():
    if sys.argv[1] == "A":
        return server(int(sys.argv[2]))
    if sys.argv[1] == "B":
        return client(int(sys.argv[2]))
    if sys.argv[1] == "C":
        return taker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    mode = sys.argv[1]
    p = socket.socket()
    p.bind(("127.0.0.1", 0))
    port = p.getsockname()[1]
    p.close()
    me = [sys.executable, __file__]
    a = subprocess.Popen(me + ["A", str(port)], stdout=subprocess.PIPE, text=True)
    a.stdout.readline()
    b = subprocess.Popen(me + ["B", str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = b.stdout.readline().strip()
    print(line)
    fd = int(line.rsplit("fd=", 1)[1])
    env = dict(os.environ)
    if mode == "nolib":
        env.pop("LD_PRELOAD", None)
    t0 = time.time()
    c = subprocess.run(me + ["C", str(b.pid), str(fd), mode], env=env, capture_output=True, text=True, timeout=20)
    print((c.stdout + c.stderr).strip(), f"({time.time() - t0:.1f} s)")
    b.stdin.write("go\n")
    b.stdin.flush()
    print(b.stdout.read().strip())
    b.wait()
    print(a.stdout.read().strip())
    a.wait(timeout=15)


if __name__ == "__main__":
    main()
