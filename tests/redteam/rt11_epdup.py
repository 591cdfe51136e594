#!/usr/bin/env python3
"""Round 11: one epoll_wait returns the same fd twice. An epoll set holds a readable pipe
(level-triggered) and a non-blocking client socket whose handshake is under way; the program
polls with timeout 0 until the client is writable. TCP: each fd at most once per call.
usage: rt11_epdup.py [ROUNDS]"""
import collections, os, select, socket, sys, threading

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(128)
port = l.getsockname()[1]
def srv():
    while True:
        c, _ = l.accept()
        d = c.recv(10)
        c.close()
        if d == b"stop":
            return
t = threading.Thread(target=srv); t.start()
r, w = os.pipe()
os.write(w, b"x")
dups = 0
calls = 0
for i in range(ROUNDS):
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT)
    for _ in range(100000):
        evs = ep.poll(0, 8)
        calls += 1
        cnt = collections.Counter(fd for fd, _ in evs)
        if any(v > 1 for v in cnt.values()):
            dups += 1
            if dups <= 3:
                print("dup", evs, file=sys.stderr)
        if any(fd == c.fileno() and e & select.EPOLLOUT for fd, e in evs):
            break
    c.setblocking(True)
    c.sendall(b"hi")
    ep.close()
    c.close()
s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"stop"); s.close()
t.join()
print("epoll_wait calls returning one fd twice:", "none" if dups == 0 else "some")
print("dups", dups, "calls", calls, file=sys.stderr)
