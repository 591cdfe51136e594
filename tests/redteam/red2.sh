#!/bin/bash
# red2 findings: builds rt2.c, runs the listed scenarios with and without the library, diffs.
# usage: tests/redteam/red2.sh [SCENARIO...]   (B= lead's binaries dir; default: all findings)
set -u
D=$(cd "$(dirname "$0")" && pwd); T=$(mktemp -d /tmp/red2.XXXX)
gcc -O2 -o $T/rt2 $D/rt2.c -lpthread 2>/dev/null || exit 1
L=${*:-sig_restart_mix sig_accept_restart sig_rcvtimeo_restart sig_sndtimeo_restart rcvlowat_lower_poll_inf rcvlowat_lower_epoll shutrd_poll_inf shutwr_pollout_inf close_while_recv dup2_while_recv epoll_close_dup linger0 fork_poller_dies}
cd $T; export RT_ALARM=${RT_ALARM:-40} TMO=${TMO:-300}
$D/world.sh tcp ./rt2 $L > tcp.out 2>&1; $D/world.sh smc ./rt2 $L > smc.out 2>&1
diff tcp.out smc.out | grep -v "SMC-D\|TCP fallback\|not on SMC-D\|Live now" ; echo "outputs in $T"
