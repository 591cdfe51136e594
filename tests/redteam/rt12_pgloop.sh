#!/bin/bash
# Round 12: PostgreSQL + pgbench -c 32 -j 2 -T 3 in rounds until one hangs (15 s); then the
# sockets (ss), pgbench threads, 1 s of strace and three gdb backtraces of a hung backend go
# to /tmp/rt12/pghang.*.
# Run with SMC_CLC_TIMEOUT_MS=1 and two CPU hogs; PGDBG=1: SMC_DEBUG for postgres.
# usage: wnl.sh smc rt12_pgloop.sh PORT   (the initdb of rt12_pg.sh first)
P=$1; PGD=/tmp/rt12pg/data; BIN=/usr/lib/postgresql/15/bin
SMC_DEBUG=${PGDBG:-} runuser -u postgres -- $BIN/postgres -D $PGD -p $P -k /tmp/rt12pg -c listen_addresses=127.0.0.1 -c max_connections=100 > /tmp/rt12pg/pgl.$P.log 2>&1 & PP=$!
for i in $(seq 300); do pg_isready -h 127.0.0.1 -p $P -q && break; sleep 0.1; done
export PGHOST=127.0.0.1 PGPORT=$P PGUSER=postgres
dropdb rt12 2>/dev/null; createdb rt12; pgbench -i -s 2 -q rt12 > /dev/null 2>&1
for r in $(seq 10); do
  pgbench -c 32 -j 2 -T 3 rt12 > /tmp/rt12/pgl2.$r.log 2>&1 & BP=$!
  for i in $(seq 150); do kill -0 $BP 2>/dev/null || break; sleep 0.1; done
  if kill -0 $BP 2>/dev/null; then
    echo "round $r: pgbench still running after 15 s"
    ss -tnpi "( sport = :$P or dport = :$P )" > /tmp/rt12/pghang.ss 2>&1
    for t in /proc/$BP/task/*; do echo "$t $(cat $t/wchan) $(cat $t/syscall | cut -d' ' -f1-3)"; done > /tmp/rt12/pghang.tasks
    timeout 3 strace -f -p $BP -o /tmp/rt12/pghang.strace 2>/dev/null
    for b in $(ss -tnpH "( sport = :$P )" | grep -o "pid=[0-9]*" | cut -d= -f2); do echo "$b $(cat /proc/$b/wchan) $(cut -d" " -f1-3 /proc/$b/syscall)"; done > /tmp/rt12/pghang.backends
    for b in $(ss -tnpH "( sport = :$P )" | grep -o "pid=[0-9]*" | cut -d= -f2 | head -1); do timeout 1 strace -p $b -o /tmp/rt12/pghang.backend.strace 2>/dev/null; cat /proc/$b/maps | grep -c smc_preload > /tmp/rt12/pghang.maps; ls -l /proc/$b/fd > /tmp/rt12/pghang.fds 2>&1; done
    for b in $(ss -tnpH "( sport = :$P )" | grep -o "pid=[0-9]*" | cut -d= -f2 | head -1); do for k in 1 2 3; do timeout 20 gdb -p $b -batch -ex bt 2>/dev/null | grep "^#" ; echo ---; done > /tmp/rt12/pghang.bt; done
    kill $BP; break
  fi
  wait $BP; echo "round $r rc $?"
done
kill $PP; wait $PP
