#!/bin/bash
# Round 13 driver: builds the probes into /tmp/rt13 and runs each case R times under world.sh tcp
# and world.sh smc, printing the distinct outputs (no stats lines).
# usage: B=/path/to/bins bash rt13_run.sh R CASE...
#   cases: wait:<scenario> (rt13_wait.c: killer eintr longjmp longjmp0 cancel),
#          scmuser:<uid> (rt13_scm_user.py), perl:<mode> (rt13_perl.pl), java:<mode> (rt13_http.java),
#          tcl:<mode> (rt13_tcl.tcl), scmdgram:dgram|seqpacket|stream (rt13_scm_dgram.py),
#          reenter:<us> (rt13_reenter.c, 64 MB), pause:pause|sigsuspend (rt13_pause.c),
#          sigclose:shutdown|close|rshutdown|hsend (rt13_sigclose.c), cancel:recv|send|poll (rt13_cancel.c),
#          sigio:MB (rt13_sigio.c)
H=$(cd "$(dirname "$0")" && pwd)
R=$1; shift
mkdir -p /tmp/rt13/j
for p in rt13_wait rt13_reenter rt13_pause rt13_sigclose rt13_cancel rt13_sigio; do gcc -O2 -o /tmp/rt13/$p $H/$p.c -lpthread || exit 1; done
[ -f /tmp/rt13/j/Rt13Http.class ] || javac -d /tmp/rt13/j $H/rt13_http.java || exit 1
for c in "$@"; do
  k=${c%%:*}; a=${c#*:}
  cmd=()
  case $k in
    wait) cmd=(/tmp/rt13/rt13_wait 62001 $a 50) ;;
    scmuser) cmd=(python3 $H/rt13_scm_user.py 62030 5 $a) ;;
    scmdgram) cmd=(python3 $H/rt13_scm_dgram.py 62080 5 $a) ;;  # CONNECT=1 in the env: connected
    reenter) cmd=(/tmp/rt13/rt13_reenter 62060 64 ${a/:/ }) ;;  # reenter:20, reenter:200:forks, reenter:20:fdopen
    pause) cmd=(/tmp/rt13/rt13_pause 62070 $a 2500) ;;
    sigclose) cmd=(/tmp/rt13/rt13_sigclose 62090 $a 40) ;;
    cancel) cmd=(/tmp/rt13/rt13_cancel 62095 $a 10) ;;
    sigio) cmd=(/tmp/rt13/rt13_sigio 62100 ${a/:/ }) ;;  # sigio:MB, sigio:MB:late
    perl) cmd=(perl $H/rt13_perl.pl 62020 $a 20) ;;
    java) cmd=(java -cp /tmp/rt13/j Rt13Http 62011 $a 100) ;;
    tcl) cmd=(tclsh $H/rt13_tcl.tcl 62040 $a 30) ;;
  esac
  for m in tcp smc; do
    echo "== $c $m x$R"
    for i in $(seq $R); do STATN=0 TMO=${TMO:-60} bash $H/world.sh $m "${cmd[@]}" 2>&1 | sed 's/[0-9.]* s$/T s/'; done | sort | uniq -c
  done
done
