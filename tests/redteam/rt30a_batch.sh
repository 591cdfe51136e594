#!/bin/bash
# rt30a_batch.sh PORT N "MEMBERS CLIENTS" ...: each scenario N times under world.sh smc, once tcp.
B=${B:-/tmp/rt30bin}; P=$1; N=$2; shift 2
D=$(dirname $0)
for sc in "$@"; do
  set -- $sc
  for i in $(seq $N); do
    o=$($B/world.sh smc python3 $D/rt30a_group.py $P $1 $2 2>&1)
    echo "smc $(echo "$o" | grep RESULT | sed 's/RESULT //') smcd=$(echo "$o" | awk '/SMC-D connections/{print $3}') fb=$(echo "$o" | awk '/TCP fallback/{print $3}')"
    echo "$o" | grep -E "e\.g\.|failed to get|client rc" | head -2
  done
  o=$($B/world.sh tcp python3 $D/rt30a_group.py $P $1 $2 2>&1)
  echo "tcp $(echo "$o" | grep RESULT | sed 's/RESULT //')"; echo "$o" | grep -E "e\.g\.|failed to get|client rc" | head -2
done
