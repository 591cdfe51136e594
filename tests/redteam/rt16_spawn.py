#!/usr/bin/env python3
# rt16: posix_spawn of `env -i wc -c` with file actions dup2(sock, 0) and close(sock) on an
# SMC-D connection whose peer sent N bytes and closed (the tail path through posix_spawn),
# optionally under RLIMIT_NOFILE=LIM. Expected: wc prints N-SKIP; then the parent reads
# what is left on its own number (TCP: the child consumed the stream: 0 bytes, EOF).
# usage: rt16_spawn.py PORT [N] [SKIP] [LIM]
import os, socket, sys, time, resource
port = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
SKIP = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
if len(sys.argv) > 4:
    lim = int(sys.argv[4]); resource.setrlimit(resource.RLIMIT_NOFILE, (lim, lim))
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(1)
pid = os.fork()
if pid == 0:
    c, _ = ls.accept(); ls.close(); c.sendall(b"x" * N); c.close(); os._exit(0)
ls.close()
s = socket.create_connection(("127.0.0.1", port))
got = 0
while got < SKIP:
    b = s.recv(SKIP - got)
    if not b: break
    got += len(b)
time.sleep(0.3)
fd = s.fileno()
sys.stdout.flush()
cp = os.posix_spawn("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {},
                    file_actions=[(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_CLOSE, fd)])
os.waitpid(cp, 0)
s.settimeout(3)
left = 0
try:
    while True:
        b = s.recv(65536)
        if not b: break
        left += len(b)
except Exception as e:
    print("parent:", type(e).__name__)
print("parent read after the child:", left)
