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
# Copies tree $1 to $2 with the 14-digit times in its paths masked.
masked_copy() {
    (cd "$1" && find . -type f) | while read -r f; do
        m=$(echo "$f" | sed 's/[0-9]\{14\}/T/g')
        mkdir -p "$2/$(dirname "$m")"
        cp "$1/$f" "$2/$m"
    done
}
for writer in csv db; do
    n=$events
    [ "$writer" = db ] && n=$((events / 10))
    for side in base new; do
        exe=$base
        [ "$side" = new ] && exe=$new
        "$exe" --events "$n" --writer "$writer" --out "$work/$side-$writer" >"$work/$side-$writer.json"
        masked_copy "$work/$side-$writer" "$work/masked-$side-$writer"
    done
    files=$(find "$work/masked-base-$writer" -type f | wc -l)
    bytes=$(find "$work/masked-base-$writer" -type f -exec cat {} + | wc -c)
    if diff -r "$work/masked-base-$writer" "$work/masked-new-$writer" >"$work/$writer.diff" 2>&1; then
        echo "$writer ($n events): $files files, $bytes bytes: identical"
    else
        echo "$writer ($n events): DIFFERENT:"
        head -20 "$work/$writer.diff"
        status=1
    fi
done
if [ "$status" = 0 ]; then echo "replay output: byte-identical"; else echo "replay output: DIFFERS"; fi
exit "$status"
