#!/bin/bash
# rt25_sandbox_all.sh [RULES...]: every rule (or those given) x both/client/server under
# world.sh tcp and world.sh smc; prints the cases whose lines differ. Outputs in
# /tmp/rt25sb.{tcp,smc}. B= as for world.sh.
H=$(cd "$(dirname "$0")" && pwd)
gcc -O1 -o /tmp/rt25_seccomp "$H/rt25_seccomp.c" || exit 1
[ $# -eq 0 ] && set -- none memfd mmapshared mmapnomem unix sendmsg recvmsg pidfd madvise ssopt:1 ssopt:2 ssopt:4 gsopt prctl ftruncate fcntl_seal
RUN="for r in $*; do for w in both client server; do echo \"== \$r \$w\"; timeout 40 bash $H/rt25_sandbox.sh \$r \$w 6 2>&1 | sort; echo \"rc=\${PIPESTATUS[0]}\"; done; done"
for m in tcp smc; do TMO=1200 nice bash "$H/world.sh" $m bash -c "$RUN" > /tmp/rt25sb.$m 2>&1; done
python3 - <<'PY'
def parse(f):
    d, cur = {}, None
    for l in open(f):
        l = l.rstrip('\n')
        if l.startswith('== '): cur = l[3:]; d[cur] = []
        elif cur and not l.startswith(('smc-preload', ' ', 'SMC-D')): d[cur].append(l)
    return d
t, s = parse('/tmp/rt25sb.tcp'), parse('/tmp/rt25sb.smc')
for k in t:
    if t[k] != s.get(k): print('DIFF', k, '\n  tcp:', t[k], '\n  smc:', s.get(k))
print('MATCH:', ' | '.join(k for k in t if t[k] == s.get(k)))
PY
