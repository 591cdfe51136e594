# rt30a_migrate.py PORT N [ADDR]: SO_REUSEPORT group with net.ipv4.tcp_migrate_req=1 (run in a
# private network namespace: `unshare -n sh -c 'ip link set lo up; sysctl -qw
# net.ipv4.tcp_migrate_req=1; python3 rt30a_migrate.py ...'` under world.sh smc|tcp).
# M0: a process WITHOUT the library listens and serves (rt30a_group echo). M1: a process with
# the world's library listens on the same address and never accepts. N clients (with the
# world's library) connect and send a line; then M1 exits (SIGKILL; RT_GRACE=1: SIGTERM, it closes the listener and exits): its queued connections migrate to
# M0, which answers them. TCP: every echo exact.
import os, sys, socket, time, threading, subprocess, select, signal
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt30a_group as g
a = sys.argv
if a[1] == "hold":
    l = g.mk(a[2], int(a[3]), True)
    def term(*_):
        l.close()          # graceful: close the listener, then exit normally
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    os.write(1, b"r"); sys.stdout.flush()
    time.sleep(60)
    os._exit(0)
port, n = int(a[1]), int(a[2])
addr = a[3] if len(a) > 3 else "v4lo"
r, w = os.pipe()
m0 = subprocess.Popen([sys.executable, g.ME, "member", "plain", addr, str(port), "1", "M0plain", str(w)],
                      env=g.env_plain(), pass_fds=(w,))
os.close(w); select.select([r], [], [], 10); os.read(r, 1)
m1 = subprocess.Popen([sys.executable, __file__, "hold", addr, str(port)], stdout=subprocess.PIPE)
m1.stdout.read(1)
fam = "v6" if addr in ("v6lo", "v6only") else "v4"
out = []
ths = [threading.Thread(target=g.client, args=(fam, i, port, out)) for i in range(n)]
for t in ths:
    t.start()
time.sleep(1.0)
if os.environ.get("RT_GRACE"):
    m1.terminate()
else:
    m1.kill()
m1.wait()
for t in ths:
    t.join()
m0.kill()
summ = {}
for o in out:
    summ[(o[0], o[1])] = summ.get((o[0], o[1]), 0) + 1
print(summ)
for o in [o for o in out if o[0] != "ok"][:3]:
    print("  e.g.", o)
bad = sum(1 for o in out if o[0] != "ok")
print("RESULT migrate bad=%d of %d lib=%s" % (bad, len(out), "LD_PRELOAD" in os.environ))
