#!/bin/bash
# Red team round 22 driver, run under world.sh (root victim with the library, attacker uid nobody
# outside the attached cgroup, without the library):
#   B=.../target/release TMO=90 bash tests/redteam/world.sh smc bash tests/redteam/rt22_run.sh leave
#   ... rt22_run.sh sweepflood|sweepns|sweepv6
set -u
SC=$1
H=$(cd "$(dirname "$0")" && pwd)
PORT=${PORT:-47210}
ROOT=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
ACG=$ROOT/smc-rt22-att-$$
mkdir -p $ACG
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in $(cat $ACG/cgroup.procs 2>/dev/null); do kill -9 $p; done 2>/dev/null
  sleep 0.1
  rmdir $ACG 2>/dev/null
}
trap cleanup EXIT
# The attacker: uid nobody, its own (not attached) cgroup, no library.
attacker() {
  ( echo $BASHPID > ${ATTCG:-$ACG}/cgroup.procs
    exec env -u LD_PRELOAD setpriv --reuid=nobody --regid=nogroup --clear-groups \
      nice python3 $H/rt22_attack.py "$@" )
}
members() { # how many of the victim's sockets (TUPLE lines of $1) the SOCKHASH holds
  env -u LD_PRELOAD bpftool -j map dump pinned /sys/fs/bpf/smc/maps/SMC_SOCKHASH 2>/dev/null |
    python3 -c '
import json, socket, sys
# Keys hold the network namespace cookie of the socket (bytes 40..48) since the hijack fix: only ours.
ns = socket.socket().getsockopt(socket.SOL_SOCKET, 71, 8)
want = set()
for l in open(sys.argv[1]):
    if l.startswith("TUPLE"):
        c, s = l.split()[1:3]; want |= {(int(c), int(s)), (int(s), int(c))}
n = 0
for e in json.load(sys.stdin):
    k = bytes(int(x, 16) for x in e["key"])
    t = (int.from_bytes(k[32:36], "little"), int.from_bytes(k[36:40], "little"))
    n += t in want and k[8:16] == bytes([0, 0, 255, 255, 127, 0, 0, 1]) and k[40:48] in (b"", ns)
print(n)' "$1"
}
ctr() { env -u LD_PRELOAD $B/smc-ctl status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"].get(sys.argv[1], 0))' $1; }
quarantined() { env -u LD_PRELOAD $B/smc-ctl status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"].get("quarantined", 0))'; }
python3 $H/rt22_victim.py server $PORT > /tmp/rt22-srv.$$ 2>&1 &
PIDS+=($!)
for i in $(seq 50); do grep -q LISTENING /tmp/rt22-srv.$$ 2>/dev/null && break; sleep 0.1; done
PORT=$(awk '/LISTENING/{print $2}' /tmp/rt22-srv.$$)
case $SC in
leave)
  python3 $H/rt22_victim.py client $PORT ${SECS:-8} ${CONNS:-4} > /tmp/rt22-cli.$$ 2>&1 &
  CP=$!; PIDS+=($CP)
  for i in $(seq 100); do grep -q READY /tmp/rt22-cli.$$ 2>/dev/null && break; sleep 0.1; done
  N=$(( $(grep -c TUPLE /tmp/rt22-cli.$$) * 2 ))
  echo "before: $(members /tmp/rt22-cli.$$) of $N victim sockets in the SOCKHASH"
  attacker leave $PORT
  echo "after: $(members /tmp/rt22-cli.$$) of $N victim sockets in the SOCKHASH"
  wait $CP
  grep -v TUPLE /tmp/rt22-cli.$$
  ;;
hijack)
  # The attacker is a process of the attached cgroup (another tenant's, uid nobody).
  python3 $H/rt22_victim.py client $PORT ${SECS:-8} ${CONNS:-4} > /tmp/rt22-cli.$$ 2>&1 &
  CP=$!; PIDS+=($CP)
  for i in $(seq 100); do grep -q READY /tmp/rt22-cli.$$ 2>/dev/null && break; sleep 0.1; done
  sleep 1
  C0=$(ctr shortcut_sockets) M0=$(ctr msg_redirected)
  ATTCG=$RT_CG attacker hijack $PORT $(( ${SECS:-8} - 2 ))
  echo "shortcut_sockets +$(( $(ctr shortcut_sockets) - C0 )) msg_redirected +$(( $(ctr msg_redirected) - M0 ))"
  wait $CP
  grep -v TUPLE /tmp/rt22-cli.$$
  ;;
sweepflood|sweepns)
  [ $SC = sweepns ] && export RT_NSLISTENERS=${NSL:-3000}
  attacker sweepflood ${NATT:-8} ${SECS:-10} &
  AP=$!; PIDS+=($AP)
  sleep 1
  # Root's short SMC-D connections meanwhile (each a daemon round trip or two), or root's
  # round trips to the daemon (PROBE=1).
  if [ "${PROBE:-}" = sweep ]; then env -u LD_PRELOAD python3 $H/rt22_attack.py sweepone $((SECS - 2))
  elif [ -n "${PROBE:-}" ]; then env -u LD_PRELOAD python3 $H/rt22_attack.py probe $((SECS - 2))
  else python3 $H/rt22_victim.py burst $PORT ${BURSTN:-200}; fi
  wait $AP
  ;;
sweepv6)
  Q0=$(quarantined)
  attacker sweepv6 $PORT ${SECS:-10} &
  AP=$!; PIDS+=($AP)
  sleep 0.5
  python3 $H/rt22_victim.py burst $PORT ${BURSTN:-300}
  wait $AP
  echo "quarantined: $(( $(quarantined) - Q0 ))"
  ;;
esac
[ -n "${DBG:-}" ] && cat /tmp/rt22-srv.$$
rm -f /tmp/rt22-srv.$$ /tmp/rt22-cli.$$
