#!/bin/bash
# usage: run.sh TAG NOFILE MODE N HOLD PROBESECS   (root; attacker runs as nobody)
TAG=$1 NOF=$2 MODE=$3 N=$4 HOLD=$5 PS=${6:-40}
S=$(cd "$(dirname "$0")" && pwd); W=${RT_D:-/tmp/rt35}; mkdir -p $W; cd $W
$S/startd.sh $NOF
P=$(cat d/pid)
nice -n 10 timeout 90 /usr/bin/python3 $S/probe.py d/ctl.sock $PS 1 > probe.$TAG.log 2>&1 &
PP=$!
( for i in $(seq $PS); do echo "t=$i daemon_fds=$(ls /proc/$P/fd 2>/dev/null | wc -l)"; sleep 1; done ) > fds.$TAG.log &
FP=$!
sleep 3
NLINGER=${NLINGER:-6} nice -n 10 timeout 80 setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $S/attack_refused.py d/ctl.sock $((20010 + RANDOM % 800)) $MODE $N $HOLD > att.$TAG.log 2>&1
echo "attacker exited rc=$? at $(date +%T)"
wait $PP; wait $FP
kill $P; sleep 0.5; kill -0 $P 2>/dev/null && kill -9 $P
echo "== attacker"; cat att.$TAG.log; echo "== probe"; cat probe.$TAG.log; echo "== fds"; paste -sd' ' fds.$TAG.log; echo "== daemon log"; grep -v INFO d/daemon.log | cut -c1-200 | tail -6
