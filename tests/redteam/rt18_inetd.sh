#!/bin/bash
# rt18_inetd.sh OUTDIR [INETD-FLAGS]: openbsd-inetd -i on 127.0.0.1:43091-43095 (nowait
# sha256sum as root, cat echo as nobody, cat of a file, a "wait" service that accepts on
# the inherited listener (rt18_inetd_wait.py), and socat clients; run inside world.sh.
set -u
OUT=$1; FL=${2:-}; D=/tmp/trial/inetd; F=/tmp/trial/50m.bin; mkdir -p $OUT; rm -f $OUT/results $OUT/times
R() { echo "$*" >> $OUT/results; }
T() { echo "$1 $(echo "$(date +%s.%N) - $2" | bc | cut -c1-6)s" >> $OUT/times; }
cat > $OUT/inetd.conf <<EOC
127.0.0.1:43091 stream tcp nowait root /usr/bin/sha256sum sha256sum
127.0.0.1:43092 stream tcp nowait nobody /bin/cat cat
127.0.0.1:43093 stream tcp nowait nobody /bin/cat cat /tmp/trial/big.bin
127.0.0.1:43094 stream tcp wait root /usr/bin/python3 python3 $(dirname $0)/rt18_inetd_wait.py
127.0.0.1:43095 stream tcp nowait.400 root /tmp/trial/inetd/svc.sh svc.sh
EOC
cp $(dirname $0)/rt18_inetd_wait.py /tmp/trial/inetd/ 2>/dev/null
/usr/sbin/inetd -i -d $FL $OUT/inetd.conf > $OUT/inetd.log 2>&1 & IP=$!
for i in $(seq 50); do [ $(ss -ltn | grep -c '127.0.0.1:4309[1-5]') = 5 ] && break; sleep 0.1; done
t=$(date +%s.%N); o=$(socat -t 60 -T 60 - TCP:127.0.0.1:43091 < $F); R "sha rc=$? ${o:0:16}"; T sha $t
t=$(date +%s.%N); o=$(socat -t 60 -T 60 - TCP:127.0.0.1:43092 < $F | sha256sum); R "echo rc=$? ${o:0:16}"; T echo $t
t=$(date +%s.%N); o=$(socat -u TCP:127.0.0.1:43093 - | sha256sum); R "catfile rc=$? ${o:0:16}"; T catfile $t
t=$(date +%s.%N); PP=; for i in $(seq 10); do (socat -t 60 -T 60 - TCP:127.0.0.1:43094 < $D/waitsrv.py > $OUT/w.$i) & PP="$PP $!"; done; wait $PP
R "wait $(cat $OUT/w.* | sort | uniq -c | tr -s ' ' | cut -c1-20)"; rm -f $OUT/w.*; T wait $t
t=$(date +%s.%N); PP=; for i in $(seq 40); do (echo hello$i | socat -t 10 -T 20 - TCP:127.0.0.1:43095 > $OUT/p.$i) & PP="$PP $!"; done; wait $PP
ok=0; for i in $(seq 40); do [ "$(head -1 $OUT/p.$i)" = "got:hello$i" ] && ok=$((ok+1)); done; R "par $ok/40 fds=$(cat $OUT/p.* | grep -v got | sort | uniq -c | tr -s ' ')"; rm -f $OUT/p.*; T par $t
t=$(date +%s.%N); PP=; for i in $(seq 20); do (socat -t 60 -T 60 - TCP:127.0.0.1:43091 < $D/waitsrv.py > $OUT/s.$i) & PP="$PP $!"; done; wait $PP
R "par_sha $(cat $OUT/s.* | sort | uniq -c | tr -s ' ' | cut -c1-20)"; rm -f $OUT/s.*; T par_sha $t
sleep 1
R "procs_in_cg=$(wc -l < $RT_CG/cgroup.procs) inetd_fds=$(ls /proc/$IP/fd | wc -l)"
kill $IP; wait $IP; R "inetd_rc=$?"
