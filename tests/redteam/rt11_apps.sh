#!/bin/bash
# Round 11: third-party programs in one world (each prints deterministic lines: digests, counts,
# exit codes; timings on stderr). usage: world.sh tcp|smc tests/redteam/rt11_apps.sh [CASE...]
# cases: socat_fork openssl iperf3 redis memcached http
set -u
T=$(mktemp -d /tmp/rt11apps.XXXX); chmod 755 $T; trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf $T' EXIT
head -c 3000000 /dev/urandom > $T/blob; WANT=$(sha256sum < $T/blob | cut -c1-16)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "$1 $(echo "$(date +%s.%N) - $s" | bc)s" >&2; return $rc; }
socat_fork() {
  local p=$(port)
  socat TCP-LISTEN:$p,bind=127.0.0.1,fork,reuseaddr EXEC:'sha256sum' & local sp=$!
  waitport $p
  local ok=0
  for i in 1 2 3 4 5 6; do
    r=$(socat -t 10 -u FILE:$T/blob TCP:127.0.0.1:$p,shut-down 2>&1; true)
    r=$(socat -t 10 - TCP:127.0.0.1:$p < $T/blob | cut -c1-16)
    [ "$r" = "$WANT" ] && ok=$((ok+1))
  done
  echo "socat fork EXEC sha256sum ok $ok of 6"
  kill $sp
}
openssl_tls() {
  local p=$(port)
  openssl req -x509 -newkey rsa:2048 -nodes -keyout $T/k.pem -out $T/c.pem -days 1 -subj /CN=x 2>/dev/null
  openssl s_server -quiet -accept 127.0.0.1:$p -cert $T/c.pem -key $T/k.pem -naccept 1 > $T/srv.out 2>/dev/null & local sp=$!
  sleep 1  # a one-shot server: no probe connection
  timeout 20 openssl s_client -quiet -connect 127.0.0.1:$p < $T/blob > /dev/null 2>&1 & local cp=$!
  for i in $(seq 200); do [ $(stat -c %s $T/srv.out) -ge 3000000 ] && break; sleep 0.05; done
  kill $cp $sp 2>/dev/null
  echo "openssl s_server got $(stat -c %s $T/srv.out) bytes sha $(head -c 3000000 $T/srv.out | sha256sum | cut -c1-16) want $WANT"
}
iperf() {
  local p=$(port)
  iperf3 -s -1 -p $p -B 127.0.0.1 > /dev/null 2>&1 & local sp=$!
  sleep 1  # a one-shot server: no probe connection
  timeout 20 iperf3 -c 127.0.0.1 -p $p -P 4 --bidir -t 2 -J > $T/ip.json 2>&1; local rc=$?
  python3 -c "
import json,sys
j=json.load(open('$T/ip.json'))
e=j.get('end',{})
print('iperf3 rc $rc streams', len(e.get('streams',[])), 'error', j.get('error','none'))
print('iperf3 Gbit/s sum_sent %.1f sum_received %.1f' % (e['sum_sent']['bits_per_second']/1e9, e['sum_received']['bits_per_second']/1e9), file=sys.stderr)
" 2>&1 | head -2
  wait $sp
}
redis() {
  local p=$(port)
  redis-server --port $p --bind 127.0.0.1 --save '' --appendonly no > /dev/null 2>&1 & local sp=$!
  waitport $p
  for i in $(seq 20000); do printf 'SET k%d v%d\r\n' $i $i; done > $T/cmds
  redis-cli -p $p --pipe < $T/cmds | tail -1
  echo "dbsize $(redis-cli -p $p dbsize) k777 $(redis-cli -p $p get k777)"
  redis-benchmark -p $p -P 16 -n 100000 -c 20 -t set,get,lpush,lpop -q 2>&1 | tr '\r' '\n' | grep -c 'requests per second' | sed 's/^/redis-benchmark tests done /'
  echo "dbsize after $(redis-cli -p $p dbsize)"
  redis-cli -p $p shutdown nosave > /dev/null 2>&1; wait $sp
}
memc() {
  local p=$(port)
  memcached -u nobody -l 127.0.0.1 -p $p -t 4 > /dev/null 2>&1 & local sp=$!
  waitport $p
  memcslap --servers=127.0.0.1:$p --concurrency=8 --execute-number=2000 --binary > $T/ms 2>&1; echo "memcslap rc $?"
  python3 - $p <<'PY'
import socket,sys
s=socket.create_connection(("127.0.0.1",int(sys.argv[1])))
f=s.makefile("rwb")
bad=0
for i in range(2000):
    v=b"%d"%(i*7)*10
    f.write(b"set key%d 0 0 %d\r\n%s\r\n"%(i,len(v),v))
f.flush()
for i in range(2000):
    if f.readline()!=b"STORED\r\n": bad+=1
for i in range(2000):
    f.write(b"get key%d\r\n"%i)
f.flush()
for i in range(2000):
    h=f.readline(); v=f.readline(); e=f.readline()
    if v!=b"%d"%(i*7)*10+b"\r\n" or e!=b"END\r\n": bad+=1
print("memcached pipelined set/get bad", bad)
PY
  kill $sp; wait $sp 2>/dev/null
}
http() {
  local p=$(port); mkdir -p $T/www; cp $T/blob $T/www/b; echo small > $T/www/s
  cat > $T/ng.conf <<NG
daemon off; worker_processes 2; pid $T/ng.pid; error_log $T/ng.err;
events { worker_connections 512; }
http { access_log off; sendfile on; keepalive_requests 1000;
 server { listen 127.0.0.1:$p; root $T/www; } }
NG
  nginx -c $T/ng.conf -p $T & local sp=$!
  waitport $p
  curl -s --http1.1 http://127.0.0.1:$p/b http://127.0.0.1:$p/s http://127.0.0.1:$p/b -o $T/o1 -o $T/o2 -o $T/o3 -w '%{num_connects} ' > $T/nc
  echo "curl keep-alive connects $(cat $T/nc) b $(sha256sum < $T/o1 | cut -c1-16) s $(cat $T/o2) b $(sha256sum < $T/o3 | cut -c1-16) want $WANT"
  # pipelined requests in one write
  (printf 'GET /s HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'; sleep 3) | timeout 10 socat - TCP:127.0.0.1:$p > $T/pl
  echo "pipelined responses $(grep -ac '^HTTP/1.1 200' $T/pl) bytes $(stat -c %s $T/pl)"
  wrk -t2 -c20 -d2s http://127.0.0.1:$p/s > $T/wrk 2>&1; echo "wrk errors: $(grep -c 'Socket errors\|Non-2xx' $T/wrk)"
  grep -E 'Requests/sec|Socket errors|Non-2xx' $T/wrk >&2
  kill $sp; wait $sp 2>/dev/null
}
CASES=${*:-socat_fork openssl_tls iperf redis memc http}
for c in $CASES; do t $c; done
