#!/bin/bash
# usage: rt5.sh N SCENARIO... : builds rt5.c, runs each scenario N times under world.sh tcp and
# world.sh smc, and prints each distinct output (lines sorted: processes print concurrently)
# with how many runs gave it.
H=$(cd "$(dirname "$0")" && pwd)
N=$1; shift
gcc -O2 -o /tmp/rt5 "$H/rt5.c" -lpthread || exit 1
for s in "$@"; do
  for m in tcp smc; do
    echo "=== $s $m"
    for i in $(seq $N); do
      TMO=${TMO:-20} "$H/world.sh" $m /tmp/rt5 $s 2>&1 | grep -v '^  \|^SMC-D Conn' | sort | tr '\n' '|'
      echo
    done | sort | uniq -c | sed 's/|/\n        /g'
  done
done
