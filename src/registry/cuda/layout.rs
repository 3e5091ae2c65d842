//! Hyper-connections, the shared expert's SwiGLU and the other row layouts on CUDA
//! (`kernels/layout.cu`).

use crate::registry::{any, require, DeviceFacts, NodeFacts, Variant};

/// Most rows the block forms (a block per output, for a few rows) are chosen for.
pub const FEW_ROWS: usize = 8;
/// Chunks of `up` a lane of `hc_read_gate_se` holds, and most ranks `hc_read_gate_s` stages
/// (`HC_GATE_CHUNKS`, `HC_GATE_MAX_RANK`).
pub const HC_GATE_CHUNKS: usize = 6;
pub const HC_GATE_MAX_RANK: usize = 1024;

/// Whether the by-stream gate's early form (`hc_read_gate_se`: a warp's lanes hold the up
/// weights of the row) takes `streams` streams of rank `rank` in `chunk`-weight loads; else the
/// staged form (`hc_read_gate_s`).
pub fn gate_early(streams: usize, rank: usize, chunk: usize) -> bool {
    streams > 0
        && streams <= 32
        && 32 % streams == 0
        && rank.is_multiple_of(chunk)
        && rank / chunk <= HC_GATE_CHUNKS * (32 / streams)
}

fn hc_read_fits(f: &NodeFacts, by_stream: bool) -> Result<(), String> {
    let (c, r) = (f.dim("streams"), f.dim("rank"));
    require(
        (1..=32).contains(&c) && f.tokens < 65_536 && (!by_stream || r <= HC_GATE_MAX_RANK),
        || {
            format!("{c} streams of rank {r}: hc_read takes 1 to 32 streams (by stream: rank up to {HC_GATE_MAX_RANK})")
        },
    )
}

fn hc_read_gate(f: &NodeFacts, by_stream: bool) -> String {
    if !by_stream {
        f.kernel("hc_read_gate")
    } else if gate_early(f.dim("streams"), f.dim("rank"), f.format().chunk_len()) {
        f.kernel("hc_read_gate_se")
    } else {
        f.kernel("hc_read_gate_s")
    }
}

/// The act kernel of a row split (`by_stream` false) or a stream split, `per_block` outputs a
/// block, and the mix's gate.
macro_rules! hc_read {
    ($name:literal, $by_stream:literal, $doc:literal) => {
        Variant {
            op: "hc_read",
            name: $name,
            doc: $doc,
            accepts: |f, _| hc_read_fits(f, $by_stream),
            kernels: |f, _| {
                vec![
                    f.kernel(concat!("hc_read_act_", $name)),
                    hc_read_gate(f, $by_stream),
                ]
            },
        }
    };
}

/// Most rows `hc_read`'s few-row kernels take (`HC_FEW_ROWS` in kernels/layout.cu).
pub const HC_FEW_ROWS: usize = 16;

/// hc_read's by-stream forms for a few rows: `act` the first kernel, the gate's rows in one
/// block (`hc_read_gate_se_few`, which needs the early form).
macro_rules! hc_read_few {
    ($name:literal, $act:literal, $doc:literal) => {
        Variant {
            op: "hc_read",
            name: $name,
            doc: $doc,
            accepts: few_rows_fit,
            kernels: |f, _| vec![f.kernel($act), f.kernel("hc_read_gate_se_few")],
        }
    };
}

fn few_rows_fit(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    hc_read_fits(f, true)?;
    require(
        f.tokens <= HC_FEW_ROWS
            && gate_early(f.dim("streams"), f.dim("rank"), f.format().chunk_len()),
        || {
            format!(
                "{} rows, {} streams of rank {}: the few-row kernels take up to {HC_FEW_ROWS} rows and the gate's early form",
                f.tokens,
                f.dim("streams"),
                f.dim("rank")
            )
        },
    )
}

pub static HC_READ: &[Variant] = &[
    hc_read!("r1", false, "a block per output over the whole row (the C inverse RMS, R mix activations and C gains), then the gate"),
    hc_read!("r2", false, "a block per 2 outputs over the whole row, then the gate"),
    hc_read!("r4", false, "a block per 4 outputs over the whole row, then the gate"),
    hc_read!("s2", true, "a block per 2 outputs over one stream's slice of the row (partial sums), then the gate kernel combining the streams"),
    hc_read!("s8", true, "as s2, 8 outputs a block: each slice of h and of the norm weight read once per 8 outputs"),
    hc_read!("s16", true, "as s2, 16 outputs a block"),
    hc_read_few!("s2_few", "hc_read_act_s2_few", "as s2 with every row of a few (up to 16) in each act and gate block, so that each weight chunk is loaded once a step; each row's sums are s2's"),
    hc_read_few!("s8_gate_few", "hc_read_act_s8", "as s8, every row of a few (up to 16) in each gate block: a lane's up chunks loaded once a step"),
    hc_read_few!("s16_gate_few", "hc_read_act_s16", "as s16, every row of a few in each gate block"),
];

pub static HC_MIX: &[Variant] = &[
    Variant {
        op: "hc_mix",
        name: "reference",
        doc: "a warp per mix activation, then the gate",
        accepts: any,
        kernels: |f, _| vec![f.kernel("hc_mix_act_warp"), f.kernel("hc_mix_gate")],
    },
    Variant {
        op: "hc_mix",
        name: "block",
        doc: "a few rows: a block per mix activation (more loads in flight), then the gate",
        accepts: few_rows,
        kernels: |f, _| vec![f.kernel("hc_mix_act_block"), f.kernel("hc_mix_gate")],
    },
];

fn few_rows(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(f.tokens <= FEW_ROWS, || {
        format!("{} rows: the block form takes at most {FEW_ROWS}", f.tokens)
    })
}

pub static HC_INJECT: &[Variant] = &[
    Variant {
        op: "hc_inject",
        name: "reference",
        doc: "a warp per gain",
        accepts: any,
        kernels: |f, _| vec![f.kernel("hc_inject_warp")],
    },
    Variant {
        op: "hc_inject",
        name: "block",
        doc: "a few rows: a block per gain",
        accepts: few_rows,
        kernels: |f, _| vec![f.kernel("hc_inject_block")],
    },
];

pub static SWIGLU_LINEAR: &[Variant] = &[
    Variant {
        op: "swiglu_linear",
        name: "reference",
        doc: "a warp per output row, gate and up rows together",
        accepts: any,
        kernels: |f, _| vec![f.kernel("swiglu_linear_reference")],
    },
    Variant {
        op: "swiglu_linear",
        name: "block",
        doc: "one token: a block per output row",
        accepts: crate::registry::one_token,
        kernels: |f, _| vec![f.kernel("swiglu_linear_block")],
    },
];
