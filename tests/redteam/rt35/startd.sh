#!/bin/bash
# usage: startd.sh NOFILE  -> starts private daemon, prints pid
D=${RT_D:-/tmp/rt35}/d
rm -rf $D/state $D/procs $D/ctl.sock*; mkdir -p $D/state $D/procs; chmod 755 $D
RUST_LOG=${RUST_LOG:-info} nice -n 10 ${B:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release}/smc-ctl daemon --socket $D/ctl.sock --state-dir $D/state --procs-dir $D/procs > $D/daemon.log 2>&1 &
P=$!
for i in $(seq 50); do [ -S $D/ctl.sock ] && break; sleep 0.1; done
[ -n "$1" ] && prlimit --pid $P --nofile=$1:$1
echo $P > $D/pid
echo "daemon pid $P nofile $(prlimit --pid $P --nofile -o SOFT --noheadings) fds $(ls /proc/$P/fd | wc -l)"
