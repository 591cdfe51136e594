#!/bin/bash
# usage: world.sh smc|tcp <cmd...>
# Runs <cmd> in a fresh attached cgroup with a private daemon; with "smc" under
# LD_PRELOAD=libsmc_preload.so (SMC_SHORT_BYTES=0: every connection SMC-D), with
# "tcp" without it (the baseline). Prints the stats summary for smc. Cleans up.
# DARGS="...": extra daemon arguments (e.g. DARGS="--shelve-after-ms 0").
set -u
MODE=$1; shift
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
ROOT=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
CG=$ROOT/smc-redteam-$$
D=/run/smc/redteam-$$
DP=
cleanup() {
  [ -n "$DP" ] && kill $DP 2>/dev/null
  for p in $(cat $CG/cgroup.procs 2>/dev/null); do kill -9 $p; done 2>/dev/null
  sleep 0.2
  $B/smc-ctl detach --cgroup $CG >/dev/null 2>&1; rmdir $CG 2>/dev/null
  [ -n "${KEEPD:-}" ] || rm -rf $D
}
trap cleanup EXIT
trap 'exit 130' INT TERM PIPE
mkdir -p $CG $D/procs
exec 9>/run/smc/tests.lock; flock 9
$B/smc-ctl attach --cgroup $CG >/dev/null || exit 1
$B/smc-ctl daemon --socket $D/ctl.sock --state-dir $D/state --procs-dir $D/procs ${DARGS:-} 9>&- > $D/daemon.log 2>&1 &
DP=$!
for i in $(seq 50); do [ -S $D/ctl.sock ] && break; sleep 0.1; done
export SMC_CTL_SOCK=$D/ctl.sock SMC_PROCS_DIR=$D/procs SMC_SHORT_BYTES=0 SMC_STATS_KEEP=1 RT_DIR=$D RT_CG=$CG
if [ "$MODE" = smc ]; then PRE="LD_PRELOAD=${LIB:-$B/libsmc_preload.so}"; else PRE=""; fi
( echo $BASHPID > $CG/cgroup.procs; exec 9>&-; exec env $PRE timeout ${TMO:-30} "$@" )
RC=$?
echo "rc=$RC"
[ "$MODE" = smc ] && SMC_PROCS_DIR=$D/procs $B/smc-ctl stats -a 2>/dev/null | grep -Ei "smc-d|fallback|tcp" | head -${STATN:-6}
exit $RC
