#!/usr/bin/env python3
"""A server that speaks first (SMTP/FTP/redis-sentinel style greeting) and its client in one
asyncio loop; prints what the client reads and how long it took (compare tcp vs smc)."""
import asyncio, sys, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3

async def handle(r, w):
    w.write(b"220 hello\r\n")
    await w.drain()
    line = await r.readline()
    w.write(b"250 " + line)
    await w.drain()
    w.close()

async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    for i in range(N):
        t0 = time.monotonic()
        r, w = await asyncio.open_connection("127.0.0.1", port)
        g = await r.readline()
        w.write(b"HELO %d\r\n" % i)
        a = await r.readline()
        e = await r.read()
        w.close()
        dt = time.monotonic() - t0
        print(i, g, a, e, "SLOW" if dt > 1 else "fast", flush=True)
    srv.close()

asyncio.run(main())
