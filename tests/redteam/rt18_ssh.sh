#!/bin/bash
# rt18_ssh.sh OUTDIR [CASE...]: OpenSSH on 127.0.0.1:43022 (config in /tmp/trial/ssh, see
# round 18), run inside world.sh: sshd -D -e in the background, then clients. Writes one
# line per case to OUTDIR/results (rc, checksums, counts), sshd's log to OUTDIR/sshd.log.
set -u
OUT=$1; shift
CASES=${*:-cmd down up scp_up scp_down sftp fwd par stdin}
S=/tmp/trial/ssh; BIG=/tmp/trial/big.bin
mkdir -p $OUT; rm -f $OUT/results $OUT/times $OUT/*.bin
R() { echo "$*" >> $OUT/results; }
/usr/sbin/sshd -D -e -f $S/sshd_config 2> $OUT/sshd.log &
SP=$!
for i in $(seq 50); do ss -ltn | grep -q 127.0.0.1:43022 && break; sleep 0.1; done
SSH="ssh -F $S/ssh_config"
for c in $CASES; do
  t0=$(date +%s.%N)
  case $c in
  cmd) o=$($SSH t 'echo out; echo err >&2; exit 7' 2>$OUT/cmd.err); R "cmd rc=$? out=$o err=$(cat $OUT/cmd.err)";;
  down) h=$($SSH t "cat $BIG" | sha256sum | cut -c1-16); R "down rc=${PIPESTATUS[0]} $h";;
  up) h=$($SSH t 'sha256sum' < $BIG | cut -c1-16); R "up rc=${PIPESTATUS[0]} $h";;
  scp_up) scp -q -F $S/ssh_config $BIG t:$OUT/scp_up.bin; r=$?; R "scp_up rc=$r $(sha256sum < $OUT/scp_up.bin | cut -c1-16)"; rm -f $OUT/scp_up.bin;;
  scp_down) scp -q -F $S/ssh_config t:$BIG $OUT/scp_down.bin; r=$?; R "scp_down rc=$r $(sha256sum < $OUT/scp_down.bin | cut -c1-16)"; rm -f $OUT/scp_down.bin;;
  sftp) printf 'put %s %s/sftp_up.bin\nget %s %s/sftp_down.bin\n' $BIG $OUT $BIG $OUT > $OUT/sftp.batch
        sftp -q -F $S/ssh_config -b $OUT/sftp.batch t > $OUT/sftp.log 2>&1; r=$?
        R "sftp rc=$r up=$(sha256sum < $OUT/sftp_up.bin | cut -c1-16) down=$(sha256sum < $OUT/sftp_down.bin | cut -c1-16)"; rm -f $OUT/sftp_*.bin;;
  fwd) (cd /tmp/trial && exec python3 -m http.server -b 127.0.0.1 43081 > $OUT/http.log 2>&1) & HP=$!
       $SSH -N -L 43080:127.0.0.1:43081 t & FP=$!
       for i in $(seq 50); do ss -ltn | grep -q 127.0.0.1:43080 && ss -ltn | grep -q 127.0.0.1:43081 && break; sleep 0.1; done
       h=$(curl -s http://127.0.0.1:43080/big.bin | sha256sum | cut -c1-16); r=${PIPESTATUS[0]}
       echo "fwd first $(date +%s.%N)" >> $OUT/times
       h2=$(curl -s http://127.0.0.1:43080/big.bin http://127.0.0.1:43080/big.bin | sha256sum | cut -c1-16); r2=${PIPESTATUS[0]}
       echo "fwd second $(date +%s.%N)" >> $OUT/times
       kill $FP $HP; wait $FP $HP 2>/dev/null
       R "fwd rc=$r $h twice rc=$r2 $h2";;
  par) N=${PAR:-60}; PP=; for i in $(seq $N); do ( o=$($SSH t "echo s$i; exit $((i % 5))"); echo "$? $o" > $OUT/par.$i ) & PP="$PP $!"; done; wait $PP
       ok=0; for i in $(seq $N); do [ "$(cat $OUT/par.$i)" = "$((i % 5)) s$i" ] && ok=$((ok+1)); done; rm -f $OUT/par.*
       R "par $ok/$N";;
  stdin) o=$(printf abc | $SSH t 'cat; echo " done"'); R "stdin rc=$? $o";;
  esac
  echo "$c $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-6)s" >> $OUT/times
done
sleep 0.5
R "procs_in_cg=$(wc -l < $RT_CG/cgroup.procs) sshd_fds=$(ls /proc/$SP/fd | wc -l)"
kill $SP; wait $SP
R "sshd_rc=$?"
