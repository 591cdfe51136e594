#!/bin/bash
# rt25_ns.sh MODE [N]: rt25_sandbox.py's workload (both roles in one process tree) inside the
# attached cgroup, in namespaces of its own. Under world.sh tcp and smc, compare:
#   userns         unshare -Ur (root of a user namespace of its own, mapped to our uid)
#   userns_nobody  the same as uid nobody
#   nobody         uid nobody, no namespace (the control)
#   mountns        unshare -m with a tmpfs over /run/smc: the daemon's socket is not there
#   netns          unshare -n with lo up: a network namespace of its own
# B=... bash world.sh smc bash tests/redteam/rt25_ns.sh userns 4
H=$(cd "$(dirname "$0")" && pwd)
M=$1; N=${2:-4}
PY="/usr/bin/python3 $H/rt25_sandbox.py pair $N"
NB="setpriv --reuid=65534 --regid=65534 --clear-groups"
case $M in
  userns) unshare -Ur $PY ;;
  userns_nobody) $NB unshare -Ur $PY ;;
  nobody) $NB $PY ;;
  mountns) unshare -m sh -c "mount -t tmpfs rt25 /run/smc && $PY" ;;
  netns) unshare -n sh -c "ip link set lo up && $PY" ;;
  *) echo "unknown mode $M"; exit 2 ;;
esac
