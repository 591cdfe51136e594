#!/bin/bash
# Round 14 driver: builds rt14_alone.c and rt14_hostile.c into /tmp/rt14 and runs each case
# under world.sh tcp and world.sh smc (WORLD=path to a world.sh; default the one beside this).
# usage: B=/path/to/bins bash rt14_run.sh CASE...
#   alone:<scenario>:<n>  (rt14_alone.c: latewrite vfork scm both both0 shutfirst shutrace
#                          peerclosed closerace chain thread epollet self busy busyq lateread
#                          oobq shutwin ownshut writeclose fdopen selfboth)
#   hostile:<mode>:<k>:<bits>  (rt14_hostile.c: wait nohang exec honest pause; alone switch count)
#   py:<mode>:<n>  (rt14_py.py: closed more shut open reply)   listen:<mode>:<n> (rt14_listen.py)
#   bash:<mode>:<n> (rt14_bash.sh: closed more open)
H=$(cd "$(dirname "$0")" && pwd)
W=${WORLD:-$H/world.sh}
mkdir -p /tmp/rt14
gcc -O2 -o /tmp/rt14/rt14_alone $H/rt14_alone.c -lpthread 2>/dev/null || exit 1
gcc -O2 -o /tmp/rt14/rt14_hostile $H/rt14_hostile.c || exit 1
for c in "$@"; do
  IFS=: read -r k a b d <<< "$c"
  case $k in
    alone) cmd=(/tmp/rt14/rt14_alone 61470 $a ${b:-5}) ;;
    hostile) cmd=(/tmp/rt14/rt14_hostile 61471 $a ${b:-1} ${d:-alone}) ;;
    py) cmd=(python3 $H/rt14_py.py 61472 ${b:-3} $a) ;;
    listen) cmd=(python3 $H/rt14_listen.py 61473 ${b:-3} $a) ;;
    bash) cmd=(bash $H/rt14_bash.sh 61474 ${b:-3} $a) ;;
  esac
  for m in tcp smc; do
    echo "== $c $m"
    STATN=0 TMO=${TMO:-600} bash $W $m "${cmd[@]}" 2>&1
  done
done
