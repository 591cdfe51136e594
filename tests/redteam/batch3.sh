#!/bin/bash
C=$(cd "$(dirname "$0")/../.." && pwd)/target/release/smc-conform
env -u LD_PRELOAD timeout 30 $C epoll_exclusive_mid_handshake > /tmp/rt_b_tcp.txt 2>&1
for lib in $OLD $NEW; do for i in 1 2; do
  LD_PRELOAD=$lib timeout 30 $C epoll_exclusive_mid_handshake > /tmp/rt_b_smc.txt 2>&1
  diff -q /tmp/rt_b_tcp.txt /tmp/rt_b_smc.txt >/dev/null && r=same || r=DIFFERS
  echo "epoll_exclusive_mid_handshake $(basename $lib) run $i: trace $r as TCP"
done; LD_PRELOAD=$lib timeout 20 ./epollx excl 2>&1 | grep -E "OK|FAIL" | sed "s|^|$(basename $lib): |"; done
bash ./batch2.sh
