#!/bin/bash
# rt25.sh [SCENARIO...]: builds rt25.c (dynamic /tmp/rt25 and its static twin /tmp/rt25s, the
# helper image without the library), runs the scenarios (all by default) in one world.sh tcp
# and one world.sh smc (each under `timeout 20`), diffs, then lists the scenarios whose output
# differs and those that match. B= as for world.sh; DBG=1: SMC_DEBUG=1 on the smc run.
H=$(cd "$(dirname "$0")" && pwd)
B=${B:-/work/main/target/release}; export B
gcc -O1 -pthread -o /tmp/rt25 "$H/rt25.c" 2>/dev/null || exit 1
gcc -O1 -static -pthread -o /tmp/rt25s "$H/rt25.c" 2>/dev/null || exit 1
[ $# -eq 0 ] && set -- $(/tmp/rt25)
RUN="for s in $*; do timeout 20 /tmp/rt25 \$s || echo \"rc=\$? (\$s)\"; done"
O=${O:-/tmp/rt25out}
TMO=${TMO:-900} nice "$H/world.sh" tcp bash -c "$RUN" > $O.tcp 2>&1
[ -n "${DBG:-}" ] && export SMC_DEBUG=1
TMO=${TMO:-900} nice "$H/world.sh" smc bash -c "$RUN" > $O.smc 2>&1
diff $O.tcp $O.smc
python3 - $O <<'PY'
import sys
def parse(f):
    d, cur = {}, None
    for l in open(f):
        l = l.rstrip('\n')
        if l.startswith('== '):
            cur = l[3:]; d[cur] = []
        elif cur and not l.startswith(('smc-preload', 'rc=0', ' ', 'SMC-D')):
            d[cur].append(l)
    return d
t, s = parse(sys.argv[1] + '.tcp'), parse(sys.argv[1] + '.smc')
print('DIFFER:', ' '.join(k for k in t if t[k] != s.get(k)))
print('MATCH: ', ' '.join(k for k in t if t[k] == s.get(k)))
PY
