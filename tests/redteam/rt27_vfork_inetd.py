# Red-team round 27, open item 2: an inetd-style Python server hands each accepted socket to
# a handler with subprocess.Popen (vfork + exec) and closes its copy at once, while the
# handshake is still under way. `world.sh tcp|smc python3 rt27_vfork_inetd.py N stdin|pass`.
import os, socket, subprocess, sys, time
HANDLER = "import os,sys; fd=int(sys.argv[1]); d=b''\nwhile not d.endswith(b'\\n'): d+=os.read(fd,100)\nos.write(fd, b'echo '+d); os.close(fd)"
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64)
port = ls.getsockname()[1]
N = int(sys.argv[1]); mode = sys.argv[2]
if os.fork() == 0:
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
for i in range(N):
    c, _ = ls.accept()
    if mode == "stdin":
        p = subprocess.Popen([sys.executable, "-c", HANDLER, "0"], stdin=c)
    else:
        p = subprocess.Popen([sys.executable, "-c", HANDLER, str(c.fileno())], pass_fds=[c.fileno()])
    c.close()
    procs.append(p)
for p in procs: p.wait()
os.wait()
