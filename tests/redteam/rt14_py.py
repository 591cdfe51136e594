#!/usr/bin/env python3
"""Round 14: Python hands a connection to an image without the library after it read what
the server sent (subprocess.run(["env", "-i", "cat"], stdin=conn)).
usage: rt14_py.py PORT N MODE
  closed: the server sent one line and closed; the client read the line (and waited 50 ms)
  more:   the server sent a line, the client read it, then the server sent a second one and closed
  shut:   the server sent one line and shut its writing (then waits on a pipe, not on the socket)
          until the client reports; the client read the line
  open:   the server sent one line and keeps the connection open 1 s, not touching it
  reply:  the client sends its request and at once runs cat on the socket; the server reads
          the request, sends a 100 KB reply and closes (HTTP/1.0 style)"""
import os, socket, subprocess, sys, time

port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(8)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    for i in range(n):
        s, _ = l.accept()
        s.recv(100)
        s.sendall(b"line1\n")
        if mode == "reply":
            s.sendall(b"R" * 100000); s.close(); continue
        if mode == "more":
            s.recv(100); s.sendall(b"line2\n"); s.close()
        elif mode == "closed":
            s.close()
        elif mode == "shut":
            s.shutdown(socket.SHUT_WR); os.read(r, 1); s.close()
        else:
            time.sleep(1); s.close()
    os._exit(0)
os.close(r)
res = {}
env = {"PATH": "/usr/bin:/bin"}
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"req\n")
    a = c.recv(100) if mode != "reply" else b""
    if mode == "more":
        c.sendall(b"next\n")
    time.sleep(0.05)
    t = time.monotonic()
    p = subprocess.run(["cat"], stdin=c, capture_output=True, env=env, timeout=30)
    dt = time.monotonic() - t
    out = p.stdout if mode != "reply" else ("%d bytes" % len(p.stdout)).encode()
    if os.environ.get("RT14_ERR"): sys.stderr.write(p.stderr.decode(errors="replace"))
    k = "read %r cat %r err %r rc=%d %s" % (a, out, p.stderr.strip()[-40:], p.returncode, "slow(>1s)" if dt > 1.5 else "")
    res[k] = res.get(k, 0) + 1
    if mode == "shut":
        os.write(w, b"x")
    c.close()
os.waitpid(pid, 0)
for k, v in sorted(res.items()):
    print("%s: %d x %s" % (mode, v, k))
