#!/bin/bash
# usage: mirror_run.sh TAG attack|none Q0 NQ
TAG=$1 MODE=$2 Q0=$3 NQ=$4
S=$(cd "$(dirname "$0")" && pwd); W=${RT_D:-/tmp/rt35}; mkdir -p $W; cd $W; $S/startd.sh ""; P=$(cat d/pid); rm -f go.$TAG
VP=$((20900 + RANDOM % 50)); OP=$((20850 + RANDOM % 50))
V=1 GO=/tmp/rt35-go.$TAG nice -n 10 timeout 25 /usr/bin/python3 $S/victim_pair.py d/ctl.sock $VP $Q0 $NQ > vict.$TAG.log 2>&1 &
VPID=$!
sleep 0.5
if [ $MODE = attack ]; then
  nice -n 10 timeout 50 setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $S/attack_refmirror.py d/ctl.sock $VP $OP $Q0 $NQ 6 > attm.$TAG.log 2>&1 &
  AP=$!
  for i in $(seq 300); do grep -q planted attm.$TAG.log && break; sleep 0.1; done
fi
touch go.$TAG; wait $VPID; [ $MODE = attack ] && wait $AP
kill $P; sleep 0.3; kill -0 $P 2>/dev/null && kill -9 $P
cat attm.$TAG.log 2>/dev/null; cat vict.$TAG.log
