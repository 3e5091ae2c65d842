#!/usr/bin/env bash
# Fewer dependent round trips in the decode chain's kernels (branch chain-rounds + the helpers'
# audits of attention.cu, linear.cu, moe.cu, ple.cu): every GPU test, built from the candidate,
# then the decode timeline at 8 layers, 8k context, for main before it (gpu-bin/graphrun-main),
# the candidate (gpu-bin/graphrun) and the candidate with hc_read_gate_s holding its dependents
# until its activations are formed (gpu-bin/graphrun-late). carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked" "$OUT/gpu_tests.log" | head -40
for v in main cand late main cand late; do
    bin=./gpu-bin/graphrun-$v
    [ "$v" = cand ] && bin=./gpu-bin/graphrun
    GRAPHRUN_BIN=$bin NAME=trace-$v bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "$v trace rc $?"
    rm -f "$OUT/trace-$v.json"
    grep -E "decode timeline|dense parts in the replayed" "$OUT/trace-$v.log" | cut -c1-60,150-230
done
