# Red team round 29 (IPv6 helper, finding 3): one process makes N loopback connections, hands
# each end to a child of its own (subprocess pass_fds: CPython's vfork child closes every other
# number with close_range) and closes its copies; each writer child sends hello, each reader
# prints what it reads. `world.sh tcp|smc python3 rt29_many_handed_on.py N cs|sc`.
import os, socket, subprocess, sys
n = int(sys.argv[1]); order = sys.argv[2]
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(n)
pairs = []
for i in range(n):
    c = socket.create_connection(l.getsockname()); s, _ = l.accept()
    pairs.append((c, s))
for c, s in pairs:
    c.sendall(b"q"); s.recv(1); s.sendall(b"a"); c.recv(1)
W = "import os,sys,time; fd=int(sys.argv[1]); time.sleep(0.3); os.write(fd, b'hello '+sys.argv[2].encode()); time.sleep(0.3); os.close(fd)"
# One write per line: the readers print at once into one pipe (print's pieces interleaved).
R = "import os,sys; fd=int(sys.argv[1]); os.write(1, ('%s reader got %r\\n' % (sys.argv[2], os.read(fd, 100))).encode()); os.close(fd)"
def spawn(code, sock, tag):
    p = subprocess.Popen([sys.executable, "-c", code, str(sock.fileno()), tag], pass_fds=[sock.fileno()])
    sock.close()
    return p
ps = []
for i, (c, s) in enumerate(pairs):
    if order == "cs":
        ps += [spawn(W, c, str(i)), spawn(R, s, str(i))]
    else:
        ps += [spawn(R, s, str(i)), spawn(W, c, str(i))]
for p in ps:
    p.wait()
