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
# gpu_test_runs TEST...: each GPU test binary of gpu-bin/ (200 s at most), its log in $OUT, its
# summary lines.
gpu_test_runs() {
    local t
    for t in "$@"; do
        timeout 200 ./gpu-bin/$t --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"
        grep -E "test result|panicked|checks passed" "$OUT/$t.log"
    done
}
# trace_of NAME BINARY NODES [VAR=VALUE ...]: the timeline at 8 layers, 8k with BINARY (and the
# env assignments), kept as $OUT/trace-NAME.log; prints its step line, the launches of the nodes
# matching the regex NODES and any phase marks (GRAPHRUN_MARKS=1 with a marks build).
trace_of() {
    local name=$1 bin=$2 nodes=$3
    shift 3
    env "$@" NAME=trace-$name GRAPHRUN_BIN=$bin timeout 60 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "trace $name rc $?"; rm -f "$OUT/trace-$name.json"
    grep -E "decode timeline" "$OUT/trace-$name.log" | cut -c1-60,150-230
    grep -E "$nodes" "$OUT/trace-$name.log" | grep blocks | cut -c1-130
    grep -E "^marks" "$OUT/trace-$name.log"
}
# memcheck_tiny BINARY: compute-sanitizer's memcheck over BINARY generating 4 tokens of the tiny
# model ($OUT/memcheck.log), its summary line.
memcheck_tiny() {
    timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck "$1" run --model models/tiny-qwen4exp --prompt "the cat sat on the mat ." --max-new-tokens 4 --device cuda >"$OUT/memcheck.log" 2>&1
    echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log"
}
# sweep_rows ROWS: `bench --sweep-linear` at 8 layers (gpu-bin/graphrun, or GRAPHRUN_BIN), kept as
# $OUT/sweep.log (its json dropped: a call returns 8 files); prints the rows matching the regex
# ROWS.
sweep_rows() {
    NAME=sweep timeout 240 bash scripts/gpu_bench.sh --layers 8 --contexts 1024 --prefills 16 --sweep-linear >/dev/null 2>&1
    echo "sweep rc $?"
    grep -E "$1" "$OUT/sweep.log"
    rm -f "$OUT/sweep.json"
}
