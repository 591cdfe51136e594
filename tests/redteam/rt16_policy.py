#!/usr/bin/env python3
# rt16: the short-connection policy deciding between connections of one destination:
# K connections to one server (a forked process), each a request/echo of a few bytes,
# every 40th a 2 MiB bulk transfer both ways; every byte checked. Run with the policy on:
# world.sh smc env SMC_SHORT_BYTES=1048576 python3 rt16_policy.py PORT [K]
import os, socket, sys, hashlib
port = int(sys.argv[1]); K = int(sys.argv[2]) if len(sys.argv) > 2 else 600
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(64)
pid = os.fork()
if pid == 0:
    for _ in range(K):
        c, _ = ls.accept()
        while True:
            b = c.recv(65536)
            if not b: break
            c.sendall(b)
        c.close()
    os._exit(0)
ls.close()
bad = 0
for i in range(K):
    s = socket.create_connection(("127.0.0.1", port))
    n = 2 << 20 if i % 40 == 39 else 100
    msg = bytes((i + j) & 0xff for j in range(256)) * (n // 256 + 1)
    msg = msg[:n]
    got = bytearray(); sent = 0
    while sent < n:
        k = s.send(msg[sent:sent + 65536]); sent += k
        while len(got) < sent:
            got += s.recv(sent - len(got))
    s.shutdown(socket.SHUT_WR)
    if s.recv(1) != b"": bad += 1
    if bytes(got) != msg: bad += 1
    s.close()
os.waitpid(pid, 0)
print("connections", K, "bad", bad)
