#!/bin/bash
# sigsafe_run.sh R SCEN K US [ENV=..]: R runs of `sigsafe PORT SCEN K US` under world.sh tcp,
# then smc (a lock-free copy of world.sh: WORLD=..., default /tmp/wnl-sigsafe.sh; the probe
# built with `gcc -O2 -o /tmp/sigsafe/sigsafe sigsafe.c -lpthread`, or SIGSAFE=...; PORT
# 42001), one summary line per run: rc | server's counts | client's counts | heap errors.
R=$1; S=$2; K=$3; U=$4; shift 4
export B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release} TMO=${TMO:-40}
for m in tcp smc; do
  for i in $(seq $R); do
    out=$(env "$@" nice bash ${WORLD:-/tmp/wnl-sigsafe.sh} $m ${SIGSAFE:-/tmp/sigsafe/sigsafe} 42001 $S $K $U 2>&1)
    rc=$(echo "$out" | grep -o 'rc=[0-9]*')
    err=$(echo "$out" | grep -Ei 'corrupt|malloc|free\(\)|abort|double|invalid|hello [0-9]|timeout' | head -2 | tr '\n' '|')
    srv=$(echo "$out" | grep '^server:' | sed 's/server: //')
    cli=$(echo "$out" | grep '^client:' | sed 's/client: //')
    echo "$m $S $* | $rc | $srv | $cli | $err"
  done
done
