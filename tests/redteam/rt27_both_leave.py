# Red-team round 27, open item 3: both ends of one connection, made in one process, handed
# to two children (subprocess pass_fds) and closed at once. `world.sh tcp|smc python3
# rt27_both_leave.py c|cs|sc` (c: only the client end leaves; as TCP).
import os, socket, subprocess, sys, time
if os.environ.get("RT27_FAMILY") == "mapped":
    # AF_INET6 sockets with IPv4-mapped addresses: a dual-stack listener and client.
    l = socket.socket(socket.AF_INET6); l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    l.bind(("::", 0)); l.listen()
    c = socket.create_connection(("::ffff:127.0.0.1", l.getsockname()[1]))
elif os.environ.get("RT27_FAMILY") == "bound":
    # Both ends bound to lo (SO_BINDTODEVICE, as a link-local IPv6 connection's).
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    l.bind(("127.0.0.1", 0)); l.listen()
    c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    c.connect(l.getsockname())
else:
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
    c = socket.create_connection(l.getsockname())
s, _ = l.accept()
c.sendall(b"?"); s.recv(1); s.sendall(b"!"); c.recv(1)
W = "import os,sys,time; fd=int(sys.argv[1]); time.sleep(0.5); os.write(fd, b'hello'); time.sleep(0.5); os.close(fd)"
R = "import os,sys; fd=int(sys.argv[1]); print('reader got', os.read(fd, 100), flush=True); os.close(fd)"
order = sys.argv[1]
def spawn(code, sock):
    p = subprocess.Popen([sys.executable, "-c", code, str(sock.fileno())], pass_fds=[sock.fileno()])
    sock.close()
    return p
if order == "cs":
    a = spawn(W, c); b = spawn(R, s)
elif order == "sc":
    b = spawn(R, s); a = spawn(W, c)
elif order == "c":
    a = spawn(W, c); print("parent read", s.recv(100)); s.close(); b = a
a.wait(); b.wait()
