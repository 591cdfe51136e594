#!/usr/bin/env python3
"""Round 14: a listener inherited by an image without the library (a helper spawned with a
clean environment while the listening socket is inheritable, as a C server's socket is unless
it asks for SOCK_CLOEXEC), then the server (with the library) accepts and greets a client.
usage: rt14_listen.py PORT N [pass|cloexec]"""
import os, socket, subprocess, sys, time

port, n = int(sys.argv[1]), int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "pass"
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
p = subprocess.Popen(["sleep", "30"], pass_fds=[l.fileno()] if mode == "pass" else [], env=env)
time.sleep(0.3)
res = {}
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port))
    s, _ = l.accept()
    t = time.monotonic()
    s.sendall(b"hello\n")
    c.settimeout(10)
    got = c.recv(100)
    dt = time.monotonic() - t
    k = "%r %s" % (got, "slow(>1s)" if dt > 1 else "fast")
    res[k] = res.get(k, 0) + 1
    c.close(); s.close()
p.kill(); p.wait()
for k, v in sorted(res.items()):
    print("%s: %d x %s" % (mode, v, k))
