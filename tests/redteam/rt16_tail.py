#!/usr/bin/env python3
# rt16: the "tails" path. A forked server sends N bytes and closes; the client reads
# SKIP bytes, puts the socket at fd 0 and execs an image without the library
# (env -i wc -c) -- directly (mode=direct), after exec'ing itself once under the
# library first (mode=chain), or from a thread while another thread is blocked in
# recv on a dup of the socket (mode=thread), or a failed exec (mode=fail: the bytes back;
# mode=failmany: 20 failed execs, then env -i wc -c). Prints the byte count wc saw; expect N-SKIP.
# usage: rt16_tail.py PORT MODE [N] [SKIP]
import os, socket, sys, threading, time
port = int(sys.argv[1]); mode = sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 300000
SKIP = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
if mode == "stage2":
    os.execve("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {})
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(1)
pid = os.fork()
if pid == 0:
    c, _ = ls.accept(); ls.close()
    c.sendall(b"x" * N); c.close(); os._exit(0)
ls.close()
s = socket.create_connection(("127.0.0.1", port))
got = 0
while got < SKIP:
    b = s.recv(SKIP - got)
    if not b: break
    got += len(b)
if not os.environ.get("RT16_NOSLEEP"):
    time.sleep(0.3)  # the peer has closed; its last bytes sit unread
# RT16_NOSLEEP=1: exec while the peer is still sending (a switch mid-stream, no tail)
os.dup2(s.fileno(), 0); s.close()
sys.stdout.flush()
if mode == "direct":
    os.execve("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {})
elif mode == "chain":
    os.execv(sys.executable, [sys.executable, sys.argv[0], sys.argv[1], "stage2"])
elif mode == "fail":
    # an image that fails to exec (a script whose interpreter is missing), env cleared:
    # the bytes must come back to this process (TCP: all N-SKIP readable)
    open("/tmp/rt16_bad.sh", "w").write("#!/nonexistent/sh\n"); os.chmod("/tmp/rt16_bad.sh", 0o755)
    try:
        os.execve("/tmp/rt16_bad.sh", ["x"], {})
    except OSError as e:
        print("exec failed:", e.errno)
    left = 0
    while True:
        b = os.read(0, 65536)
        if not b: break
        left += len(b)
    print("read after the failed exec:", left)
elif mode == "failmany":
    # 20 failed execs in a row (each makes and undoes a tail), then a successful one
    open("/tmp/rt16_bad.sh", "w").write("#!/nonexistent/sh\n"); os.chmod("/tmp/rt16_bad.sh", 0o755)
    for _ in range(20):
        try:
            os.execve("/tmp/rt16_bad.sh", ["x"], {})
        except OSError:
            pass
    os.execve("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {})
elif mode == "thread":
    d = os.dup(0)
    def rd():
        try:
            os.read(d, 1)  # races the exec for a byte
        except OSError:
            pass
    threading.Thread(target=rd, daemon=True).start()
    time.sleep(0.1)
    os.execve("/usr/bin/env", ["env", "-i", "/usr/bin/wc", "-c"], {})
