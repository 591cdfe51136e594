# rt20_greet.py PORT greet|hc|ka [N] [SLEEP]: N clients (under the library) connect to a
# listener made under the library while nobody accepts; after SLEEP s (0.02) the process execs
# an image WITHOUT the library that serves the queued connections on the inherited listener.
# greet: SMTP-like, the server speaks first ("220 ready"), the client answers "HELO I", the
# server "250 HELO I". hc: the client sends "hello I" and half-closes (SHUT_WR) at once, the
# server echoes everything up to EOF. ka: HTTP keep-alive shape: 3 request lines on one
# connection, each answered before the next is sent. exit: each client, a process of its own,
# sends "hello I" and leaves with libc's exit() without closing (atexit handlers run, Python's
# finalizers do not): the kernel's close sends its FIN; the serving image then says what it
# read. _exit, closerange, dup2, fclose: the same, but the client leaves with libc's _exit()
# (os._exit), or closes its socket with close_range (os.closerange), by dup2 of /dev/null onto
# it, or by fclose of an fdopen'd stream, and then _exits. Prints "wrong K/N"; TCP: 0.
import os, socket, sys, time
a = sys.argv
EXITS = ("exit", "_exit", "closerange", "dup2", "fclose")
def rl(c):
    b = b""
    while not b.endswith(b"\n"):
        x = c.recv(4096)
        if not x:
            break
        b += x
    return b
if a[1] == "serve":
    l = socket.socket(fileno=int(a[2])); mode = a[3]; l.settimeout(4)
    while True:
        try:
            c, _ = l.accept()
        except (socket.timeout, TimeoutError):
            break
        c.settimeout(5)
        try:
            if mode == "greet":
                c.sendall(b"220 ready\n"); c.sendall(b"250 " + rl(c)[:60])
            elif mode in ("hc",) + EXITS:
                b = b""
                while True:
                    x = c.recv(4096)
                    if not x:
                        break
                    b += x
                if mode in EXITS:
                    n_seen = globals().get("n_seen", 0) + 1
                    globals()["n_seen"] = n_seen
                    if not (b.startswith(b"hello ") and b.endswith(b"\n") and len(b) < 12):
                        globals()["n_bad"] = globals().get("n_bad", 0) + 1
                        print("wrong:", b[:50], file=sys.stderr)
                    continue
                c.sendall(b"echo " + b[:60])
            else:
                for _ in range(3):
                    c.sendall(b"ok " + rl(c)[:60])
        except OSError:
            pass
        c.close()
    if mode in EXITS:
        print("%s wrong %d/%d" % (mode, globals().get("n_bad", 0), globals().get("n_seen", 0)))
    os._exit(0)
port, mode = int(a[1]), a[2]
n = int(a[3]) if len(a) > 3 else 8
slp = float(a[4]) if len(a) > 4 else 0.02
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(64)
if os.fork() == 0:
    l.close()
    from concurrent.futures import ThreadPoolExecutor
    def one(i):
        c = socket.create_connection(("127.0.0.1", port)); c.settimeout(8)
        try:
            if mode == "greet":
                g = rl(c); c.sendall(b"HELO %d\n" % i); r = rl(c)
                ok = g == b"220 ready\n" and r == b"250 HELO %d\n" % i
                got = g + r
            elif mode == "hc":
                c.sendall(b"hello %d\n" % i); c.shutdown(socket.SHUT_WR)
                got = b""
                while True:
                    x = c.recv(4096)
                    if not x:
                        break
                    got += x
                ok = got == b"echo hello %d\n" % i
            else:
                got = b""
                for k in range(3):
                    c.sendall(b"GET /%d/%d\n" % (i, k)); got += rl(c)
                ok = got == b"".join(b"ok GET /%d/%d\n" % (i, k) for k in range(3))
        except OSError as e:
            ok, got = False, repr(e).encode()
        c.close()
        return ok, got
    if mode in EXITS:
        import ctypes
        kids = []
        for i in range(n):
            k = os.fork()
            if k == 0:
                c = socket.create_connection(("127.0.0.1", port))
                c.sendall(b"hello %d\n" % i)
                libc = ctypes.CDLL(None)
                fd = c.detach()
                if mode == "exit":
                    libc.exit(0)
                elif mode == "closerange":
                    os.closerange(fd, fd + 1)
                elif mode == "dup2":
                    os.dup2(os.open("/dev/null", os.O_RDONLY), fd)
                elif mode == "fclose":
                    libc.fdopen.restype = ctypes.c_void_p
                    libc.fclose.argtypes = [ctypes.c_void_p]
                    libc.fclose(libc.fdopen(fd, b"r"))
                os._exit(0)
            kids.append(k)
        for k in kids:
            os.waitpid(k, 0)
        os._exit(0)
    with ThreadPoolExecutor(n) as ex:
        res = list(ex.map(one, range(n)))
    bad = [g for ok, g in res if not ok]
    for g in bad[:2]:
        print("wrong:", g[:50], file=sys.stderr)
    print("%s sleep %s wrong %d/%d" % (mode, slp, len(bad), n))
    os._exit(0)
time.sleep(slp)
os.set_inheritable(l.fileno(), True)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
os.execve(sys.executable, [sys.executable, a[0], "serve", str(l.fileno()), mode], env)
