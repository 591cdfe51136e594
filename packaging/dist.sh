#!/bin/sh
# Builds the smc-rs release tarball from built binaries (`cargo xtask dist` runs it after the
# release build): dist.sh BIN_DIR OUT_DIR VERSION. BIN_DIR holds smc-ctl and libsmc_preload.so.
# The tarball holds files/ (the tree to install under /: the binary, the library, the systemd
# units, the man pages, the shell completions, the Kubernetes manifests), install.sh and
# MANIFEST (the installed paths). It needs no Rust toolchain to install.
set -eu
BIN=$1 OUT=$2 VERSION=$3
HERE=$(cd "$(dirname "$0")" && pwd)
NAME=smc-rs-$VERSION-$(uname -m)-linux
STAGE=$OUT/$NAME
rm -rf "$STAGE" "$OUT/$NAME.tar.gz"
F=$STAGE/files
install -D -m 0755 "$BIN/smc-ctl" "$F/usr/bin/smc-ctl"
install -D -m 0644 "$BIN/libsmc_preload.so" "$F/usr/lib/smc/libsmc_preload.so"
# The release profile keeps line tables for the project's own debugging; the package does not.
if command -v strip >/dev/null; then
    strip --strip-debug "$F/usr/bin/smc-ctl" "$F/usr/lib/smc/libsmc_preload.so"
fi
for u in smc-daemon.service smc-attach@.service smc.slice; do
    install -D -m 0644 "$HERE/systemd/$u" "$F/usr/lib/systemd/system/$u"
done
# The drop-in that enables one service: copy it to /etc/systemd/system/NAME.service.d/smc.conf.
install -D -m 0644 "$HERE/systemd/smc-enable.conf" "$F/usr/share/smc/systemd/smc-enable.conf"
for k in "$HERE"/kubernetes/*.yaml; do
    install -D -m 0644 "$k" "$F/usr/share/smc/kubernetes/$(basename "$k")"
done
mkdir -p "$F/usr/share/man/man8"
"$BIN/smc-ctl" man "$F/usr/share/man/man8" >/dev/null
gzip -9n "$F"/usr/share/man/man8/*.8
mkdir -p "$F/usr/share/bash-completion/completions" "$F/usr/share/zsh/vendor-completions" \
    "$F/usr/share/fish/vendor_completions.d"
"$BIN/smc-ctl" completions bash > "$F/usr/share/bash-completion/completions/smc-ctl"
"$BIN/smc-ctl" completions zsh > "$F/usr/share/zsh/vendor-completions/_smc-ctl"
"$BIN/smc-ctl" completions fish > "$F/usr/share/fish/vendor_completions.d/smc-ctl.fish"
install -m 0755 "$HERE/install.sh" "$STAGE/install.sh"
(cd "$F" && find . -type f | sed 's|^\.||' | LC_ALL=C sort) > "$STAGE/MANIFEST"
tar -C "$OUT" --owner=0 --group=0 --numeric-owner --sort=name -czf "$OUT/$NAME.tar.gz" "$NAME"
echo "$OUT/$NAME.tar.gz"
