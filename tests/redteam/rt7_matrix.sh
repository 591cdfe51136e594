#!/bin/bash
# rt7 matrix: every op x reuse kind under tcp and smc; prints the differing cases.
# usage: rt7_matrix.sh [ops...]   (BIN=/tmp/rt7/rt7, RUS="pipe file sock dup2pipe")
W=$(dirname "$0")/world.sh
BIN=${BIN:-/tmp/rt7/rt7}
OPS=${*:-recv read readv recvmsg send write writev sendmsg sendfile splice_in splice_out shutdown fionread poll epoll}
RUS=${RUS:-pipe file sock dup2pipe}
OUT=${OUT:-/tmp/rt7/out}; mkdir -p $OUT
norm() { grep -v -e '^during fds' -e '^ ' -e '^SMC-D' -e '^after fds' | sed -E 's/accept (s2?)=[0-9]+/accept \1=N/'; }
for op in $OPS; do for ru in $RUS; do
  for m in tcp smc; do nice -n 10 $W $m $BIN $op $ru > $OUT/$op.$ru.$m 2>&1; done
  if ! diff <(norm < $OUT/$op.$ru.tcp) <(norm < $OUT/$op.$ru.smc) > $OUT/$op.$ru.diff; then echo "### DIFF $op $ru"; cat $OUT/$op.$ru.diff; else echo "same $op $ru"; fi
done; done
