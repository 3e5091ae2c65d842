#!/usr/bin/env bash
# Sourced by the A/B experiment scripts (on the device, in the repository root, $OUT set):
#   bench NAME BINARY [VAR=VALUE ...]
# runs the plain bench at 8 layers, 8k context with BINARY (and the env assignments), keeps
# $OUT/bench-NAME.log and prints one line: the dense-part measures (the bench's, then the experts
# at the copy rate) and the 8192 row (ms/tok graph, no overlap, eager, MB/tok, of copy bw,
# [ms per segment]). Put the baseline binary in the same call: machines differ by a few percent.
bench() {
    local name=$1 bin=$2
    shift 2
    env "$@" NAME=bench-$name GRAPHRUN_BIN=$bin timeout 60 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1
    echo "$name rc $? $(grep -h "dense parts in the replayed" "$OUT/bench-$name.log" | grep -o '0\.[0-9]* of copy' | tr '\n' ' ') | $(grep -hE '^ +8192 ' "$OUT/bench-$name.log" | head -1 | tr -s ' ')"
    rm -f "$OUT/bench-$name.json"
}
