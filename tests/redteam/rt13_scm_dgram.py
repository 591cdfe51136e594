#!/usr/bin/env python3
# Round 13: an SMC connection passed with SCM_RIGHTS over a Unix DATAGRAM socket (sendmsg to a
# bound address, systemd's fd store / sd_notify FDSTORE=1 style; or SOCK_SEQPACKET connected)
# to a receiver (same user) that runs without the library. usage: rt13_scm_dgram.py PORT N dgram|seqpacket|stream
import array, os, socket, subprocess, sys, time
PY = "/usr/bin/python3"
def recv_fd(u):
    fds = array.array("i")
    msg, anc, _, _ = u.recvmsg(1, socket.CMSG_LEN(4))
    for lvl, typ, data in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[:4])
    return fds[0] if fds else -1
TYPES = {"dgram": socket.SOCK_DGRAM, "seqpacket": socket.SOCK_SEQPACKET, "stream": socket.SOCK_STREAM}
if sys.argv[1] == "recv":
    path, n, ty = sys.argv[2], int(sys.argv[3]), TYPES[sys.argv[4]]
    u = socket.socket(socket.AF_UNIX, ty)
    u.bind(path)
    if ty != socket.SOCK_DGRAM:
        u.listen(1)
    print("ready", flush=True)
    if ty != socket.SOCK_DGRAM:
        u, _ = u.accept()
    for _ in range(n):
        fd = recv_fd(u)
        c = socket.socket(fileno=fd); c.settimeout(3)
        try:
            c.sendall(c.recv(100).upper())
        except Exception as e:
            print("receiver:", repr(e), flush=True)
        c.close()
    sys.exit(0)
port, n, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
path = "/tmp/rt13dg.%d.sock" % os.getpid()
rcv = subprocess.Popen(["env", "-u", "LD_PRELOAD", PY, os.path.abspath(__file__), "recv", path, str(n), kind], stdout=subprocess.PIPE)
rcv.stdout.readline()
u = socket.socket(socket.AF_UNIX, TYPES[kind])
if kind == "dgram":
    u.connect(path) if os.environ.get("CONNECT") else None
else:
    u.connect(path)
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(64)
ok = 0
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(5)
    s, _ = l.accept()
    want = b"hello %d\n" % i
    c.sendall(want)
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))]
    if kind == "dgram" and not os.environ.get("CONNECT"):
        u.sendmsg([b"x"], anc, 0, path)
    else:
        u.sendmsg([b"x"], anc)
    s.close()
    try:
        got = c.recv(100)
    except Exception as e:
        got = repr(e).encode()
    if got == want.upper(): ok += 1
    else: print("client %d: got %r" % (i, got), flush=True)
    c.close()
print("%s%s: %d of %d answered right" % (kind, " connected" if os.environ.get("CONNECT") else "", ok, n))
rcv.wait(10); os.unlink(path)
