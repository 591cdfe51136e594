# rt8_pass: an SMC connection passed with SCM_RIGHTS to a receiver WITHOUT the library, in ways
# SO_PEERCRED does not name. usage: world.sh smc|tcp python3 rt8_pass.py MODE [GREET_BYTES]
# MODE: pair_fork_exec   socketpair made before fork, the child execs python3 without the library
#       conn_fork_exec   receiver connects to a unix listener (with library), forks, the child
#                        execs without the library and receives; the connecting parent stays alive
#       disabled         receiver maps the library but runs with SMC_DISABLE=1
#       dgram            unix datagram socketpair before fork, child execs without library
#       plain            receiver connects without the library (the fixed case; control)
# The server greets with GREET bytes (pattern) + b"\n" before the pass (unread by the sender), then
# echoes one line, then EOF. The receiver prints what it got.
import os, sys, socket, time, array, hashlib
MODE = sys.argv[1]
G = int(sys.argv[2]) if len(sys.argv) > 2 else 8
ENV_NOLIB = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
PAT = bytes((i * 7 + 3) % 251 for i in range(G)) + b"\n"

RECV = r'''
import os, sys, socket, time, hashlib
u = socket.socket(fileno=int(sys.argv[1]))
kind = sys.argv[2]
G = int(sys.argv[3])
PAT = bytes((i * 7 + 3) % 251 for i in range(G)) + b"\n"
if kind == "connect":
    pass
msg, fds, fl, ad = socket.recv_fds(u, 16, 4)
print("RECV got fds", len(fds), "LD_PRELOAD" in os.environ, flush=True)
s = socket.socket(fileno=fds[0])
s.settimeout(6)
got = b""
t0 = time.time()
try:
    while len(got) < len(PAT):
        d = s.recv(65536)
        if not d: break
        got += d
    print("RECV greet ok" if got == PAT else "RECV greet BAD len=%d head=%r" % (len(got), got[:24]), flush=True)
    s.sendall(b"hello\n")
    r = b""
    while not r.endswith(b"\n"):
        d = s.recv(100)
        if not d: break
        r += d
    print("RECV reply", r, flush=True)
    s.shutdown(socket.SHUT_WR)
    rest = s.recv(100)
    print("RECV rest", rest, flush=True)
except Exception as e:
    print("RECV EXC %s after %.1fs got=%d head=%r" % (type(e).__name__, time.time() - t0, len(got), got[:16]), flush=True)
'''

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
port = ls.getsockname()[1]
spid = os.fork()
if spid == 0:
    c, _ = ls.accept()
    c.settimeout(15)
    try:
        c.sendall(PAT)
        line = b""
        while not line.endswith(b"\n"):
            d = c.recv(100)
            if not d: break
            line += d
        c.sendall(b"ECHO:" + line)
        rest = c.recv(100)
        print("SERVER line", line, "then", rest, flush=True)
    except Exception as e:
        print("SERVER EXC", type(e).__name__, e, flush=True)
    os._exit(0)
ls.close()

def run_receiver_child(ufd, kind, env):
    pid = os.fork()
    if pid == 0:
        os.execve("/usr/bin/python3", ["python3", "-c", RECV, str(ufd), kind, str(G)], env)
    return pid

if MODE in ("pair_fork_exec", "dgram"):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM if MODE == "pair_fork_exec" else socket.SOCK_DGRAM)
    b.set_inheritable(True)
    rpid = run_receiver_child(b.fileno(), "pair", ENV_NOLIB)
    b.close()
    snd = a
elif MODE in ("conn_fork_exec", "plain", "disabled"):
    path = "/tmp/rt8/u%d.sock" % os.getpid()
    try: os.unlink(path)
    except FileNotFoundError: pass
    ul = socket.socket(socket.AF_UNIX)
    ul.bind(path); ul.listen(1)
    # receiver: a process that connects (with or without library) ...
    code = r'''
import os, sys, socket
u = socket.socket(socket.AF_UNIX); u.connect(sys.argv[1]); u.set_inheritable(True)
mode = sys.argv[2]
if mode == "conn_fork_exec":
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    pid = os.fork()
    if pid == 0:
        os.execve("/usr/bin/python3", ["python3", "-c", sys.argv[3], str(u.fileno()), "x", sys.argv[4]], env)
    os.waitpid(pid, 0)
else:
    os.execve("/usr/bin/python3", ["python3", "-c", sys.argv[3], str(u.fileno()), "x", sys.argv[4]], dict(os.environ))
'''
    env = dict(os.environ)
    if MODE == "plain":
        env = ENV_NOLIB
    if MODE == "disabled":
        env["SMC_DISABLE"] = "1"
    rpid = os.fork()
    if rpid == 0:
        os.execve("/usr/bin/python3", ["python3", "-c", code, path, MODE, RECV, str(G)], env)
    snd, _ = ul.accept()
    time.sleep(0.3)
c = socket.create_connection(("127.0.0.1", port))
import select; select.select([c], [], [], 5)  # drives the handshake; the greeting is there (unread)
time.sleep(0.3)  # greeting arrives unread
t0 = time.time()
socket.send_fds(snd, [b"x"], [c.fileno()])
print("SENDER passed after %.2fs" % (time.time() - t0), flush=True)
c.close()
os.waitpid(rpid, 0)
os.waitpid(spid, 0)
print("DONE", flush=True)
