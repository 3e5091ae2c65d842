//! The MoE on CUDA (`kernels/moe.cu`): the router and the routed experts.

use crate::registry::{require, DeviceFacts, NodeFacts, Variant, WeightFormat};

/// The largest `top_k` the router kernels keep (`ROUTER_MAX_TOPK`).
pub const ROUTER_MAX_TOPK: usize = 64;
/// The router's threads a block, and the experts a thread of the wide kernel holds
/// (`ROUTER_THREADS`, `ROUTER_PER_LANE`).
pub const ROUTER_THREADS: usize = 1024;
pub const ROUTER_PER_LANE: usize = 4;
/// Output rows a block of `moe_experts_down_rows_*` takes (`DOWN_ROWS`) and the shared memory it
/// may stage a token's act rows in.
pub const DOWN_ROWS: usize = 8;
pub const DOWN_ROWS_MAX_SHARED: usize = 48 * 1024;
/// Most slot products a row of the down kernels keeps.
pub const DOWN_MAX_TOPK: usize = 4096;

fn router(max_experts: usize) -> impl Fn(&NodeFacts) -> Result<(), String> {
    move |f| {
        let (e, k) = (f.dim("experts"), f.dim("top_k"));
        require(
            e > 0 && e <= max_experts && k > 0 && k <= e && k <= ROUTER_MAX_TOPK,
            || {
                format!("top {k} of {e} experts: this router takes up to {max_experts} experts and top {ROUTER_MAX_TOPK}")
            },
        )
    }
}

pub static MOE_ROUTER: &[Variant] = &[
    Variant {
        op: "moe_router",
        name: "reference",
        doc: "a block per row, up to 4 experts a thread: softmax, then top-k with ties to the lower id",
        accepts: |f, _| router(ROUTER_THREADS * ROUTER_PER_LANE)(f),
        kernels: |_, _| vec!["moe_router_reference_f32".into()],
    },
    Variant {
        op: "moe_router",
        name: "narrow",
        doc: "a block per row, an expert a thread: a quarter of the wide kernel's code, the same bits",
        accepts: |f, _| router(ROUTER_THREADS)(f),
        kernels: |_, _| vec!["moe_router_narrow_f32".into()],
    },
];

/// Shared memory of `moe_experts_down_rows_*`: the token's act rows, its expert ids (i64) and
/// router weights, and its blocks' products.
pub fn down_rows_shared(top_k: usize, intermediate: usize) -> usize {
    (top_k * intermediate + DOWN_ROWS * top_k + top_k) * 4 + top_k * 8
}

/// Whether `moe_experts_down_rows_*` takes the shape: whole blocks of rows, the act rows in
/// 16-byte units and within its shared memory.
pub fn down_rows_fits(top_k: usize, hidden: usize, intermediate: usize) -> bool {
    hidden.is_multiple_of(DOWN_ROWS)
        && (top_k * intermediate).is_multiple_of(4)
        && down_rows_shared(top_k, intermediate) <= DOWN_ROWS_MAX_SHARED
}

/// Warps of a block of the NVFP4 token-major kernels (`NVFP4_WARPS` in kernels/moe_nvfp4.cu), and
/// the output rows of a token a down block takes (`NVFP4_DOWN_ROWS`).
pub const NVFP4_WARPS: usize = 8;
pub const NVFP4_DOWN_ROWS: usize = 8;
/// Dynamic shared memory a kernel may use without opting in.
const SHARED_LIMIT: usize = 48 * 1024;

/// Shared memory of `moe_experts_down_nvfp4`: a token's act rows, its ids (i64) and weights.
pub fn nvfp4_down_shared(top_k: usize, intermediate: usize) -> usize {
    top_k * intermediate * 4 + top_k * 12
}

/// Lanes per slot in `moe_experts_down_nvfp4`: the fewest (a power of 2) that leave each lane at
/// most 16 words (8 codes each) of a row, so that several slots' rows are read at once.
pub fn nvfp4_down_lanes(intermediate: usize) -> usize {
    let words = intermediate / 8;
    let mut lanes = 1;
    while lanes < 32 && words.div_ceil(lanes) > 16 {
        lanes *= 2;
    }
    lanes
}

/// The union kernels (`kernels/moe_nvfp4_union.cu`): weight rows of a tile (`UN_ROWS`), columns a
/// warp reads of a row per chunk (`UN_CHUNK`), chunks a warp loads at once (`UN_BATCH`), most
/// warps a block splits a row's chunks over (`UN_MAX_WARPS`), and most slots a step may have
/// (a grid row each).
pub const UNION_ROWS: usize = 16;
pub const UNION_CHUNK: usize = 128;
pub const UNION_BATCH: usize = 5;
pub const UNION_MAX_WARPS: usize = 4;
pub const UNION_MAX_SLOTS: usize = 65_535;

/// Channel tiles (8 channels each) a gate/up block of the union kernels takes one after another,
/// all prefetched at its start (`tiles`): a decode step's 800 tiles (270 blocks) then fit the GPU
/// at once at the kernel's three blocks an SM (three measured faster than two:
/// results/bench-compare.log (5)).
pub const UNION_GATE_TILES: usize = 3;
/// Slots a pass of a union block serves (`UN_SLOTS`: an mma's 8 columns, hi and lo each).
pub const UNION_SLOTS: usize = 4;

/// Most dynamic shared memory a union kernel may take: 48 KiB without opting in, less its static
/// shared memory (the scale table, the pass, the warps' products: about 3 KiB).
pub const UNION_SHARED_MAX: usize = 44 * 1024;

/// 16-byte words a staged row of `k` values takes in a union kernel's shared memory: `k / 8`
/// raised to 4 more than a multiple of 8, so that a quarter warp's reads meet no bank conflict
/// (`union_stride` in kernels/moe_nvfp4_union.cu).
pub fn union_stride(k: usize) -> usize {
    k / 8 + (12 - (k / 8) % 8) % 8
}

/// Dynamic shared memory of the union gate/up and down kernels for `rows` tokens: a pass's x rows
/// split (at most min(4, rows) distinct tokens), its act rows split (at most 4 slots); a row
/// split is two staged rows.
pub fn union_shared(rows: usize, top_k: usize, hidden: usize, inter: usize) -> (usize, usize) {
    (
        UNION_SLOTS.min(rows) * 2 * union_stride(hidden) * 16,
        UNION_SLOTS.min(rows * top_k) * 2 * union_stride(inter) * 16,
    )
}

/// Whether the union kernels take a step of `rows` tokens (the registry's `accepts` and the
/// launcher's check): a grid row a slot, the staged rows within their shared memory.
pub fn union_fits(rows: usize, top_k: usize, hidden: usize, inter: usize) -> Result<(), String> {
    let (gu, down) = union_shared(rows, top_k, hidden, inter);
    require(
        rows * top_k <= UNION_MAX_SLOTS && gu <= UNION_SHARED_MAX && down <= UNION_SHARED_MAX,
        || {
            format!(
                "{rows} rows of top {top_k}, hidden {hidden}, intermediate {inter}: the union kernels take at most {UNION_MAX_SLOTS} slots (a grid row each) and staged rows ({gu} and {down} bytes) within {UNION_SHARED_MAX} bytes of shared memory"
            )
        },
    )
}

/// The persistent union kernels (`kernels/moe_nvfp4_persistent.cu`): warps a block
/// (`PU_WARPS`) and blocks an SM the launch asks for (its `__launch_bounds__`).
pub const PERSISTENT_WARPS: usize = 4;
pub const PERSISTENT_BLOCKS_PER_SM: usize = 3;

/// Dynamic shared memory of the persistent union kernels: the union's lists (`PuLists`: an
/// expert's first slot and count, a slot's expert, a leader's first slot and its units' end).
pub fn persistent_shared(slots: usize, experts: usize) -> usize {
    (2 * experts + 3 * slots) * 4
}

/// Whether the persistent union kernels take a step (the registry's `accepts` and the
/// launcher's check): the union's lists within their shared memory, rows of whole scale groups.
pub fn persistent_fits(
    slots: usize,
    experts: usize,
    hidden: usize,
    inter: usize,
) -> Result<(), String> {
    let need = persistent_shared(slots, experts);
    require(
        need <= UNION_SHARED_MAX && hidden.is_multiple_of(16) && inter.is_multiple_of(16),
        || {
            format!(
                "{slots} slots of {experts} experts, hidden {hidden}, intermediate {inter}: the persistent union kernels keep the union's lists ({need} bytes) within {UNION_SHARED_MAX} bytes of shared memory and take rows of whole scale groups (multiples of 16)"
            )
        },
    )
}

/// Warps of a union block over rows of `k` values: enough that each loads its chunks at once.
pub fn union_warps(k: usize) -> usize {
    k.div_ceil(UNION_CHUNK)
        .div_ceil(UNION_BATCH)
        .clamp(1, UNION_MAX_WARPS)
}

/// Dense (f32 or bf16) experts: the kernels that read them.
fn dense(f: &NodeFacts) -> Result<(), String> {
    require(f.weight != Some(WeightFormat::Nvfp4), || {
        "NVFP4 experts: this variant reads f32 or bf16 banks (the nvfp4_* variants read packed ones)".into()
    })
}

/// NVFP4 experts whose rows split into scale groups.
fn nvfp4(f: &NodeFacts) -> Result<(), String> {
    let (h, i) = (f.dim("hidden"), f.dim("intermediate"));
    require(
        f.weight == Some(WeightFormat::Nvfp4)
            && h.is_multiple_of(crate::quant::nvfp4::GROUP)
            && i.is_multiple_of(crate::quant::nvfp4::GROUP),
        || {
            format!(
                "{} experts of hidden {h} and intermediate {i}: this variant reads NVFP4 banks of sizes that are multiples of 16",
                f.format()
            )
        },
    )
}

fn top_k_fits(f: &NodeFacts) -> Result<(), String> {
    require(f.dim("top_k") <= DOWN_MAX_TOPK, || {
        format!(
            "top {}: the down kernels keep at most {DOWN_MAX_TOPK} slot products a row",
            f.dim("top_k")
        )
    })
}

fn mma_fits(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(
        f.weight == Some(WeightFormat::Bf16)
            && f.dim("hidden").is_multiple_of(8)
            && f.dim("intermediate").is_multiple_of(8),
        || {
            format!(
                "{} experts of hidden {} and intermediate {}: the tensor-core tiles take bf16 weights and sizes that are multiples of 8",
                f.format(),
                f.dim("hidden"),
                f.dim("intermediate")
            )
        },
    )
}

pub static MOE_EXPERTS: &[Variant] = &[
    Variant {
        op: "moe_experts",
        name: "token_major",
        doc: "gate/up a warp per (slot, row), then down a block per (token, output row) over the token's slots",
        accepts: |f, _| {
            dense(f)?;
            top_k_fits(f)
        },
        kernels: |f, _| vec![f.kernel("moe_experts_gate_up"), f.kernel("moe_experts_down")],
    },
    Variant {
        op: "moe_experts",
        name: "token_major_rows",
        doc: "as token_major, down 8 output rows of a token a block with the token's act rows staged in shared memory once",
        accepts: |f, _| {
            dense(f)?;
            top_k_fits(f)?;
            let (k, h, i) = (f.dim("top_k"), f.dim("hidden"), f.dim("intermediate"));
            require(down_rows_fits(k, h, i), || {
                format!(
                    "hidden {h}, top {k} x intermediate {i}: down_rows takes hidden a multiple of {DOWN_ROWS} and the act rows ({} bytes) within {DOWN_ROWS_MAX_SHARED} bytes",
                    down_rows_shared(k, i)
                )
            })
        },
        kernels: |f, _| vec![f.kernel("moe_experts_gate_up"), f.kernel("moe_experts_down_rows")],
    },
    Variant {
        op: "moe_experts",
        name: "expert_major",
        doc: "slots grouped by expert on the device, each expert's weights read once per tile of 64 of its slots (SIMT tiles), then the combine",
        accepts: |f, _| dense(f),
        kernels: |f, _| {
            vec![
                "moe_experts_expert_major_group".into(),
                f.kernel("moe_experts_expert_major_gate_up"),
                f.kernel("moe_experts_expert_major_down"),
                "moe_experts_expert_major_combine_f32".into(),
            ]
        },
    },
    Variant {
        op: "moe_experts",
        name: "expert_major_mma",
        doc: "as expert_major on the tensor cores (bf16 mma.sync tiles)",
        accepts: mma_fits,
        kernels: |_, _| {
            vec![
                "moe_experts_expert_major_group".into(),
                "moe_experts_expert_major_gate_up_mma_bf16".into(),
                "moe_experts_expert_major_down_mma_bf16".into(),
                "moe_experts_expert_major_combine_f32".into(),
            ]
        },
    },
    Variant {
        op: "moe_experts",
        name: "nvfp4_token_major",
        doc: "NVFP4 banks read packed: gate/up a warp per (slot, channel) with the token's x staged, then down a warp per output row over the token's staged act rows",
        accepts: |f, _| {
            nvfp4(f)?;
            let (k, h, i) = (f.dim("top_k"), f.dim("hidden"), f.dim("intermediate"));
            require(
                h * 4 <= SHARED_LIMIT && nvfp4_down_shared(k, i) <= SHARED_LIMIT,
                || {
                    format!(
                        "hidden {h}, top {k} x intermediate {i}: a token's x row and act rows must fit {SHARED_LIMIT} bytes of shared memory"
                    )
                },
            )
        },
        kernels: |_, _| {
            vec![
                "moe_experts_gate_up_nvfp4".into(),
                "moe_experts_down_nvfp4".into(),
            ]
        },
    },
    Variant {
        op: "moe_experts",
        name: "nvfp4_union_mma",
        doc: "NVFP4 banks read packed, the union of the step's experts: a block per 16 rows of a selected expert serves every slot that chose it (the codes read once a step), widened by shifts into the tensor cores with x split into bf16 hi and lo; then the combine",
        accepts: |f, _| {
            nvfp4(f)?;
            union_fits(
                f.dim("rows"),
                f.dim("top_k"),
                f.dim("hidden"),
                f.dim("intermediate"),
            )
        },
        kernels: |_, _| {
            vec![
                "moe_experts_union_gate_up_nvfp4".into(),
                "moe_experts_union_down_nvfp4".into(),
                "moe_experts_expert_major_combine_f32".into(),
            ]
        },
    },
    Variant {
        op: "moe_experts",
        name: "nvfp4_union_persistent",
        doc: "NVFP4 banks read packed, the union of the step's experts by a grid sized to the GPU: each warp streams a run of the union's 16-row tiles (the next batch of codes in flight while the tensor cores take the current), B parts read split from global memory (x split once); then the combine",
        accepts: |f, _| {
            nvfp4(f)?;
            persistent_fits(
                f.dim("rows") * f.dim("top_k"),
                f.dim("experts"),
                f.dim("hidden"),
                f.dim("intermediate"),
            )
        },
        kernels: |_, _| {
            vec![
                "moe_experts_union_split_rows".into(),
                "moe_experts_persistent_gate_up_nvfp4".into(),
                "moe_experts_persistent_down_nvfp4".into(),
                "moe_experts_expert_major_combine_f32".into(),
            ]
        },
    },
    Variant {
        op: "moe_experts",
        name: "nvfp4_expert_major_mma",
        doc: "NVFP4 banks read packed, slots grouped by expert: each expert's codes read once per tile of 64 of its slots and widened to bf16 into the tensor cores, then the combine",
        accepts: |f, _| nvfp4(f),
        kernels: |_, _| {
            vec![
                "moe_experts_expert_major_group".into(),
                "moe_experts_expert_major_gate_up_mma_nvfp4".into(),
                "moe_experts_expert_major_down_mma_nvfp4".into(),
                "moe_experts_expert_major_combine_f32".into(),
            ]
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_row_is_padded_to_four_past_a_multiple_of_eight_words() {
        for k in (16..=4096).step_by(16) {
            let s = union_stride(k);
            assert!(s >= k / 8 && s < k / 8 + 8, "k {k}: stride {s}");
            assert_eq!(s % 8, 4, "k {k}");
        }
        // The real geometry's rows (hidden 2560, intermediate 640) and four staged rows fit.
        assert_eq!(union_stride(2560), 324);
        assert!(union_fits(63, 10, 2560, 640).is_ok());
    }
}
