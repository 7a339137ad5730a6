#!/bin/sh
# Do two builds write the same output files? Runs the replay example (the synthetic event
# stream of `cargo xtask bench --only replay`) from a baseline build and from this tree with
# each writer, and compares every file byte for byte. Output directory and file names carry
# the wall-clock time (YYYYMMDDhhmmss), so files are matched by their path with those 14
# digits masked.
#
#   tests/replay-identical.sh BASELINE_REPLAY [EVENTS]
#
# BASELINE_REPLAY: the replay example built from the baseline, e.g. before a merge:
#   cargo build --release -p memscope-bpf --example replay && cp target/release/examples/replay /tmp/replay.base
# EVENTS: events per run with the csv writer (default 1000000; the db writer gets a tenth).
# Exit status 0 when every file matches, 1 when one differs or is missing.
set -eu
base=${1:?usage: tests/replay-identical.sh BASELINE_REPLAY [EVENTS]}
events=${2:-1000000}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cargo build --release -p memscope-bpf --example replay
target=${CARGO_TARGET_DIR:-target}
new="$target/release/examples/replay"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for writer in csv db; do
    n=$events
    [ "$writer" = db ] && n=$((events / 10))
    for side in base new; do
        exe=$base
        [ "$side" = new ] && exe=$new
        "$exe" --events "$n" --writer "$writer" --out "$work/$side-$writer" >"$work/$side-$writer.json"
        (cd "$work/$side-$writer" && find . -type f | sort) |
            sed 's/[0-9]\{14\}/T/g' >"$work/$side-$writer.names"
    done
    if ! cmp -s "$work/base-$writer.names" "$work/new-$writer.names"; then
        echo "$writer: different files:"
        diff "$work/base-$writer.names" "$work/new-$writer.names" || true
        status=1
        continue
    fi
    count=0
    for f in $(cd "$work/base-$writer" && find . -type f | sort); do
        masked=$(echo "$f" | sed 's/[0-9]\{14\}/T/g')
        other=$(cd "$work/new-$writer" && find . -type f | while read -r g; do
            [ "$(echo "$g" | sed 's/[0-9]\{14\}/T/g')" = "$masked" ] && echo "$g"; done)
        if cmp "$work/base-$writer/$f" "$work/new-$writer/$other"; then
            count=$((count + 1))
        else
            status=1
        fi
    done
    echo "$writer ($n events): $count files, $( (cd "$work/base-$writer" && find . -type f -exec cat {} +) | wc -c) bytes compared"
done
[ "$status" = 0 ] && echo "replay output: byte-identical" || echo "replay output: DIFFERS"
exit "$status"
