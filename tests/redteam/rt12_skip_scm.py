#!/usr/bin/env python3
"""Round 12: a server end that fell back and still has to skip its client's late CLC
Proposal (`Obj::Skip`) is passed with SCM_RIGHTS to a forked worker (the library runs in
both), which reads the request and echoes it. usage: rt12_skip_scm.py PORT [N] [DELAY]
The client connects (non-blocking connect), waits DELAY s, then sends "ping i". The primary
accepts, reads nothing, waits DELAY/2 s and passes the connection. Run with
SMC_CLC_TIMEOUT_MS=1 and two CPU hogs (the accept's wait for the Proposal times out: `Skip`).
EXEC=1: instead, a forked child execs a handler (with the library) on the connection (inetd).
TCP: every "pong i" back. Under the library: the worker reads the Proposal (e2 d4 c3 d9 ...),
and the client gets ECONNRESET (the worker closes with the request unread)."""
import os, socket, sys, time

EXEC_HANDLER = r'''
import socket, sys
c = socket.socket(fileno=int(sys.argv[1]))
c.settimeout(10)
d = c.recv(100)
if not d.startswith(b"ping"):
    print("handler read %r" % d[:12].hex(), flush=True)
c.sendall(d.replace(b"ping", b"pong"))
'''
port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(16)
a, b = socket.socketpair()
if os.fork() == 0:  # worker
    a.close()
    while True:
        msg, fds, _, _ = socket.recv_fds(b, 16, 4)
        if not fds:
            os._exit(0)
        c = socket.socket(fileno=fds[0])
        c.settimeout(10)
        d = c.recv(100)
        if not d.startswith(b"ping"):
            print("worker read %r" % d[:12].hex(), flush=True)
        c.sendall(d.replace(b"ping", b"pong"))
        c.close()
b.close()
ok = 0
for i in range(n):
    cp = os.fork()
    if cp == 0:  # client
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        time.sleep(delay)
        c.setblocking(True)
        c.settimeout(10)
        try:
            c.sendall(b"ping %d" % i)
            got = c.recv(100)
        except OSError as e:
            got = repr(e).encode()
        print("conn %d: %s" % (i, "ok" if got == b"pong %d" % i else "got %r" % got[:16]), flush=True)
        os._exit(0 if got == b"pong %d" % i else 1)
    s, _ = l.accept()
    time.sleep(delay / 2)
    if os.environ.get("EXEC"):
        # inetd's shape: a child execs a handler (with the library) on the connection
        os.set_inheritable(s.fileno(), True)
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", EXEC_HANDLER, str(s.fileno())])
    else:
        socket.send_fds(a, [b"x"], [s.fileno()])
    s.close()
    _, st = os.waitpid(cp, 0)
    ok += st == 0
print("answered %d of %d" % (ok, n))
a.close()
os.wait()
