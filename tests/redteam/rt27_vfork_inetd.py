# Red-team round 27, open item 2: an inetd-style Python server hands each accepted socket to
# a handler with subprocess.Popen (vfork + exec) and closes its copy at once, while the
# handshake is still under way (RT27_DECIDE=1: decided first, established SMC-D).
# `world.sh tcp|smc python3 rt27_vfork_inetd.py N stdin|pass`.
import os, socket, subprocess, sys, time
HANDLER = "import os,sys; fd=int(sys.argv[1]); d=b''\nwhile not d.endswith(b'\\n'): d+=os.read(fd,100)\nos.write(fd, b'echo '+d); os.close(fd)"
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64)
port = ls.getsockname()[1]
N = int(sys.argv[1]); mode = sys.argv[2]
if os.fork() == 0:
    if os.environ.get("RT27_OWN_LISTENER") != "1":
        # A client process without the listener (holding it, its non-blocking writes meet
        # `write_before_accept` and its connections fall back TIMEOUT_CL, by design).
        ls.close()
    ok = 0
    for i in range(N):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        try:
            s.sendall(b"hi %d\n" % i)
            got = b""
            while True:
                b = s.recv(100)
                if not b: break
                got += b
            ok += got == b"echo hi %d\n" % i
        except Exception as e:
            print("client", i, e)
        s.close()
    print("client ok", ok, "of", N, flush=True)
    os._exit(0)
procs = []
if os.environ.get("RT27_NONBLOCK") == "1":
    # An event loop's accept (non-blocking listener): the handshake is left undecided.
    ls.setblocking(False)
import select
for i in range(N):
    select.select([ls], [], [])
    c, _ = ls.accept()
    c.setblocking(True)
    if os.environ.get("RT27_DECIDE") == "1":
        # An empty send (nothing over TCP) waits for the handshake: the connection leaves
        # established, SMC-D.
        c.send(b"")
    if mode == "stdin":
        p = subprocess.Popen([sys.executable, "-c", HANDLER, "0"], stdin=c)
    else:
        p = subprocess.Popen([sys.executable, "-c", HANDLER, str(c.fileno())], pass_fds=[c.fileno()])
    c.close()
    procs.append(p)
for p in procs: p.wait()
os.wait()
