#!/usr/bin/env python3
"""Round 21: the switch's stash (F_STASH). A client writes N bytes (default 7 MiB) that the
server does not read; the server then puts the connection on cat's stdin/stdout (dup2 + exec,
SRV=lib: cat under the library, nolib: without it). The client's library sends those bytes again
while cat echoes them, and reads the echo meanwhile into its ring (the stash). The client's
first read (1 byte, blocking) makes that switch; then MODE reads the rest in some hostile way.
Same output expected under `world.sh smc` and `world.sh tcp`.
usage: rt21_stash.py PORT MODE [SRV=lib|nolib] [N]
modes: plain peek waitall readv recvmsg recvinto trunc dontwait fionread selfion poll select
       epoll_lt epoll_et epoll_pre_lt epoll_pre_et splice fork execlib execnolib reuse write
       wbusy wbusyep wbusysel shutrd shutwr threads2 closeearly"""
import os, sys, socket, select, threading, hashlib, random, time, fcntl, termios, array

if sys.argv[1] == "cont":
    # the image the client execs into: argv fd first-bytes-hex mode
    fd, n = int(sys.argv[2]), int(sys.argv[4])
    first = open(sys.argv[3], "rb").read()
    os.unlink(sys.argv[3])
    h = hashlib.sha256(first)
    total = len(first)
    end = "EOF"
    try:
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            h.update(b)
            total += len(b)
    except ConnectionResetError:
        end = "RESET"
    want = hashlib.sha256(random.Random(3).randbytes(n)).hexdigest()
    print("CLIENT", total, h.hexdigest() == want, end, flush=True)
    sys.exit(0)

port, mode = int(sys.argv[1]), sys.argv[2]
srv = sys.argv[3] if len(sys.argv) > 3 else "lib"
n = int(sys.argv[4]) if len(sys.argv) > 4 else 7 << 20
data = random.Random(3).randbytes(n)
extra = b""

ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for port in range(port, port + 20):  # a port of the range may be some connection's own
    try:
        ls.bind(("127.0.0.1", port))
        break
    except OSError:
        pass
ls.listen(1)
spid = os.fork()
if spid == 0:
    c, _ = ls.accept()
    end = time.monotonic() + 2
    while time.monotonic() < end:
        q = array.array("i", [0])
        fcntl.ioctl(c.fileno(), termios.FIONREAD, q)
        if q[0] >= n:
            break
        time.sleep(0.01)
    if os.environ.get("RT21_SRVBUF"):
        # the server's socket buffers, which cat inherits
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(os.environ["RT21_SRVBUF"]))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(os.environ["RT21_SRVBUF"]))
    os.dup2(c.fileno(), 0)
    os.dup2(c.fileno(), 1)
    env = {"PATH": "/usr/bin:/bin"} if srv == "nolib" else dict(os.environ)
    os.execvpe("cat", ["cat"], env)
ls.close()

if mode == "scm":
    # a worker forked before the connection, which receives it with SCM_RIGHTS and reads on
    ua, ub = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    wpid = os.fork()
    if wpid == 0:
        msg, fds, _, _ = socket.recv_fds(ub, 8, 1)
        w = socket.socket(fileno=fds[0])
        ln = int.from_bytes(msg, "big")
        msg = b""
        while len(msg) < ln:
            msg += ub.recv(ln - len(msg))
        h = hashlib.sha256(msg)
        tot, e = len(msg), "EOF"
        try:
            while True:
                b = w.recv(1 << 16)
                if not b:
                    break
                h.update(b)
                tot += len(b)
        except ConnectionResetError:
            e = "RESET"
        ok = h.hexdigest() == hashlib.sha256(random.Random(3).randbytes(n)).hexdigest()
        print("WORKER", tot, ok, e, flush=True)
        os._exit(0)
s = socket.socket()
# small buffers (RT21_RCVBUF: the client's receive buffer, which also sizes its ring under the
# library; RT21_SNDBUF: the client's send buffer): the echo must be read (stashed) while the
# client sends again
if os.environ.get("RT21_RCVBUF"):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(os.environ["RT21_RCVBUF"]))
if os.environ.get("RT21_SNDBUF"):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(os.environ["RT21_SNDBUF"]))
s.connect(("127.0.0.1", port))
fd = s.fileno()
ep = None
if mode.startswith("epoll_pre"):
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN | (select.EPOLLET if mode.endswith("et") else 0))
shut_in_writer = mode not in ("write", "wbusy", "wbusyep", "wbusysel", "shutwr")
wdone = threading.Event()


def write():
    s.sendall(data)
    if shut_in_writer:
        s.shutdown(socket.SHUT_WR)
    wdone.set()


t = threading.Thread(target=write, daemon=True)
t.start()
got = hashlib.sha256()
total = 0
note = []
cpu0 = time.process_time()


def take(b):
    global total
    got.update(b)
    total += len(b)


first = s.recv(1)
take(first)
end = "EOF"


def fionread():
    q = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, q)
    return q[0]


def drain_plain():
    while True:
        b = s.recv(1 << 16)
        if not b:
            return
        take(b)


try:
    if mode == "plain":
        drain_plain()
    elif mode == "peek":
        bad = 0
        while True:
            p = s.recv(1 << 16, socket.MSG_PEEK)
            if not p:
                break
            d = s.recv(len(p))
            if d != p[: len(d)]:
                bad += 1
            take(d)
        note.append("peek_mismatch=%d" % bad)
    elif mode in ("peekwaitall", "lowatpeek", "lowat"):
        # a peek that needs more than the stash holds (MSG_WAITALL, or SO_RCVLOWAT)
        # (4 KiB: a peek for more than TCP's receive buffer holds while nothing is read
        # hangs on TCP too; the stash's last bytes are fewer than that at some point)
        K = 4096
        fl = socket.MSG_PEEK | (socket.MSG_WAITALL if mode == "peekwaitall" else 0)
        if mode != "peekwaitall":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, K)
        bad = 0
        while True:
            if mode == "lowat":
                d = s.recv(K)
                if not d:
                    break
                if len(d) < K and total + len(d) < n:
                    bad += 1
                take(d)
                continue
            p = s.recv(K, fl)
            if not p:
                break
            if len(p) < K and total + len(p) < n:
                bad += 1
            d = s.recv(len(p))
            if d != p[: len(d)]:
                bad += 1
            take(d)
        note.append("short_or_mismatch=%d" % bad)
    elif mode == "waitall":
        short = 0
        while True:
            b = s.recv(1 << 20, socket.MSG_WAITALL)
            if not b:
                break
            take(b)
            if len(b) < 1 << 20 and total < n + len(extra):
                short += 1
        note.append("waitall_short_before_end=%d" % short)
    elif mode == "readv":
        while True:
            bufs = [bytearray(1000), bytearray(70000), bytearray(3)]
            r = os.readv(fd, bufs)
            if r == 0:
                break
            take(b"".join(bytes(x) for x in bufs)[:r])
    elif mode == "recvmsg":
        while True:
            b, anc, fl, _ = s.recvmsg(1 << 16)
            if not b:
                break
            take(b)
    elif mode == "recvinto":
        buf = bytearray(1 << 16)
        while True:
            r = s.recv_into(buf, 40000, socket.MSG_WAITALL)
            if r == 0:
                break
            take(bytes(buf[:r]))
    elif mode == "trunc":
        # MSG_TRUNC on TCP discards: count only
        while True:
            r = len(s.recv(1 << 16, socket.MSG_TRUNC))
            if r == 0:
                break
            total += r
        note.append("(digest not comparable)")
    elif mode == "dontwait":
        eag = 0
        while True:
            try:
                b = s.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                eag += 1
                time.sleep(0.001)
                continue
            if not b:
                break
            take(b)
    elif mode == "fionread":
        time.sleep(0.3)
        note.append("fionread_after_first>0=%s" % (fionread() > 0))
        drain_plain()
    elif mode == "selfion":
        # a common idiom: select says readable, FIONREAD 0 means the peer closed
        while True:
            r, _, _ = select.select([fd], [], [], 10)
            if not r:
                note.append("select_timeout")
                break
            q = fionread()
            if q == 0:
                break
            b = s.recv(q)
            take(b)
    elif mode in ("poll", "select", "epoll_lt", "epoll_et", "epoll_pre_lt", "epoll_pre_et"):
        s.setblocking(False)
        if mode == "poll":
            p = select.poll()
            p.register(fd, select.POLLIN)
            wait = lambda: p.poll(5000)
        elif mode == "select":
            wait = lambda: select.select([fd], [], [], 5)[0]
        else:
            if ep is None:
                ep = select.epoll()
                ep.register(fd, select.EPOLLIN | (select.EPOLLET if mode.endswith("et") else 0))
            wait = lambda: ep.poll(5)
        et = mode.endswith("et")
        timeouts = eagain = 0
        done = False
        while not done:
            if not wait():
                timeouts += 1
                if timeouts >= 2:
                    note.append("gave_up_waiting")
                    break
                continue
            while True:
                try:
                    b = s.recv(1 << 16)
                except BlockingIOError:
                    eagain += 1
                    break
                if not b:
                    done = True
                    break
                take(b)
                if not et:
                    break
        note.append("timeouts=%d" % timeouts)
        note.append("eagain_heavy=%s" % (eagain > 1000))
    elif mode == "splice":
        r, w = os.pipe()
        while True:
            k = os.splice(fd, w, 1 << 16)
            if k == 0:
                break
            take(os.read(r, k))
    elif mode == "sendfile":
        import tempfile
        with tempfile.TemporaryFile() as f:
            while True:
                k = os.sendfile(f.fileno(), fd, None, 1 << 16)
                if k == 0:
                    break
                total += k
            f.seek(0)
            got = hashlib.sha256(first + f.read())
    elif mode == "scm":
        # what was read so far goes with the socket (at most 1 MiB here)
        firsts = bytearray(first)
        while not wdone.is_set():  # under TCP the writer needs us to read
            firsts += s.recv(4096)
        socket.send_fds(ua, [len(firsts).to_bytes(8, "big")], [fd])
        ua.sendall(firsts)
        s.close()
        os.waitpid(wpid, 0)
    elif mode == "fork":
        pid = os.fork()
        if pid == 0:
            try:
                drain_plain()
            except ConnectionResetError:
                end = "RESET"
            print("CHILD", total, got.hexdigest() == hashlib.sha256(data).hexdigest(), end, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        note.append("parent_done")
    elif mode in ("execlib", "execnolib"):
        # wait for the writer (under TCP it needs us to read), then exec with what was read
        firsts = bytearray(first)
        while not wdone.is_set():
            b = s.recv(4096)
            if not b:
                break
            firsts += b
        os.set_inheritable(fd, True)
        env = dict(os.environ)
        if mode == "execnolib":
            env.pop("LD_PRELOAD", None)
        sys.stdout.flush()
        fp = "/tmp/rt21-first-%d" % os.getpid()
        open(fp, "wb").write(firsts)
        os.execve(sys.executable, [sys.executable, sys.argv[0], "cont", str(fd), fp, str(n)], env)
    elif mode == "reuse":
        fd2 = os.dup(fd)
        s.detach()
        os.close(fd)
        a, b2 = socket.socketpair()
        # one of a/b2 likely took fd's number
        note.append("reused=%s" % (fd in (a.fileno(), b2.fileno())))
        other = b2 if a.fileno() == fd else a
        mine = a if a.fileno() == fd else b2
        other.sendall(b"PAIR")
        mine.settimeout(5)
        try:
            note.append("pair=%r" % mine.recv(10))
        except Exception as e:
            note.append("pair_err=%s" % type(e).__name__)
        s = socket.socket(fileno=fd2)
        drain_plain()
    elif mode in ("write", "shutwr"):
        while not wdone.is_set():  # under TCP the writer needs us to read
            take(s.recv(4096))
        if mode == "write":
            extra = b"TAIL" * 25000
            s.sendall(extra)
        s.shutdown(socket.SHUT_WR)
        drain_plain()
    elif mode in ("wbusy", "wbusyep", "wbusysel"):
        # wbusy: poll(POLLOUT); wbusyep: a level-triggered epoll for EPOLLOUT; wbusysel: select
        # for writing.
        while not wdone.is_set():
            take(s.recv(4096))
        s.setblocking(False)
        class Wait:
            def __init__(self, f):
                self.poll = f
        if mode == "wbusyep":
            ep = select.epoll()
            ep.register(fd, select.EPOLLOUT)
            p = Wait(lambda ms: ep.poll(ms / 1000))
        elif mode == "wbusysel":
            p = Wait(lambda ms: select.select([], [fd], [], ms / 1000)[1])
        else:
            p = select.poll()
            p.register(fd, select.POLLOUT)
        ex = bytearray()
        eag = polls = 0
        c0 = time.process_time()
        stop = time.monotonic() + 2
        while time.monotonic() < stop:
            polls += 1
            if not p.poll(200):
                continue
            try:
                k = s.send(b"W" * 4096)
                ex += b"W" * k
            except BlockingIOError:
                eag += 1
        cpu = time.process_time() - c0
        note.append("wbusy_cpu_over_0.5s=%s eagain_over_100=%s" % (cpu > 0.5, eag > 100))
        sys.stderr.write("wbusy: polls %d eagain %d cpu %.2f written %d\n" % (polls, eag, cpu, len(ex)))
        extra = bytes(ex)
        s.setblocking(True)
        s.shutdown(socket.SHUT_WR)
        drain_plain()
    elif mode == "shutrd":
        s.shutdown(socket.SHUT_RD)
        drain_plain()
    elif mode == "threads2":
        lock = threading.Lock()
        cnt = [0]

        def rd():
            while True:
                b = s.recv(1 << 16)
                if not b:
                    return
                with lock:
                    cnt[0] += len(b)

        ts = [threading.Thread(target=rd) for _ in range(2)]
        [x.start() for x in ts]
        [x.join() for x in ts]
        total += cnt[0]
        note.append("(digest not comparable)")
    elif mode == "closeearly":
        s.close()
        note.append("closed")
    else:
        print("unknown mode", mode)
except ConnectionResetError:
    end = "RESET"
except BrokenPipeError:
    end = "EPIPE"
except OSError as e:
    end = "ERR:%s" % e.strerror
ok = got.hexdigest() == hashlib.sha256(data + extra).hexdigest()
cpu = time.process_time() - cpu0
print("CLIENT", mode, total, ok, end, " ".join(note), flush=True)
try:
    os.waitpid(spid, 0)
except ChildProcessError:
    pass
