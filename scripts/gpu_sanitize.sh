#!/usr/bin/env bash
# compute-sanitizer over graphrun's kernels, on the GPU machine: memcheck (out-of-bounds and
# misaligned accesses, in global and shared memory) and racecheck (shared-memory races) on the
# tiny model shipped in models/ (prefill and decode, CUDA graphs on, then eager with a sync after
# every node; a short prompt and one of 40 tokens), both on the tiny geometry in bf16 with 70
# tokens (the tensor-core tiles), and memcheck on one layer at the real geometry (decode, and an
# 80-token prefill: the tensor-core tiles there).
#
#   here:            cargo build --release && mkdir -p gpu-bin && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_sanitize.sh     # through the `device` tool, carry: ["gpu-bin"]
#
# Writes $OUT/sanitize.log (or results/ when OUT is unset): each run's command and the
# sanitizer's error summary (the first errors in full). Commit it as results/sanitize.log.
source "$(dirname "$0")/gpu_env.sh"
SANITIZER=${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
tiny=(./gpu-bin/graphrun run --model models/tiny-qwen4exp --prompt "the cat sat on the mat ." --max-new-tokens 4 --device cuda)
# A prompt of 40 ids: the GDN scan stages several chunks of 16 tokens (kernels/gdn.cu).
ids=$(seq -s, 1 40)
long=(./gpu-bin/graphrun run --model models/tiny-qwen4exp --prompt-ids "$ids" --max-new-tokens 2 --device cuda)
# The tiny model's geometry in bf16 (synthesized on the device) with a prompt of 70 ids: the
# tensor-core tiles (64 tokens or more, bf16 weights) and the expert-major experts at shapes small
# enough for racecheck, which takes minutes on them at the real geometry.
tiny_bf16=/tmp/graphrun-tiny-bf16
ids70=$(seq -s, 1 70)
mma=(./gpu-bin/graphrun run --model "$tiny_bf16" --prompt-ids "$ids70" --max-new-tokens 2 --device cuda)
# The NVFP4 fixture (packed experts with E4M3 NaN scale bytes; vocab 128): one token a step
# (token-major) after a 70-token prompt (the expert-major tensor-core tiles).
nvfp4=(./gpu-bin/graphrun run --model tests/fixtures/tiny-nvfp4 --prompt-ids "$ids70" --max-new-tokens 2 --device cuda)
# The real geometry, one layer, NVFP4 experts (bench's default).
real=(./gpu-bin/graphrun bench --layers 1 --contexts 16 --prefills 16 --chunk 16 --decode-steps 2)
# A prefill of 80 tokens at the real geometry: at least 64, so the tensor-core tiles run (a
# part-full tile of tokens, split k for the narrow products, the expert-major experts).
real_mma=(./gpu-bin/graphrun bench --layers 1 --contexts 16 --prefills 80 --chunk 80 --decode-steps 2)
check() {
    local tool=$1
    shift
    echo "## $tool: $*"
    "$SANITIZER" --tool "$tool" --print-limit 10 "$@" >"$out/sanitize_run.txt" 2>&1 || true
    grep -v "Host Frame" "$out/sanitize_run.txt" | grep -E "^=========" | head -40
}
{
    echo "# graphrun under compute-sanitizer"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: bash scripts/gpu_sanitize.sh"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    check memcheck "${tiny[@]}"
    check memcheck "${tiny[@]}" --sync-each-node
    check racecheck "${tiny[@]}" --sync-each-node
    check racecheck "${long[@]}" --sync-each-node
    check memcheck "${long[@]}"
    ./gpu-bin/graphrun synth --config models/tiny-qwen4exp/config.json --dtype bf16 --out "$tiny_bf16"
    check memcheck "${mma[@]}"
    check racecheck "${mma[@]}" --sync-each-node
    check memcheck "${nvfp4[@]}"
    check racecheck "${nvfp4[@]}" --sync-each-node
    check memcheck "${real[@]}"
    check memcheck "${real_mma[@]}"
    # No racecheck on real_mma: it takes longer than ~4 minutes there (the tensor-core tiles get it
    # on the tiny bf16 model above).
} >"$out/sanitize.log" 2>&1
rm -f "$out/sanitize_run.txt"
