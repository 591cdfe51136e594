#!/bin/bash
# Round 12: third-party programs not tried before (deterministic lines on stdout: digests,
# counts, exit codes; timings on stderr). usage: wnl.sh|world.sh tcp|smc rt12_apps.sh CASE...
# cases: haproxy_tcp haproxy_http haproxy_reload sockperf redis_many curl_loop
set -u
T=$(mktemp -d /tmp/rt12apps.XXXX); chmod 755 $T; trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf $T' EXIT
head -c 3000000 /dev/urandom > $T/blob; WANT=$(sha256sum < $T/blob | cut -c1-16)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
now() { date +%s%N; }
ms() { echo $(( ($(now) - $1) / 1000000 )); }
nginx_up() { # $1 port: nginx serving $T/www
  mkdir -p $T/www $T/ng; cp $T/blob $T/www/blob; echo small > $T/www/small
  cat > $T/ng/nginx.conf <<NG
daemon off; worker_processes 2; error_log $T/ng/err.log; pid $T/ng/pid;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 100000;
  client_body_temp_path $T/ng; proxy_temp_path $T/ng; fastcgi_temp_path $T/ng; uwsgi_temp_path $T/ng; scgi_temp_path $T/ng;
  server { listen 127.0.0.1:$1; root $T/www; } }
NG
  nginx -c $T/ng/nginx.conf -p $T/ng & NGP=$!
  waitport $1
}
hap_cfg() { # $1 mode $2 front $3 back
  cat > $T/hap.cfg <<H
global
  maxconn 2000
  stats socket $T/hap.sock mode 600 expose-fd listeners level admin
defaults
  mode $1
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend f
  bind 127.0.0.1:$2
  default_backend b
backend b
  server s1 127.0.0.1:$3
H
}
haproxy_tcp() {
  local pb=$(port) pf=$(port)
  socat TCP-LISTEN:$pb,bind=127.0.0.1,fork,reuseaddr EXEC:'sha256sum' & local sp=$!
  waitport $pb
  hap_cfg tcp $pf $pb
  haproxy -db -f $T/hap.cfg > $T/hap.log 2>&1 & local hp=$!
  waitport $pf
  local ok=0 s=$(now)
  for i in $(seq 10); do
    r=$(socat -t 10 - TCP:127.0.0.1:$pf < $T/blob | cut -c1-16)
    [ "$r" = "$WANT" ] && ok=$((ok+1))
  done
  echo "haproxy tcp: sha256 through it ok $ok of 10"; echo "haproxy tcp: $(ms $s) ms" >&2
  kill $hp $sp; wait $hp $sp 2>/dev/null
}
haproxy_http() {
  local pb=$(port) pf=$(port)
  nginx_up $pb
  hap_cfg http $pf $pb
  haproxy -db -f $T/hap.cfg > $T/hap.log 2>&1 & local hp=$!
  waitport $pf
  local ok=0 s=$(now)
  for i in $(seq 20); do
    r=$(curl -s --max-time 10 http://127.0.0.1:$pf/blob | sha256sum | cut -c1-16)
    [ "$r" = "$WANT" ] && ok=$((ok+1))
  done
  echo "haproxy http: blob ok $ok of 20"
  # keep-alive: one curl, 200 URLs
  local urls=""; for i in $(seq 200); do urls="$urls http://127.0.0.1:$pf/small"; done
  echo "haproxy http keep-alive: $(curl -s --max-time 30 $urls | grep -c small) of 200"
  echo "haproxy http: $(ms $s) ms" >&2
  wrk -t2 -c50 -d3s http://127.0.0.1:$pf/small > $T/wrk.out 2>&1
  echo "haproxy http wrk: $(grep -c 'Non-2xx\|Socket errors' $T/wrk.out) error lines"; grep -E "Requests/sec|errors" $T/wrk.out >&2
  kill $hp $NGP; wait $hp $NGP 2>/dev/null
}
haproxy_reload_nolib() { RELOADER="env -u LD_PRELOAD" haproxy_reload; }
RELOADER=
haproxy_reload() {
  # (haproxy_reload_nolib: the new processes run without the library)
  # haproxy -sf with the listeners taken over from the old process (-x: SCM_RIGHTS over the
  # stats socket) under a curl loop: every request must succeed.
  local pb=$(port) pf=$(port)
  nginx_up $pb
  hap_cfg http $pf $pb
  haproxy -db -f $T/hap.cfg > $T/hap.log 2>&1 & local hp=$!
  waitport $pf
  ( local ok=0 bad=0; for i in $(seq 400); do
      r=$(curl -s --max-time 10 http://127.0.0.1:$pf/small); if [ "$r" = small ]; then ok=$((ok+1)); else bad=$((bad+1)); fi
    done; echo "haproxy reload: curl ok $ok bad $bad" ) & local cl=$!
  local hps="$hp"
  for k in 1 2 3 4; do
    sleep 0.7
    $RELOADER haproxy -db -f $T/hap.cfg -x $T/hap.sock -sf $(echo $hps | awk '{print $NF}') >> $T/hap.log 2>&1 & hps="$hps $!"
  done
  wait $cl
  local words=$(pgrep -f "haproxy -db -f $T/hap.cfg" | wc -l)
  echo "haproxy reload: processes left $words"
  grep -i "fail\|error\|alert" $T/hap.log | sort | uniq -c | head -5 >&2
  kill $hps $NGP 2>/dev/null; wait 2>/dev/null
}
sockperf_() {
  local p=$(port)
  sockperf sr --tcp -i 127.0.0.1 -p $p > $T/sp.log 2>&1 & local sp=$!
  sleep 1
  sockperf pp --tcp -i 127.0.0.1 -p $p -t 3 --msg-size 64 > $T/pp.log 2>&1; echo "sockperf pp rc $?"
  grep -E "avg-latency|Summary: Latency" $T/pp.log | head -2 >&2
  grep -ciE "error|fail" $T/pp.log | sed 's/^/sockperf pp error lines /'
  sockperf tp --tcp -i 127.0.0.1 -p $p -t 3 --msg-size 1400 > $T/tp.log 2>&1; echo "sockperf tp rc $?"
  grep -E "Summary: (Message Rate|BandWidth)" $T/tp.log >&2
  sockperf pp --tcp -i 127.0.0.1 -p $p -t 2 --msg-size 65000 > $T/pp2.log 2>&1; echo "sockperf pp 65000 rc $?"
  grep -ciE "error|fail" $T/pp2.log | sed 's/^/sockperf pp 65000 error lines /'
  kill $sp; wait $sp 2>/dev/null
}
redis_many() {
  local p=$(port)
  redis-server --port $p --bind 127.0.0.1 --save '' --appendonly no --maxclients 2000 > /dev/null 2>&1 & local sp=$!
  waitport $p
  redis-benchmark -p $p -n 50000 -c 300 -t set,get,incr -q > $T/rb.log 2>&1; echo "redis-benchmark -c 300 rc $?"
  tr '\r' '\n' < $T/rb.log | grep 'requests per second' >&2
  echo "incr counter $(redis-cli -p $p get counter:__rand_int__)"
  redis-benchmark -p $p -n 50000 -c 100 -P 32 -t incr -q > $T/rb2.log 2>&1; echo "redis-benchmark -c 100 -P 32 rc $?"
  echo "incr counter $(redis-cli -p $p get counter:__rand_int__)"
  redis-benchmark -p $p -n 3000 -c 50 -k 0 -t ping -q > $T/rb3.log 2>&1; echo "redis-benchmark -k 0 (reconnect) rc $?"; tr "\r" "\n" < $T/rb3.log | grep -v "requests per second\|^ *$\|rps=" | sort | uniq -c | head -3
  tr '\r' '\n' < $T/rb3.log | grep 'requests per second' >&2
  redis-cli -p $p shutdown nosave > /dev/null 2>&1; wait $sp
}
curl_loop() {
  local pb=$(port)
  nginx_up $pb
  local ok=0 s=$(now)
  for i in $(seq 300); do [ "$(curl -s --max-time 10 http://127.0.0.1:$pb/small)" = small ] && ok=$((ok+1)); done
  echo "curl loop: $ok of 300"; echo "curl loop: $(ms $s) ms" >&2
  kill $NGP; wait $NGP 2>/dev/null
}
for c in "$@"; do
  case $c in sockperf) sockperf_ ;; *) $c ;; esac
done
