#!/usr/bin/env python3
"""As stall_accept.py, against an asyncio (non-blocking, event loop) server; the attacker
also sends the first bytes of a CLC Proposal (the eyecatcher) and then stays silent."""
import asyncio, os, socket, subprocess, sys, time
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
async def main():
    async def handle(r, w):
        try:
            while d := await r.read(4096):
                w.write(d); await w.drain()
        except Exception:
            pass
        w.close()
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    att = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
def c():
    s = socket.socket()
    try: s.setsockopt(0x534d4300, 1, (1).to_bytes(4, 'little'))
    except OSError: pass
    s.connect(('127.0.0.1', {port}))
    s.send(bytes([0xe2, 0xd4, 0xc3, 0xd9]))  # 'SMCR' eyecatcher of a Proposal, then silence
    return s
s = [c() for _ in range({N})]
print('ready', flush=True)
time.sleep(60)
"""], env=env, stdout=subprocess.PIPE)
    await asyncio.get_running_loop().run_in_executor(None, att.stdout.readline)
    t = time.monotonic()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"ping"); await w.drain()
    got = await asyncio.wait_for(r.read(16), 20)
    dt = time.monotonic() - t
    att.kill()
    print(f"honest client echo {got!r} after {dt:.2f} s (attacker connections {N})")
    return got == b"ping" and dt < 1.5
sys.exit(0 if asyncio.run(main()) else 1)
