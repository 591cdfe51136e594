#!/usr/bin/env python3
"""rt31: clients whose connection is reset while their handshake waits for the server's Accept.
usage: rt31_reset_in_handshake.py SCEN M PORT   prints one line per client (sorted, counted).
A server process listens and never accepts; M clients connect (blocking) and say so through a
pipe; the server is then killed (SIGKILL: its listener's queued connections are reset), and
each client, told so through another pipe, makes its calls:
 read    recv, recv, send          (TCP: ECONNRESET, EOF, EPIPE)
 write   send, recv, send          (TCP: ECONNRESET, EOF, EPIPE)
 soerr   SO_ERROR, recv            (TCP: ECONNRESET, EOF)
 pread   poll for readable, then as read on the socket made non-blocking
A blocking connect decides its handshake before it returns (it waits for the Accept up to the
library's accept wait); with nb- before the scenario the client connects non-blocking (poll
for writable, then blocking again), so that its handshake is still under way at the reset.
With go- the client connects non-blocking, is blocking again at once and makes its calls
without waiting to be told: the reset comes before or while its first call waits for the
handshake (TCP: `read` as above; `write` as above, or w5 ECONNRESET EPIPE when the bytes
went before the reset).
"""
import errno, os, select, signal, socket, sys


def en(e):
    return errno.errorcode.get(e, str(e))


def call(o, f):
    try:
        r = f()
        o.append(('r%d' % len(r)) if isinstance(r, bytes) else ('w%d' % r))
    except OSError as e:
        o.append(en(e.errno))


def client(scen, port, up, go, out):
    s = socket.socket()
    told = True
    if scen.startswith('go-'):
        scen = scen[3:]
        told = False
        s.setblocking(False)
        o = ['c:' + en(s.connect_ex(('127.0.0.1', port)))]
        s.setblocking(True)
    elif scen.startswith('nb-'):
        scen = scen[3:]
        s.setblocking(False)
        o = ['c:' + en(s.connect_ex(('127.0.0.1', port)))]
        p = select.poll()
        p.register(s, select.POLLOUT)
        o.append('w%d' % len(p.poll(5000)))
        s.setblocking(True)
    else:
        try:
            s.connect(('127.0.0.1', port))
            o = ['c0']
        except OSError as e:
            o = ['c:' + en(e.errno)]
    os.write(up, b'x')
    if told:
        os.read(go, 1)
    if scen == 'read':
        call(o, lambda: s.recv(10))
        call(o, lambda: s.recv(10))
        call(o, lambda: s.send(b'hello'))
    elif scen == 'write':
        call(o, lambda: s.send(b'hello'))
        call(o, lambda: s.recv(10))
        call(o, lambda: s.send(b'hello'))
    elif scen == 'soerr':
        o.append('so:' + en(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
        call(o, lambda: s.recv(10))
    elif scen == 'pread':
        s.setblocking(False)
        p = select.poll()
        p.register(s, select.POLLIN)
        o.append('p%d' % len(p.poll(5000)))
        call(o, lambda: s.recv(10))
        call(o, lambda: s.recv(10))
    s.close()
    os.write(out, (' '.join(o) + '\n').encode())


def main():
    scen, m, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    ready_r, ready_w = os.pipe()
    srv = os.fork()
    if srv == 0:
        l = socket.socket()
        l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind(('127.0.0.1', port))
        l.listen(64)
        os.write(ready_w, b'x')
        signal.pause()
        os._exit(0)
    os.read(ready_r, 1)
    up_r, up_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    kids = []
    for _ in range(m):
        pid = os.fork()
        if pid == 0:
            try:
                client(scen, port, up_w, go_r, out_w)
            finally:
                os._exit(0)
        kids.append(pid)
    for _ in range(m):
        os.read(up_r, 1)
    os.kill(srv, signal.SIGKILL)
    os.waitpid(srv, 0)
    os.write(go_w, b'x' * m)
    os.close(out_w)
    for k in kids:
        os.waitpid(k, 0)
    data = b''
    while True:
        d = os.read(out_r, 65536)
        if not d:
            break
        data += d
    lines = sorted(data.decode().splitlines())
    for k in sorted(set(lines)):
        print('%4d %s' % (lines.count(k), k))


main()
