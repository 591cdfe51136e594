#!/bin/bash
# Round 11 differential driver.
# usage: rt11.sh N CMD...   runs CMD N times under `world.sh tcp` and N times under `world.sh smc`,
# prints the distinct outputs (stdout + rc, timings in stderr files) of each side with counts and
# the wall time of each run. Outputs: /tmp/rt11out/{tcp,smc}.<i>.{out,err}
# DBG=1: SMC_DEBUG=1 on the smc side (stderr file).
set -u
N=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
O=/tmp/rt11out; mkdir -p $O
for mode in tcp smc; do
  for i in $(seq $N); do
    t0=$(date +%s.%N)
    if [ $mode = smc ] && [ -n "${DBG:-}" ]; then
      SMC_DEBUG=1 $HERE/world.sh $mode "$@" > $O/$mode.$i.out 2> $O/$mode.$i.err
    else
      $HERE/world.sh $mode "$@" > $O/$mode.$i.out 2> $O/$mode.$i.err
    fi
    t1=$(date +%s.%N)
    printf "%s run %d: %.2fs\n" $mode $i $(echo "$t1 - $t0" | bc) >&2
  done
  echo "== $mode: distinct outputs (count)"
  for i in $(seq $N); do grep -vE 'SMC-D|fallback|not on SMC-D|Live now|Connections Summary' $O/$mode.$i.out | md5sum | cut -c1-8; done | sort | uniq -c
  grep -vE 'SMC-D Conn|Live now|Connections Summary' $O/$mode.1.out
done
