#!/usr/bin/env bash
# Run every fuzz target of smc-common (and the daemon request decoder of smc-ism) for SECONDS each (default 10), one after the other,
# single process (the machine is shared). Exits non-zero if any target finds a crash.
#
#   smc-common/fuzz/run.sh 30
#
# Needs the nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz if it
# is missing. Corpora grow in fuzz/corpus/<target>/ (not committed); committed seeds are read
# from fuzz/seeds/<target>/ when present. Crashes land in fuzz/artifacts/<target>/.
set -euo pipefail

secs="${1:-10}"
case "$secs" in
'' | *[!0-9]*) echo "usage: $0 SECONDS" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "run.sh: the nightly toolchain is required (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# Keep fuzz builds (sanitizer flags) apart from normal builds.
target_dir="${CARGO_TARGET_DIR:-$here/target}/fuzz"
targets=(clc_decode clc_message handshake cdc ism_request procstats)

buildlog="$(mktemp)"
if ! cargo +nightly fuzz build --target-dir "$target_dir" >"$buildlog" 2>&1; then
    cat "$buildlog" >&2
    rm -f "$buildlog"
    exit 1
fi
rm -f "$buildlog"

status=0
summary=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    dirs=("corpus/$t")
    [ -d "seeds/$t" ] && dirs+=("seeds/$t")
    log="$(mktemp)"
    echo "== $t: ${secs}s"
    if cargo +nightly fuzz run --target-dir "$target_dir" "$t" "${dirs[@]}" -- \
        -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
        tail -n 40 "$log" >&2
    fi
    runs="$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -n1 | grep -Eo '[0-9]+' || true)"
    cov="$(grep -Eo 'cov: [0-9]+' "$log" | tail -n1 || true)"
    summary+=("$t: $result, ${runs:-?} executions, ${cov:-cov: ?}")
    rm -f "$log"
done

echo "== fuzz summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
exit "$status"
