//! Attention, RoPE and the QSA indexer on CUDA (`kernels/attention.cu`).

use crate::registry::{any, require, DeviceFacts, NodeFacts, Variant};

/// Shared memory a block may use without opting in.
pub const SHARED_LIMIT: usize = 48 * 1024;
/// The split kernels: widest head (4 values a lane), the instantiations of
/// `attention_split_g<G>_f32` (exactly G query heads a kv head) and `attention_split_upto<G>_f32`
/// (up to G).
pub const SPLIT_MAX_HEAD_DIM: usize = 4 * 64;
pub const SPLIT_GROUPS: [usize; 4] = [4, 8, 12, 16];

fn reference_fits(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    let hd = f.dim("head_dim");
    require(2 * hd * 4 <= SHARED_LIMIT, || {
        format!("head_dim {hd}: the reference kernel stages q and its sums in shared memory")
    })
}

/// The split kernel for a GQA group of `group` query heads, if one is compiled.
pub fn split_kernel(group: usize, head_dim: usize) -> Option<String> {
    let fits = group > 0 && head_dim.is_multiple_of(4) && head_dim <= SPLIT_MAX_HEAD_DIM;
    let g = SPLIT_GROUPS.into_iter().find(|&g| fits && group <= g)?;
    Some(if g == group {
        format!("attention_split_g{g}_f32")
    } else {
        format!("attention_split_upto{g}_f32")
    })
}

fn split_fits(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    let (group, hd) = (f.dim("group"), f.dim("head_dim"));
    require(split_kernel(group, hd).is_some(), || {
        format!(
            "{group} query heads a kv head, head_dim {hd}: the split kernels take up to {} a kv head and head_dim a multiple of 4 up to {SPLIT_MAX_HEAD_DIM}",
            SPLIT_GROUPS[SPLIT_GROUPS.len() - 1]
        )
    })
}

fn split_of(f: &NodeFacts) -> String {
    split_kernel(f.dim("group"), f.dim("head_dim")).unwrap_or_default()
}

pub static ATTENTION: &[Variant] = &[
    Variant {
        op: "attention",
        name: "reference",
        doc: "k and v appended, then a block per (row, query head) over the row's selected positions",
        accepts: reference_fits,
        kernels: |_, _| vec!["append_rows2_f32".into(), "attention_reference_f32".into()],
    },
    Variant {
        op: "attention",
        name: "split",
        doc: "k and v appended, then a block per (row, kv head, split of the positions) attending every query head of its kv head, so each K/V row is read once a step; a second kernel combines the splits",
        accepts: split_fits,
        kernels: |f, _| {
            vec![
                "append_rows2_f32".into(),
                split_of(f),
                "attention_split_combine_f32".into(),
            ]
        },
    },
];

pub static GATED_ATTENTION: &[Variant] = &[
    Variant {
        op: "gated_attention",
        name: "reference",
        doc: "q and k normalised and rotated, k and v appended (one kernel), then the reference attention with the output gate as its epilogue",
        accepts: reference_fits,
        kernels: |_, _| {
            vec![
                "gated_attention_prepare_f32".into(),
                "attention_reference_gated_f32".into(),
            ]
        },
    },
    Variant {
        op: "gated_attention",
        name: "split",
        doc: "q and k prepared in one kernel, then the split attention, the output gate applied by the split combine",
        accepts: split_fits,
        kernels: |f, _| {
            vec![
                "gated_attention_prepare_f32".into(),
                split_of(f),
                "attention_split_combine_gated_f32".into(),
            ]
        },
    },
];

const INDEXER: [&str; 3] = [
    "indexer_select_prep_f32",
    "indexer_select_score_f32",
    "indexer_select_topk_f32",
];

pub static INDEXER_SELECT: &[Variant] = &[Variant {
    op: "indexer_select",
    name: "reference",
    doc: "the step's keys appended and complete blocks pooled, every pooled block scored, then a top-k per row",
    accepts: any,
    kernels: |_, _| INDEXER.iter().map(|k| k.to_string()).collect(),
}];

pub static INDEXER_SELECT_QK: &[Variant] = &[Variant {
    op: "indexer_select_qk",
    name: "reference",
    doc: "as indexer_select, the queries normalised and rotated by the first kernel's last blocks",
    accepts: any,
    kernels: |_, _| INDEXER.iter().map(|k| k.to_string()).collect(),
}];

pub static ROPE: &[Variant] = &[Variant {
    op: "rope",
    name: "reference",
    doc: "a thread per rotated pair",
    accepts: any,
    kernels: |_, _| vec!["rope_reference_f32".into()],
}];

pub static NORM_ROPE: &[Variant] = &[Variant {
    op: "norm_rope",
    name: "reference",
    doc: "a block per (row, head): the head normalised, then rotated",
    accepts: |f, _| {
        require(f.dim("head_dim") <= 1024, || {
            format!(
                "head_dim {}: norm_rope stages at most 1024",
                f.dim("head_dim")
            )
        })
    },
    kernels: |_, _| vec!["norm_rope_f32".into()],
}];
