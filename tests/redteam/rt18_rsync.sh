#!/bin/bash
# rt18_rsync.sh OUTDIR: rsync daemon (--no-detach, uid nobody, chroot) on 127.0.0.1:43873 and
# rsync over ssh (sshd of rt18_ssh.sh on 43022): push and pull of /tmp/trial/rs/src (200 MB
# file + /usr/include copy), checksums of the trees; 20 parallel small pulls.
set -u
OUT=$1; S=/tmp/trial/ssh; RS=/tmp/trial/rs; mkdir -p $OUT; rm -f $OUT/results $OUT/times
R() { echo "$*" >> $OUT/results; }
sum() { (cd $1 && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }
T() { echo "$1 $(echo "$(date +%s.%N) - $2" | bc | cut -c1-6)s" >> $OUT/times; }
rm -rf $RS/mod/* $RS/pull*; chown nobody $RS/mod
R "src $(sum $RS/src)"
rsync --daemon --no-detach --config $RS/rsyncd.conf --log-file $OUT/rsyncd.log & DP=$!
/usr/sbin/sshd -D -e -f $S/sshd_config 2> $OUT/sshd.log & SP=$!
for i in $(seq 50); do ss -ltn | grep -q 127.0.0.1:43873 && ss -ltn | grep -q 127.0.0.1:43022 && break; sleep 0.1; done
t=$(date +%s.%N); rsync -a $RS/src/ rsync://127.0.0.1:43873/m/push/ > $OUT/c1.log 2>&1; R "d_push rc=$? $(sum $RS/mod/push)"; T d_push $t
t=$(date +%s.%N); rsync -a rsync://127.0.0.1:43873/m/push/ $RS/pull1/ > $OUT/c2.log 2>&1; R "d_pull rc=$? $(sum $RS/pull1)"; T d_pull $t
t=$(date +%s.%N); rsync -a -e "ssh -F $S/ssh_config" $RS/src/ t:$RS/pull2/ > $OUT/c3.log 2>&1; R "s_push rc=$? $(sum $RS/pull2)"; T s_push $t
t=$(date +%s.%N); rsync -a -e "ssh -F $S/ssh_config" t:$RS/src/ $RS/pull3/ > $OUT/c4.log 2>&1; R "s_pull rc=$? $(sum $RS/pull3)"; T s_pull $t
# delta transfer: change 1 MB in the middle of the file on the daemon side copy and pull again
dd if=/dev/zero of=$RS/pull1/big.bin bs=1M seek=100 count=1 conv=notrunc status=none
t=$(date +%s.%N); rsync -a --stats rsync://127.0.0.1:43873/m/push/ $RS/pull1/ > $OUT/c5.log 2>&1; R "d_delta rc=$? $(sum $RS/pull1) $(grep -i 'Literal data' $OUT/c5.log)"; T d_delta $t
t=$(date +%s.%N); PP=; for i in $(seq 20); do rsync -a rsync://127.0.0.1:43873/m/push/inc/stdio.h $RS/p.$i > /dev/null 2>&1 & PP="$PP $!"; done; ok=0
for p in $PP; do wait $p && ok=$((ok+1)); done; n=$(cat $RS/p.* | sha256sum | cut -c1-16); R "d_par $ok/20 $n"; rm -f $RS/p.*; T d_par $t
t=$(date +%s.%N); rsync rsync://127.0.0.1:43873/ > $OUT/list.log 2>&1; R "d_list rc=$? $(cat $OUT/list.log | tr -s ' \t' ' ')"; T d_list $t
t=$(date +%s.%N); rsync -a rsync://127.0.0.1:43873/nosuch/ $RS/x/ > $OUT/c6.log 2>&1; R "d_nosuch rc=$? $(head -1 $OUT/c6.log)"; T d_nosuch $t
sleep 0.5
R "procs_in_cg=$(wc -l < $RT_CG/cgroup.procs) rsyncd_fds=$(ls /proc/$DP/fd | wc -l)"
kill $DP $SP; wait $DP; R "rsyncd_rc=$?"; wait $SP
grep -v -E 'connect from|rsync on|rsync to|sent [0-9]+ bytes|building file list|total size' $OUT/rsyncd.log | sed 's/^[^]]*\] //' | sort | uniq -c > $OUT/rsyncd.other
rm -rf $RS/mod/* $RS/pull*
