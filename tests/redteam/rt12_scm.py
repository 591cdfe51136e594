#!/usr/bin/env python3
"""Round 12: SMC connections passed with SCM_RIGHTS over a socketpair made before the fork to
a receiver that does not run the library, in shapes the peer-inode lookup
(`receiver_runs_library`, `unix_peer::children_holding`) may not see.
usage: rt12_scm.py PORT CASE [N]
  direct    Popen of a receiver without LD_PRELOAD (pass_fds): a direct child
  sh        the receiver started by `sh -c 'receiver; true'` (a grandchild; sh keeps the fd)
  daemon    the receiver double-forked (its parent exits: nobody among our children)
  stale     a forked child (the library mapped) receives one connection, then execs the
            receiver without the library, which gets the next ones (within 1 s)
Each connection: the client sends "ping i", the receiver answers "pong i" and closes."""
import os, socket, subprocess, sys, time

RECV = r'''
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
while True:
    msg, fds, flags, addr = socket.recv_fds(s, 16, 4)
    if not fds:
        break
    for fd in fds:
        c = socket.socket(fileno=fd)
        c.settimeout(5)
        try:
            data = c.recv(100)
            c.sendall(data.replace(b"ping", b"pong"))
        except OSError as e:
            print("receiver:", e, flush=True)
        c.close()
'''

def main():
    port, case = int(sys.argv[1]), sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(16)
    a, b = socket.socketpair()
    os.set_inheritable(b.fileno(), True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = [sys.executable, "-c", RECV, str(b.fileno())]
    first = 0
    if case == "direct":
        p = subprocess.Popen(cmd, pass_fds=[b.fileno()], env=env)
    elif case == "sh":
        p = subprocess.Popen(["sh", "-c", "env -u LD_PRELOAD %s -c '%s' %s; true" % (cmd[0], RECV, cmd[3])],
                             pass_fds=[b.fileno()])
    elif case == "daemon":
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                os.execve(cmd[0], cmd, env)
            os._exit(0)
        os.waitpid(pid, 0)
        p = None
    elif case == "stale":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            # The library's copy: take the first connection, answer it, then exec the receiver.
            os.close(w)
            msg, fds, _, _ = socket.recv_fds(b, 16, 4)
            c = socket.socket(fileno=fds[0])
            c.sendall(c.recv(100).replace(b"ping", b"pong"))
            c.close()
            os.read(r, 1)
            os.execve(cmd[0], cmd, env)
        os.close(r)
        first = 1
        p = None
    else:
        sys.exit("unknown case")
    b.close()
    ok = 0
    for i in range(n + first):
        c = socket.create_connection(("127.0.0.1", port))
        s, _ = l.accept()
        socket.send_fds(a, [b"x"], [s.fileno()])
        s.close()
        c.settimeout(5)
        try:
            c.sendall(b"ping %d" % i)
            got = c.recv(100)
        except OSError as e:
            got = repr(e).encode()
        good = got == b"pong %d" % i
        ok += good
        if not good:
            print("conn %d: %r" % (i, got[:60]), flush=True)
        c.close()
        if case == "stale" and i == 0:
            os.write(w, b"x")
            time.sleep(0.2)  # the exec happens; the next connections go within the second
    print("%s: %d of %d answered" % (case, ok, n + first), flush=True)
    a.close()
    if p:
        p.wait()
    else:
        try:
            os.wait()
        except ChildProcessError:
            pass

main()
