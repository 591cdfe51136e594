#!/bin/bash
# rt30c: run rt30c_abrupt SCEN N under world.sh tcp and smc; print the distinct outcomes of each
# and the daemon's live DMBs after the processes ended.  usage: rt30c_run.sh SCEN N PORT [BIN]
S=$1; N=$2; P=$3; BIN=${4:-/tmp/rt30c/abrupt}; B=${B:-/tmp/rt30bin}
O=/tmp/rt30c/out; mkdir -p $O
inner='"$0" "$1" "$2" "$3" > '$O'/$1.$MODE; for i in $(seq 60); do L=$(SMC_CTL_SOCK=$SMC_CTL_SOCK '$B'/smc-ctl stats -d 2>/dev/null | grep -E "Live DMBs"); case "$L" in *" 0 (0 bytes, 0 attachments)"*) break;; esac; sleep 0.1; done; echo "DAEMON after ${i}x0.1s: $L"; SMC_CTL_SOCK=$SMC_CTL_SOCK '$B'/smc-ctl stats -d 2>/dev/null | grep -E "open now|Handshake errors|TCP fallback|SMC-D connections"'
for MODE in tcp smc; do
  export MODE
  echo "== $MODE $S x$N"
  B=$B TMO=${TMO:-300} $B/world.sh $MODE bash -c "$inner" $BIN $S $N $P 2>&1 | grep -E "rc=|DAEMON|open now|Handshake|fallback|SMC-D conn" | sort -u | tr '\n' ';'; echo
  sort $O/$S.$MODE | uniq -c | sort -rn
done
