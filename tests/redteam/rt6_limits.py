#!/usr/bin/env python3
"""red6: uid nobody pins what it can in the daemon (DMBs with a state page each, parked PAIRs),
then root asks for a DMB, in the same cgroup and in another one.

Run as root: tests/redteam/world.sh tcp python3 tests/redteam/rt6_limits.py
(DARGS="--shelve-after-ms 0" to shelve every file at once.)

nobody (setpriv, in world.sh's cgroup) opens one TCP connection and sends OP_REGISTER with
that socket and a fresh sealed 4 KiB memfd (a state page) until refused; then OP_PAIR records
that park (a socket each, no peer) until refused. Printed: why it stopped, the daemon's
descriptors and mappings; then root's OP_REGISTER from the same cgroup and from the cgroup
above it.
"""
import array
import os
import socket
import struct
import subprocess
import sys
import time

SOCK = os.environ["SMC_CTL_SOCK"]
MAGIC = 0x49434D53
ST = {0: "Ok", 6: "MaxDmb", 7: "QuotaDmbs", 8: "QuotaBytes", 9: "Mem", 16: "NoPeer"}
seq = [0]


def send(d, op, payload, fds):
    seq[0] += 1
    rec = struct.pack("<IHHII", MAGIC, 1, op, len(payload), seq[0]) + payload
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    d.sendmsg([rec], anc)
    return seq[0]


def recv(d):
    msg, anc, _, _ = d.recvmsg(512, socket.CMSG_SPACE(4 * 4))
    fds = []
    for lvl, typ, data in anc:
        a = array.array("i")
        a.frombytes(data[: len(data) - len(data) % 4])
        fds.extend(a)
    _, _, op, _, s = struct.unpack("<IHHII", msg[:16])
    st, det = struct.unpack("<II", msg[16:24])
    return s, st, det, fds


def state_page():
    f = os.memfd_create("st", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(f, 4096)
    import fcntl
    fcntl.fcntl(f, 1033, 0x0002 | 0x0004)  # F_ADD_SEALS: SHRINK | GROW
    return f


def tcp_pair():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen()
    a = socket.create_connection(l.getsockname())
    b, _ = l.accept()
    return l, a, b


def daemon_pid():
    out = subprocess.run(["fuser", SOCK], capture_output=True, text=True)
    for p in (out.stdout + " " + out.stderr).split():
        p = p.strip(":")
        if p.isdigit():
            return int(p)
    # fall back: the smc-ctl daemon with this socket
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open("/proc/%s/cmdline" % p, "rb").read()
            except OSError:
                continue
            if b"daemon" in cmd and SOCK.encode() in cmd:
                return int(p)
    return None


def daemon_usage():
    p = daemon_pid()
    if not p:
        return "?"
    fds = len(os.listdir("/proc/%d/fd" % p))
    maps = sum(1 for _ in open("/proc/%d/maps" % p))
    lim = [l for l in open("/proc/%d/limits" % p) if l.startswith("Max open files")][0].split()[3:5]
    return "daemon: %d fds (limit %s), %d mappings" % (fds, "/".join(lim), maps)


def register(d, sock, page):
    send(d, 2, bytes([0, 0, 0, 0, 0, 0, 0, 0]), [sock] + ([page] if page is not None else []))
    s, st, det, fds = recv(d)
    for f in fds:
        os.close(f)
    return st, det


def hog():
    l, a, b = tcp_pair()
    d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.connect(SOCK)
    send(d, 1, b"", [])
    recv(d)
    n = 0
    t0 = time.time()
    while True:
        p = state_page()
        st, det = register(d, b.fileno(), p)
        os.close(p)
        if st != 0:
            break
        n += 1
    print("nobody: %d DMBs registered with a state page each in %.1f s, then %s (detail %d)"
          % (n, time.time() - t0, ST.get(st, st), det))
    # Parked PAIRs: one socket pair each, a peer that never asks (park 10 s).
    parked = 0
    socks = []
    for i in range(5000):
        try:
            l2, x, y = tcp_pair()
        except OSError:
            break
        socks += [l2, x, y]
        send(d, 12, struct.pack("<BBHIQ", 0, 0, 0, 10000, 0), [x.fileno()])
        d.settimeout(0.002)
        try:
            s, st, det, fds = recv(d)
            print("nobody: PAIR %d answered at once: %s" % (i, ST.get(st, st)))
            break
        except (socket.timeout, BlockingIOError):
            parked += 1
        finally:
            d.settimeout(None)
    print("nobody: %d PAIR requests parked" % parked)
    sys.stdout.flush()
    os.write(1, b"")
    sys.stdin.readline()


def root_register(where):
    l, a, b = tcp_pair()
    d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.connect(SOCK)
    send(d, 1, b"", [])
    recv(d)
    st, det = register(d, b.fileno(), None)
    print("root (%s): OP_REGISTER -> %s (detail %d)" % (where, ST.get(st, st), det))
    sys.stdout.flush()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "hog":
        hog()
        return
    print(daemon_usage())
    h = subprocess.Popen(["prlimit", "--nofile=20000:20000", "setpriv", "--reuid", "65534",
                          "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                          os.path.abspath(__file__), "hog"],
                         stdin=subprocess.PIPE, text=True)
    # Wait until it has parked its PAIRs (it prints, then waits on stdin).
    for _ in range(600):
        time.sleep(0.5)
        if h.poll() is not None:
            break
        p = daemon_pid()
        # crude: when the daemon's fd count stops growing
        u1 = daemon_usage()
        time.sleep(0.5)
        if daemon_usage() == u1:
            break
    print(daemon_usage())
    sys.stdout.flush()
    root_register("same cgroup as nobody")
    pid = os.fork()
    if pid == 0:
        cg = os.path.dirname(os.environ["RT_CG"])
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        root_register("the parent cgroup")
        os._exit(0)
    os.waitpid(pid, 0)
    h.stdin.write("\n")
    h.stdin.flush()
    h.wait()
    time.sleep(0.5)
    print("after nobody left:", daemon_usage())


main()
