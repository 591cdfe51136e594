#!/bin/bash
# rt24: uid nobody squats the pin root of the eBPF programs (/sys/fs/bpf is bpffs's default
# mode 1777) while nothing is attached; then root attaches a cgroup. Run as root, with nothing
# attached (takes the tests lock; cleans up). usage: rt24_bpffs.sh links|symlink|empty|file
set -u
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
MODE=${1:-links}
ROOT=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
CG=$ROOT/smc-rt24-bpffs-$$
exec 9>/run/smc/tests.lock; flock 9
if [ -e /sys/fs/bpf/smc ]; then echo "pins present (something attached): not tried"; exit 2; fi
mkdir -p $CG
NB="setpriv --reuid=65534 --regid=65534 --clear-groups"
case $MODE in
  links) ino=$(stat -c %i $ROOT); $NB mkdir -p /sys/fs/bpf/smc/links/$ino-shortcut-squat ;;
  symlink) $NB mkdir -p /sys/fs/bpf/nobody-rt24/links; $NB ln -s /sys/fs/bpf/nobody-rt24 /sys/fs/bpf/smc ;;
  empty) $NB mkdir /sys/fs/bpf/smc ;;
  file) $NB mkdir -p /sys/fs/bpf/smc/maps/x ;;
esac
ls -la /sys/fs/bpf/ | grep -E "smc|nobody"
$B/smc-ctl attach --cgroup $CG; echo "attach rc=$?"
ls -la /sys/fs/bpf/smc/ 2>&1 | head -8
$B/smc-ctl detach --cgroup $CG >/dev/null 2>&1
rmdir $CG
rm -rf /sys/fs/bpf/smc /sys/fs/bpf/nobody-rt24
[ -e /sys/fs/bpf/smc ] && echo "LEFT /sys/fs/bpf/smc"
exit 0
