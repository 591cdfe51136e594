# rt25_sandbox.py [pair|server PORTFILE|client PORT] [N]: the workload of red team round 25's
# sandboxed programs (rt25_sandbox.sh runs it under rt25_seccomp.c's filters): N connections,
# the server greets on every other one, the client sends 256 KiB with its length, the server
# answers the sha256, both end with EOF. One line per connection (ok/error, fast/SLOW): a
# sandboxed run under the library must print what it prints over plain TCP.
# In `pair` mode the roles filter themselves (seccomp through ctypes, no libseccomp):
#   RT25_DENY=gsopt|recvmsg  getsockopt at the library's private level (SOL_SMC_BPF), or
#                            recvmsg, fail with EPERM
#   RT25_WHO=client|server|both (default both)   RT25_LATE=1: the server filters itself
#   after listen (a server that sandboxes itself once set up), else before.
import hashlib, os, socket, struct, sys, time

N = int(sys.argv[-1]) if sys.argv[-1].isdigit() else 6
DENY = os.environ.get("RT25_DENY", "")
WHO = os.environ.get("RT25_WHO", "both")


def deny(what):
    import ctypes
    ins = lambda code, jt, jf, k: struct.pack("HBBI", code, jt, jf, k)
    LD, JEQ, RET, ALLOW, EPERM = 0x20, 0x15, 0x06, 0x7FFF0000, 0x00050000 | 1
    head = [ins(LD, 0, 0, 4), ins(JEQ, 1, 0, 0xC000003E), ins(RET, 0, 0, ALLOW), ins(LD, 0, 0, 0)]
    if what == "gsopt":  # getsockopt (55) with level (args[1]) SOL_SMC_BPF
        body = [ins(JEQ, 0, 3, 55), ins(LD, 0, 0, 24), ins(JEQ, 0, 1, 0x534D4300), ins(RET, 0, 0, EPERM)]
    elif what == "recvmsg":  # recvmsg (47)
        body = [ins(JEQ, 0, 1, 47), ins(RET, 0, 0, EPERM)]
    else:
        raise SystemExit(f"unknown RT25_DENY {what}")
    prog = b"".join(head + body + [ins(RET, 0, 0, ALLOW)])
    buf = ctypes.create_string_buffer(prog)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fp = Fprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(fp), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER


def serve(l, n, out):
    for i in range(n):
        s, _ = l.accept()
        s.settimeout(10)
        try:
            if i % 2:
                s.sendall(b"hi\n")
            h = b""
            while len(h) < 4:
                h += s.recv(4 - len(h))
            ln = struct.unpack("!I", h)[0]
            d = bytearray()
            while len(d) < ln:
                b = s.recv(65536)
                if not b:
                    break
                d += b
            s.sendall(hashlib.sha256(d).hexdigest().encode())
            s.shutdown(socket.SHUT_WR)
            eof = s.recv(10)
            out(f"server {i} got {len(d)} eof={eof == b''}")
        except Exception as e:
            out(f"server {i} {type(e).__name__} {e}")
        s.close()


def client(port, n):
    payload = os.urandom(1 << 18)
    want = hashlib.sha256(payload).hexdigest().encode()
    for i in range(n):
        t = time.monotonic()
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                g = b""
                while len(g) < 3:
                    g += c.recv(3 - len(g))
                assert g == b"hi\n", g
            c.sendall(struct.pack("!I", len(payload)) + payload)
            r = b""
            while True:
                b = c.recv(100)
                if not b:
                    break
                r += b
            c.close()
            res = "ok" if r == want else f"WRONG {r[:20]!r}"
        except Exception as e:
            res = f"{type(e).__name__} {e}"
        dt = time.monotonic() - t
        print(f"client {i} {res} {'SLOW' if dt > 1 else 'fast'}", flush=True)


def listener():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(16)
    return l


def pr(line):
    print(line, flush=True)


mode = sys.argv[1] if len(sys.argv) > 1 else "pair"
if mode == "pair":
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        if DENY and WHO in ("client", "both"):
            deny(DENY)
        port = int(os.read(r, 16))
        client(port, N)
        os._exit(0)
    os.close(r)
    srv = DENY and WHO in ("server", "both")
    late = bool(os.environ.get("RT25_LATE"))
    if srv and not late:
        deny(DENY)
    l = listener()
    if srv and late:
        deny(DENY)
    os.write(w, str(l.getsockname()[1]).encode())
    lines = []
    serve(l, N, lines.append)
    os.waitpid(pid, 0)
    for x in lines:
        print(x, flush=True)
elif mode == "server":
    l = listener()
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(l.getsockname()[1]))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    serve(l, N, pr)
else:
    client(int(sys.argv[2]), N)
