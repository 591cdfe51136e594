#!/usr/bin/env python3
"""rt24: TLS over the data path (round 11 left openssl s_server/s_client not concluded).
A threaded TLS echo server (ssl.wrap_socket over the accepted socket) and N clients, each
sending M MiB in 100 kB pieces, each read back before the next; digests compared. Also one
asyncio TLS (start_server/open_connection with ssl) round of the same.
usage: rt24_tls.py CERT KEY [N] [MB]   (under world.sh smc|tcp)"""
import asyncio, hashlib, os, socket, ssl, sys, threading

cert, key = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 4
MB = int(sys.argv[4]) if len(sys.argv) > 4 else 8
sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); sctx.load_cert_chain(cert, key)
cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); cctx.check_hostname = False; cctx.verify_mode = ssl.CERT_NONE


def handle(c):
    try:
        t = sctx.wrap_socket(c, server_side=True)
        while True:
            d = t.recv(65536)
            if not d:
                break
            t.sendall(d)
        t.close()
    except OSError as e:
        print("server", type(e).__name__, e, flush=True)


def serve(ls):
    while True:
        c, _ = ls.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def client(port, i, res):
    data = os.urandom(MB << 20)
    s = socket.socket(); s.connect(("127.0.0.1", port))
    t = cctx.wrap_socket(s, server_hostname="localhost")
    # one thread per SSL object (OpenSSL's are not for concurrent use): a piece, then its echo
    got = hashlib.sha256(); n = [0]
    for off in range(0, len(data), 100000):
        piece = data[off:off + 100000]
        t.sendall(piece)
        want = len(piece)
        while want:
            d = t.recv(want)
            if not d:
                break
            got.update(d); n[0] += len(d); want -= len(d)
    res[i] = (n[0] == len(data) and got.digest() == hashlib.sha256(data).digest())
    t.close()


ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(16)
port = ls.getsockname()[1]
threading.Thread(target=serve, args=(ls,), daemon=True).start()
res = {}
ts = [threading.Thread(target=client, args=(port, i, res)) for i in range(N)]
[t.start() for t in ts]; [t.join(120) for t in ts]
print("threaded TLS clients right:", sum(1 for v in res.values() if v), "of", N, flush=True)


async def amain():
    async def h(r, w):
        while True:
            d = await r.read(65536)
            if not d:
                break
            w.write(d); await w.drain()
        w.close()
    srv = await asyncio.start_server(h, "127.0.0.1", 0, ssl=sctx)
    p = srv.sockets[0].getsockname()[1]
    ok = 0
    for _ in range(N):
        r, w = await asyncio.open_connection("127.0.0.1", p, ssl=cctx, server_hostname="localhost")
        data = os.urandom(1 << 20)
        w.write(data); await w.drain()
        got = await r.readexactly(len(data))
        ok += got == data
        w.close()
    print("asyncio TLS clients right:", ok, "of", N, flush=True)
    srv.close()

asyncio.run(amain())
