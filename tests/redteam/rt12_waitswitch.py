#!/usr/bin/env python3
"""Round 12: Python's subprocess with a connection's end passed to an image without the
library (the static helper of rt12_waitswitch.c on fd 20), the parent waiting with
Popen.wait(timeout=...) (a WNOHANG poll with sleeps), Popen.wait() and Popen.communicate().
usage: rt12_waitswitch.py PORT MODE [remote]  (timeout | plain | communicate)
remote: the server end lives in another process (forked before the connection), which sends
the ping at once and waits in recv for the answer; the parent only passes its client end and
waits. Without remote, the parent holds the server end: Popen's parent sits in read() on its
exec-error pipe until the child's exec is done, the child's exec waits for the parent's
answer to its switch to TCP: 10 s, then both ends reset."""
import os, socket, subprocess, sys, time

port, mode = int(sys.argv[1]), sys.argv[2]
if os.environ.get("NOVFORK"):
    subprocess._USE_VFORK = False  # fork + exec instead
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(4)
remote = len(sys.argv) > 3
if remote:
    r, w = os.pipe()
    sp = os.fork()
    if sp == 0:
        s, _ = l.accept()
        s.sendall(b"x"); s.recv(1)
        t = time.monotonic()
        s.sendall(b"ping\n")
        s.settimeout(15)
        try:
            got = s.recv(10)
        except OSError as e:
            got = repr(e).encode()
        print("%s remote: server read %r, %s" % (mode, got, "within 1 s" if time.monotonic() - t < 1 else "after >= 1 s"), flush=True)
        os._exit(0)
    c = socket.create_connection(("127.0.0.1", port))
    c.recv(1); c.sendall(b"x")
else:
    c = socket.create_connection(("127.0.0.1", port))
    s, _ = l.accept()
    c.sendall(b"x"); s.recv(1); s.sendall(b"x"); c.recv(1)
t = time.monotonic()
os.dup2(c.fileno(), 20, inheritable=True)
p = subprocess.Popen(["/tmp/rt12/rt12_waitswitch_s", "helper"], pass_fds=[20], stdout=subprocess.PIPE if mode == "communicate" else None)
os.close(20)
c.close()
if remote:
    os.write(w, b"x")
    p.wait(timeout=30) if mode == "timeout" else p.wait()
    os.waitpid(sp, 0)
    print("%s remote: helper exit %d" % (mode, p.returncode))
    sys.exit(0)
s.sendall(b"ping\n")
if mode == "timeout":
    p.wait(timeout=30)
elif mode == "communicate":
    p.communicate(timeout=30)
else:
    p.wait()
dt = time.monotonic() - t
s.settimeout(2)
try:
    got = s.recv(10)
except OSError as e:
    got = repr(e).encode()
print("%s: helper exit %d, server read %r, %s" % (mode, p.returncode, got, "within 1 s" if dt < 1 else "after >= 1 s"))
print("%s: %.0f ms" % (mode, dt * 1e3), file=sys.stderr)
