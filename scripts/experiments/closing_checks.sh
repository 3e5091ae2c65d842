#!/usr/bin/env bash
# Sourced by the experiment scripts (on the device, in the repository root, $OUT set) for a
# session's closing run of a build:
#   closing_checks NODES   every GPU test, the decode timeline at 8 layers, 8k (its lines for the
#                          nodes matching the regex NODES), the default bench, the sanitizers
# Each step is also a function of its own (gpu_tests_check, trace_check [NODES],
# default_bench_check, sanitize_check). Logs: $OUT/gpu_tests.log, trace.log, bench.log,
# bench.json, sanitize.log.
gpu_tests_check() {
    bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu_tests rc $?"
    grep -E "^## |test result|panicked|FAILED" "$OUT/gpu_tests.log" | head -30
}
trace_check() {
    NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
    rm -f "$OUT/trace.json"
    grep -E "decode timeline|dense parts in the replayed" "$OUT/trace.log" | cut -c1-60,150-230
    if [ -n "${1:-}" ]; then grep -E "$1" "$OUT/trace.log" | cut -c1-130; fi
}
default_bench_check() {
    bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
    grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
}
sanitize_check() {
    timeout 170 bash scripts/gpu_sanitize.sh >/dev/null 2>&1; echo "sanitize rc $?"
    grep -E "^##|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log"
}
closing_checks() {
    gpu_tests_check
    trace_check "$1"
    default_bench_check
    sanitize_check
}
