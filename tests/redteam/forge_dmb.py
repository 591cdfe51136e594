#!/usr/bin/env python3
"""Hostile peer: an SMC-D client (with the library) scribbles random bytes over both DMBs of
its connection to a victim echo server (forged cursors, flags, lengths), as any peer can. The
victim must neither crash nor hang: after the attack it must still serve an honest client.
Run under world.sh smc (everything preloaded). Victim = child process; attacker = this one."""
import ctypes, os, random, socket, subprocess, sys, threading, time
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
victim = subprocess.Popen([sys.executable, "-c", r"""
import socket, threading, sys
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(64)
print(l.getsockname()[1], flush=True)
def serve(c):
    try:
        while True:
            d = c.recv(65536)
            if not d: break
            c.sendall(d)
    except OSError as e:
        pass
    c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""], stdout=subprocess.PIPE)
port = int(victim.stdout.readline())
rnd = random.Random(SEED)
def memfd_maps():
    out = []
    for line in open("/proc/self/maps"):
        f = line.split()
        if len(f) >= 6 and "memfd:" in line and "rw" in f[1]:
            a, b = (int(x, 16) for x in f[0].split("-"))
            out.append((a, b, " ".join(f[5:])))
    return out
before = {m[2] for m in memfd_maps()}
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"hello"); assert s.recv(5) == b"hello"
maps = memfd_maps()
print("memfd mappings:", [(hex(a), b - a, n) for a, b, n in maps], flush=True)
s.setblocking(False)
for r in range(ROUNDS):
    for a, b, n in maps:
        # header page: random words; also some in the rings' first bytes
        for _ in range(2):
            off = rnd.randrange(0, int(os.environ.get("FORGE_SPAN", "40")) // 8) * 8
            v = rnd.choice([0, 1, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, rnd.getrandbits(64), rnd.getrandbits(20), (b - a), (b - a) + 1, 1 << 63])
            ctypes.c_uint64.from_address(a + off).value = v
    try: s.send(os.urandom(rnd.randrange(1, 5000)))
    except OSError: pass
    try: s.recv(65536)
    except OSError: pass
    time.sleep(0.002)
s.close()
print("attack done; honest client now", flush=True)
ok = [False]
def honest():
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(10)
    c.sendall(b"x" * 100000); got = b""
    while len(got) < 100000:
        d = c.recv(65536)
        if not d: break
        got += d
    ok[0] = got == b"x" * 100000
t = threading.Thread(target=honest, daemon=True); t.start(); t.join(15)
alive = victim.poll() is None
# CPU time of the victim (spinning threads?)
st = open(f"/proc/{victim.pid}/stat").read().split() if alive else None
time.sleep(1)
st2 = open(f"/proc/{victim.pid}/stat").read().split() if alive else None
cpu = (int(st2[13]) + int(st2[14]) - int(st[13]) - int(st[14])) if alive else -1
threads = len(os.listdir(f"/proc/{victim.pid}/task")) if alive else -1
print(f"victim threads {threads} (1 = every connection thread finished after its peer closed)")
print(f"victim alive={alive} rc={victim.returncode} honest_ok={ok[0]} victim_cpu_ticks_in_1s_idle={cpu}")
victim.kill()
sys.exit(0 if alive and ok[0] and cpu < 50 and threads == 1 else 1)
