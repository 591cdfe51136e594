# rt20_alias.py PORT v4b|v6|none [N] [nobody]: a listener on 127.0.0.1:PORT made under the
# library goes (exec) to an image WITHOUT it, which answers each connection's first line with
# "got <line>". Then another program (under the library; as uid nobody with "nobody") listens
# on the SAME PORT at another address: 127.0.0.2 (v4b) or [::1] v6only (v6). N clients (under
# the library) then connect to 127.0.0.1:PORT one after the other. The eBPF listener key is
# (netns, port): the other listener's announcement revives the withdrawn one's. TCP: every
# answer is "got hello I".
import os, socket, sys, time, pwd, encodings.idna
a = sys.argv
if a[1] == "serve":
    l = socket.socket(fileno=int(a[2])); l.settimeout(4)
    while True:
        try:
            c, _ = l.accept()
        except (socket.timeout, TimeoutError):
            break
        c.settimeout(3)
        b = b""
        try:
            while not b.endswith(b"\n") and len(b) < 4096:
                x = c.recv(4096)
                if not x:
                    break
                b += x
            c.sendall(b"got " + b[:60] + (b"" if b.endswith(b"\n") else b"\n"))
        except OSError:
            pass
        c.close()
    os._exit(0)
port, mode = int(a[1]), a[2]
n = int(a[3]) if len(a) > 3 else 10
asnobody = len(a) > 4 and a[4] == "nobody"
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(64)
if os.fork() == 0:
    # the other program: listens on the same port at another address
    if asnobody:
        pw = pwd.getpwnam("nobody"); os.setgid(pw.pw_gid); os.setuid(pw.pw_uid)
    l.close()
    if mode != "none":
        if mode == "v6":
            o = socket.socket(socket.AF_INET6); o.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            o.bind(("::1", port))
        else:
            o = socket.socket(); o.bind(("127.0.0.2", port))
        time.sleep(0.5)
        o.listen(8)
    time.sleep(1.0)
    bad = 0
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port)); c.settimeout(5)
        c.sendall(b"hello %d\n" % i)
        b = b""
        try:
            while not b.endswith(b"\n"):
                x = c.recv(4096)
                if not x:
                    break
                b += x
        except OSError as e:
            b += repr(e).encode()
        if b != b"got hello %d\n" % i:
            bad += 1
            if bad <= 2:
                print("wrong:", b[:40], file=sys.stderr)
        c.close()
    print("alias %s wrong %d/%d" % (mode, bad, n))
    os._exit(0)
time.sleep(0.2)
os.set_inheritable(l.fileno(), True)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
os.execve(sys.executable, [sys.executable, a[0], "serve", str(l.fileno())], env)
