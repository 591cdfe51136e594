#!/usr/bin/python3
"""Red team round 23: descriptors of odd types in SCM_RIGHTS, and malformed records, to the
loopback-ism daemon ($SMC_CTL_SOCK), from uid nobody (run as root: the attacker part drops to
nobody after it made what needs root to measure).

usage: rt23_fds.py ROUNDS   (under tests/redteam/world.sh smc|tcp)

Each round sends, for every request op that takes a socket (REGISTER, ATTACH, ATTACH_PEER,
ADOPT, PAIR, LEAVE_SHORTCUT, SWEEP) and ops that take none (QUERY_GID, STATS, LIST), each fd
kind below (one fd; then the same fd twice; then 250 of them), and a few malformed records
(short, wrong magic, wrong length, an op beyond the last, the no-reply bit on an op that must
reply, 256+ bytes). Every record must be answered (or, with the no-reply bit, not), within
10 s. Kinds: pipe ends, a FIFO, epoll, eventfd, timerfd, pidfd, inotify, memfd (plain, sealed,
4 KiB sealed: a state page's shape), /dev/null, an O_PATH fd, a directory, AF_UNIX pairs of
each type, the daemon socket's own connection, UDP, an unbound TCP socket, a TCP listener, a
connected TCP pair (in this namespace), a TCP socket mid-connect to a blackhole, netlink.

Prints `FDS sent=N answered=A missing=M fds_before=B fds_after=C alive=1` (the daemon's open
descriptors before the first round and after the last, once its closer is done) and
`ROOT ok` when a root QUERY_GID is answered at the end.
"""
import ctypes
import os
import socket
import stat
import struct
import subprocess
import sys
import time

MAGIC = struct.unpack("<I", b"SMCI")[0]
ROUNDS = int(sys.argv[1])
CTL = os.environ.get("SMC_CTL_SOCK", "/run/smc/ctl.sock")
libc = ctypes.CDLL(None, use_errno=True)


def daemon_pid():
    # The daemon: the process started with `--socket CTL`.
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            a = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"daemon" in a and CTL.encode() in a:
            return int(p)
    return None


def nfds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rec(op, payload=b"", seq=1, magic=MAGIC, length=None, version=1):
    n = len(payload) if length is None else length
    return struct.pack("<IHHII", magic, version, op, n, seq) + payload


def kinds():
    k = {}
    r, w = os.pipe()
    k["pipe_r"], k["pipe_w"] = r, w
    fifo = f"/tmp/rt23-fifo-{os.getpid()}"
    os.mkfifo(fifo)
    k["fifo"] = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    os.unlink(fifo)
    import select
    ep = select.epoll()
    k["epoll"] = os.dup(ep.fileno())
    k["eventfd"] = os.eventfd(0)
    k["timerfd"] = libc.timerfd_create(1, 0)
    k["pidfd"] = os.pidfd_open(os.getpid())
    k["inotify"] = libc.inotify_init1(0)
    k["memfd"] = os.memfd_create("x")
    os.ftruncate(k["memfd"], 4096)
    m = os.memfd_create("y", os.MFD_ALLOW_SEALING)
    os.ftruncate(m, 4096)
    F_ADD_SEALS, SEAL_ALL = 1033, 0x1 | 0x2 | 0x4 | 0x8
    libc.fcntl(m, F_ADD_SEALS, SEAL_ALL)
    k["memfd_sealed_page"] = m
    m2 = os.memfd_create("z", os.MFD_ALLOW_SEALING)
    os.ftruncate(m2, 4096)
    libc.fcntl(m2, F_ADD_SEALS, 0x2)  # shrink only: the daemon's test of a state page
    k["memfd_shrink_sealed"] = m2
    k["devnull"] = os.open("/dev/null", os.O_RDWR)
    k["opath"] = os.open("/", os.O_PATH)
    k["dir"] = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
    for t, n in [(socket.SOCK_STREAM, "stream"), (socket.SOCK_DGRAM, "dgram"),
                 (socket.SOCK_SEQPACKET, "seqpacket")]:
        a, b = socket.socketpair(socket.AF_UNIX, t)
        k["unix_" + n] = a.detach()
        b.detach()
    d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.connect(CTL)
    k["daemon_conn"] = d.detach()
    k["udp"] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach()
    k["tcp_unbound"] = socket.socket().detach()
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    c = socket.socket()
    c.connect(ls.getsockname())
    a, _ = ls.accept()
    k["tcp_listener"] = ls.detach()
    k["tcp_client"] = c.detach()
    k["tcp_accepted"] = a.detach()
    sy = socket.socket()
    sy.setblocking(False)
    try:
        sy.connect(("192.0.2.1", 9))  # TEST-NET-1: no answer, stays SYN_SENT
    except OSError:
        pass
    k["tcp_syn_sent"] = sy.detach()
    k["tcp6"] = socket.socket(socket.AF_INET6).detach()
    k["netlink"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).detach()
    return {n: f for n, f in k.items() if f >= 0}


PAYLOADS = {
    1: b"",                               # QUERY_GID
    2: bytes([0, 0]) + bytes(6),          # REGISTER
    3: struct.pack("<Q", 0x1234),         # ATTACH (a guessed token)
    6: b"",                               # STATS
    8: struct.pack("<II", 0, 10),         # LIST
    10: b"",                              # ATTACH_PEER
    11: bytes([1, 0]) + bytes(6),         # ADOPT
    12: bytes([0, 0, 0, 0]) + struct.pack("<IQ", 10, 0),  # PAIR, park 10 ms
    14: b"",                              # LEAVE_SHORTCUT
    15: b"",                              # SWEEP
}


def attack():
    ks = kinds()
    d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.connect(CTL)
    d.settimeout(10)
    sent = answered = 0
    missing = []
    seq = 1

    def ask(data, fds, expect=True, what=""):
        nonlocal sent, answered, seq
        sent += 1
        try:
            if fds:
                socket.send_fds(d, [data], fds)
            else:
                d.send(data)
        except OSError as e:
            missing.append(f"{what}: send {e}")
            return
        if not expect:
            return
        try:
            r = d.recv(65536)
            if len(r) >= 16:
                answered += 1
            else:
                missing.append(f"{what}: short reply {r!r}")
        except socket.timeout:
            missing.append(f"{what}: no reply")

    for _ in range(ROUNDS):
        for op, p in PAYLOADS.items():
            for n, f in ks.items():
                for fds in ([f], [f, f], [f] * 250):
                    seq += 1
                    ask(rec(op, p, seq), fds, what=f"op {op} {n} x{len(fds)}")
        for what, data in [
            ("short", b"SMC"),
            ("magic", rec(1, b"", 2, magic=0x41414141)),
            ("length", rec(2, bytes(8), 3, length=200)),
            ("op", rec(99, b"", 4)),
            ("noreply", rec(1 | 0x8000, b"", 5)),
            ("oversized", rec(2, bytes(300), 6)),
            ("version", rec(1, b"", 7, version=77)),
        ]:
            ask(data, [ks["pipe_r"]], what=what)
    # Ops with the no-reply bit get no reply: a record after them is answered in turn.
    return sent, answered, missing


pid = daemon_pid()
before = nfds(pid) if pid else -1
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    sent, answered, missing = attack()
    os.write(w, f"{sent} {answered} {len(missing)} {missing[:5]!r}".encode())
    os._exit(0)
os.close(w)
res = b""
while True:
    b = os.read(r, 65536)
    if not b:
        break
    res += b
os.waitpid(child, 0)
sent, answered, nmiss, rest = res.decode().split(" ", 3)
# The daemon closes what it was given on closer threads: wait (bounded) for the count to settle.
after = -1
for _ in range(100):
    after = nfds(pid) if pid else -1
    if after <= before:
        break
    time.sleep(0.05)
if os.environ.get("RT_SHOWFDS"):
    for f in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            print("  fd", f, os.readlink(f"/proc/{pid}/fd/{f}"))
        except OSError:
            pass
alive = int(pid is not None and os.path.exists(f"/proc/{pid}"))
print(f"FDS sent={sent} answered={answered} missing={nmiss} fds_before={before} "
      f"fds_after={after} alive={alive} first_missing={rest}", flush=True)
d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
d.settimeout(10)
d.connect(CTL)
d.send(rec(1, b"", 1))
rep = d.recv(4096)
print("ROOT ok" if struct.unpack_from("<I", rep, 16)[0] == 0 else f"ROOT status {rep[16:20]!r}")
