# rt20_mix.py PORT [N] [ROUNDS]: one listener shared by a process WITHOUT the library (A, which
# made it) and a process WITH it (B: A forks and execs itself with LD_PRELOAD put back, the
# listener inherited: Server::Starter/einhorn generations, nginx USR2 from a build without
# the library to one with it, a prefork where only some workers run the library). Both accept
# and answer "<who> <line>". N clients (under the library) each send "req I\n" on a new
# connection, ROUNDS rounds. TCP: every answer ends in "req I". Prints the count of wrong.
import os, socket, sys, time
LIB = os.environ.get("RT_LIB", os.environ.get("LD_PRELOAD", ""))
def serve(l, who, until):
    l.settimeout(0.2)
    while time.time() < until:
        try:
            c, _ = l.accept()
        except (socket.timeout, TimeoutError):
            continue
        c.settimeout(5)
        b = b""
        try:
            while not b.endswith(b"\n"):
                x = c.recv(4096)
                if not x:
                    break
                b += x
            c.sendall(who.encode() + b" " + b)
        except OSError:
            pass
        c.close()
    os._exit(0)
def envw(lib):
    e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    e["RT_LIB"] = LIB
    if lib:
        e["LD_PRELOAD"] = lib
    return e
a = sys.argv
if a[1] == "B":
    serve(socket.socket(fileno=int(a[2])), "B", float(a[3]))
if a[1] == "C":
    port, n, rounds = int(a[2]), int(a[3]), int(a[4])
    bad = 0; tot = 0; served = {}
    for r in range(rounds):
        cs = []
        for i in range(n):
            c = socket.create_connection(("127.0.0.1", port)); c.settimeout(5)
            c.sendall(b"req %d\n" % i); cs.append(c)
        for i, c in enumerate(cs):
            b = b""
            try:
                while not b.endswith(b"\n"):
                    x = c.recv(4096)
                    if not x:
                        break
                    b += x
            except OSError as e:
                b += repr(e).encode()
            tot += 1
            who = b[:1].decode("latin1")
            served[who] = served.get(who, 0) + 1
            if not b.endswith(b"req %d\n" % i) or len(b) != len(b"X req %d\n" % i):
                bad += 1
                if bad <= 3:
                    print("wrong:", b[:60], file=sys.stderr)
            c.close()
    print("wrong %d/%d served=%s" % (bad, tot, sorted(served.items())))
    os._exit(0)
def mk(port):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port)); l.listen(128); os.set_inheritable(l.fileno(), True)
    return l
if a[1] != "A":
    # the launcher: A without the library. RT_MIXL=1: the launcher (under the library) makes
    # the listener first and A inherits it (withdrawn at the exec), as a supervisor would.
    fd = "-1"
    if os.environ.get("RT_MIXL") == "1":
        keep = mk(int(a[1])); fd = str(keep.fileno())
    # RT_ALIB=1: A keeps the library too (the legitimate shape: a library image's fork execs
    # another library image that shares the listener, as an nginx binary upgrade): SMC-D.
    os.execve(sys.executable, [sys.executable, a[0], "A"] + a[1:] + [fd],
              envw(LIB if os.environ.get("RT_ALIB") == "1" else ""))
port = int(a[2]); n = int(a[3]) if len(a) > 3 else 20; rounds = int(a[4]) if len(a) > 4 else 5
l = mk(port) if len(a) <= 5 or a[5] == "-1" else socket.socket(fileno=int(a[5]))
until = time.time() + 3 + rounds * 1.0
if os.fork() == 0:
    os.execve(sys.executable, [sys.executable, a[0], "B", str(l.fileno()), str(until)], envw(LIB))
time.sleep(0.5)
if os.fork() == 0:
    l.close()
    os.execve(sys.executable, [sys.executable, a[0], "C", str(port), str(n), str(rounds)], envw(LIB))
if os.fork() == 0:
    serve(l, "A", until)
l.close()
for _ in range(3):
    os.wait()
