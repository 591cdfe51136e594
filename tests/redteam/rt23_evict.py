#!/usr/bin/python3
"""Red team round 23: another tenant evicts a withdrawn listener's entry from SMC_LISTENERS
(an LRU of 16 384 keys) and announces SMC for its port with an IPv6-only wildcard.

usage: rt23_evict.py MODE   (under tests/redteam/world.sh smc: an attached cgroup)

- the victim (root): a server under the library listens on 127.0.0.1:PORT (it announces SMC),
  then execs into an image without the library (env without LD_PRELOAD: the library withdraws
  the listener first, its SMC_LISTENERS entry says 0), which accepts N=5 connections and
  prints the first bytes of each;
- the attacker (uid nobody, the same attached cgroup, no library), MODE `attack`: binds
  [::]:PORT with IPV6_V6ONLY next to the victim's IPv4 listener, opts in and listens (key
  (::, PORT) announcing; `::` is a candidate of every address of the port), then, in a user
  and network namespace of its own, opts in and listens on K=20000 ports (each a new key;
  each connected to once by a client that opts in too, whose SYN-ACK looks the key up; closed
  at once, the entries stay), which evicts the victim's entry, then opts its [::]
  listener in again (a fresh entry). MODE `wild`: only the [::] listener; `flood`: only the
  flood; `none`: nothing;
- a client under the library (root) connects 5 times, sends "hello\\n", reads the echo.

Prints `EVICT mode=M got=[...]`: what the server without the library read first on each
connection: `b'hello\\n'`, or the client's CLC Proposal (`b'\\xe2\\xd4\\xc3\\xd9...'`).
"""
import os
import socket
import subprocess
import sys

MODE = sys.argv[1]
N = 5
K = int(os.environ.get("RT_K", "20000"))

env = dict(os.environ)
env.pop("LD_PRELOAD", None)

SERVER = r"""
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
print("EXECED", flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept()
    c.settimeout(10)
    try:
        b = c.recv(64)
    except OSError as e:
        b = repr(e).encode()
    print(repr(b), flush=True)
    try:
        c.sendall(b)
    except OSError:
        pass
    c.close()
"""

# The victim, under the library (this process's environment), then without it.
VICTIM = r"""
import os, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
sys.stdin.readline()
os.set_inheritable(s.fileno(), True)
env = dict(os.environ)
env.pop("LD_PRELOAD", None)
os.execve("/usr/bin/python3", ["python3", "-c", sys.argv[1], str(s.fileno()), sys.argv[2]], env)
"""
srv = subprocess.Popen(["/usr/bin/python3", "-c", VICTIM, SERVER, str(N)],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
port = int(srv.stdout.readline())
srv.stdin.write("go\n")
srv.stdin.flush()
assert srv.stdout.readline().strip() == "EXECED"

ATTACK = r"""
import ctypes, os, socket, sys
port, mode, k = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
SOL_SMC_BPF, SMC_SO_ENABLE = 0x534D4300, 1
w = None
if mode in ("attack", "wild"):
    w = socket.socket(socket.AF_INET6)
    w.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    w.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
    w.bind(("::", port))
    w.listen(1)
if mode in ("attack", "flood"):
  pids = []
  for cpu in range(int(os.environ.get("RT_PAR", "1"))):
    pid = os.fork()
    pids.append(pid)
    if pid == 0:
        os.sched_setaffinity(0, {cpu % os.cpu_count()})
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x40000000) != 0:
            print("unshare failed", ctypes.get_errno(), flush=True)
            os._exit(1)
        touch = os.environ.get("RT_TOUCH", "1") == "1"
        made = 0
        for p in range(1024, 1024 + k):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
            try:
                s.bind(("127.0.0.1", p))
                s.listen(1)
                made += 1
                if touch:
                    # A SYN with the option: the SYN-ACK's lookup marks the entry referenced
                    # (the LRU keeps referenced entries, the victim's among them, longest).
                    c = socket.socket()
                    c.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
                    c.connect(("127.0.0.1", p))
                    c.close()
            except OSError:
                pass
            s.close()
        print("FLOOD made=%d" % made, flush=True)
        os._exit(0)
  for pid in pids:
    os.waitpid(pid, 0)
  if w is not None:
      # A fresh entry for the wildcard (the flood may have evicted it too).
      w.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 0)
      w.setsockopt(SOL_SMC_BPF, SMC_SO_ENABLE, 1)
print("READY", flush=True)
sys.stdin.read()
"""
att = None
if MODE != "none":
    att = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "/usr/bin/python3", "-c", ATTACK, str(port), MODE, str(K)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    while True:
        line = att.stdout.readline()
        if not line or line.strip() == "READY":
            break
        print("attacker:", line.strip(), flush=True)

if os.environ.get("RT_DUMP"):
    import json
    d = json.loads(subprocess.run(["bpftool", "-j", "map", "dump", "name", "SMC_LISTENERS"],
                                  capture_output=True, text=True).stdout or "[]")
    pb = port.to_bytes(4, "little")
    mine = [e for e in d if bytes(int(x, 16) for x in e["key"][24:28]) == pb]
    print(f"DUMP entries={len(d)} port={port}:", [(e["key"][8:24], e["value"]) for e in mine], flush=True)

for i in range(N):
    c = socket.socket()
    c.settimeout(15)
    c.connect(("127.0.0.1", port))
    try:
        c.sendall(b"hello\n")
        c.recv(64)
    except OSError:
        pass
    c.close()

got = [srv.stdout.readline().strip() for _ in range(N)]
srv.wait()
if att:
    att.stdin.close()
    att.wait()
print(f"EVICT mode={MODE} got={got}", flush=True)
