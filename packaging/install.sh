#!/bin/sh
# Installs smc-rs from an unpacked release tarball: install.sh [--root DIR] (default /).
# Copies files/ under DIR (binary /usr/bin/smc-ctl, library /usr/lib/smc/libsmc_preload.so,
# systemd units, man pages, completions, Kubernetes manifests under /usr/share/smc), then, on a
# running systemd host with DIR=/, reloads systemd. Enable the daemon with
# `systemctl enable --now smc-daemon.service`. Needs no Rust toolchain.
set -eu
ROOT=/
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT=$2; shift 2 ;;
        --root=*) ROOT=${1#--root=}; shift ;;
        -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (usage: install.sh [--root DIR])" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
while read -r f; do
    install -D -m "$(stat -c %a "$HERE/files$f")" "$HERE/files$f" "$ROOT$f"
done < "$HERE/MANIFEST"
if [ "$ROOT" = / ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "smc-rs installed under $ROOT ($(wc -l < "$HERE/MANIFEST") files); next: systemctl enable --now smc-daemon.service"
