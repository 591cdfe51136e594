#!/usr/bin/env python3
"""N threads connect at once to one threaded echo server and exchange 64 KiB each."""
import socket, sys, threading, time
N = int(sys.argv[1])
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1024); port = l.getsockname()[1]
def serve(c):
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d)
    c.close()
def acc():
    while True:
        c, _ = l.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=acc, daemon=True).start()
ok = [0]; bad = []
go = threading.Barrier(N)
def client(i):
    go.wait()
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
        msg = bytes([i % 251]) * 65536
        threading.Thread(target=c.sendall, args=(msg,), daemon=True).start()
        got = b""
        while len(got) < len(msg):
            d = c.recv(65536)
            if not d: break
            got += d
        c.close()
        if got == msg: ok[0] += 1
        else: bad.append((i, len(got)))
    except Exception as e:
        bad.append((i, repr(e)))
t = time.monotonic()
ts = [threading.Thread(target=client, args=(i,)) for i in range(N)]
[x.start() for x in ts]; [x.join() for x in ts]
print(f"{ok[0]}/{N} exact in {time.monotonic() - t:.2f} s; failures {bad[:5]}")
sys.exit(0 if ok[0] == N else 1)
