#!/usr/bin/env python3
# red2: a uid outside the cgroup (nobody) floods the daemon socket with requests and never reads
# the replies; meanwhile a root client's QUERY_GID must still be answered promptly and the
# daemon's memory must stay bounded. Run: world.sh tcp python3 daemon_flood.py
import os, socket, struct, time, sys
SOCK = os.environ["SMC_CTL_SOCK"]
def rec(op, seq, payload=b""):
    return b"SMCI" + struct.pack("<HHII", 1, op, len(payload), seq) + payload
def daemon_pid():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cl = open(f"/proc/{p}/cmdline", "rb").read()
            except OSError:
                continue
            if b"smc-ctl\0daemon" in cl and SOCK.encode() in cl:
                return int(p)
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"):
            return int(l.split()[1])
def probe():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    t0 = time.monotonic()
    s.connect(SOCK)
    s.send(rec(1, 7))
    r = s.recv(4096)
    s.close()
    return time.monotonic() - t0, len(r)
dp = daemon_pid()
print("daemon", dp, "rss0", rss(dp), "probe", probe())
kids = []
for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    pid = os.fork()
    if pid == 0:
        os.setgid(65534); os.setuid(65534)
        ss = []
        for j in range(8):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(SOCK); s.setblocking(False); ss.append(s)
            except OSError as e:
                print("conn", j, e); break
        sent = 0
        t_end = time.monotonic() + 6
        ops = [1, 6, 8, 4, 5, 13]  # QUERY_GID, STATS, LIST, DETACH, UNREGISTER, CANCEL
        while time.monotonic() < t_end:
            for s in ss:
                try:
                    op = ops[sent % len(ops)]
                    s.send(rec(op, sent, b"\0" * (8 if op in (4, 5, 13) else 0)))
                    sent += 1
                except BlockingIOError:
                    pass
                except OSError as e:
                    pass
        print("child sent", sent); sys.stdout.flush()
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
worst = 0
for i in range(8):
    time.sleep(1)
    try:
        d, n = probe()
    except Exception as e:
        d, n = 99, repr(e)
    worst = max(worst, d)
    print("t", i, "rss", rss(dp), "probe %.3f" % d, n)
for p in kids: os.waitpid(p, 0)
time.sleep(0.5)
print("rss end", rss(dp), "worst probe %.3f" % worst)
