//! Gated DeltaNet on CUDA (`kernels/gdn.cu`): the causal convolution, the gates, the recurrence
//! in its layouts and the fused forms, and the limits their kernels are compiled with.

use crate::registry::{any, require, DeviceFacts, NodeFacts, Variant};

/// Most rows `causal_conv_step_f32` takes: the convolution and the window's shift in one launch,
/// a thread per channel.
pub const CONV_STEP_ROWS: usize = 8;
/// Rows a thread of `causal_conv_rows_f32` takes, and the most taps it holds (`CONV_ROWS`,
/// `CONV_MAX_TAPS` in kernels/gdn.cu).
pub const CONV_ROWS: usize = 16;
pub const CONV_MAX_TAPS: usize = 8;

/// The block layout's columns a block, its most key rows (`GDN_COLS`, `GDN_MAX_THREADS`).
pub const BLOCK_COLS: usize = 32;
pub const BLOCK_MAX_DK: usize = 512;
/// The warp layout: columns a warp, warps a block, most key rows (`GdnLanes<16>::COLS`,
/// `GDNW_WARPS`, `GDNW_MAX_DK`).
pub const WARP_COLS: usize = 4;
pub const WARPS_PER_BLOCK: usize = 4;
pub const WARP_MAX_DK: usize = 128;
/// The normed kernel: columns a warp holds (GDNN_GROUPS 8: 2 x 32 / 8), most value and key
/// columns (GDNN_MAX_DV, GDNW_MAX_DK).
pub const NORMED_WARP_COLS: usize = 8;
pub const NORMED_MAX_DV: usize = 128;
pub const NORMED_MAX_DK: usize = WARP_MAX_DK;
/// Most rows `gdn_conv_normed_recurrence_f32` takes (GDNN_T).
pub const CONV_NORMED_MAX_ROWS: usize = 8;

fn taps_fit(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(f.dim("kernel") <= CONV_MAX_TAPS, || {
        format!(
            "{} taps: causal_conv_rows holds at most {CONV_MAX_TAPS}",
            f.dim("kernel")
        )
    })
}

/// The window's shift after a many-row convolution, where the window has rows.
fn with_shift(f: &NodeFacts, conv: &str) -> Vec<String> {
    let mut k = vec![conv.to_string()];
    if f.dim("kernel").saturating_sub(1) * f.dim("dilation").max(1) > 0 {
        k.push("causal_conv_window_f32".into());
    }
    k
}

pub static CAUSAL_CONV: &[Variant] = &[
    Variant {
        op: "causal_conv",
        name: "reference",
        doc: "a thread per output value, then the window's shift",
        accepts: any,
        kernels: |f, _| with_shift(f, "causal_conv_reference_f32"),
    },
    Variant {
        op: "causal_conv",
        name: "rows",
        doc: "a thread per channel over runs of 16 rows (taps in registers), then the window's shift",
        accepts: taps_fit,
        kernels: |f, _| with_shift(f, "causal_conv_rows_f32"),
    },
    Variant {
        op: "causal_conv",
        name: "step",
        doc: "a few rows: a thread per channel, its rows in order, then its window's shift, in one launch",
        accepts: |f, _| {
            require(f.tokens <= CONV_STEP_ROWS, || {
                format!("{} rows: the step kernel takes at most {CONV_STEP_ROWS}", f.tokens)
            })
        },
        kernels: |_, _| vec!["causal_conv_step_f32".into()],
    },
];

/// Head shapes every recurrence kernel takes: whole value-head groups a key head, a grid
/// dimension of value heads.
fn heads_fit(f: &NodeFacts, max_dk: usize, max_dv: usize) -> Result<(), String> {
    let (kh, vh, dk, dv) = (
        f.dim("key_heads"),
        f.dim("value_heads"),
        f.dim("key_dim"),
        f.dim("value_dim"),
    );
    require(
        kh > 0
            && vh.is_multiple_of(kh)
            && vh <= 65_535
            && (1..=max_dk).contains(&dk)
            && (1..=max_dv).contains(&dv)
            && f.tokens <= i32::MAX as usize,
        || format!("Kh {kh}, Vh {vh}, dk {dk} (at most {max_dk}), dv {dv} (at most {max_dv})"),
    )
}

fn block_layout(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    heads_fit(f, BLOCK_MAX_DK, 65_535 * BLOCK_COLS)
}

fn warp_layout(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    heads_fit(f, WARP_MAX_DK, 65_535 * WARP_COLS * WARPS_PER_BLOCK)
}

fn normed_fits(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    heads_fit(f, NORMED_MAX_DK, NORMED_MAX_DV)
}

pub static GDN_GATES: &[Variant] = &[Variant {
    op: "gdn_gates",
    name: "reference",
    doc: "a thread per (row, value head)",
    accepts: any,
    kernels: |_, _| vec!["gdn_gates_reference_f32".into()],
}];

pub static GDN_RECURRENCE: &[Variant] = &[
    Variant {
        op: "gdn_recurrence",
        name: "reference",
        doc: "a block per (head, 32 columns), a warp per 32 key rows: four block barriers a token",
        accepts: block_layout,
        kernels: |_, _| vec!["gdn_recurrence_reference_f32".into()],
    },
    Variant {
        op: "gdn_recurrence",
        name: "warp",
        doc: "a warp per (head, 4 columns), each lane 2 columns x 8 rows, the tokens staged a chunk at a time: no block barrier a token",
        accepts: warp_layout,
        kernels: |_, _| vec!["gdn_recurrence_warp_f32".into()],
    },
];

pub static GDN_GATED_RECURRENCE: &[Variant] = &[
    Variant {
        op: "gdn_gated_recurrence",
        name: "reference",
        doc: "the gates formed in the recurrence's kernel; its block layout",
        accepts: block_layout,
        kernels: |_, _| vec!["gdn_gated_recurrence_f32".into()],
    },
    Variant {
        op: "gdn_gated_recurrence",
        name: "warp",
        doc: "the gates formed in the recurrence's kernel; its warp layout",
        accepts: warp_layout,
        kernels: |_, _| vec!["gdn_gated_recurrence_warp_f32".into()],
    },
];

pub static GDN_NORMED_RECURRENCE: &[Variant] = &[
    Variant {
        op: "gdn_normed_recurrence",
        name: "reference",
        doc: "the gated recurrence (block layout, its output in scratch), then the gated RMS norm",
        accepts: block_layout,
        kernels: |_, _| {
            vec![
                "gdn_gated_recurrence_f32".into(),
                "gated_rms_norm_reference_f32".into(),
            ]
        },
    },
    Variant {
        op: "gdn_normed_recurrence",
        name: "fused",
        doc:
            "a block per value head holding its whole state, the norm as the recurrence's epilogue",
        accepts: normed_fits,
        kernels: |_, _| vec!["gdn_normed_recurrence_f32".into()],
    },
];

pub static GDN_CONV_NORMED_RECURRENCE: &[Variant] = &[
    Variant {
        op: "gdn_conv_normed_recurrence",
        name: "reference",
        doc: "the convolution (reference kernel, its output in scratch), the gated recurrence (block layout, in scratch), then the gated RMS norm",
        accepts: block_layout,
        kernels: |f, _| {
            let mut k = with_shift(f, "causal_conv_reference_f32");
            k.push("gdn_gated_recurrence_f32".into());
            k.push("gated_rms_norm_reference_f32".into());
            k
        },
    },
    Variant {
        op: "gdn_conv_normed_recurrence",
        name: "fused",
        doc: "a block per value head, the convolution of its key head's channels in its prologue, the value heads of a key head meeting at an arrival counter",
        accepts: |f, d| {
            normed_fits(f, d)?;
            require(
                (1..=CONV_NORMED_MAX_ROWS).contains(&f.tokens)
                    && (1..=CONV_MAX_TAPS).contains(&f.dim("kernel"))
                    && f.dim("key_heads") <= d.arrival_counters,
                || {
                    format!(
                        "{} rows, {} taps, {} key heads: the fused kernel takes 1 to {CONV_NORMED_MAX_ROWS} rows, 1 to {CONV_MAX_TAPS} taps and a key head an arrival counter ({})",
                        f.tokens,
                        f.dim("kernel"),
                        f.dim("key_heads"),
                        d.arrival_counters
                    )
                },
            )
        },
        kernels: |_, _| vec!["gdn_conv_normed_recurrence_f32".into()],
    },
];
