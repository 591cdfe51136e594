#!/usr/bin/python3
"""Red team round 23: another tenant's IPv6-only wildcard listener announces SMC for a
listener without the library of the same port.

usage: rt23_v6announce.py MODE   (under tests/redteam/world.sh smc: the attached cgroup)

- the victim server (root): plain TCP, *without* the library (LD_PRELOAD removed, it never
  opts in), in the attached cgroup, listens on 127.0.0.1:PORT and prints the first bytes each
  connection brings;
- the attacker (uid nobody, same attached cgroup, no library): with MODE `attack`, binds
  [::]:PORT with IPV6_V6ONLY (allowed next to the victim's IPv4 listener), opts in
  (SMC_SO_ENABLE) and listens: the sock_ops program records the key (::, PORT) as announcing,
  and a wildcard `::` key covers every address of the port. With MODE `none`, nothing;
- a client under the library (this process's child, root) connects N=5 times and sends
  "hello\\n", then reads the echo.

Prints `V6ANNOUNCE mode=M got=[...]` with what the victim read first on each connection:
`b'hello\\n'` every time, or the client's CLC Proposal (`b'\\xe2\\xd4\\xc3\\xd9...'`).
"""
import os
import socket
import subprocess
import sys

MODE = sys.argv[1]
N = 5
SOL_SMC_BPF = 0x534D4300
SMC_SO_ENABLE = 1

env = dict(os.environ)
env.pop("LD_PRELOAD", None)
# The victim: without the library.
srv = subprocess.Popen(
    ["/usr/bin/python3", "-c", r"""
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
for _ in range(int(sys.argv[1])):
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
""", str(N)], env=env, stdout=subprocess.PIPE, text=True)
port = int(srv.stdout.readline())

att = None
if MODE == "attack":
    att = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "/usr/bin/python3", "-c", r"""
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.setsockopt(0x534D4300, 1, 1)
s.bind(("::", int(sys.argv[1])))
s.listen(1)
print("LISTENING", flush=True)
sys.stdin.read()
""", str(port)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert att.stdout.readline().strip() == "LISTENING"

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
print(f"V6ANNOUNCE mode={MODE} got={got}", flush=True)
