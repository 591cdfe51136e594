# A listener process greets a client, then hands the live connection to its parent with
# SCM_RIGHTS; the client and the parent go on talking. Prints what each end reads.
# tests/tests/lifecycle_smc.rs a_connection_passed_on_without_pairing_or_shortcut_reads_like_tcp
import os, socket
for i in range(3):
    lsock = socket.create_server(("127.0.0.1", 0)); port = lsock.getsockname()[1]
    up, down = socket.socketpair()
    lp = os.fork()
    if lp == 0:
        up.close(); s, _ = lsock.accept()
        s.sendall(b"hi"); 
        socket.send_fds(down, [b"x"], [s.fileno()]); s.close(); down.recv(1); os._exit(0)
    down.close(); lsock.close()
    c = socket.create_connection(("127.0.0.1", port))
    print(i, "client got", c.recv(10))
    _, fds, _, _ = socket.recv_fds(up, 1, 1)
    s = socket.socket(fileno=fds[0])
    c.sendall(b"after pass %d" % i)
    print(i, "parent read", s.recv(100))
    s.sendall(b"back"); print(i, "client got", c.recv(10))
    up.send(b"x"); os.waitpid(lp, 0); s.close(); c.close()
