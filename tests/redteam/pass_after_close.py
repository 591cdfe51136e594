# A listener process accepts a connection and hands it to its parent with SCM_RIGHTS only
# after the client sent its bytes, closed and exited (multiprocessing's resource sharer
# does this: CPython test_multiprocessing_fork test_pickling). Prints what the parent reads.
# usage: pass_after_close.py [N]   (tests/tests/lifecycle_smc.rs runs it by include_str!)
import os, socket, sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for i in range(n):
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    up, down = socket.socketpair()
    go_r, go_w = os.pipe()
    lp = os.fork()
    if lp == 0:
        up.close()
        s, _ = lsock.accept()
        os.read(go_r, 1)              # the client is gone
        socket.send_fds(down, [b"x"], [s.fileno()])
        s.close()
        down.recv(1)
        os._exit(0)
    down.close(); lsock.close()
    cp = os.fork()
    if cp == 0:
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"This connection uses a normal socket %d" % i)
        c.close()
        os._exit(0)
    os.waitpid(cp, 0)
    os.write(go_w, b"g")
    _, fds, _, _ = socket.recv_fds(up, 1, 1)
    s = socket.socket(fileno=fds[0])
    buf = b""
    try:
        while True:
            d = s.recv(100)
            if not d:
                break
            buf += d
        print(i, "read", buf, "then EOF", flush=True)
    except OSError as e:
        print(i, "read", buf, "then", type(e).__name__, flush=True)
    s.close(); up.send(b"x"); os.waitpid(lp, 0)
