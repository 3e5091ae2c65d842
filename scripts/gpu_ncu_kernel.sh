#!/usr/bin/env bash
# Nsight Compute detail (speed of light, occupancy, warp stall reasons, launch statistics) for
# named decode kernels, on the GPU machine: where a latency-bound kernel waits.
#
#   here:            cargo build --release && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_ncu_kernel.sh REGEX [SKIP COUNT]   # `device` tool, carry: ["gpu-bin"]
#   EXTRA_SECTIONS="SourceCounters" adds sections (SourceCounters: the instructions warps stall on).
#   BENCH_ARGS="..." profiles another bench run than the default one-layer decode.
#
# Profiles COUNT launches (default 8) of the kernels matching REGEX after the first SKIP (default
# 8: past warm-up) in a one-layer bench at the real geometry; writes $OUT/ncu_kernel.log (or
# results/ when OUT is unset) and ncu's unfiltered output in ncu_raw.txt.
source "$(dirname "$0")/gpu_env.sh"
# BENCH_ARGS replaces the bench's arguments (e.g. a 2048-token prefill for a prefill kernel).
read -r -a bench_args <<<"${BENCH_ARGS:---layers 1 --contexts 16 --prefills 16 --chunk 16 --decode-steps 4}"
cmd=(./gpu-bin/graphrun bench "${bench_args[@]}")
sections=(--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis)
for s in ${EXTRA_SECTIONS:-}; do sections+=(--section "$s"); done
re=$1
skip=${2:-8}
count=${3:-8}
{
    echo "# graphrun decode kernels under ncu, in detail"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: $NCU --kernel-name regex:$re --launch-skip $skip --launch-count $count ${sections[*]} ${cmd[*]}"
    "$NCU" --kernel-name "regex:$re" --launch-skip "$skip" --launch-count "$count" "${sections[@]}" "${cmd[@]}" \
        >"$out/ncu_raw.txt" 2>&1 || true
    # ncu's report from the first kernel's header on (the bench's own table is left out).
    sed -n '/^  [a-z_0-9]* *(/,$p' "$out/ncu_raw.txt"
} >"$out/ncu_kernel.log" 2>&1
