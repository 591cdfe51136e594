#!/usr/bin/env python3
"""Round 11: Python standard-library servers and clients as a new user writes them.

usage: rt11_py.py SCENARIO   (rt11_py.py lists them)
Each scenario prints only deterministic lines (digests, counts, exit codes), so that the
output under `world.sh tcp` and `world.sh smc` can be diffed. Timing goes to stderr.
"""
import asyncio
import hashlib
import http.client
import http.server
import multiprocessing
import os
import selectors
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request

HOST = "127.0.0.1"


def blob(n, seed):
    out = bytearray()
    h = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        h = hashlib.sha256(h).digest()
        out += h
    return bytes(out[:n])


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def recv_all(s, n):
    buf = bytearray()
    while len(buf) < n:
        d = s.recv(min(65536, n - len(buf)))
        if not d:
            break
        buf += d
    return bytes(buf)


# ---------------------------------------------------------------- asyncio streams
def asyncio_echo():
    async def handle(r, w):
        while True:
            d = await r.read(65536)
            if not d:
                break
            w.write(d)
            await w.drain()
        w.close()
        await w.wait_closed()

    async def client(port, i):
        r, w = await asyncio.open_connection(HOST, port)
        data = blob(200_000 + i * 997, i)
        w.write(data)
        await w.drain()
        w.write_eof()
        got = await r.read()  # to EOF
        w.close()
        return digest(got) == digest(data), len(got)

    async def main():
        srv = await asyncio.start_server(handle, HOST, 0)
        port = srv.sockets[0].getsockname()[1]
        res = await asyncio.gather(*[client(port, i) for i in range(40)])
        srv.close()
        await srv.wait_closed()
        print("asyncio ok", sum(1 for ok, _ in res if ok), "of", len(res), "bytes", sum(n for _, n in res))

    asyncio.run(main())


# ---------------------------------------------------------------- selectors
def selectors_echo():
    sel = selectors.DefaultSelector()
    l = socket.socket()
    l.bind((HOST, 0))
    l.listen(64)
    l.setblocking(False)
    sel.register(l, selectors.EVENT_READ, None)
    port = l.getsockname()[1]
    N = 20
    results = {}

    def cli(i):
        s = socket.create_connection((HOST, port))
        data = blob(300_000, i + 100)
        t = threading.Thread(target=s.sendall, args=(data,))
        t.start()
        got = recv_all(s, len(data))
        t.join()
        s.close()
        results[i] = got == data

    ths = [threading.Thread(target=cli, args=(i,)) for i in range(N)]
    for t in ths:
        t.start()
    out = {}
    done = 0
    deadline = time.time() + 25
    while done < N and time.time() < deadline:
        for key, ev in sel.select(1):
            if key.data is None:
                c, _ = l.accept()
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ, bytearray())
                continue
            c = key.fileobj
            if ev & selectors.EVENT_READ:
                try:
                    d = c.recv(65536)
                except BlockingIOError:
                    continue
                if not d:
                    sel.unregister(c)
                    c.close()
                    continue
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
        done = len(results)
    for t in ths:
        t.join(5)
    print("selectors ok", sum(results.values()), "of", N)


# ---------------------------------------------------------------- socketserver
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        n = int(self.rfile.readline())
        data = self.rfile.read(n)
        self.wfile.write(b"%d %s\n" % (os.getpid() != MAINPID, digest(data).encode()))
        self.wfile.write(data[::-1])


MAINPID = os.getpid()


def socketserver_run(kind):
    cls = {"threading": socketserver.ThreadingTCPServer, "forking": socketserver.ForkingTCPServer}[kind]
    cls.allow_reuse_address = True
    srv = cls((HOST, 0), Echo)
    port = srv.server_address[1]
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    th.start()
    ok = 0
    lock = threading.Lock()

    def cli(i):
        nonlocal ok
        data = blob(50_000 + 1000 * i, i)
        with socket.create_connection((HOST, port)) as s:
            s.sendall(b"%d\n" % len(data) + data)
            f = s.makefile("rb")
            line = f.readline()
            rev = f.read(len(data))
            forked, d = line.split()
            if d.decode() == digest(data) and rev == data[::-1] and int(forked) == (kind == "forking"):
                with lock:
                    ok += 1

    ths = [threading.Thread(target=cli, args=(i,)) for i in range(30)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    srv.shutdown()
    srv.server_close()
    print(kind, "ok", ok, "of 30")


def socketserver_threading():
    socketserver_run("threading")


def socketserver_forking():
    socketserver_run("forking")


# ---------------------------------------------------------------- http.server + urllib
def http_server_urllib():
    d = "/tmp/rt11_http_%d" % os.getpid()
    os.makedirs(d, exist_ok=True)
    files = {}
    for i, n in enumerate([0, 1, 4096, 65536, 1_000_003, 5_000_000]):
        b = blob(n, i)
        with open(os.path.join(d, "f%d" % i), "wb") as f:
            f.write(b)
        files["f%d" % i] = digest(b)

    class H(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def __init__(self, *a, **k):
            super().__init__(*a, directory=d, **k)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer((HOST, 0), H)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    ok = 0
    for name, dg in sorted(files.items()):
        with urllib.request.urlopen("http://%s:%d/%s" % (HOST, port, name), timeout=10) as r:
            ok += digest(r.read()) == dg
    # keep-alive: one http.client connection, every file 3 times
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    ka = 0
    for _ in range(3):
        for name, dg in sorted(files.items()):
            conn.request("GET", "/" + name)
            r = conn.getresponse()
            ka += digest(r.read()) == dg
    conn.close()
    # pipelined by hand: 6 requests in one write, read all responses
    s = socket.create_connection((HOST, port))
    req = b"".join(b"GET /%s HTTP/1.1\r\nHost: x\r\n\r\n" % n.encode() for n in sorted(files))
    s.sendall(req)
    f = s.makefile("rb")
    pl = 0
    for name, dg in sorted(files.items()):
        status = f.readline()
        clen = 0
        while True:
            h = f.readline()
            if h in (b"\r\n", b""):
                break
            if h.lower().startswith(b"content-length"):
                clen = int(h.split(b":")[1])
        body = f.read(clen)
        pl += status.startswith(b"HTTP/1.0 200") or status.startswith(b"HTTP/1.1 200") and digest(body) == dg
    s.close()
    srv.shutdown()
    for n in files:
        os.unlink(os.path.join(d, n))
    os.rmdir(d)
    print("http urllib", ok, "keepalive", ka, "pipelined", pl)


# ---------------------------------------------------------------- subprocess pass_fds
CHILD = r"""
import os, socket, sys, hashlib
fd = int(sys.argv[1])
s = socket.socket(fileno=fd)
buf = bytearray()
while True:
    d = s.recv(65536)
    if not d: break
    buf += d
s.sendall(hashlib.sha256(buf).hexdigest().encode() + b" %d\n" % len(buf))
s.close()
"""


def subprocess_pass_fds():
    l = socket.socket()
    l.bind((HOST, 0))
    l.listen(16)
    port = l.getsockname()[1]
    ok = 0
    for i in range(8):
        data = blob(100_000 * (i + 1), i)
        res = {}

        def cli():
            s = socket.create_connection((HOST, port))
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            res["r"] = recv_all(s, 1000)
            s.close()

        t = threading.Thread(target=cli)
        t.start()
        c, _ = l.accept()
        if i % 2:
            # the parent reads the first bytes itself, then hands the socket over
            first = c.recv(10)
        else:
            first = b""
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(c.fileno())], pass_fds=[c.fileno()])
        c.close()
        p.wait()
        t.join()
        want = hashlib.sha256(data[len(first):]).hexdigest().encode() + b" %d\n" % (len(data) - len(first))
        ok += res.get("r") == want and p.returncode == 0
        if res.get("r") != want:
            print("mismatch", i, res.get("r"), file=sys.stderr)
    print("pass_fds ok", ok, "of 8")


# ---------------------------------------------------------------- multiprocessing shared listener
def mp_worker(l, q):
    n = 0
    while True:
        try:
            c, _ = l.accept()
        except OSError:
            break
        hdr = recv_all(c, 8)
        if hdr == b"STOPSTOP":
            c.close()
            break
        size = int(hdr)
        data = recv_all(c, size)
        c.sendall(digest(data).encode())
        c.close()
        n += 1
    q.put(n)


def multiprocessing_listener():
    ctx = multiprocessing.get_context("fork")
    l = socket.socket()
    l.bind((HOST, 0))
    l.listen(64)
    port = l.getsockname()[1]
    q = ctx.Queue()
    ws = [ctx.Process(target=mp_worker, args=(l, q)) for _ in range(4)]
    for w in ws:
        w.start()
    ok = 0
    lock = threading.Lock()

    def cli(i):
        nonlocal ok
        data = blob(20_000 + 3000 * i, i)
        s = socket.create_connection((HOST, port))
        s.sendall(b"%08d" % len(data) + data)
        r = recv_all(s, 16)
        s.close()
        with lock:
            ok += r.decode() == digest(data)

    ths = [threading.Thread(target=cli, args=(i,)) for i in range(60)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for _ in ws:
        s = socket.create_connection((HOST, port))
        s.sendall(b"STOPSTOP")
        s.close()
    total = sum(q.get(timeout=10) for _ in ws)
    for w in ws:
        w.join()
    print("mp ok", ok, "of 60 served", total, "exits", [w.exitcode for w in ws])


# ---------------------------------------------------------------- multiprocessing.connection
def mp_connection():
    from multiprocessing.connection import Client, Listener

    lst = Listener((HOST, 0), authkey=b"k")
    addr = lst.address

    def srv():
        for _ in range(5):
            c = lst.accept()
            while True:
                try:
                    m = c.recv_bytes()
                except EOFError:
                    break
                c.send_bytes(m[::-1])
            c.close()

    t = threading.Thread(target=srv)
    t.start()
    ok = 0
    for i in range(5):
        c = Client(addr, authkey=b"k")
        for j in range(50):
            m = blob(1 + 4000 * j, i * 100 + j)
            c.send_bytes(m)
            ok += c.recv_bytes() == m[::-1]
        c.close()
    t.join()
    lst.close()
    print("mp.connection ok", ok, "of 250")


SCEN = {
    f.__name__: f
    for f in [
        asyncio_echo,
        selectors_echo,
        socketserver_threading,
        socketserver_forking,
        http_server_urllib,
        subprocess_pass_fds,
        multiprocessing_listener,
        mp_connection,
    ]
}

if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(" ".join(SCEN))
        sys.exit(0)
    for name in sys.argv[1:]:
        t0 = time.time()
        SCEN[name]()
        sys.stdout.flush()
        print("%s %.2fs" % (name, time.time() - t0), file=sys.stderr)
