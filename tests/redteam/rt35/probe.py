#!/usr/bin/python3
"""root victim: every INTERVAL s, (a) a fresh daemon connection asks QUERY_GID, (b) a kept
connection (made before the attack) sends a PAIR with a TCP socket (parks; then CANCEL
... simply: QUERY_GID with a socket passed); prints what happened.
usage: probe.py SOCK SECONDS [INTERVAL]"""
import sys, os, socket, time, struct
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *

path, secs = sys.argv[1], float(sys.argv[2])
iv = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
kept = dconnect(path)
print('probe uid', os.getuid(), recv_reply(kept, 0.01)[0], flush=True)
lst = socket.socket(); lst.bind(('127.0.0.1', 0)); lst.listen(8)
t0 = time.time(); seq = 1
while time.time() - t0 < secs:
    t = time.time()
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.setblocking(False)
        c.connect(path)  # as the library: a full backlog fails at once
        c.setblocking(True)
        c.send(rec(OP_QUERY_GID, seq=seq))
        fresh = recv_reply(c, 2.0)
        c.close()
    except OSError as e:
        fresh = ('connect-err:%s' % e.strerror, None, [])
    dt = time.time() - t
    # kept connection: a PAIR with a real connected socket, 0 ms park: answered at once
    a = socket.create_connection(lst.getsockname()); b, _ = lst.accept()
    payload = struct.pack('<BBHIQ', 0, 0, 0, 0, 0)
    try:
        send_fds(kept, rec(OP_PAIR, payload, seq=seq), [a.fileno()])
        kr = recv_reply(kept, 2.0)
    except OSError as e:
        kr = ('err:%s' % e.strerror, None, [])
    a.close(); b.close()
    print('t=%5.1f fresh=%s %s (%.0f ms)  kept-PAIR=%s %s' % (t - t0, fresh[0], fresh[1], dt * 1000, kr[0], kr[1]), flush=True)
    seq += 1
    time.sleep(iv)
