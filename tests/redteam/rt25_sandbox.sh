#!/bin/bash
# rt25_sandbox.sh RULES [both|client|server] [N]: under world.sh (tcp or smc), the
# rt25_sandbox.py workload with the filter RULES (rt25_seccomp.c) on both ends (one process
# forks the other), only the client, or only the server.
# B=... bash world.sh smc bash tests/redteam/rt25_sandbox.sh memfd both 6
H=$(cd "$(dirname "$0")" && pwd)
RULES=$1; WHO=${2:-both}; N=${3:-6}
[ -x /tmp/rt25_seccomp ] || gcc -O1 -o /tmp/rt25_seccomp "$H/rt25_seccomp.c" || exit 1
SB="/tmp/rt25_seccomp $RULES"
PF=/tmp/rt25d/port.$$; sort $PF.out $PF.cout 2>/dev/null
rm -f $PF $PF.out $PF.cout
case $WHO in
  both) $SB python3 "$H/rt25_sandbox.py" pair $N > $PF.out 2>&1 ;;
  client|server)
    if [ $WHO = server ]; then S="$SB"; C=""; else S=""; C="$SB"; fi
    $S python3 "$H/rt25_sandbox.py" server $PF $N > $PF.out 2>&1 &
    SP=$!
    for i in $(seq 100); do [ -s $PF ] && break; sleep 0.05; done
    $C python3 "$H/rt25_sandbox.py" client $(cat $PF) $N > $PF.cout 2>&1
    wait $SP ;;
esac
cat $PF.out $PF.cout 2>/dev/null | sort
rm -f $PF $PF.out $PF.cout
