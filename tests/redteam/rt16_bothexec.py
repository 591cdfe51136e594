#!/usr/bin/env python3
# rt16: both ends exec an image without the library at the same moment, the connection
# at their stdio. A sends 50000 bytes, SHUT_WR, execs `env -i wc -c` (stdin = socket);
# B, without reading, execs `env -i sh -c 'wc -c >&2; head -c 100000 /dev/zero'`
# (stdin/stdout = socket). Expected: B prints 50000 (stderr), A prints 100000.
# Arg 'full': A fills the ring until EAGAIN first (B must print A's count).
import os, socket, sys, time
port = int(sys.argv[1])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(1)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    c, _ = ls.accept(); ls.close(); os.close(w)
    os.read(r, 1)
    os.dup2(c.fileno(), 0); os.dup2(c.fileno(), 1); c.close()
    os.execve("/usr/bin/env", ["env", "-i", "/bin/sh", "-c", "wc -c >&2; head -c 100000 /dev/zero"], {})
ls.close(); os.close(r)
s = socket.create_connection(("127.0.0.1", port))
if len(sys.argv) > 2 and sys.argv[2] == "full":
    # fill the ring (and the socket buffers): send until EAGAIN
    s.setblocking(False); tot = 0
    while True:
        try:
            tot += s.send(b"a" * 65536)
        except BlockingIOError:
            break
    s.setblocking(True); print("A sent", tot, file=sys.stderr, flush=True)
else:
    s.sendall(b"a" * 50000)
s.shutdown(socket.SHUT_WR)
os.write(w, b"x")
os.dup2(s.fileno(), 0); s.close()
sys.stdout.flush()
os.execve("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {})
