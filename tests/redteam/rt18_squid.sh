#!/bin/bash
# rt18_squid.sh OUTDIR: squid (-N, no cache, user proxy) on 43128 in front of lighttpd on 43180
# (configs of rt18_setup.sh + /tmp/trial/squid/squid.conf, see round 18); curl through it.
set -u
OUT=$1; M=/tmp/trial/misc; Q=/tmp/trial/squid; mkdir -p $OUT; rm -f $OUT/results; : > $Q/cache.log; : > $Q/access.log
R() { echo "$*" >> $OUT/results; }
lighttpd -D -f $M/lighttpd.conf > $OUT/lighttpd.out 2>&1 & LP=$!
squid -N -f $Q/squid.conf > $OUT/squid.out 2>&1 & SP=$!
for i in $(seq 100); do [ $(ss -ltn | grep -c -E '127.0.0.1:(43180|43128)') = 2 ] && break; sleep 0.1; done
R "proxy $(curl -s -x http://127.0.0.1:43128 http://127.0.0.1:43180/50m.bin | sha256sum | cut -c1-16)"
R "proxy_post $(curl -s -x http://127.0.0.1:43128 --data-binary @/tmp/trial/50m.bin http://127.0.0.1:43180/cgi-bin/t.cgi | tr '\n' ' ')"
ok=0; PP=; for i in $(seq 30); do (curl -s -x http://127.0.0.1:43128 "http://127.0.0.1:43180/cgi-bin/t.cgi?i=$i" > $OUT/p.$i) & PP="$PP $!"; done; wait $PP
for i in $(seq 30); do grep -q "q=i=$i" $OUT/p.$i && ok=$((ok+1)); done; rm -f $OUT/p.*; R "proxy_par $ok/30"
R "keepalive $(curl -s -x http://127.0.0.1:43128 http://127.0.0.1:43180/50m.bin http://127.0.0.1:43180/50m.bin http://127.0.0.1:43180/cgi-bin/t.cgi?k | sha256sum | cut -c1-16)"
R "procs_in_cg=$(wc -l < $RT_CG/cgroup.procs) squid_fds=$(ls /proc/$SP/fd | wc -l)"
kill $SP; wait $SP; R "squid_rc=$?"; kill $LP; wait $LP
R "cache_log_errors $(grep -i -c -E 'error|warning' $Q/cache.log) access $(wc -l < $Q/access.log) $(awk '{print $4}' $Q/access.log | sort | uniq -c | tr -s ' ')"
