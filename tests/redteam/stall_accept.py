#!/usr/bin/env python3
"""A same-host client that connects to an SMC listener and never speaks (no library:
its SYN is marked by the eBPF programs of the attached cgroup) holds up a *blocking*
accept loop of the victim. Thread-per-connection echo server, N silent attacker
connections (a separate process without LD_PRELOAD), then one honest client.
TCP: the honest client is served at once. Fails if it takes longer than 1.5 s."""
import os, socket, subprocess, sys, threading, time
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(128)
port = l.getsockname()[1]
def serve(c):
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d)
    c.close()
def acceptor():
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=acceptor, daemon=True).start()
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
att = subprocess.Popen([sys.executable, "-c", f"""
import socket, time, sys
def c():
    s = socket.socket()
    s.setsockopt(0x534d4300, 1, (1).to_bytes(4, 'little'))  # SMC_SO_ENABLE: announce SMC, then stay silent
    s.connect(('127.0.0.1', {port}))
    return s
s = [c() for _ in range({N})]
print('attacker: {N} silent connections', flush=True)
time.sleep(60)
"""], env=env, stdout=subprocess.PIPE)
att.stdout.readline()
t = time.monotonic()
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"ping"); r = c.recv(16)
dt = time.monotonic() - t
att.kill()
print(f"honest client echo {r!r} after {dt:.2f} s (attacker connections {N})")
sys.exit(0 if r == b"ping" and dt < 1.5 else 1)
