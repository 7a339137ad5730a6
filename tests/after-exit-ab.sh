#!/bin/bash
# Side by side: the formerly traced target's and a neighbour's HAL loop 0.5 s after a --pid
# tracer exits (SIGINT after 0.3 s attached), for tracer binaries given as arguments (and no
# tracer), interleaved rounds. Prints cpu ns per pair (target, neighbour) per run.
# Needs root and the fixtures (make -C tests/fixtures). A system-wide agent on the machine puts
# breakpoints in every HAL loop and spoils the figures: check none runs.
#   tests/after-exit-ab.sh ROUNDS NAME=TRACER_BINARY ...
# e.g. tests/after-exit-ab.sh 10 before=/tmp/memscope-bpf.base after=target/release/memscope-bpf
set -u
B=$(cd "$(dirname "$0")" && pwd)/fixtures/build/bin
ROUNDS=$1; shift
D=$(mktemp -d)
no_tracer_left() { for e in /proc/[0-9]*/exe; do r=$(readlink $e 2>/dev/null); for b in "$@"; do [ "$r" = "$b" ] && return 1; done; done; return 0; }
bins=(); for a in "$@"; do bins+=("$(realpath "${a#*=}")"); done
for round in $(seq $ROUNDS); do
  for cfg in none "$@"; do
    name=${cfg%%=*}; bin=${cfg#*=}
    for i in $(seq 60); do no_tracer_left "${bins[@]}" && break; sleep 0.5; done
    rm -f $D/go; $B/bench_loop --mode hal --iters 200000 --wait-file $D/go > $D/t.out & T=$!
    $B/bench_loop --mode hal --iters 200000 --wait-file $D/go > $D/n.out & N=$!
    sleep 0.3
    if [ $name != none ]; then
      $bin --pid $T -o $D/out 2> $D/err & P=$!
      for i in $(seq 300); do grep -q "attached to pid" $D/err && break; sleep 0.1; done
      sleep 0.3; kill -INT $P; wait $P
      sleep 0.5
    fi
    touch $D/go; wait $T $N
    t=$(grep -o 'cpu_ns_per_call=[0-9.]*' $D/t.out | cut -d= -f2); n=$(grep -o 'cpu_ns_per_call=[0-9.]*' $D/n.out | cut -d= -f2)
    echo "round=$round cfg=$name target_cpu_ns_pair=$(echo "$t*2" | bc) neighbour_cpu_ns_pair=$(echo "$n*2" | bc)"
  done
done
rm -rf $D
