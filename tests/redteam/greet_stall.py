#!/usr/bin/env python3
"""A single-threaded event-loop server that greets first (SMTP, FTP, MySQL style: a
non-blocking send right after accept) and two clients in other processes: a quiet one that
connects non-blocking and then does nothing for a while (a stopped or hostile local process),
then an honest one. Prints how long the server's non-blocking send took and how long the
honest client waited for its greeting. Under TCP a non-blocking send never waits."""
import os, select, socket, sys, time

QUIET = float(sys.argv[1]) if len(sys.argv) > 1 else 6
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0)); l.listen(16); l.setblocking(False)
port = l.getsockname()[1]

def quiet_client():
    c = socket.socket(); c.setblocking(False)
    c.connect_ex(("127.0.0.1", port))
    select.select([], [c], [], 5)
    time.sleep(QUIET)
    os._exit(0)

def honest_client():
    t0 = time.monotonic()
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    g = c.recv(100)
    print("honest client: greeting %r after %.2f s" % (g, time.monotonic() - t0), flush=True)
    os._exit(0)

q = os.fork()
if q == 0:
    l.close(); quiet_client()
ep = select.epoll(); ep.register(l.fileno(), select.EPOLLIN)
served = 0; h = None; conns = []
t_end = time.monotonic() + 15
while served < 2 and time.monotonic() < t_end:
    for fd, ev in ep.poll(1):
        while True:
            try:
                s, _ = l.accept()
            except BlockingIOError:
                break
            s.setblocking(False)
            t0 = time.monotonic()
            try:
                n = s.send(b"220 hello\r\n")
            except OSError as e:
                n = e
            print("conn %d: non-blocking send = %r took %.2f s" % (served, n, time.monotonic() - t0), flush=True)
            conns.append(s); served += 1
            if h is None:
                time.sleep(0.2)
                h = os.fork()
                if h == 0:
                    l.close(); honest_client()
os.waitpid(h, 0)
os.kill(q, 9); os.waitpid(q, 0)
