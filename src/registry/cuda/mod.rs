//! The CUDA executor's variants (`exec::cuda`), by op family; kernel names as in
//! `kernels/*.cu`, `<op>_<variant>_<dtype>`.

pub mod attention;
pub mod embed;
pub mod gdn;
pub mod layout;
pub mod linear;
pub mod moe;

use super::{any, Variant};

/// The prefix of a kernel name the executor runs on the host, before the step's graphs: its
/// result reaches the step through a buffer the step copies from.
pub const HOST_PREFIX: &str = "host_";

/// Whether the kernels of a node start with a step on the host ([`HOST_PREFIX`]).
pub fn runs_on_host(kernels: &[String]) -> bool {
    kernels.first().is_some_and(|k| k.starts_with(HOST_PREFIX))
}

/// A variant of one kernel that takes every node its op makes.
macro_rules! single {
    ($op:literal, $kernel:literal, $doc:literal) => {
        &[Variant {
            op: $op,
            name: "reference",
            doc: $doc,
            accepts: any,
            kernels: |_, _| vec![$kernel.to_string()],
        }]
    };
    ($op:literal, per_format $base:literal, $doc:literal) => {
        &[Variant {
            op: $op,
            name: "reference",
            doc: $doc,
            accepts: any,
            kernels: |f, _| vec![f.kernel($base)],
        }]
    };
}

pub static VARIANTS: &[&[Variant]] = &[
    linear::LINEAR,
    linear::LINEAR_GROUP,
    linear::STREAM_LINEAR,
    linear::LINEAR_HC_WRITE,
    linear::MOE_SHARED_WRITE,
    attention::ATTENTION,
    attention::GATED_ATTENTION,
    attention::INDEXER_SELECT,
    attention::INDEXER_SELECT_QK,
    attention::ROPE,
    attention::NORM_ROPE,
    gdn::CAUSAL_CONV,
    gdn::GDN_GATES,
    gdn::GDN_RECURRENCE,
    gdn::GDN_GATED_RECURRENCE,
    gdn::GDN_NORMED_RECURRENCE,
    gdn::GDN_CONV_NORMED_RECURRENCE,
    moe::MOE_ROUTER,
    moe::MOE_EXPERTS,
    layout::HC_READ,
    layout::HC_MIX,
    layout::HC_INJECT,
    layout::SWIGLU_LINEAR,
    embed::EMBED,
    single!("embed_streams", per_format "embed_streams_reference", "a thread per gathered value, written to every stream"),
    embed::PLE_EMBED,
    single!(
        "repeat_streams",
        "repeat_streams_reference_f32",
        "a thread per value"
    ),
    single!("rms_norm", "rms_norm_reference_f32", "a block per group"),
    single!("div_by", "div_by_reference_f32", "a thread per value"),
    single!("mul_by", "mul_by_reference_f32", "a thread per value"),
    single!("silu", "silu_reference_f32", "a thread per value"),
    single!("sigmoid", "sigmoid_reference_f32", "a thread per value"),
    single!("mul", "mul_reference_f32", "a thread per value"),
    single!("add", "add_reference_f32", "a thread per value"),
    single!(
        "sigmoid_mul",
        "sigmoid_mul_reference_f32",
        "a thread per value"
    ),
    single!("slice", "slice_reference_f32", "a thread per value"),
    single!(
        "stream_mean",
        "stream_mean_reference_f32",
        "a thread per output"
    ),
    single!("hc_write", "hc_write_reference_f32", "a thread per output"),
    single!(
        "gated_stream_mean",
        "gated_stream_mean_f32",
        "a thread per output"
    ),
    single!(
        "gated_rms_norm",
        "gated_rms_norm_reference_f32",
        "a block per (row, head)"
    ),
    single!(
        "split_q_gate",
        "split_q_gate_reference_f32",
        "a thread per value"
    ),
    single!(
        "ple_ngram_ids",
        "ple_ngram_ids_reference_i64",
        "a thread per (row, n-gram head)"
    ),
    single!("ple_gate", "ple_gate_reference_f32", "a block per row"),
    single!(
        "ple_mix",
        "ple_mix_f32",
        "the PLE mix's norms, convolution and residual write in one kernel"
    ),
    single!(
        "sigmoid_gated_add",
        "sigmoid_gated_add_reference_f32",
        "a warp per row"
    ),
    single!(
        "last_row",
        "cuMemcpyDtoD",
        "a device-to-device copy of the last row (no kernel)"
    ),
];
