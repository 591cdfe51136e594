# A client process (non-blocking connects, its Proposal sent at its poll) closes three
# connections before its server accepts them; then the server accepts and reads each: EOF.
# tests/tests/lifecycle_smc.rs a_client_that_closes_before_its_server_accepts_is_an_abandoned_handshake
import socket, os, select, sys
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
port = l.getsockname()[1]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    l.close()
    for i in range(3):
        c = socket.socket(); c.setblocking(False)
        try: c.connect(("127.0.0.1", port))
        except BlockingIOError: pass
        p = select.poll(); p.register(c, select.POLLOUT); p.poll(50)
        c.close()
    os.write(w, b"x"); os._exit(0)
os.read(r, 1); os.waitpid(pid, 0)
for i in range(3):
    s, _ = l.accept()
    try: print("read", s.recv(100))
    except OSError as e: print("read error", e)
    s.close()
