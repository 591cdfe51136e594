#!/bin/bash
# usage: rt31x_runl.sh CLIENT OPS N PORT DELAY_MS [R]: /tmp/rt31x/left under tcp and smc, R runs each
for MODE in tcp smc; do
  echo "== $MODE $*"
  for i in $(seq ${6:-2}); do
    B=/tmp/rt31bin TMO=${TMO:-60} /tmp/rt31bin/world-priv.sh $MODE /tmp/rt31x/left $1 $2 $3 $4 $5 2>/dev/null | grep -v "^rc=\|SMC-D\|fallback\|TCP\|^  "
  done | sort | uniq -c | sort -rn
done
