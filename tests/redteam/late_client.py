#!/usr/bin/env python3
"""A client that comes back after its server gave up on the handshake: non-blocking connect
(the Proposal goes out), then the client does nothing until its server (another process,
blocking accept, speaks first) has given up waiting for the Confirm, failed its greeting and
closed. Then the client reads. TCP: the greeting. The data path may end this connection (the
server timed out), but must never hand the server's CLC Decline to the client as data.
usage: late_client.py [N]; prints one line per connection, `CLC AS DATA` on the failure."""
import os, select, socket, sys

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
EYE = (b"\xe2\xd4\xc3\xd9", b"\xe2\xd4\xc3\xc4")  # SMC-R / SMC-D eyecatchers (EBCDIC)
bad = 0
for i in range(N):
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4); addr = l.getsockname()
    r1, w1 = os.pipe(); r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r1, 1)  # the client's Proposal is out
        s, _ = l.accept()
        try:
            s.sendall(b"220 hello\r\n")
            out = b"sent"
        except OSError as e:
            out = os.strerror(e.errno).encode()
        s.close()
        os.write(w2, out)
        os._exit(0)
    l.close()
    c = socket.socket(); c.setblocking(False)
    c.connect_ex(addr)
    select.select([], [c], [], 10)
    try:
        c.recv(100)  # drives the pending connect: the Proposal goes out
    except BlockingIOError:
        pass
    os.write(w1, b"x")
    select.select([r2], [], [], 30)
    srv = os.read(r2, 100).decode()
    c.setblocking(True); c.settimeout(10)
    try:
        got = repr(c.recv(100))
    except OSError as e:
        got = os.strerror(e.errno) if e.errno else "timeout"
    clc = any(got.startswith(repr(e)[:-1]) for e in EYE)
    bad += clc
    print("conn %d: server %s, client read %s%s" % (i, srv, got[:40], "  CLC AS DATA" if clc else ""), flush=True)
    c.close(); os.waitpid(pid, 0)
    for f in (r1, w1, r2, w2):
        os.close(f)
print("CLC_AS_DATA", bad, flush=True)
