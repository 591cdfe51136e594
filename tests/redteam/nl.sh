#!/bin/bash
# Without eBPF and without the tests lock: a private daemon and SMC_PRELOAD_ASSUME_PEER=1
# (both ends assumed to run the library). usage: nl.sh <cmd...>; LIB overrides the library.
B=$(cd "$(dirname "$0")/../.." && pwd)/target/release
D=/run/smc/rtnl-$$; mkdir -p $D
$B/smc-ctl daemon --socket $D/ctl.sock --state-dir $D/state --procs-dir $D/procs > $D/log 2>&1 & DP=$!
trap 'kill $DP 2>/dev/null; sleep 0.1; rm -rf $D' EXIT
for i in $(seq 50); do [ -S $D/ctl.sock ] && break; sleep 0.1; done
SMC_PRELOAD_ASSUME_PEER=1 SMC_CTL_SOCK=$D/ctl.sock SMC_PROCS_DIR=$D/procs SMC_SHORT_BYTES=0 SMC_STATS_KEEP=1 \
  LD_PRELOAD=${LIB:-$B/libsmc_preload.so} timeout ${TMO:-30} "$@"
RC=$?
echo "rc=$RC smc-d: $(SMC_PROCS_DIR=$D/procs $B/smc-ctl stats -a 2>/dev/null | grep -m1 'SMC-D connections')"
exit $RC
