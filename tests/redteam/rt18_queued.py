# rt18_queued.py PORT [N]: a listener made under the library, N clients (a child, under the
# library) connect and send "hello" + SHUT_WR while no one accepts; then the parent execs an
# image without the library (LD_PRELOAD removed, as inetd's environment laundering does) that
# accepts the queued connections and answers what it read (first 40 bytes). TCP: "hello" N
# times. RT17_SLEEP: seconds before the exec (0.02).
import os, socket, sys, time
if sys.argv[1] == "serve":
    l = socket.socket(fileno=int(sys.argv[2]))
    l.settimeout(3)
    for _ in range(int(sys.argv[3])):
        c, _ = l.accept()
        c.settimeout(5)
        b = b""
        while True:
            x = c.recv(65536)
            if not x:
                break
            b += x
        print("server read", len(b), b[:8], file=sys.stderr)
        c.sendall(b[:40])
        c.close()
    try:
        os.waitpid(-1, 0)  # the clients' child (exec kept our pid)
    except ChildProcessError:
        pass
    sys.exit(0)
port, n = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(64)
pid = os.fork()
if pid == 0:
    l.close()
    cs = []
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"hello")
        c.shutdown(socket.SHUT_WR)
        cs.append(c)
    for c in cs:
        b = b""
        c.settimeout(10)
        try:
            while True:
                x = c.recv(100)
                if not x:
                    break
                b += x
        except OSError as e:
            b += repr(e).encode()
        print(b)
    os._exit(0)
time.sleep(float(os.environ.get("RT17_SLEEP", "0.02")))
os.set_inheritable(l.fileno(), True)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
os.execve(sys.executable, [sys.executable, sys.argv[0], "serve", str(l.fileno()), str(n)], env)
