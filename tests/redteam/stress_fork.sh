#!/bin/bash
# runs inside world.sh smc: fork_stress variant; prints STORM line and STORM-BAD lines
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
export SMC_DMB_SIZE=16384
DPID=$(pgrep -f "smc-ctl daemon --socket $RT_DIR/ctl.sock")
( while :; do :; done ) & H1=$!
( while :; do :; done ) & H2=$!
SMC_DEBUG=${DBG:-0} $B/preload-prog server 0 thread > $RT_DIR/server.out 2> $RT_DIR/server.err &
SP=$!
for i in $(seq 50); do PORT=$(awk '/READY/{print $2}' $RT_DIR/server.out); [ -n "$PORT" ] && break; sleep 0.1; done
coproc ST { SMC_DEBUG=${DBG:-0} $B/preload-prog storm 127.0.0.1 $PORT 8 240 20000 stops=6 stop_children=8 close=1 ballast=256 2> $RT_DIR/storm.err; }
for k in 1 2 3 4 5 6; do
read -r l <&${ST[0]}; kill -STOP $DPID; echo go >&${ST[1]}
read -r l <&${ST[0]}; kill -CONT $DPID; echo go >&${ST[1]}
done
cat <&${ST[0]}
kill $SP $H1 $H2
sleep 0.5
grep -v "^CONN" $RT_DIR/server.out | sort | uniq -c | head
grep -h "STORM-BAD" $RT_DIR/storm.err | sort | uniq -c | head
mkdir -p /tmp/stress; cp $RT_DIR/*.err $RT_DIR/server.out /tmp/stress/
