#!/bin/bash
# Round 21: runs rt21_stash.py MODE under the library and as plain TCP, R times each, and prints
# each distinct result line with its count. usage: rt21_run.sh SRV R MODE... (env RT21_* passed on)
# e.g. RT21_SRVBUF=65536 B=target/release bash tests/redteam/rt21_run.sh nolib 2 plain peek
cd "$(dirname "$0")/../.."
SRV=$1 R=$2; shift 2
PORT=${PORT:-47010}
for m in "$@"; do
  for w in smc tcp; do
    for i in $(seq $R); do
      out=$(TMO=${TMO:-60} SMC_DEBUG=1 bash tests/redteam/world.sh $w python3 tests/redteam/rt21_stash.py $PORT $m $SRV 2>/tmp/rt21-run-$$.err)
      rc=$?
      st=$(grep -o "sent again, [0-9]* bytes of the peer's read" /tmp/rt21-run-$$.err | awk '{s+=$3} END{print s+0}')
      line=$(echo "$out" | grep -E "^(CLIENT|CHILD|WORKER)" | tr '\n' ' ')
      echo "$m $w rc=$rc stash=$st :: ${line:-<no client line>}"
      [ $rc -ne 0 ] || ! echo "$line" | grep -q "True EOF" && cp /tmp/rt21-run-$$.err /tmp/rt21-fail-$m-$w-$i.err
      PORT=$((PORT+1)); [ $PORT -gt 47400 ] && PORT=47010
    done
  done
done
rm -f /tmp/rt21-run-$$.err
