#!/usr/bin/env python3
# Round 13: an SMC connection passed with SCM_RIGHTS to a process of ANOTHER user that does not
# run the library. The sender's verdict (lifecycle::receiver_runs_library) reads the receiver's
# /proc/<pid>/maps, which an unprivileged sender cannot read for another uid: "not known" is
# taken as "runs the library" and the connection is passed as SMC-D.
# usage (root, under world.sh smc|tcp): python3 rt13_scm_user.py PORT N [RECV_UID]
#   The sender (uid 65534, with the library as world.sh gives it) listens on PORT; its clients
#   (uid 65534, with the library) send a line; the sender accepts each connection and passes it
#   over a Unix socket to the receiver (RECV_UID, default 1 = daemon; 65534 for the control),
#   which runs without LD_PRELOAD, reads the line and answers it upper-cased. Its Unix socket is
#   in RT_DIR.PID (default /tmp/rt13scm). Run by lifecycle_smc.rs
#   (a_connection_passed_to_another_users_process_without_the_library_continues_on_tcp).
import os, socket, sys, array, time, subprocess
ME = os.path.abspath(__file__)
PY = "/usr/bin/python3"  # readable by the other users (not a pyenv under /root)

def recv_fd(u):
    fds = array.array("i")
    msg, anc, _, _ = u.recvmsg(1, socket.CMSG_LEN(4))
    for lvl, typ, data in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[:4])
    return fds[0] if fds else -1

def receiver(path, n):
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.connect(path)
    for _ in range(n):
        fd = recv_fd(u)
        if fd < 0:
            break
        c = socket.socket(fileno=fd)
        c.settimeout(3)
        try:
            line = c.recv(100)
            c.sendall(line.upper())
        except Exception as e:
            print("receiver:", repr(e), flush=True)
        c.close()

def sender(port, path, n):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port)); l.listen(64)
    us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    us.bind(path); os.chmod(path, 0o777); us.listen(1)
    print("ready", flush=True)
    u, _ = us.accept()
    for _ in range(n):
        c, _ = l.accept()
        u.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [c.fileno()]))])
        c.close()

def clients(port, n):
    ok = 0
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        want = b"hello %d\n" % i
        s.sendall(want)
        try:
            got = s.recv(100)
        except Exception as e:
            got = repr(e).encode()
        if got == want.upper():
            ok += 1
        else:
            print("client %d: got %r" % (i, got), flush=True)
        s.close()
    print("clients: %d of %d answered right" % (ok, n), flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "recv":
        receiver(sys.argv[2], int(sys.argv[3])); sys.exit(0)
    if sys.argv[1] == "send":
        sender(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])); sys.exit(0)
    if sys.argv[1] == "cli":
        clients(int(sys.argv[2]), int(sys.argv[3])); sys.exit(0)
    port, n = int(sys.argv[1]), int(sys.argv[2])
    ruid = sys.argv[3] if len(sys.argv) > 3 else "1"
    d = os.environ.get("RT_DIR", "/tmp/rt13scm") + ".%d" % os.getpid()
    os.mkdir(d); os.chmod(d, 0o777)
    path = d + "/u.sock"
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    snd = subprocess.Popen(nobody + [PY, ME, "send", str(port), path, str(n)], stdout=subprocess.PIPE)
    snd.stdout.readline()
    rcv = subprocess.Popen(["setpriv", "--reuid=" + ruid, "--regid=" + ruid, "--clear-groups",
                            "env", "-u", "LD_PRELOAD", PY, ME, "recv", path, str(n)])
    subprocess.run(nobody + [PY, ME, "cli", str(port), str(n)])
    for p in (snd, rcv):
        try: p.wait(5)
        except Exception: p.kill(); p.wait()
    os.unlink(path); os.rmdir(d)
