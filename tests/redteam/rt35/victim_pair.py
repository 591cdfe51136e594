#!/usr/bin/python3
"""root, raw protocol as the library: a server on VPORT; for each client source port q,
one connection; the server end's PAIR first (parks, 2 s), then the client end's PAIR
(pairs it). Prints the statuses: 0/0 = paired (SMC-D), else what each end got.
usage: victim_pair.py SOCK VPORT Q0 NQ"""
import sys, os, socket, time, struct
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
path, vport, q0, nq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ds, dc = dconnect(path), dconnect(path)
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', vport)); l.listen(512)
pl = struct.pack('<BBHIQ', 0, 0, 0, 2000, 0)
go = os.environ.get('GO')
if go:
    t0 = time.time()
    while not os.path.exists(go) and time.time() - t0 < 40: time.sleep(0.05)
l.setblocking(False)
drained = 0
while True:
    try:
        x, _ = l.accept(); x.close(); drained += 1
    except BlockingIOError:
        break
print('drained', drained, 'earlier connections from the backlog', flush=True)
l.settimeout(2)
res = {}
for q in range(q0, q0 + nq):
    c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        c.bind(('127.0.0.1', q)); c.connect(('127.0.0.1', vport))
    except OSError as e:
        res['connect:' + e.strerror] = res.get('connect:' + e.strerror, 0) + 1; continue
    while True:
        s, a = l.accept()
        if a[1] == q: break
        s.close()
    t = time.time()
    first, second = ((ds, s), (dc, c)) if os.environ.get('ORDER', 'server') == 'server' else ((dc, c), (ds, s))
    send_fds(first[0], rec(OP_PAIR, pl, seq=q), [first[1].fileno()])
    time.sleep(0.002)
    send_fds(second[0], rec(OP_PAIR, pl, seq=q), [second[1].fileno()])
    rs = recv_reply(ds, 3.0); rc = recv_reply(dc, 3.0)
    k = 'server=%s client=%s' % (rs[1][1] if rs[1] else rs[0], rc[1][1] if rc[1] else rc[0])
    res[k] = res.get(k, 0) + 1
    if os.environ.get('V'): print(q, k, '%.0f ms' % ((time.time() - t) * 1000), flush=True)
    c.close(); s.close()
print('victim ports %d..%d: %s (0=Ok, 16=NoPeer)' % (q0, q0 + nq - 1, res), flush=True)
