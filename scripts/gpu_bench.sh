#!/usr/bin/env bash
# The benchmark at the real geometry, on the GPU machine (which has no Rust toolchain).
#
#   here:            cargo build --release && mkdir -p gpu-bin && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_bench.sh [bench options]   # through the `device` tool, carry: ["gpu-bin"]
#
# Writes $OUT/bench.log (a header with the command and date, then the table) and $OUT/bench.json
# (or results/ when OUT is unset); commit them as results/bench-default.{log,json} (the default
# options), results/bench-trace.log (--trace) or results/bench-sweep-linear.log (--sweep-linear).
# Default options: the whole model (48 layers, NVFP4 experts, the release's n-gram table where
# the memory plan puts it: the host), decode at 1k, 8k and 32k, prompts of 2k to 262k tokens (in
# steps of the chunk graphs/steps.ron gives CUDA, as `graphrun run` prefills; --chunk N for
# steps of N tokens, --chunk 0 for each prompt in one step).
# Add --trace for the decode step's timeline inside the replayed graph at the largest context,
# kernel by kernel (the kernels are then built to record it: time the headline figures without).
# GRAPHRUN_BIN picks another binary (an experiment's, say gpu-bin/handoff/graphrun) and NAME the
# log's name ($OUT/$NAME.log, $OUT/$NAME.json; default bench), so that one device call compares
# several builds.
source "$(dirname "$0")/gpu_env.sh"
bin="${GRAPHRUN_BIN:-./gpu-bin/graphrun}"
name="${NAME:-bench}"
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    args=(--contexts 1024,8192,32768 --prefills 2048,8192,32768,131072,262000 --decode-steps 16)
fi
{
    echo "# graphrun bench"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: $bin bench ${args[*]} --json $name.json"
    echo "# commit: ${TREE:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (plus uncommitted changes, if any)}"
    env | grep '^GRAPHRUN_' | sort | sed 's/^/# env: /' || true
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$bin" bench "${args[@]}" --json "$out/$name.json"
} 2>&1 | tee "$out/$name.log"
