# rt7 control: no handshake window. Client sends 8 bytes and closes; the server writes 4 bytes
# to the closed peer, then reads until EOF/error. world.sh smc|tcp python3 rt7_ctl.py
import socket, time, select
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
c = socket.create_connection(l.getsockname())
s, _ = l.accept()
c.sendall(b"WRITDATA"); c.close()
time.sleep(0.3)
s.send(b"late")
time.sleep(0.3)
out = []
while True:
    select.select([s], [], [], 1)
    try:
        d = s.recv(4096, socket.MSG_DONTWAIT)
    except OSError as e:
        out.append("err " + e.strerror); break
    out.append(repr(d))
    if not d: break
print("server reads:", out)
try:
    print("second recv:", s.recv(10))
except OSError as e:
    print("second recv err", e.strerror)
