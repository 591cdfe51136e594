#!/usr/bin/env python3
"""Round 12: Python multiprocessing handing accepted connections to workers:
send_handle over a Pipe made before the start (fork and spawn), and socket objects pickled
through a Queue (DupFd: resource_sharer's SCM_RIGHTS). usage: rt12_mp.py PORT N"""
import multiprocessing as mp, os, socket, sys, time
from multiprocessing import reduction

def echo(c):
    c.settimeout(10)
    d = c.recv(100)
    c.sendall(d.replace(b"ping", b"pong"))
    c.close()

def w_handle(conn):
    while True:
        try:
            fd = reduction.recv_handle(conn)
        except EOFError:
            return
        if fd < 0:
            return
        echo(socket.socket(fileno=fd))

def w_queue(q):
    while True:
        s = q.get()
        if s is None:
            return
        echo(s)

def client(port, i):
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(10)
    c.sendall(b"ping %d" % i)
    try:
        return c.recv(100) == b"pong %d" % i
    except OSError:
        return False

def run(method, how, port, n):
    ctx = mp.get_context(method)
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(64)
    if how == "handle":
        a, b = ctx.Pipe()
        p = ctx.Process(target=w_handle, args=(b,))
    else:
        q = ctx.Queue()
        p = ctx.Process(target=w_queue, args=(q,))
    p.start()
    ok = 0
    t = time.monotonic()
    for i in range(n):
        # client in a thread-free way: connect, hand over the accepted end, then talk
        c = socket.create_connection(("127.0.0.1", port))
        s, _ = l.accept()
        if how == "handle":
            reduction.send_handle(a, s.fileno(), p.pid)
        else:
            q.put(s)
        c.settimeout(10)
        c.sendall(b"ping %d" % i)
        try:
            ok += c.recv(100) == b"pong %d" % i
        except OSError as e:
            print(method, how, i, e)
        s.close()
        c.close()
    if how == "handle":
        a.close()
    else:
        q.put(None)
    p.join(10)
    l.close()
    print("%s %s: %d of %d" % (method, how, ok, n), flush=True)
    print("%s %s: %.0f ms" % (method, how, (time.monotonic() - t) * 1e3), file=sys.stderr)

if __name__ == "__main__":
    port, n = int(sys.argv[1]), int(sys.argv[2])
    for k, (m, h) in enumerate([("fork", "handle"), ("spawn", "handle"), ("fork", "queue"), ("spawn", "queue"), ("forkserver", "queue")]):
        run(m, h, port + k, n)
