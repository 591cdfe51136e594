#!/bin/bash
# rt31x: run BIN SCEN N PORT under world-priv.sh tcp and smc, R times each; print the counted lines.
# usage: rt31x_run.sh BIN SCEN N PORT [R]
BIN=$1; S=$2; N=$3; P=$4; R=${5:-3}
for MODE in tcp smc; do
  echo "== $MODE $S x$N x$R"
  for i in $(seq $R); do
    B=/tmp/rt31bin TMO=${TMO:-60} /tmp/rt31bin/world-priv.sh $MODE $BIN $S $N $P 2>/dev/null | grep -v "^rc=\|SMC-D\|fallback\|TCP" 
  done | sort | uniq -c | sort -rn
done
