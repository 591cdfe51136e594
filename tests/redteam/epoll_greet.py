#!/usr/bin/env python3
"""red3: a server that speaks first polls an accepted socket for IN|OUT (level-triggered
epoll), sends its greeting when writable, and reports every event it sees until the client's
request: TCP reports EPOLLIN only once the request is there. usage: epoll_greet.py [IDLE] [EVENT]"""
import os, select, socket, sys, time
IDLE = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
pid = os.fork()
if pid == 0:
    c = socket.socket(); c.setblocking(False); c.connect_ex(l.getsockname())
    time.sleep(IDLE); c.setblocking(True); c.settimeout(10)
    g = c.recv(100); c.sendall(b"HELO\n"); r = c.recv(100); print("client got", g, r, flush=True); os._exit(0)
s, _ = l.accept(); s.setblocking(False)
ep = select.epoll(); ep.register(s, select.EPOLLIN | select.EPOLLOUT)
greeted = False; log = []
t0 = time.time()
while time.time() - t0 < 15:
    ev = ep.poll(5)
    if not ev: log.append("timeout"); break
    e = ev[0][1]; log.append("ev=%x" % e)
    if e & select.EPOLLOUT and not greeted:
        s.send(b"220 hi\r\n"); greeted = True; ep.modify(s, select.EPOLLIN); log.append("OUT->greet"); continue
    if e & select.EPOLLIN:
        try:
            d = s.recv(100); log.append("IN recv=%r" % d)
        except BlockingIOError:
            log.append("IN recv=EAGAIN"); time.sleep(0.05)
            if len(log) > 6: break
            continue
        if d: s.send(b"250 ok\r\n")
        break
os.waitpid(pid, 0)
print("server", log, flush=True)
