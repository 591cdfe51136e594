#!/bin/bash
# rt10.sh [SCENARIO...]: builds rt10.c (dynamic /tmp/rt10 and its static twin /tmp/rt10s, the
# helper image without the library), runs the scenarios (all by default) in one world.sh tcp
# and one world.sh smc (each under `timeout 20`) and diffs. B= as for world.sh.
H=$(cd "$(dirname "$0")" && pwd)
B=${B:-/work/main/target/release}; export B
gcc -O1 -pthread -o /tmp/rt10 "$H/rt10.c" 2>/dev/null || exit 1
gcc -O1 -static -pthread -o /tmp/rt10s "$H/rt10.c" 2>/dev/null || exit 1
[ $# -eq 0 ] && set -- $(/tmp/rt10)
RUN="for s in $*; do timeout 20 /tmp/rt10 \$s || echo \"rc=\$? (\$s)\"; done"
O=${O:-/tmp/rt10out}
TMO=${TMO:-900} nice "$H/world.sh" tcp bash -c "$RUN" > $O.tcp 2>&1
TMO=${TMO:-900} SMC_DEBUG=${SMC_DEBUG:-} nice "$H/world.sh" smc bash -c "$RUN" > $O.smc 2>&1
diff $O.tcp $O.smc
