#!/usr/bin/env python3
"""rt30c: many clients at once against a listener that is slow, full, closed or killed.
usage: rt30c_multi.py SCEN M PORT   (run under world.sh smc|tcp); prints one line per client
(sorted) and the server's line.
 backlog   listen(1), M blocking clients connect+write+read; server accepts after 1 s
 backlognb as backlog with non-blocking connects (poll for writable up to 5 s)
 lclose    listen(16), M clients connect, write, read; listener closed unaccepted after 0.3 s
 lclosenb  as lclose with non-blocking connects
 lclosehalf  listener accepts half (reads, answers), then closes with the rest queued
 refused   connect to a port without a listener (blocking and non-blocking)
 skill     a server process (accept loop, echo) killed 0-5 ms after M clients start
 skillq    a server process that never accepts, killed 50 ms after M clients connected
"""
import errno, os, random, select, signal, socket, sys, time

def en(e):
    return errno.errorcode.get(e, str(e))

def rev(r):
    s = ''.join(c for b, c in ((select.POLLIN, 'I'), (select.POLLOUT, 'O'), (select.POLLERR, 'E'),
                               (select.POLLHUP, 'H'), (0x2000, 'R'), (select.POLLNVAL, 'N')) if r & b)
    return s or '-'

def poll1(s, ev, tmo):
    p = select.poll(); p.register(s, ev)
    r = p.poll(tmo)
    return r[0][1] if r else 0

def drain(s, tmo=3.0):
    got = b''
    s.settimeout(tmo)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                end = 'EOF'; break
            got += d
    except socket.timeout:
        end = 'TMO'
    except OSError as e:
        end = en(e.errno)
    bad = '' if all(x in b'hellobye' for x in got) else ' BAD:' + got[:8].hex()
    return f'r{len(got)}+{end}{bad}'

def client(port, nb, out):
    o = []
    s = socket.socket()
    t0 = time.time()
    if nb:
        s.setblocking(False)
        r = s.connect_ex(('127.0.0.1', port))
        o.append('c:' + en(r) if r else 'c0')
        if r == errno.EINPROGRESS:
            o.append('p' + rev(poll1(s, select.POLLOUT, 5000)))
            o.append('se:' + en(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
        s.setblocking(True)
    else:
        try:
            s.connect(('127.0.0.1', port)); o.append('c0')
        except OSError as e:
            o.append('c:' + en(e.errno))
    dt = time.time() - t0
    o.append('slow' if dt > 0.9 else 'fast')
    if os.environ.get('CSLEEP'):
        time.sleep(float(os.environ['CSLEEP']))
    if not os.environ.get('RONLY'):
      try:
        s.send(b'hello'); o.append('w5')
      except OSError as e:
        o.append('w:' + en(e.errno))
    o.append(drain(s, 6))
    s.close()
    os.write(out, (' '.join(o) + '\n').encode())

LST = [None]
def spawn(fn, *a):
    pid = os.fork()
    if pid == 0:
        if LST[0] is not None:
            LST[0].close()
        try:
            fn(*a)
        finally:
            os._exit(0)
    return pid

def main():
    scen, m, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    rp, wp = os.pipe()
    srv = []
    nb = scen.endswith('nb')
    if scen == 'refused':
        for i in range(m):
            for nb in (0, 1):
                s = socket.socket()
                s.setblocking(not nb)
                r = s.connect_ex(('127.0.0.1', port))
                o = ['nb' if nb else 'bl', 'c:' + en(r)]
                if nb and r == errno.EINPROGRESS:
                    o.append('p' + rev(poll1(s, select.POLLIN | select.POLLOUT | 0x2000, 2000)))
                    o.append('se:' + en(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
                    o.append('c2:' + en(s.connect_ex(('127.0.0.1', port))))
                try:
                    s.send(b'x'); o.append('w1')
                except OSError as e:
                    o.append('w:' + en(e.errno))
                try:
                    o.append('r%d' % len(s.recv(10)))
                except OSError as e:
                    o.append('r:' + en(e.errno))
                s.close()
                print(' '.join(o))
        return
    if scen in ('skill', 'skillq'):
        lr, lw = os.pipe()
        def server():
            l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            l.bind(('127.0.0.1', port)); l.listen(64)
            os.write(lw, b'x')
            if scen == 'skillq':
                time.sleep(100)
            while True:
                c, _ = l.accept()
                try:
                    c.recv(5); c.send(b'bye')
                except OSError:
                    pass
                c.close()
        sp = spawn(server)
        os.read(lr, 1)
        kids = [spawn(client, port, 0, wp) for _ in range(m)]
        time.sleep(float(os.environ.get('KQ', '0.05')) if scen == 'skillq' else random.random() * 0.005)
        os.kill(sp, signal.SIGKILL); os.waitpid(sp, 0)
    else:
        l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind(('127.0.0.1', port)); LST[0] = l
        l.listen(1 if scen.startswith('backlog') else 16)
        kids = [spawn(client, port, nb, wp) for _ in range(m)]
        if scen.startswith('backlog'):
            time.sleep(1)
            n = 0
            l.settimeout(8)
            res = {}
            try:
                while n < m:
                    c, _ = l.accept(); n += 1
                    c.settimeout(3)
                    try:
                        d = c.recv(5)
                        k = 'ok' if d == b'hello' else 'got:' + d[:8].hex()
                        c.send(b'bye')
                    except OSError as e:
                        k = en(e.errno)
                    res[k] = res.get(k, 0) + 1
                    c.close()
            except socket.timeout:
                res['ACCEPT-TMO'] = 1
            srv.append('server accepted %d %s' % (n, sorted(res.items())))
        else:
            time.sleep(float(os.environ.get('LQ', '0.3')))
            if scen == 'lclosehalf':
                l.settimeout(1)
                for i in range(m // 2):
                    c, _ = l.accept()
                    c.settimeout(3)
                    try:
                        c.recv(5); c.send(b'bye')
                    except OSError:
                        pass
                    c.close()
            l.close()
    os.close(wp)
    lines = []
    for k in kids:
        os.waitpid(k, 0)
    data = b''
    while True:
        d = os.read(rp, 65536)
        if not d:
            break
        data += d
    lines = sorted(data.decode().splitlines())
    from collections import Counter
    for k, v in sorted(Counter(lines).items()):
        print(f'{v:4d} {k}')
    for x in srv:
        print(x)

main()
