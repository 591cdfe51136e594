# inetd "wait" stream service: the listening socket is fd 0; accept until 2 s idle.
import socket, hashlib
l = socket.socket(fileno=0)
l.settimeout(2)
while True:
    try:
        c, _ = l.accept()
    except (socket.timeout, TimeoutError):
        break
    c.settimeout(None)
    h = hashlib.sha256()
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
    c.sendall(h.hexdigest().encode() + b"\n")
    c.close()
