# Red team round 28 (thirtieth session), F1: rt27_both_leave "cs" in the process's own network
# namespace, after the process made one unrelated connection inside another namespace (setns,
# connect, one round trip, kept open): both ends are handed to pass_fds children and the maker
# exits. Usage: rt30_mixed_ns.py NETNS_NAME (a namespace under /run/netns with lo up; "" for
# none). Over TCP the reader prints b'hello'. Before, the daemon released the references of a
# client with sockets in two namespaces at once: the children failed (ECONNRESET, EPIPE).
import ctypes, os, socket, subprocess, sys, time

_libc = ctypes.CDLL(None, use_errno=True)


def in_ns(name, f):
    if not name:
        return f()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open("/run/netns/" + name, os.O_RDONLY)
    assert _libc.setns(fd, 0x40000000) == 0
    try:
        return f()
    finally:
        assert _libc.setns(own, 0x40000000) == 0
        os.close(fd)
        os.close(own)


other = sys.argv[1] if len(sys.argv) > 1 else ""
# The maker is a child that exits once it handed both ends on (its daemon connection closes);
# this process only waits until the handed-on children are done (EOF on `done`).
done_r, done_w = os.pipe()
maker = os.fork()
if maker == 0:
    os.close(done_r)
    ol = in_ns(other, socket.socket)
    ol.bind(("127.0.0.1", 0))
    ol.listen()
    o = in_ns(other, socket.socket)
    o.connect(ol.getsockname())
    os_, _ = ol.accept()
    os_.sendall(b"o")
    o.recv(1)
    o.sendall(b"k")
    os_.recv(1)
    ol.close()
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen()
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept()
    c.sendall(b"?")
    s.recv(1)
    s.sendall(b"!")
    c.recv(1)
    W = "import os,sys,time; fd=int(sys.argv[1]); time.sleep(0.5); os.write(fd, b'hello'); time.sleep(0.5); os.close(fd)"
    R = "import os,sys,time; fd=int(sys.argv[1]); time.sleep(0.3); print('reader got', os.read(fd, 100), flush=True); os.close(fd)"
    for code, sock in ((W, c), (R, s)):
        subprocess.Popen([sys.executable, "-c", code, str(sock.fileno())], pass_fds=[sock.fileno(), done_w])
        sock.close()
    os._exit(0)
os.close(done_w)
os.waitpid(maker, 0)
while os.read(done_r, 1):
    pass
