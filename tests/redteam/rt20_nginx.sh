#!/bin/bash
# rt20_nginx.sh PORT down|up [SECONDS]: nginx binary upgrade (USR2, then QUIT to the old
# master) while 4 curl loops keep connecting (keep-alive: 5 URLs per curl). down: nginx
# started under the library (world.sh smc); nginx execs the new binary with only TZ and its
# `env` directives, so the new master runs WITHOUT the library. up: the old master runs
# without it and the conf says `env LD_PRELOAD=<lib>` (a library rollout by binary upgrade):
# the new master and its workers run it while the old workers still accept. Prints
# "ok/total" and the distinct wrong answers; TCP: all ok.
set -u
P=$1; MODE=$2; S=${3:-4}
LIB=${LD_PRELOAD:-}
D=$(mktemp -d /tmp/rt20ngx.XXXX); trap 'kill $(cat $D/nginx.pid* 2>/dev/null) 2>/dev/null; sleep 0.3; rm -rf $D' EXIT
chmod 755 $D; mkdir -p $D/www; for i in 1 2 3 4 5; do head -c $((i*3000)) /dev/zero | tr '\0' "$i" > $D/www/f$i; done
ENVL=""; [ "$MODE" = up ] && [ -n "$LIB" ] && ENVL="env LD_PRELOAD=$LIB;"
cat > $D/nginx.conf <<EOC
daemon on; master_process on; worker_processes 2; pid $D/nginx.pid; error_log $D/err.log notice;
$ENVL
events { worker_connections 256; }
http { access_log off; keepalive_timeout 30; keepalive_requests 1000;
  server { listen 127.0.0.1:$P reuseport; root $D/www; } }
EOC
sed -i 's/ reuseport//' $D/nginx.conf
if [ "$MODE" = up ]; then env -u LD_PRELOAD /usr/sbin/nginx -c $D/nginx.conf -p $D; else /usr/sbin/nginx -c $D/nginx.conf -p $D; fi
for i in $(seq 50); do [ -f $D/nginx.pid ] && ss -ltn | grep -q "127.0.0.1:$P " && break; sleep 0.1; done
end=$(( $(date +%s) + S ))
loop() { n=0; while [ $(date +%s) -lt $end ]; do
  curl -s -m 5 --max-time 5 $(for i in 1 2 3 4 5; do echo http://127.0.0.1:$P/f$i; done) | sha256sum | cut -c1-12 >> $D/r.$1; done; }
LP=; for k in 1 2 3 4; do loop $k & LP="$LP $!"; done
sleep 1; OLD=$(cat $D/nginx.pid); kill -USR2 $OLD
for i in $(seq 30); do [ -f $D/nginx.pid.oldbin ] && break; sleep 0.1; done
sleep 1; kill -WINCH $OLD; sleep 0.5; kill -QUIT $OLD
wait $LP
GOOD=$(for i in 1 2 3 4 5; do cat $D/www/f$i; done | sha256sum | cut -c1-12)
T=$(cat $D/r.* | wc -l); OK=$(grep -c "^$GOOD" $D/r.* | awk -F: '{s+=$2} END{print s}')
echo "nginx $MODE ok $OK/$T upgraded=$(grep -c "changing binary" $D/err.log) newmaster_lib=$(grep -c smc_preload /proc/$(cat $D/nginx.pid)/maps 2>/dev/null)"
grep -h "" $D/err.log | grep -v "signal\|start\|exit\|reconfig\|gracefully\|changing binary\|worker process" | sort | uniq -c | head -5
