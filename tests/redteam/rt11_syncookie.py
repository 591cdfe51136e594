#!/usr/bin/env python3
"""Round 11: connections established through SYN cookies (a listener with a short backlog,
a burst of connects: Python's socketserver listens with 5). Each client sends 'hello N\n' and
waits for the server's echo; the server (accepting late, after the burst) reads one line.
Prints how many lines arrived intact, how many began with CLC bytes (e2 d4 c3 d9), and the
kernel's SyncookiesSent delta. usage: rt11_syncookie.py [N] [BACKLOG]"""
import os, socket, sys, threading, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 24
BACKLOG = int(sys.argv[2]) if len(sys.argv) > 2 else 1

def cookies():
    with open("/proc/net/netstat") as f:
        rows = [l.split() for l in f if l.startswith("TcpExt:")]
    return int(rows[1][rows[0].index("SyncookiesSent")])

c0 = cookies()
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(BACKLOG)
port = l.getsockname()[1]
res = {}
def cli(i):
    s = socket.socket()
    s.settimeout(8)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"hello %d\n" % i)
        res[i] = s.makefile("rb").readline()
    except OSError as e:
        res[i] = repr(e).encode()
    s.close()
ths = [threading.Thread(target=cli, args=(i,)) for i in range(N)]
for t in ths: t.start()
time.sleep(0.5)          # the burst meets a full accept queue
good = clc = other = 0
def srv(c):
    global good, clc, other
    try:
        line = c.makefile("rb").readline()
    except OSError as e:
        line = repr(e).encode()
    if line.startswith(b"hello "): good += 1
    elif line.startswith(b"\xe2\xd4\xc3\xd9"): clc += 1
    else: other += 1
    try:
        c.sendall(line if line.startswith(b"hello") else b"bad\n")
    except OSError:
        pass
    c.close()
l.settimeout(8)
sths = []
for _ in range(N):
    try:
        c, _ = l.accept()
    except OSError:
        break
    c.settimeout(5)
    t = threading.Thread(target=srv, args=(c,)); t.start(); sths.append(t)
for t in sths: t.join(10)
for t in ths: t.join(10)
echoed = sum(1 for i in range(N) if res.get(i) == b"hello %d\n" % i)
print("server lines ok", good, "clc", clc, "other", other, "clients echoed", echoed, "of", N)
print("syncookies sent", "yes" if cookies() > c0 else "no")
print("client errors:", sorted(set(v.decode(errors="replace")[:40] for v in res.values() if not v.startswith(b"hello"))), file=sys.stderr)
sys.stdout.flush()
os._exit(0)
