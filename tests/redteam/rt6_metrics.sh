#!/bin/bash
# red6: uid nobody makes the daemon's metrics scrape hold every planted statistics file's
# connection table in memory at once: N files of the largest size a reader accepts
# (MAX_FILE_LEN, 8192 records) in its own directory, pid namespace 1 (never folded, always
# "live"), then C concurrent scrapes of the daemon's --metrics port (any local uid may connect).
# Run as root: DARGS="--metrics 127.0.0.1:19464" tests/redteam/world.sh tcp tests/redteam/rt6_metrics.sh
# (N=300 C=4 by default: ~1.2 GB; the peak grows with N x C, bounded only by nobody's disk or
# tmpfs space for N and the scrapes it opens for C). Prints the daemon's peak RSS (VmHWM).
N=${N:-300}; C=${C:-4}; PORT=${PORT:-19464}
DP=$(pgrep -f "smc-ctl daemon --socket $SMC_CTL_SOCK" | head -1)
hwm() { awk '/VmHWM/{h=$2} /VmRSS/{r=$2} END{printf "peak %d MiB, now %d MiB", h/1024, r/1024}' /proc/$DP/status; }
nob() { setpriv --reuid 65534 --regid 65534 --clear-groups /usr/bin/python3 - "$@" <<'PY'
import os, socket, struct, sys, time, threading
mode, n = sys.argv[1], int(sys.argv[2])
if mode == "plant":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(os.environ["SMC_CTL_SOCK"])
    s.send(struct.pack("<IHHII", 0x49434D53, 1, 1, 0, 1)); s.recv(256)
    d = os.path.join(os.environ["SMC_PROCS_DIR"], "uid-65534")
    for _ in range(50):
        if os.path.isdir(d): break
        time.sleep(0.1)
    slots = 8192
    b = bytearray(4096 + 128 * slots)
    def u(o, v): b[o:o+8] = struct.pack("<Q", v)
    u(0, 0x534D435053544154); u(8, 1); u(424, 1); u(456, 1 | 64); u(1296, slots); u(1304, 4096); u(1312, 128); u(1320, 1)
    for i in range(slots):
        u(4096 + 128 * i, 2); u(4096 + 128 * i + 8, 2)
    for k in range(n):
        u(16, 4000000 + k)
        with open(os.path.join(d, str(4000000 + k)), "wb") as f: f.write(b)
    print("nobody planted %d files of %d bytes" % (n, len(b)))
else:
    port = int(os.environ.get("PORT", "19464"))
    res = [None] * n
    def scrape(i):
        t0 = time.time()
        x = socket.create_connection(("127.0.0.1", port))
        x.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        got = 0
        while True:
            r = x.recv(65536)
            if not r: break
            got += len(r)
        res[i] = (got, time.time() - t0)
    ts = [threading.Thread(target=scrape, args=(i,)) for i in range(n)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print("nobody: %d concurrent scrape(s): %s" % (n, ", ".join("%d bytes in %.1f s" % r for r in res)))
PY
}
export PORT
echo "daemon peak RSS at start: $(hwm)"
nob plant $N
nob scrape 1
echo "daemon peak RSS after 1 scrape: $(hwm)"
nob scrape $C
echo "daemon peak RSS after $C concurrent scrapes: $(hwm)"
rm -f $SMC_PROCS_DIR/uid-65534/4*
