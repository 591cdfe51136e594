#!/bin/bash
# rt9.sh [SCENARIO...]: builds rt9.c, runs the scenarios (all by default) in one world.sh tcp
# and one world.sh smc (each scenario under `timeout 20`) and diffs. B= as for world.sh.
H=$(cd "$(dirname "$0")" && pwd)
B=${B:-/work/main/target/release}; export B
gcc -O1 -pthread -o /tmp/rt9 "$H/rt9.c" 2>/dev/null || exit 1
[ $# -eq 0 ] && set -- $(/tmp/rt9)
RUN="for s in $*; do timeout 20 /tmp/rt9 \$s || echo \"rc=\$? (\$s)\"; done"
O=${O:-/tmp/rt9out}
TMO=${TMO:-900} nice "$H/world.sh" tcp bash -c "$RUN" > $O.tcp 2>&1
TMO=${TMO:-900} nice "$H/world.sh" smc bash -c "$RUN" > $O.smc 2>&1
diff $O.tcp $O.smc
