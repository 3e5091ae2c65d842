#!/usr/bin/env bash
# A load of the real release's layout, timed on the GPU machine: `graphrun synth --sparse` writes
# a checkpoint with the names, shapes and dtypes of Qwen3.8-Flash-Next with NVFP4 experts (its
# matrices left as holes: zeros, almost no disk), then `graphrun run --device cuda` loads it onto
# the device and decodes a few tokens; its stderr line `loaded ...` gives the bytes, seconds,
# GB/s and host memory of the load.
#
#   here:            cargo build --release && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_load.sh     # through the `device` tool, carry: ["gpu-bin"]
#
# NGRAM_BASE (default: the config's 20000000, the release's 102 GB bf16 n-gram table, which the
# memory plan keeps on the host) sets ngram_vocab_size_base. Writes $OUT/load.log (or results/);
# commit it as results/load.log.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results}"
base="${NGRAM_BASE:-20000000}"
dir=/tmp/graphrun-release-layout
config=/tmp/graphrun-release-config.json
python3 - "$base" >"$config" <<'PY'
import json, sys
c = json.load(open("tests/data/configs/qwen3.8-flash-next.json"))
c["text_config"]["ngram_vocab_size_base"] = int(sys.argv[1])
print(json.dumps(c))
PY
{
    echo "# graphrun: a load of the release's layout (sparse synth, NVFP4 experts, bf16 trunk)"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ); ngram_vocab_size_base $base"
    echo "# command: bash scripts/gpu_load.sh"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    rm -rf "$dir"
    TIMEFORMAT="synth: %R s"
    time ./gpu-bin/graphrun synth --config "$config" --out "$dir" \
        --experts nvfp4 --dtype bf16 --sparse
    echo "apparent size: $(du -sh --apparent-size "$dir" | cut -f1), on disk: $(du -sh "$dir" | cut -f1)"
    # Cold and then warm page cache (the second run reads the files from memory).
    for pass in 1 2; do
        echo "## pass $pass"
        TIMEFORMAT="run (load, compile, 8-token prefill, 4 tokens): %R s"
        time ./gpu-bin/graphrun run --model "$dir" --device cuda \
            --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 4 --context 4096
    done
    rm -rf "$dir"
} >"$out/load.log" 2>&1
