#!/usr/bin/env python3
"""Round 11: a selectors (epoll, level-triggered) echo server with a non-blocking listener and
20 client threads of the same process, ROUNDS times in one process. Counts the times the
selector reported the listener readable and accept() said EAGAIN (TCP: never; an accept queue
entry stays until accepted), and the echoes that came back intact.
usage: rt11_sel.py [ROUNDS] [CLIENTS] [asyncio]   (asyncio: an asyncio echo run before each round)"""
import hashlib, selectors, socket, sys, threading, time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20
spurious = 0
okt = 0
evlog = []

def one_round(r):
    global spurious, okt
    sel = selectors.DefaultSelector()
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(64)
    l.setblocking(False)
    sel.register(l, selectors.EVENT_READ, None)
    port = l.getsockname()[1]
    results = {}
    def cli(i):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(10)
        data = bytes([i % 251]) * 100000
        t = threading.Thread(target=s.sendall, args=(data,)); t.start()
        got = bytearray()
        try:
            while len(got) < len(data):
                d = s.recv(65536)
                if not d: break
                got += d
        except OSError:
            pass
        t.join(); s.close()
        results[i] = bytes(got) == data
    ths = [threading.Thread(target=cli, args=(i,)) for i in range(N)]
    for t in ths: t.start()
    deadline = time.time() + 10
    while len(results) < N and time.time() < deadline:
        for key, ev in sel.select(0.5):
            if key.data is None:
                try:
                    c, _ = l.accept()
                except BlockingIOError:
                    spurious += 1
                    evlog.append((r, ev, len(sel.get_map())))
                    continue
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ, bytearray())
                continue
            c = key.fileobj
            if ev & selectors.EVENT_READ:
                try:
                    d = c.recv(65536)
                except BlockingIOError:
                    d = None
                except OSError:
                    d = b""
                if d == b"":
                    sel.unregister(c); c.close(); continue
                if d:
                    key.data.extend(d)
                    sel.modify(c, selectors.EVENT_READ | selectors.EVENT_WRITE, key.data)
            if ev & selectors.EVENT_WRITE and key.data:
                try:
                    n = c.send(key.data)
                except BlockingIOError:
                    n = 0
                del key.data[:n]
                if not key.data:
                    sel.modify(c, selectors.EVENT_READ, key.data)
    for t in ths: t.join(5)
    okt += sum(results.values())
    for k in list(sel.get_map().values()):
        k.fileobj.close()
    sel.close()

ASYNC = len(sys.argv) > 3 and sys.argv[3] == "asyncio"
if ASYNC:
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rt11_py
for r in range(ROUNDS):
    if ASYNC:
        rt11_py.asyncio_echo()   # an asyncio loop (its own epoll set) runs and closes first
    one_round(r)
print("echoes ok", okt, "of", ROUNDS * N)
print("listener readable but accept EAGAIN", "never" if not spurious else "yes")
print("spurious", spurious, evlog[:5], file=sys.stderr)
