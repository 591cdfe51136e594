#!/bin/bash
# Runs inside one world.sh smc (one lock hold): each probe with the old library (OLD) and
# the new one, each N times; prints one line per run.
C=$(cd "$(dirname "$0")/../.." && pwd)/target/release/smc-conform
N=${N:-3}
for sc in dup_mid_handshake_both_used dup_mid_handshake_number_reused epoll_exclusive_mid_handshake; do
  env -u LD_PRELOAD timeout 30 $C $sc > /tmp/rt_b_tcp.txt 2>&1
  for lib in $OLD $NEW; do
    for i in $(seq $N); do
      LD_PRELOAD=$lib timeout 30 $C $sc > /tmp/rt_b_smc.txt 2>&1
      if diff -q /tmp/rt_b_tcp.txt /tmp/rt_b_smc.txt >/dev/null; then r=same; else r=DIFFERS; fi
      echo "$sc $(basename $(dirname $lib))/$(basename $lib) run $i: trace $r as TCP"
      [ $r = DIFFERS ] && [ $i = 1 ] && diff /tmp/rt_b_tcp.txt /tmp/rt_b_smc.txt | head -8
    done
  done
done
for m in excl dupreuse dupboth; do
  for lib in $OLD $NEW; do
    LD_PRELOAD=$lib timeout 20 ./epollx $m 2>&1 | grep -E "OK|FAIL" | sed "s|^|$(basename $lib): |"
  done
done
