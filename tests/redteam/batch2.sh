#!/bin/bash
# Second batch (one lock hold): new probes under the current library, plain TCP first.
for m in scm; do
  env -u LD_PRELOAD timeout 20 ./epollx2 $m 2>&1 | grep -E "OK|FAIL|child" | sed 's/^/tcp: /'
  for i in 1 2 3; do LD_PRELOAD=$NEW timeout 20 ./epollx2 $m 2>&1 | grep -E "OK|FAIL|child" | sed 's/^/smc: /'; done
done
env -u LD_PRELOAD timeout 30 python3 threads.py 150 2>&1 | sed 's/^/tcp: /'
LD_PRELOAD=$NEW timeout 60 python3 threads.py 150 2>&1 | sed 's/^/smc: /'
