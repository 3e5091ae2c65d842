#!/usr/bin/env bash
# Session 12, second call: the ring down kernel after its fix (the shared-memory allowance
# rounded as the launcher rounds the launch's: 16-byte words; the first call's launches past
# 48 KB failed with CUDA_ERROR_INVALID_VALUE, results/2026-11-30-session12-ab-*.log).
# Build as 2026-11-30-session12-ab.sh (patches/2026-11-30-down-ring2.patch now holds the fix).
# carry: ["gpu-bin"]. RESULT (results/2026-11-30-session12-ring-*.log): correct (bit-equal to the
# rows kernel) but 25.9 us a layer against 12.4-12.7: segments 1.333 against 1.218 ms. Not landed.
# gpu_moe (the ring against the rows kernel bit for bit and the CPU at the real shape), then the
# plain bench at 8 layers, 8k (dense-part measures, no trace build) alternating main's
# behaviour / the narrow router / the narrow router + the ring, twice, then one trace of the last.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe --nocapture --test-threads=1 >"$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked|real|H2560" "$OUT/gpu_moe.log" | head -20
source scripts/experiments/ab_bench.sh
for pass in 1 2; do
    bench main ./gpu-bin/graphrun GRAPHRUN_ROUTER_GENERAL=1 GRAPHRUN_GDN_HOLD=0 GRAPHRUN_DOWN_RING=0
    bench narrow ./gpu-bin/graphrun GRAPHRUN_GDN_HOLD=0 GRAPHRUN_DOWN_RING=0
    bench ring ./gpu-bin/graphrun GRAPHRUN_GDN_HOLD=0
done
GRAPHRUN_GDN_HOLD=0 NAME=trace-ring bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
echo "ring trace rc $?"; rm -f "$OUT/trace-ring.json"
grep -E "decode timeline" "$OUT/trace-ring.log" | cut -c1-60,150-230
grep -E "^    blk.1.(moe|mlp)" "$OUT/trace-ring.log" | cut -c1-130
