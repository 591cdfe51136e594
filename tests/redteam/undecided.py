#!/usr/bin/env python3
"""Operations on connections whose SMC handshake is still under way (a client and its server
end in one process: the accepted socket is handed back undecided). Prints a trace; compare
`world.sh tcp` with `world.sh smc`. usage: undecided.py SCENARIO (or `all`)"""
import errno, fcntl, os, select, socket, struct, sys, termios, threading, time

def log(*a):
    print(*a, flush=True)

def pair(nb_client=True):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 0)); l.listen(16)
    c = socket.socket()
    if nb_client:
        c.setblocking(False)
        r = c.connect_ex(l.getsockname())
        assert r in (0, errno.EINPROGRESS), r
        select.select([], [c], [], 5)
        c.setblocking(True)
    else:
        c.connect(l.getsockname())
    s, _ = l.accept()
    return l, c, s

def fionread(fd):
    b = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", b)[0]

def try_(what, f):
    try:
        v = f()
        log(what, "=", repr(v))
        return v
    except OSError as e:
        log(what, "=", errno.errorcode.get(e.errno, e.errno))

def sc_peek():
    l, c, s = pair()
    c.sendall(b"hello world")
    try_("select s", lambda: select.select([s], [], [], 5)[0] == [s])
    try_("peek", lambda: s.recv(100, socket.MSG_PEEK))
    try_("fionread", lambda: fionread(s))
    try_("recv", lambda: s.recv(100))

def sc_fionread_first():
    l, c, s = pair()
    try_("fionread s", lambda: fionread(s))
    try_("fionread c", lambda: fionread(c))
    c.sendall(b"abc")
    try_("poll s", lambda: select.poll() and None)
    p = select.poll(); p.register(s, select.POLLIN)
    try_("poll", lambda: p.poll(5000))
    try_("fionread s", lambda: fionread(s))
    try_("recv", lambda: s.recv(10))

def sc_dontwait_empty():
    l, c, s = pair()
    try_("recv dontwait s", lambda: s.recv(10, socket.MSG_DONTWAIT))
    try_("recv dontwait c", lambda: c.recv(10, socket.MSG_DONTWAIT))
    c.sendall(b"x")
    s.settimeout(5)
    try_("recv s", lambda: s.recv(10))
    try_("recv dontwait s", lambda: s.recv(10, socket.MSG_DONTWAIT))

def sc_waitall():
    l, c, s = pair()
    def w():
        time.sleep(0.05); c.send(b"ab"); time.sleep(0.05); c.send(b"cd")
    t = threading.Thread(target=w); t.start()
    try_("recv waitall", lambda: s.recv(4, socket.MSG_WAITALL))
    t.join()

def sc_readv():
    l, c, s = pair()
    c.sendall(b"0123456789")
    a, b = bytearray(3), bytearray(20)
    try_("readv", lambda: (os.readv(s.fileno(), [a, b]), bytes(a), bytes(b[:7])))

def sc_recvmsg():
    l, c, s = pair()
    c.sendall(b"0123456789")
    try_("recvmsg", lambda: s.recvmsg(100)[0])

def sc_os_read():
    l, c, s = pair()
    c.sendall(b"0123456789")
    try_("read", lambda: os.read(s.fileno(), 100))

def sc_splice():
    l, c, s = pair()
    c.sendall(b"spliced!")
    r, w = os.pipe()
    try_("splice", lambda: os.splice(s.fileno(), w, 100))
    try_("pipe", lambda: os.read(r, 100))

def sc_sendfile():
    l, c, s = pair()
    fd = os.memfd_create("x"); os.write(fd, b"F" * 1000); os.lseek(fd, 0, 0)
    try_("sendfile", lambda: os.sendfile(s.fileno(), fd, None, 1000))
    got = b""
    c.settimeout(5)
    while len(got) < 1000:
        d = c.recv(2000)
        if not d: break
        got += d
    log("client got", len(got), got == b"F" * 1000)

def sc_splice_out():
    l, c, s = pair()
    r, w = os.pipe(); os.write(w, b"P" * 100)
    try_("splice out", lambda: os.splice(r, s.fileno(), 100))
    c.settimeout(5)
    try_("recv c", lambda: c.recv(1000))

def sc_dup2():
    l, c, s = pair()
    other = socket.socket()
    n = other.fileno()
    os.dup2(s.fileno(), n)
    s.close()
    c.sendall(b"via dup2")
    try_("read n", lambda: os.read(n, 100))
    os.write(n, b"back")
    try_("recv c", lambda: c.recv(100))
    other.close()
    try_("recv c eof", lambda: c.recv(100))

def sc_dup_close_orig():
    l, c, s = pair()
    n = os.dup(s.fileno())
    s.close()
    c.sendall(b"via dup")
    try_("read n", lambda: os.read(n, 100))
    os.close(n)
    try_("recv c eof", lambda: c.recv(100))

def sc_shutdown_first():
    l, c, s = pair()
    try_("shutdown s WR", lambda: s.shutdown(socket.SHUT_WR))
    try_("recv c", lambda: c.recv(100))
    c.sendall(b"after")
    try_("recv s", lambda: s.recv(100))

def sc_so_error():
    l, c, s = pair()
    try_("so_error s", lambda: s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
    try_("so_error c", lambda: c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    c.settimeout(5)
    try_("recv c", lambda: c.recv(100))
    try_("so_error c", lambda: c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))

def sc_close_unread():
    l, c, s = pair()
    c.sendall(b"unread")
    time.sleep(0.05)
    s.close()
    c.settimeout(5)
    try_("recv c", lambda: c.recv(100))
    try_("send c", lambda: c.send(b"x"))

def sc_client_close_first():
    l, c, s = pair()
    c.sendall(b"bye")
    c.close()
    s.settimeout(5)
    try_("recv s", lambda: s.recv(100))
    try_("recv s", lambda: s.recv(100))

def sc_fork_child_reads():
    l, c, s = pair()
    c.sendall(b"to child")
    pid = os.fork()
    if pid == 0:
        s.settimeout(5)
        try:
            d = s.recv(100)
            os.write(1, b"child recv = " + repr(d).encode() + b"\n")
            s.sendall(b"from child")
        except OSError as e:
            os.write(1, b"child err %d\n" % e.errno)
        os._exit(0)
    s.close()
    os.waitpid(pid, 0)
    c.settimeout(5)
    try_("recv c", lambda: c.recv(100))

def sc_select_write_first():
    l, c, s = pair()
    try_("select c w", lambda: select.select([c], [c], [], 1))
    try_("select s w", lambda: select.select([s], [s], [], 1))
    s.sendall(b"srv first")
    try_("recv c", lambda: c.recv(100))

def sc_epoll_et():
    l, c, s = pair()
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
    try_("ep wait0", lambda: ep.poll(0.2))
    c.sendall(b"x" * 10)
    try_("ep wait", lambda: ep.poll(5))
    try_("ep wait again", lambda: ep.poll(0.1))
    try_("recv", lambda: s.recv(100))
    c.sendall(b"y")
    try_("ep wait", lambda: ep.poll(5))

def sc_blocked_read_then_close_other_thread():
    l, c, s = pair()
    res = []
    def rd():
        try:
            res.append(s.recv(100))
        except OSError as e:
            res.append(errno.errorcode[e.errno])
    t = threading.Thread(target=rd); t.start()
    time.sleep(0.2)
    c.shutdown(socket.SHUT_WR)
    t.join(5)
    log("blocked recv got", res, "alive", t.is_alive())

ALL = {k[3:]: v for k, v in globals().items() if k.startswith("sc_")}
if __name__ == "__main__":
    names = list(ALL) if sys.argv[1] == "all" else sys.argv[1:]
    for n in names:
        log("##", n)
        pid = os.fork()
        if pid == 0:
            try:
                ALL[n]()
            except Exception as e:
                log("EXC", type(e).__name__, e)
            sys.stdout.flush()
            os._exit(0)
        t0 = time.time()
        os.waitpid(pid, 0)
        if time.time() - t0 > 1.5:
            log("SLOW", n)
