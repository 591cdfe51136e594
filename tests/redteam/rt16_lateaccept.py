#!/usr/bin/env python3
# rt16: a client that writes its request non-blocking right after a blocking connect,
# to a server that accepts late (busy for ACC s). Over TCP the request is queued at once
# (send returns its count, POLLOUT set). Prints the first send's result and how long
# poll(POLLOUT) took.  usage: rt16_lateaccept.py PORT [ACC] [POLL_MS]
import os, socket, sys, time, select
port = int(sys.argv[1]); acc = float(sys.argv[2]) if len(sys.argv) > 2 else 1.5
pms = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(8)
pid = os.fork()
if pid == 0:
    time.sleep(acc); c, _ = ls.accept(); b = c.recv(100); c.sendall(b"ok:" + b); time.sleep(0.5); os._exit(0)
ls.close()
s = socket.create_connection(("127.0.0.1", port)); s.setblocking(False)
try:
    first = s.send(b"GET")
except BlockingIOError:
    first = "EAGAIN"
t = time.time(); p = select.poll(); p.register(s, select.POLLOUT); ev = p.poll(pms)
print("first send", first, "poll(POLLOUT,%d ms)" % pms, ev, "after %.2f s" % (time.time() - t))
if first == "EAGAIN":
    s.setblocking(True); s.send(b"GET")
s.setblocking(True); print("reply", s.recv(100))
os.waitpid(pid, 0)
