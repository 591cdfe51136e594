#!/usr/bin/env python3
"""rt24: a listener taken with pidfd_getfd(2). A (library) listens and never accepts; C takes
A's listener with pidfd_getfd (MODE lib: C runs the library; nolib: it does not) and serves 3
clients (the library) in turn: each sends a line, C echoes what it read. Prints C's reads.
Also lifecycle_smc::a_listener_taken_with_pidfd_getfd_serves_like_tcp (MODE lib).
usage: rt24_getfd_listener.py lib|nolib   (under world.sh smc|tcp)"""
import ctypes, os, socket, subprocess, sys, time

if sys.argv[1] == "A":
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(8)
    print(ls.getsockname()[1], ls.fileno(), flush=True)
    time.sleep(30); sys.exit(0)
if sys.argv[1] == "C":
    libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
    nfd = libc.syscall(438, os.pidfd_open(int(sys.argv[2])), int(sys.argv[3]), 0)
    ls = socket.socket(fileno=nfd)
    print("taken", flush=True)
    for _ in range(3):
        c, _ = ls.accept(); c.settimeout(5)
        try:
            d = c.recv(1000); print("C read", d[:12], len(d), flush=True); c.sendall(d)
        except OSError as e:
            print("C", type(e).__name__, flush=True)
        c.close()
    sys.exit(0)
mode = sys.argv[1]
me = [sys.executable, __file__]
a = subprocess.Popen(me + ["A"], stdout=subprocess.PIPE, text=True)
port, fd = a.stdout.readline().split()
env = dict(os.environ)
if mode == "nolib":
    env.pop("LD_PRELOAD", None)
c = subprocess.Popen(me + ["C", str(a.pid), fd], env=env, stdout=subprocess.PIPE, text=True)
c.stdout.readline()
for i in range(3):
    s = socket.socket(); s.settimeout(5); s.connect(("127.0.0.1", int(port)))
    try:
        s.sendall(b"line%d\n" % i); got = s.recv(100)
        print(c.stdout.readline().strip(), flush=True); print("client got", got, flush=True)
    except OSError as e:
        print("client", type(e).__name__, flush=True)
    s.close()
c.wait(timeout=20); a.kill()
