#!/usr/bin/env bash
# What each op kind costs inside the replayed decode graph: the benchmark once as it is, then once
# per kind with that kind's nodes launched twice (`graphrun bench --launch-twice KIND`); a node's
# marginal cost is the step's growth over the baseline divided by the kind's nodes a step. Runs
# on the GPU machine (which has no Rust toolchain):
#
#   here:            cargo build --release && mkdir -p gpu-bin && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_marginal_costs.sh [KIND...]   # through the `device` tool, carry: ["gpu-bin"]
#
# Writes $OUT/marginal.log (or results/ when OUT is unset): each run's command, and a table.
# Commit it as results/marginal-costs.log. Runs vary by about ±0.01 ms a step, so a
# node's figure is uncertain by about that divided by its count. A kind whose kernels run ahead of
# the node before them (kernels/common.cuh) reads low here: its second launch runs ahead of its
# first. Only the step's total says whether a change gained.
# A second launch also finds the weights of a small node hot in L2: `bash scripts/gpu_bench.sh
# --layers 8 --contexts 8192 --prefills 16 --trace` times every launch inside the graph as it is.
source "$(dirname "$0")/gpu_env.sh"
kinds=("$@")
if [ ${#kinds[@]} -eq 0 ]; then
    kinds=(hc_read linear_group causal_conv gdn_normed_recurrence linear_hc_write moe_router moe_experts
        swiglu_linear moe_shared_write indexer_select_qk gated_attention)
fi
common=(--layers 8 --contexts 1024 --decode-steps 64 --prefills 16 --chunk 16)
step_ms() { # the replayed graph's ms a step (device events) and the kind's node count from bench.json
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
kind = sys.argv[2]
nodes = sum(r["nodes_per_step"] for r in d["decode_profile"] if r["op"].split("/")[0] == kind)
print("%.4f %d" % (sum(d["decode"][0]["ms_per_segment"]), nodes))' "$1" "$2"
}
{
    echo "# graphrun marginal costs in the replayed decode graph"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: bash scripts/gpu_marginal_costs.sh ${kinds[*]}"
    echo "# each run: ./gpu-bin/graphrun bench ${common[*]} [--launch-twice KIND]"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    ./gpu-bin/graphrun bench "${common[@]}" --json "$out/base.json" >"$out/base.txt" 2>&1
    read -r base _ < <(step_ms "$out/base.json" none)
    echo "baseline: $base ms a step"
    printf "%-24s %6s %12s %14s\n" kind nodes "ms a step" "us a node"
    for k in "${kinds[@]}"; do
        ./gpu-bin/graphrun bench "${common[@]}" --launch-twice "$k" --json "$out/twice.json" >"$out/twice.txt" 2>&1 ||
            { echo "$k: failed"; tail -3 "$out/twice.txt"; continue; }
        read -r ms _ < <(step_ms "$out/twice.json" none)
        read -r _ nodes < <(step_ms "$out/base.json" "$k")
        python3 -c 'import sys
k, n, b, m = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print("%-24s %6d %12.4f %14.2f" % (k, n, m, (m - b) / n * 1000 if n else float("nan")))' "$k" "$nodes" "$base" "$ms"
    done
    ./gpu-bin/graphrun bench "${common[@]}" --json "$out/base2.json" >/dev/null 2>&1
    read -r again _ < <(step_ms "$out/base2.json" none)
    echo "baseline again: $again ms a step"
} 2>&1 | tee "$out/marginal.log"
rm -f "$out/twice.json" "$out/twice.txt"
