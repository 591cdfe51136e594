#!/usr/bin/env python3
"""Round 11: socketserver.ThreadingTCPServer (blocking listener, serve_forever's poll loop,
one handler thread per connection) with 30 client threads of the same process connecting at
once. Prints 'ok N of 30'; every handler reads a decimal length line first, so a CLC message
read as data shows as 'bad header' (and the client then reads EOF)."""
import hashlib, socket, socketserver, sys, threading, time

class H(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline()
        try:
            n = int(line)
        except ValueError:
            print("bad header", line[:8].hex(), len(line), file=sys.stderr)
            return
        data = self.rfile.read(n)
        self.wfile.write(hashlib.sha256(data).hexdigest().encode() + b"\n")

srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
port = srv.server_address[1]
threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
ok = 0
lock = threading.Lock()
def cli(i):
    global ok
    data = bytes([i]) * (50000 + i)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"%d\n" % len(data) + data)
        r = s.makefile("rb").readline()
    if r.strip().decode() == hashlib.sha256(data).hexdigest():
        with lock:
            ok += 1
t0 = time.time()
ths = [threading.Thread(target=cli, args=(i,)) for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30)]
for t in ths: t.start()
for t in ths: t.join()
print("ok", ok, "of", len(ths))
print("%.2fs" % (time.time() - t0), file=sys.stderr)
