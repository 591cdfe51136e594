#!/usr/bin/env python3
"""rt24: a hostile peer (uid nobody, same attached cgroup, the library too) stops itself
(SIGSTOP) in the middle of a connection with root's server. What root's calls do then, against
plain TCP: a non-blocking write loop until EAGAIN, shutdown(SHUT_WR), close, a second
connection served meanwhile, and the process's exit.

usage: rt24_stopped.py MODE   (as root, under world.sh smc|tcp)
 MODE full   the client reads 1 byte and stops: root fills the connection, shuts, closes
      idle   the client stops right after its first round trip: root writes 100 bytes, closes
Prints the time of each of root's steps (ms) and whether the other connection was served."""
import os, signal, socket, subprocess, sys, time

NOBODY = 65534


def client(port, mode):
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    s = socket.socket()  # no create_connection: its idna lookup needs files nobody may not read
    s.connect(("127.0.0.1", port))
    s.sendall(b"x")
    s.recv(1)
    print("stopping", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(30)


def main():
    if sys.argv[1] == "client":
        return client(int(sys.argv[2]), sys.argv[3])
    mode = sys.argv[1]
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    port = ls.getsockname()[1]
    c = subprocess.Popen([sys.executable, __file__, "client", str(port), mode], stdout=subprocess.PIPE, text=True)
    s, _ = ls.accept()
    s.recv(1)
    s.sendall(b"y")
    c.stdout.readline()
    time.sleep(0.2)
    out = []
    t = time.time()
    s.setblocking(False)
    n = 0
    if mode == "full":
        try:
            while True:
                n += s.send(b"z" * 65536)
        except BlockingIOError:
            pass
    else:
        n = s.send(b"z" * 100)
    out.append(f"wrote>0={n > 0} {1000 * (time.time() - t):.0f}ms")
    # another client (root) is served meanwhile
    t = time.time()
    o = socket.socket()
    o.connect(("127.0.0.1", port))
    o2, _ = ls.accept()
    o.sendall(b"ping")
    got = o2.recv(4)
    out.append(f"other {got!r} {1000 * (time.time() - t):.0f}ms")
    s.setblocking(True)
    t = time.time()
    s.shutdown(socket.SHUT_WR)
    out.append(f"shutdown {1000 * (time.time() - t):.0f}ms")
    t = time.time()
    s.close()
    out.append(f"close {1000 * (time.time() - t):.0f}ms")
    print(" ".join(out), flush=True)
    # the exit: a forked child holding nothing, and our own exit, timed by the parent shell
    c.kill()
    c.wait()


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {1000 * (time.time() - t0):.0f}ms", flush=True)
