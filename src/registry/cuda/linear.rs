//! Linear layers on CUDA (`kernels/linear.cu`): the variants of `linear`, `linear_group`,
//! `linear_hc_write` and `moe_shared_write`, and the limits their kernels are compiled with.

use crate::registry::{any, one_token, require, DeviceFacts, NodeFacts, Variant};

/// The most 16-byte chunks of a row a lane holds in the streamed kernels (`WHOLE_ROW_CHUNKS` in
/// kernels/linear.cu): rows of up to 32 x 10 chunks.
pub const WHOLE_ROW_CHUNKS: usize = 10;
/// Resident blocks a multiprocessor the streamed kernels are built for (their launch bounds).
pub const STREAM_BLOCKS_PER_SM: usize = 2;
/// The (rows, loads) pairs of the one-token block kernels (`GROUP_KERNELS` in kernels/linear.cu).
pub const GROUPS: [(usize, usize); 3] = [(1, 4), (2, 2), (4, 1)];
/// Most matrices one `linear_parts1` launch takes (`GROUP_PARTS`).
pub const MAX_PARTS: usize = 4;
/// Most blocks of a one-dimensional grid the launchers make.
pub const MAX_GRID: usize = 65_535 * 8;

/// A tensor-core tile of the `mma` variants: tokens x outputs a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaTile {
    /// 64 x 64, 4 warps (`linear_mma64_bf16`; the `mma` variant).
    T64,
    /// 64 x 128, 8 warps (`linear_mma_wide_bf16`; the `mma_wide` variant): each staged
    /// activation tile serves twice the outputs.
    Wide,
}

/// Most runs of k one tensor-core product is split into.
const MAX_K_SPLITS: usize = 8;
/// k a tensor-core tile takes a stage (`MMA_BK` in kernels/mma.cuh).
pub const MMA_BK: usize = 32;
/// Fewest stages of k a split keeps (shorter runs spend more on the tile's start and stores
/// than they save).
const MIN_SPLIT_STAGES: usize = 8;

impl MmaTile {
    pub const ALL: [MmaTile; 2] = [MmaTile::T64, MmaTile::Wide];

    /// Kernel, tokens and outputs a block, threads, blocks a multiprocessor holds at once (the
    /// registers decide: ptxas gives both kernels ~128 a thread).
    pub fn geometry(self) -> (&'static str, usize, usize, u32, usize) {
        match self {
            MmaTile::T64 => ("linear_mma64_bf16", 64, 64, 128, 4),
            MmaTile::Wide => ("linear_mma_wide_bf16", 64, 128, 256, 2),
        }
    }

    /// How many runs of k a `tokens x n` product (k deep) is split into: where the tiles alone
    /// fill less than one round of the device's resident blocks (a narrow product over a long
    /// k), enough runs that tiles times runs still fit one round, each at least
    /// `MIN_SPLIT_STAGES` deep; 1 otherwise.
    pub fn k_splits(self, multiprocessors: usize, tokens: usize, k: usize, n: usize) -> usize {
        let (_, bm, bn, _, per_sm) = self.geometry();
        let tiles = tokens.div_ceil(bm) * n.div_ceil(bn);
        let stages = k.div_ceil(MMA_BK);
        let wanted = (multiprocessors * per_sm) / tiles.max(1);
        let splits = wanted
            .min(MAX_K_SPLITS)
            .min(stages / MIN_SPLIT_STAGES)
            .max(1);
        // Runs of ceil(stages / splits) stages: as many as that takes, so none is empty.
        stages.div_ceil(stages.div_ceil(splits))
    }
}

/// The (rows, warps) of a block of the few-token tensor-core kernels (`FEW_KERNELS` in
/// kernels/linear_few.cu): a block's warps share its rows and split k.
pub const FEW_SHAPES: [(usize, usize); 3] = [(16, 4), (16, 8), (32, 4)];
/// Most rows the few-token kernels take: two n8 tiles of tokens.
pub const FEW_MAX_ROWS: usize = 16;

/// The few-token kernel of `base` (`linear_few`, `linear_hc_write_few`) for a block of `rows`
/// rows and `warps` warps over `tokens` rows of x: one n8 tile of tokens up to 8, two up to 16.
pub fn few_kernel(base: &str, rows: usize, warps: usize, tokens: usize) -> String {
    let tile = if tokens <= 8 { 8 } else { 16 };
    format!("{base}_r{rows}_s{warps}_t{tile}_bf16")
}

/// The (rows, warps) a `few_r{rows}s{warps}` variant names.
pub fn few_shape(variant: &str) -> Option<(usize, usize)> {
    FEW_SHAPES
        .into_iter()
        .find(|&(r, s)| variant == format!("few_r{r}s{s}"))
}

fn few_takes(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(
        f.weight == Some(crate::registry::WeightFormat::Bf16)
            && f.dim("k") > 0
            && f.dim("k").is_multiple_of(32)
            && (1..=FEW_MAX_ROWS).contains(&f.tokens)
            && f.dim("n").div_ceil(16) <= MAX_GRID,
        || {
            format!(
                "{} weights, k {}, {} rows: the few-token tensor-core kernels take bf16 weights, k a multiple of 32 and 1 to {FEW_MAX_ROWS} rows",
                f.format(),
                f.dim("k"),
                f.tokens
            )
        },
    )
}

macro_rules! few_variant {
    ($op:literal, $base:literal, $rows:literal, $warps:literal) => {
        Variant {
            op: $op,
            name: concat!("few_r", $rows, "s", $warps),
            doc: concat!(
                "2 to 16 rows on the tensor cores: a block of ",
                $warps,
                " warps per ",
                $rows,
                " weight rows (the mma's M side; the tokens its N side), the warps splitting k"
            ),
            accepts: few_takes,
            kernels: |f, _| vec![few_kernel($base, $rows, $warps, f.tokens)],
        }
    };
}

/// The split-k partial sums' kernel, launched after a tensor-core product split over k.
pub const SPLIT_SUM: &str = "linear_split_sum_f32";

/// Whether the streamed kernels take rows of `row_chunks` chunks with `row_tail` weights past
/// the last whole one: each lane holds its share of a row in registers, loaded in whole chunks.
pub fn streamed_fits(f: &NodeFacts) -> Result<(), String> {
    require(
        f.dim("k") > 0 && f.dim("row_tail") == 0 && f.dim("row_chunks") <= 32 * WHOLE_ROW_CHUNKS,
        || {
            format!(
                "rows of {} {} weights: the streamed kernels hold whole 16-byte chunks, at most {} a row",
                f.dim("k"),
                f.format(),
                32 * WHOLE_ROW_CHUNKS
            )
        },
    )
}

fn streamed(f: &NodeFacts, d: &DeviceFacts) -> Result<(), String> {
    one_token(f, d)?;
    streamed_fits(f)
}

fn tiled_grid(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(
        f.dim("n").div_ceil(64) < 1 << 31 && f.tokens.div_ceil(64) < 65_536,
        || format!("{} x {} is too large a grid", f.tokens, f.dim("n")),
    )
}

fn mma_takes(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(
        f.weight == Some(crate::registry::WeightFormat::Bf16) && f.dim("k").is_multiple_of(8),
        || {
            format!(
                "{} weights, k {}: the tensor-core tiles take bf16 weights with k a multiple of 8",
                f.format(),
                f.dim("k")
            )
        },
    )
}

fn mma_kernels(tile: MmaTile, f: &NodeFacts, d: &DeviceFacts) -> Vec<String> {
    let mut k = vec![tile.geometry().0.to_string()];
    if tile.k_splits(d.sms, f.tokens, f.dim("k"), f.dim("n")) > 1 {
        k.push(SPLIT_SUM.into());
    }
    k
}

macro_rules! group_variant {
    ($op:literal, $name:literal, $base:literal, $doc:literal) => {
        Variant {
            op: $op,
            name: $name,
            doc: $doc,
            accepts: one_token,
            kernels: |f, _| vec![f.kernel($base)],
        }
    };
}

pub static LINEAR: &[Variant] = &[
    Variant {
        op: "linear",
        name: "rows",
        doc: "a warp per output row, up to 8 tokens in the warp a pass, so each weight row is read once a pass",
        accepts: any,
        kernels: |f, _| vec![f.kernel("linear_rows")],
    },
    Variant {
        op: "linear",
        name: "rows1",
        doc: "one token: a warp per output row",
        accepts: one_token,
        kernels: |f, _| vec![f.kernel("linear_rows1")],
    },
    group_variant!("linear", "group1_g1u4", "linear_group1_g1u4", "one token: a block per row, 4 chunks of it in flight a thread"),
    group_variant!("linear", "group1_g2u2", "linear_group1_g2u2", "one token: a block per 2 rows, 2 chunks of each in flight a thread"),
    group_variant!("linear", "group1_g4u1", "linear_group1_g4u1", "one token: a block per 4 rows, a chunk of each in flight a thread"),
    Variant {
        op: "linear",
        name: "rows1_stream",
        doc: "one token: a persistent grid of two blocks a multiprocessor, each warp holding its row in registers and loading its next row before the products of the one it holds",
        accepts: streamed,
        kernels: |f, _| vec![f.kernel("linear_rows1_stream")],
    },
    Variant {
        op: "linear",
        name: "tiled",
        doc: "shared-memory tiles of 64 tokens x 64 outputs, each weight tile read once per 64 tokens",
        accepts: tiled_grid,
        kernels: |f, _| vec![f.kernel("linear_tiled")],
    },
    Variant {
        op: "linear",
        name: "mma",
        doc: "tensor-core tiles of 64 tokens x 64 outputs (bf16 mma.sync, activations split into bf16 hi + lo so the products keep f32 accuracy); split over k where the tiles leave the device idle",
        accepts: mma_takes,
        kernels: |f, d| mma_kernels(MmaTile::T64, f, d),
    },
    Variant {
        op: "linear",
        name: "mma_wide",
        doc: "as mma in tiles of 64 tokens x 128 outputs: each staged activation tile serves twice the outputs",
        accepts: mma_takes,
        kernels: |f, d| mma_kernels(MmaTile::Wide, f, d),
    },
    few_variant!("linear", "linear_few", 16, 4),
    few_variant!("linear", "linear_few", 16, 8),
    few_variant!("linear", "linear_few", 32, 4),
];

/// `stream_linear`: one matrix over every stream of each row, as `linear` over `rows x streams`
/// rows (the streams of a row are contiguous).
pub static STREAM_LINEAR: &[Variant] = &[
    Variant {
        op: "stream_linear",
        name: "rows",
        doc: "linear's `rows` over every stream of every row",
        accepts: any,
        kernels: |f, _| vec![f.kernel("linear_rows")],
    },
    Variant {
        op: "stream_linear",
        name: "tiled",
        doc: "linear's `tiled` over every stream of every row",
        accepts: tiled_grid,
        kernels: |f, _| vec![f.kernel("linear_tiled")],
    },
];

fn parts_fit(f: &NodeFacts) -> Result<(), String> {
    require(
        (1..=MAX_PARTS).contains(&f.dim("parts")) && f.dim("n").div_ceil(2) <= MAX_GRID,
        || {
            format!(
                "{} parts of {} rows: one launch takes 1 to {MAX_PARTS}",
                f.dim("parts"),
                f.dim("n")
            )
        },
    )
}

pub static LINEAR_GROUP: &[Variant] = &[
    Variant {
        op: "linear_group",
        name: "rows",
        doc: "each part as linear's `rows`",
        accepts: any,
        kernels: |f, _| vec![f.kernel("linear_rows"); f.dim("parts")],
    },
    Variant {
        op: "linear_group",
        name: "parts1",
        doc: "one token, every part in one launch: a block per 2 rows of a part",
        accepts: |f, d| {
            one_token(f, d)?;
            parts_fit(f)
        },
        kernels: |f, _| vec![f.kernel("linear_parts1")],
    },
    Variant {
        op: "linear_group",
        name: "parts1_stream",
        doc: "one token, every part in one launch: the parts' rows end to end, streamed as linear's rows1_stream",
        accepts: |f, d| {
            one_token(f, d)?;
            parts_fit(f)?;
            streamed_fits(f)
        },
        kernels: |f, _| vec![f.kernel("linear_parts1_stream")],
    },
];

pub static LINEAR_HC_WRITE: &[Variant] = &[
    Variant {
        op: "linear_hc_write",
        name: "reference",
        doc: "a warp per output row, up to 8 tokens a pass, the epilogue writing the residual streams",
        accepts: any,
        kernels: |f, _| vec![f.kernel("linear_hc_write_reference")],
    },
    Variant {
        op: "linear_hc_write",
        name: "rows1",
        doc: "one token: a warp per output row, the epilogue writing the residual streams",
        accepts: one_token,
        kernels: |f, _| vec![f.kernel("linear_hc_write1")],
    },
    group_variant!("linear_hc_write", "group1_g1u4", "linear_hc_write_group1_g1u4", "one token: a block per row, 4 chunks in flight a thread"),
    group_variant!("linear_hc_write", "group1_g2u2", "linear_hc_write_group1_g2u2", "one token: a block per 2 rows, 2 chunks of each in flight a thread"),
    group_variant!("linear_hc_write", "group1_g4u1", "linear_hc_write_group1_g4u1", "one token: a block per 4 rows, a chunk of each in flight a thread"),
    few_variant!("linear_hc_write", "linear_hc_write_few", 16, 4),
    few_variant!("linear_hc_write", "linear_hc_write_few", 16, 8),
    few_variant!("linear_hc_write", "linear_hc_write_few", 32, 4),
];

pub static MOE_SHARED_WRITE: &[Variant] = &[Variant {
    op: "moe_shared_write",
    name: "reference",
    doc: "a warp per output row of the shared expert's down projection, a grid row per token; the gate, the routed experts' sum and the residual write in its epilogue",
    accepts: |f, _| require(f.tokens < 65_536, || format!("{} tokens: a grid row each", f.tokens)),
    kernels: |f, _| vec![f.kernel("moe_shared_write_reference")],
}];
