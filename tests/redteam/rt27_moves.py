#!/usr/bin/python3
"""Red-team round 27: a random differential of one connection's ends moving across process
and fd boundaries while bytes are in flight.

Each end of a connection is owned by a worker process that the controller drives over a
SEQPACKET socketpair. A seeded random sequence writes and reads (exact counts, contents
checked), and moves ends: the owner forks and its child takes over, the owner passes the
socket by SCM_RIGHTS (through the controller) to a fresh worker, the owner execs itself with
the socket inherited, renumbers it with dup2, runs a subprocess that inherits it and exits,
shuts its writing. Every step's result is printed; run the same seeds with and without the
library (world.sh tcp|smc python3 rt27_moves.py SEED [SEED...]) and diff.
"""
import array
import hashlib
import json
import os
import random
import socket
import subprocess
import sys

ME = os.path.abspath(__file__)


def pattern(direction, off, n):
    """Bytes off..off+n of direction d's stream (deterministic)."""
    out = bytearray()
    block = off // 64
    while len(out) < (off % 64) + n:
        out += hashlib.sha256(f"{direction}:{block}".encode()).digest() * 2
        block += 1
    s = off % 64
    return bytes(out[s:s + n])


def send_fd(sock, msg, fd):
    sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def recv_fd(sock):
    msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4))
    fds = array.array("i")
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % 4)])
    return msg, (fds[0] if fds else -1)


# ── worker ────────────────────────────────────────────────────────────────────────────────


def worker(ctl_fd, conn_fd):
    ctl = socket.socket(fileno=ctl_fd)
    while True:
        msg = ctl.recv(65536)
        if not msg:
            os._exit(0)
        cmd = json.loads(msg)
        op = cmd["op"]
        reply = {"ok": True}
        try:
            if op == "connect":
                conn = bound(socket.socket(FAMILY))
                conn.connect((CONNECT_TO, cmd["port"]))
                conn_fd = conn.detach()
            elif op == "accept":
                lst = socket.socket(fileno=conn_fd)
                conn, _ = lst.accept()
                lst.close()
                conn_fd = conn.detach()
            elif op == "w":
                data = pattern(cmd["dir"], cmd["off"], cmd["n"])
                view = memoryview(data)
                while view:
                    k = os.write(conn_fd, view)
                    view = view[k:]
            elif op == "r":
                want = cmd["n"]
                got = bytearray()
                while len(got) < want:
                    b = os.read(conn_fd, want - len(got))
                    if not b:
                        break
                    got += b
                reply["n"] = len(got)
                reply["same"] = bytes(got) == pattern(cmd["dir"], cmd["off"], len(got))
            elif op == "eof":
                # The peer shut its writing and everything was read: a read says 0.
                reply["read"] = len(os.read(conn_fd, 100))
            elif op == "shut":
                socket.socket(fileno=os.dup(conn_fd)).shutdown(socket.SHUT_WR)
            elif op == "dup2":
                new = cmd["to"]
                os.dup2(conn_fd, new)
                os.close(conn_fd)
                conn_fd = new
            elif op == "sub":
                # A child that inherits the socket (or not) and exits without a word.
                keep = (conn_fd,) if cmd["inherit"] else ()
                subprocess.run([sys.executable, "-c", "pass"], pass_fds=keep, check=True)
            elif op == "fork":
                pid = os.fork()
                if pid:
                    os.close(conn_fd)
                    ctl.send(json.dumps({"ok": True}).encode())
                    os._exit(0)
                continue  # the child serves the next command
            elif op == "pass":
                send_fd(ctl, json.dumps({"ok": True}).encode(), conn_fd)
                os.close(conn_fd)
                os._exit(0)
            elif op == "exec":
                os.set_inheritable(conn_fd, True)
                os.set_inheritable(ctl.fileno(), True)
                ctl.send(json.dumps({"ok": True}).encode())
                os.execv(sys.executable, [sys.executable, ME, "worker", str(ctl.fileno()), str(conn_fd)])
            elif op == "close":
                os.close(conn_fd)
                ctl.send(json.dumps({"ok": True}).encode())
                os._exit(0)
        except OSError as e:
            reply = {"ok": False, "err": e.strerror or e.__class__.__name__}
        ctl.send(json.dumps(reply).encode())


# ── controller ────────────────────────────────────────────────────────────────────────────


class End:
    def __init__(self, name, sock):
        self.name = name
        self.ctl = None
        self.proc = None
        self.spawn(sock.fileno())
        sock.close()

    def start(self, **cmd):
        self.ctl.send(json.dumps(cmd).encode())

    def spawn(self, conn_fd):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, ME, "worker", str(b.fileno()), str(conn_fd)],
            pass_fds=(b.fileno(), conn_fd),
        )
        b.close()
        if self.ctl:
            self.ctl.close()
        self.ctl = a

    def call(self, **cmd):
        self.ctl.send(json.dumps(cmd).encode())
        if cmd["op"] == "pass":
            msg, fd = recv_fd(self.ctl)
            self.proc.wait()
            self.spawn(fd)
            os.close(fd)
            return json.loads(msg)
        msg = self.ctl.recv(65536)
        return json.loads(msg) if msg else {"ok": False, "err": "worker gone"}


# RT27_FAMILY=mapped: AF_INET6 sockets with IPv4-mapped addresses (a dual-stack listener on
# `::`, a client that connects to `::ffff:127.0.0.1`).
# RT27_FAMILY=bound: IPv4 sockets bound to `lo` (SO_BINDTODEVICE, as a link-local IPv6
# connection's ends are bound to their link).
MAPPED = os.environ.get("RT27_FAMILY") == "mapped"
BOUND = os.environ.get("RT27_FAMILY") == "bound"
FAMILY = socket.AF_INET6 if MAPPED else socket.AF_INET
CONNECT_TO = "::ffff:127.0.0.1" if MAPPED else "127.0.0.1"


def bound(sock):
    if BOUND:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    return sock


def listener():
    lst = bound(socket.socket(FAMILY))
    if MAPPED:
        lst.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    lst.bind(("::" if MAPPED else "127.0.0.1", 0))
    lst.listen()
    return lst


def run(seed):
    rnd = random.Random(seed)
    lst = listener()
    port = lst.getsockname()[1]
    # Each end starts in a process of its own: the server worker accepts on the listener it
    # inherits, the client worker connects. (Both ends made in one process and both handed
    # away is round 27's open item 3.)
    srv = End("s", lst)
    cli = End("c", socket.socket(FAMILY))
    srv.start(op="accept")
    cli.call(op="connect", port=port)
    srv.ctl.recv(65536)
    ends = {"c": cli, "s": srv}
    if os.environ.get("RT27_SETTLE", "1") == "1":
        # A round trip first: the handshake is decided before the ends move (a handshake
        # still under way when a vfork child execs with the socket is round 27's open item 2;
        # RT27_SETTLE=0 shows it).
        cli.call(op="w", dir="x", off=0, n=1)
        srv.call(op="r", dir="x", off=0, n=1)
        srv.call(op="w", dir="y", off=0, n=1)
        cli.call(op="r", dir="y", off=0, n=1)
    # Per direction (writer name): bytes written, bytes read, writing shut.
    wr = {"c": 0, "s": 0}
    rd = {"c": 0, "s": 0}
    shut = {"c": False, "s": False}
    peer = {"c": "s", "s": "c"}
    log = []
    # RT27_SEQ="s:pass,s:w,c:r": a fixed sequence (end:op) instead of the seed's.
    fixed = [x.split(":") for x in os.environ.get("RT27_SEQ", "").split(",") if x]
    for step in range(len(fixed) if fixed else rnd.randint(10, 30)):
        if fixed:
            who, op = fixed[step]
        else:
            who = rnd.choice("cs")
            op = rnd.choice(["w", "w", "w", "r", "r", "r", "fork", "pass", "exec", "dup2", "sub", "shut"])
        e = ends[who]
        if op == "w":
            if shut[who]:
                continue
            n = rnd.randint(1, 16384)
            n = min(n, 60000 - (wr[who] - rd[who]))
            if n <= 0:
                continue
            r = e.call(op="w", dir=who, off=wr[who], n=n)
            wr[who] += n
            log.append(f"{step} {who} write {n}: {r}")
        elif op == "r":
            unread = wr[peer[who]] - rd[peer[who]]
            if unread == 0:
                continue
            n = rnd.randint(1, unread)
            r = e.call(op="r", dir=peer[who], off=rd[peer[who]], n=n)
            rd[peer[who]] += r.get("n", 0)
            log.append(f"{step} {who} read {n}: {r}")
        elif op == "shut":
            if shut[who]:
                continue
            shut[who] = True
            log.append(f"{step} {who} shutdown WR: {e.call(op='shut')}")
        elif op == "dup2":
            log.append(f"{step} {who} dup2: {e.call(op='dup2', to=rnd.randint(20, 200))}")
        elif op == "sub":
            inherit = rnd.random() < 0.5
            log.append(f"{step} {who} subprocess inherit={inherit}: {e.call(op='sub', inherit=inherit)}")
        else:
            log.append(f"{step} {who} {op}: {e.call(op=op)}")
    # The end: each side reads what is left, shuts, reads EOF, closes.
    for who in "cs":
        unread = wr[peer[who]] - rd[peer[who]]
        if unread:
            r = ends[who].call(op="r", dir=peer[who], off=rd[peer[who]], n=unread)
            log.append(f"end {who} read the rest {unread}: {r}")
    for who in "cs":
        if not shut[who]:
            log.append(f"end {who} shutdown WR: {ends[who].call(op='shut')}")
    for who in "cs":
        log.append(f"end {who} reads EOF: {ends[who].call(op='eof')}")
        log.append(f"end {who} close: {ends[who].call(op='close')}")
    for e in ends.values():
        e.ctl.close()
    for line in log:
        print(f"seed {seed}: {line}")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
    else:
        for a in sys.argv[1:]:
            if "-" in a:
                lo, hi = a.split("-")
                for seed in range(int(lo), int(hi) + 1):
                    run(seed)
            else:
                run(int(a))
