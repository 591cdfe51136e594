#!/bin/bash
# Round 12: PostgreSQL (a backend forked per connection) with pgbench: -C (a new connection
# per transaction) and -c 32. Needs an initdb'd cluster in $PGD (uid postgres):
#   runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D /tmp/rt12pg/data -A trust -U postgres
# usage: wnl.sh tcp|smc rt12_pg.sh PORT
P=${1:-61200}; PGD=${PGD:-/tmp/rt12pg/data}; BIN=/usr/lib/postgresql/15/bin
runuser -u postgres -- $BIN/postgres -D $PGD -p $P -k /tmp/rt12pg -c listen_addresses=127.0.0.1 -c max_connections=100 > /tmp/rt12pg/pg.$P.log 2>&1 & PP=$!
for i in $(seq 300); do pg_isready -h 127.0.0.1 -p $P -q && break; sleep 0.1; done
export PGHOST=127.0.0.1 PGPORT=$P PGUSER=postgres
createdb rt12 2>/dev/null; pgbench -i -s 2 -q rt12 > /tmp/rt12pg/init.$P.log 2>&1; echo "pgbench -i rc $?"
s=$(date +%s%N)
pgbench -C -c 4 -j 2 -t ${PGT:-200} rt12 > /tmp/rt12pg/C.$P.log 2>&1; echo "pgbench -C rc $? $(grep -E 'number of (transactions actually processed|failed)' /tmp/rt12pg/C.$P.log | tr '\n' ' ')"
grep -E "^tps|latency average" /tmp/rt12pg/C.$P.log >&2
timeout 60 pgbench -c 32 -j 2 -T 5 rt12 > /tmp/rt12pg/c32.$P.log 2>&1; echo "pgbench -c 32 rc $? $(grep -E 'number of failed' /tmp/rt12pg/c32.$P.log)"
grep -E "^tps|latency average" /tmp/rt12pg/c32.$P.log >&2
echo "sum of balances (tellers = branches = history): $(psql -qtA rt12 -c 'select (select sum(tbalance) from pgbench_tellers) = (select sum(bbalance) from pgbench_branches) and (select sum(bbalance) from pgbench_branches) = (select coalesce(sum(delta),0) from pgbench_history)')"
dropdb rt12
kill $PP; wait $PP
grep -iE "error|fatal|panic" /tmp/rt12pg/pg.$P.log | grep -v "does not exist" | sort | uniq -c | head -5
