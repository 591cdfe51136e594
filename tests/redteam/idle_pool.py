#!/usr/bin/env python3
"""A connection pool: the client connects with a timeout (Python's create_connection: a
non-blocking connect and a poll), keeps the connection idle for IDLE seconds, then uses it
against a thread-per-connection echo server (socketserver) in another process.
usage: idle_pool.py IDLE [server_speaks_first]. Under TCP the idle connection just works."""
import os, socket, socketserver, sys, time

IDLE = float(sys.argv[1]) if len(sys.argv) > 1 else 5
GREET = len(sys.argv) > 2

class H(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            if GREET:
                self.request.sendall(b"hello\n")
            while True:
                d = self.request.recv(100)
                if not d:
                    break
                self.request.sendall(d)
        except OSError as e:
            print("server:", e, flush=True)

srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
port = srv.server_address[1]
pid = os.fork()
if pid == 0:
    srv.serve_forever()
    os._exit(0)
srv.socket.close()
c = socket.create_connection(("127.0.0.1", port), timeout=10)
time.sleep(IDLE)
try:
    if GREET:
        print("client greeting:", c.recv(100), flush=True)
    c.sendall(b"ping")
    print("client got:", c.recv(100), flush=True)
except OSError as e:
    print("client:", e, flush=True)
c.close()
os.kill(pid, 9)
