#!/usr/bin/env bash
# Two builds of graphrun on one GPU in one call: their logits and greedy tokens compared bit for
# bit on the fixtures, then the default bench alternating between them (machines differ from
# call to call by a few percent: compare only within one call).
#
#   here:            cargo build --release; cp target/release/graphrun gpu-bin/graphrun;
#                    (another build) -> gpu-bin/base/graphrun
#   on the device:   bash scripts/gpu_compare.sh gpu-bin/base/graphrun gpu-bin/graphrun [passes]
#
# Writes $OUT/compare.log (or results/): the bit comparison, then each bench's summary lines
# (full logs as $OUT/compare-<a|b><pass>.log). Commit it as results/bench-compare.log.
source "$(dirname "$0")/gpu_env.sh"
base=${1:?the baseline binary}
new=${2:?the new binary}
passes=${3:-2}
# The bench's shapes (BENCH_ARGS overrides them, e.g. to fit a short device call). Both binaries
# get the same arguments: a baseline from before 05b90c4 benches bf16 experts and knows no
# --experts, the newer ones NVFP4 by default; compare across that change only by hand.
read -r -a bench_args <<<"${BENCH_ARGS:---layers 8 --contexts 1024,8192 --prefills 2048,8192}"
# A prompt of 4 ids (a short prefill: its lm head sees one row) and one of 30.
prompts=("5,6,7,8" "$(seq -s, 3 2 61)")
{
    echo "# graphrun: two builds compared"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: bash scripts/gpu_compare.sh $base $new $passes (bench ${bench_args[*]})"
    echo "# a: $base ($(sha256sum "$base" | cut -c1-12)), b: $new ($(sha256sum "$new" | cut -c1-12))"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    echo "## logits and greedy tokens, bit for bit"
    for m in tests/fixtures/tiny-flat-f32 tests/fixtures/tiny-composite-bf16 tests/fixtures/tiny-long-f32 models/tiny-qwen4exp; do
      for ids in "${prompts[@]}"; do
        for graphs in "" "--no-graphs"; do
            for b in a b; do
                bin=$base; [ $b = b ] && bin=$new
                "$bin" logits --model "$m" --prompt-ids "$ids" --device cuda $graphs --out "/tmp/logits-$b.safetensors" >/dev/null 2>&1 || echo "logits failed: $bin $m $graphs"
                "$bin" run --model "$m" --prompt-ids "$ids" --max-new-tokens 24 --ignore-eos --device cuda $graphs 2>/dev/null | tail -1 >"/tmp/greedy-$b.txt" || echo "run failed: $bin $m $graphs"
            done
            l=$(cmp -s /tmp/logits-a.safetensors /tmp/logits-b.safetensors && echo same || echo DIFFER)
            g=$(cmp -s /tmp/greedy-a.txt /tmp/greedy-b.txt && echo same || echo DIFFER)
            echo "$m ${ids:0:12}... ${graphs:-graphs}: logits $l, greedy tokens $g ($(cut -c1-50 /tmp/greedy-b.txt)...)"
        done
      done
    done
    echo "## default bench, alternating"
    for p in $(seq 1 "$passes"); do
        for b in a b; do
            bin=$base; [ $b = b ] && bin=$new
            "$bin" bench "${bench_args[@]}" >"$out/compare-$b$p.log" 2>&1 || echo "bench failed: $bin"
            echo "### $b pass $p ($bin)"
            grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|greedy decode|dense parts in the replayed graph \(|tok/s|tokens/s" "$out/compare-$b$p.log" | head -14
        done
    done
} 2>&1 | tee "$out/compare.log"
