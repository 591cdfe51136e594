#!/bin/bash
# rt18_misc.sh OUTDIR: lighttpd (mod_cgi, user www-data) on 43180, tinyproxy on 43188 in
# front of it, git daemon on 43190, socat fork + EXEC on 43191; curl/git/socat clients.
set -u
OUT=$1; M=/tmp/trial/misc; mkdir -p $OUT; rm -rf $OUT/results $OUT/clone*
R() { echo "$*" >> $OUT/results; }
lighttpd -D -f $M/lighttpd.conf > $OUT/lighttpd.out 2>&1 & LP=$!
tinyproxy -d -c $M/tinyproxy.conf > $OUT/tinyproxy.out 2>&1 & TP=$!
git daemon --reuseaddr --listen=127.0.0.1 --port=43190 --base-path=$M/git --export-all $M/git > $OUT/gitd.out 2>&1 & GP=$!
socat TCP-LISTEN:43191,bind=127.0.0.1,reuseaddr,fork EXEC:"sha256sum" > $OUT/socat.out 2>&1 & SP=$!
for i in $(seq 50); do [ $(ss -ltn | grep -c -E '127.0.0.1:(43180|43188|43190|43191)') = 4 ] && break; sleep 0.1; done
R "static $(curl -s http://127.0.0.1:43180/50m.bin | sha256sum | cut -c1-16)"
R "cgi_get $(curl -s 'http://127.0.0.1:43180/cgi-bin/t.cgi?x=1' | tr '\n' ' ')"
R "cgi_post $(curl -s --data-binary @/tmp/trial/50m.bin http://127.0.0.1:43180/cgi-bin/t.cgi | tr '\n' ' ')"
ok=0; PP=; for i in $(seq 30); do (curl -s "http://127.0.0.1:43180/cgi-bin/t.cgi?i=$i" > $OUT/c.$i) & PP="$PP $!"; done; wait $PP
for i in $(seq 30); do grep -q "q=i=$i" $OUT/c.$i && ok=$((ok+1)); done; rm -f $OUT/c.*; R "cgi_par $ok/30"
R "proxy $(curl -s -x http://127.0.0.1:43188 http://127.0.0.1:43180/50m.bin | sha256sum | cut -c1-16)"
R "proxy_cgi $(curl -s -x http://127.0.0.1:43188 --data-binary @/tmp/trial/50m.bin http://127.0.0.1:43180/cgi-bin/t.cgi | tr '\n' ' ')"
ok=0; PP=; for i in $(seq 20); do (curl -s -x http://127.0.0.1:43188 "http://127.0.0.1:43180/cgi-bin/t.cgi?i=$i" > $OUT/p.$i) & PP="$PP $!"; done; wait $PP
for i in $(seq 20); do grep -q "q=i=$i" $OUT/p.$i && ok=$((ok+1)); done; rm -f $OUT/p.*; R "proxy_par $ok/20"
git clone -q git://127.0.0.1:43190/r.git $OUT/clone1 > $OUT/git1.log 2>&1; R "git_clone rc=$? $(git -C $OUT/clone1 rev-parse HEAD 2>&1) $(sha256sum < $OUT/clone1/blob.bin | cut -c1-16)"
PP=; for i in 1 2 3 4; do git clone -q git://127.0.0.1:43190/r.git $OUT/clonep$i > /dev/null 2>&1 & PP="$PP $!"; done; ok=0; for p in $PP; do wait $p && ok=$((ok+1)); done
R "git_par $ok/4 $(for i in 1 2 3 4; do git -C $OUT/clonep$i fsck --no-progress >/dev/null 2>&1 && echo ok; done | sort | uniq -c | tr -s ' ')"
R "socat_fork $(for i in $(seq 10); do socat -t 30 - TCP:127.0.0.1:43191 < /tmp/trial/50m.bin | cut -c1-16; done | sort | uniq -c | tr -s ' ')"
sleep 0.5
R "procs_in_cg=$(wc -l < $RT_CG/cgroup.procs) fds lighttpd=$(ls /proc/$LP/fd | wc -l) tinyproxy=$(ls /proc/$TP/fd | wc -l) gitd=$(ls /proc/$GP/fd | wc -l) socat=$(ls /proc/$SP/fd | wc -l)"
kill $LP $TP $GP $SP; wait $LP $TP $GP $SP 2>/dev/null
R "errlog $(grep -v -i -E 'server started|server stopped|graceful' $M/log/lighttpd.err 2>/dev/null | wc -l) tinyproxy_err $(grep -c -i -E 'ERROR|WARNING' $M/tinyproxy.log 2>/dev/null)"
rm -rf $OUT/clone*; : > $M/log/lighttpd.err; : > $M/tinyproxy.log
