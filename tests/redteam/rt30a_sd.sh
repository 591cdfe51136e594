#!/bin/bash
# rt30a_sd.sh PORT ACT PROG MODE CLIENTS ADDR...  (run under world.sh smc|tcp)
# systemd-socket-activate (ACT: lib = with the world's LD_PRELOAD, plain = without) listens
# on each ADDR (e.g. 127.0.0.1:P [::]:P [::1]:P) and starts rt30a_sdserve.py MODE with
# (PROG lib) or without (plain) the library. Clients as rt30a_group.py.
D=$(cd $(dirname $0); pwd); P=$1; ACT=$2; PROG=$3; MODE=$4; CL=$5; shift 5
PRE=${LD_PRELOAD:-}
L=(); for a in "$@"; do L+=(-l "$a"); done
for v in SMC_CTL_SOCK SMC_PROCS_DIR SMC_SHORT_BYTES SMC_STATS_KEEP SMC_DEBUG; do [ -n "${!v:-}" ] && L+=(-E "$v=${!v}"); done
[ "$MODE" = accept ] && L+=(--accept); [ "$MODE" = inetd ] && L+=(--inetd --accept)
if [ "$PROG" = lib ]; then PE=(env LD_PRELOAD=$PRE); else PE=(env -u LD_PRELOAD); fi
if [ "$ACT" = lib ]; then AE=(env LD_PRELOAD=$PRE); else AE=(env -u LD_PRELOAD); fi
[ -z "$PRE" ] && { PE=(env -u LD_PRELOAD); AE=(env -u LD_PRELOAD); }
"${AE[@]}" systemd-socket-activate "${L[@]}" "${PE[@]}" python3 $D/rt30a_sdserve.py $MODE SD >/tmp/rt30a_sd.$$.log 2>&1 &
A=$!
for i in $(seq 50); do ss -ltnH "sport = :$P" | grep -q . && break; sleep 0.1; done
R=0; out=""
IFS=, read -ra parts <<< "$CL"
for part in "${parts[@]}"; do
  IFS=: read fam cl n <<< "$part"
  if [ "$cl" = plain ]; then CE=(env -u LD_PRELOAD); else CE=(env); fi
  out+=$("${CE[@]}" python3 $D/rt30a_group.py client "$part" $P | sed "s|^R |$fam/$cl |")$'\n'
done
kill $A 2>/dev/null; wait $A 2>/dev/null
echo "$out" | awk 'NF{k=$1" "$2" "$3; c[k]++} END{for(k in c) print "  "k, c[k]}' | sort
bad=$(echo "$out" | awk 'NF && $2!="ok"' | wc -l); tot=$(echo "$out" | awk 'NF' | wc -l)
echo "$out" | awk 'NF && $2!="ok"' | head -2 | sed 's/^/  e.g. /'
echo "RESULT sd act=$ACT prog=$PROG mode=$MODE clients=$CL addrs=$* bad=$bad of $tot lib=${PRE:+True}"
[ $bad = 0 ]
