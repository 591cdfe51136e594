#!/usr/bin/env python3
"""red3: idle clients against a server that speaks first (the withdrawn Accept), diffed with TCP.
usage: idle_greet.py MODE N [MAXIDLE]
MODE: talk (greet, read a request, answer), close (greet, close), linger0 (greet, close with
linger 0), shutwr (greet, shut the write side, read the request, answer), epoll (talk, epoll
server). Clients connect non-blocking, stay idle for a seeded random time up to MAXIDLE s, then
read. Prints one sorted line per connection (client and server view)."""
import os, random, select, selectors, socket, struct, sys, threading, time

MODE, N = sys.argv[1], int(sys.argv[2]); MAXIDLE = float(sys.argv[3]) if len(sys.argv) > 3 else 6
GREET = b"220 " + bytes(range(256)) * 4 + b"\r\n"  # holds 0x01, 0x02, EBCDIC eyecatcher bytes
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", 0)); l.listen(128)
addr = l.getsockname(); rp, wp = os.pipe()

def serve_one(s):
    res = []
    try:
        s.sendall(GREET)
        if MODE == "close": s.close(); return "sent+closed"
        if MODE == "linger0":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close(); return "sent+rst"
        if MODE == "shutwr": s.shutdown(socket.SHUT_WR)
        req = b""
        while not req.endswith(b"\n"):
            d = s.recv(100)
            if not d: break
            req += d
        if req: s.sendall(b"250 " + req)
        res.append("req=%r" % req[:20])
    except OSError as e:
        res.append("err=%s" % os.strerror(e.errno))
    s.close(); return " ".join(res)

def server():
    out = []; lock = threading.Lock()
    if MODE == "epoll":
        ep = select.epoll(); ep.register(l, select.EPOLLIN); st = {}; done = 0
        while done < N:
            for fd, ev in ep.poll(30):
                if fd == l.fileno():
                    s, _ = l.accept(); s.setblocking(False); st[s.fileno()] = [s, GREET, b"", []]
                    ep.register(s, select.EPOLLIN | select.EPOLLOUT)
                    continue
                b = st[fd]; s = b[0]; step = "?"; b[3].append("%x" % ev)
                try:
                    if ev & select.EPOLLOUT and b[1]:
                        step = "send"; n = s.send(b[1]); b[1] = b[1][n:]
                        if not b[1]: ep.modify(s, select.EPOLLIN)
                    if ev & ~select.EPOLLOUT:
                        step = "recv"; d = s.recv(100); b[2] += d
                        if not d or b[2].endswith(b"\n"):
                            if d: s.setblocking(True); s.sendall(b"250 " + b[2])
                            sp = sum(1 for x in b[3] if x.startswith("EAGAIN")); out.append("srv req=%r%s" % (b[2][:20], " spurious=%d" % sp if sp else "")); ep.unregister(s); s.close(); done += 1
                except BlockingIOError as e:
                    b[3].append("EAGAIN@" + step)
                    if os.environ.get("ROBUST"): continue
                    out.append("srv err=%s at %s events %s" % (os.strerror(e.errno), step, ",".join(b[3]))); ep.unregister(s); s.close(); done += 1
                except OSError as e:
                    out.append("srv err=%s at %s events %s" % (os.strerror(e.errno), step, ",".join(b[3]))); ep.unregister(s); s.close(); done += 1
        return out
    ths = []
    def one(s):
        r = serve_one(s)
        with lock: out.append("srv " + r)
    for i in range(N):
        s, _ = l.accept(); t = threading.Thread(target=one, args=(s,)); t.start(); ths.append(t)
    for t in ths: t.join()
    return out

pid = os.fork()
if pid == 0:
    os.close(rp); out = server(); os.write(wp, ("\n".join(out) + "\n").encode()); os._exit(0)
os.close(wp); l.close()
rnd = random.Random(int(os.environ.get("SEED", "7"))); res = []; lock = threading.Lock()
def client(i, idle):
    c = socket.socket(); c.setblocking(False); c.connect_ex(addr)
    time.sleep(idle); c.setblocking(True); c.settimeout(20); got = b""; err = ""
    try:
        while len(got) < len(GREET):
            d = c.recv(4096)
            if not d: break
            got += d
        if MODE in ("talk", "shutwr", "epoll") and got == GREET:
            c.sendall(b"HELO %d\n" % i)
            while True:
                d = c.recv(4096)
                if not d: break
                got += d
        else:
            d = c.recv(10); got += d
    except OSError as e:
        err = os.strerror(e.errno) if e.errno else "timeout"
    ok = got[:len(GREET)] == GREET
    with lock: res.append("cli greet_ok=%d rest=%r err=%s" % (ok, got[len(GREET):][:24] if ok else got[:24], err))
    c.close()
ths = [threading.Thread(target=client, args=(i, rnd.uniform(0, MAXIDLE))) for i in range(N)]
for t in ths: t.start()
for t in ths: t.join()
srv = b""
while True:
    d = os.read(rp, 65536)
    if not d: break
    srv += d
os.waitpid(pid, 0)
import re
lines = res + srv.decode().split("\n")
lines = [re.sub(r"HELO \d+", "HELO n", x) for x in lines if x]
from collections import Counter
for k, v in sorted(Counter(lines).items()): print(v, k)
