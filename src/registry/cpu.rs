//! The CPU executor's variants (`exec::cpu`): each names the function of `src/ops` that computes
//! it. The CPU functions take every shape, so every variant accepts every node.

use super::{any, DeviceFacts, NodeFacts, Variant};

/// A CPU variant computed by one function of `crate::ops`.
macro_rules! cpu {
    ($op:literal, $name:literal, $func:literal, $doc:literal) => {
        Variant {
            op: $op,
            name: $name,
            doc: $doc,
            accepts: any,
            kernels: |_: &NodeFacts, _: &DeviceFacts| vec![$func.to_string()],
        }
    };
}

/// The reference (and only) variant of an op computed by one function.
macro_rules! reference {
    ($op:literal, $func:literal) => {
        &[cpu!($op, "reference", $func, "the reference")]
    };
}

pub static VARIANTS: &[&[Variant]] = &[
    &[
        cpu!(
            "linear",
            "rows",
            "ops::linear::rows",
            "output rows across cores"
        ),
        cpu!(
            "linear",
            "tiled",
            "ops::linear::tiled",
            "tiles of tokens share each weight row while it is in cache"
        ),
    ],
    &[
        cpu!(
            "moe_experts",
            "token_major",
            "ops::moe::token_major",
            "each token's experts in turn"
        ),
        cpu!(
            "moe_experts",
            "expert_major",
            "ops::moe::expert_major",
            "tokens grouped by expert, each expert's weights read once"
        ),
    ],
    reference!("embed", "ops::embed::gather"),
    reference!("embed_streams", "ops::embed::gather_streams"),
    reference!("repeat_streams", "ops::elementwise::repeat_streams"),
    reference!("rms_norm", "ops::norm::rms_norm"),
    reference!("div_by", "ops::elementwise::div_by"),
    reference!("mul_by", "ops::elementwise::mul_by"),
    reference!("silu", "ops::elementwise::silu_all"),
    reference!("sigmoid", "ops::elementwise::sigmoid_all"),
    reference!("mul", "ops::elementwise::mul"),
    reference!("add", "ops::elementwise::add"),
    reference!("slice", "ops::elementwise::slice_cols"),
    reference!("stream_mean", "ops::elementwise::stream_mean"),
    reference!("hc_write", "ops::elementwise::hc_write"),
    reference!("causal_conv", "ops::conv::causal_conv"),
    reference!("gdn_gates", "ops::gdn::gates"),
    reference!("gdn_recurrence", "ops::gdn::recurrence"),
    reference!("gdn_gated_recurrence", "ops::gdn::gated_recurrence"),
    reference!("gdn_normed_recurrence", "ops::gdn::normed_recurrence"),
    reference!(
        "gdn_conv_normed_recurrence",
        "ops::gdn::conv_normed_recurrence"
    ),
    reference!("gated_rms_norm", "ops::norm::gated_rms_norm"),
    reference!("split_q_gate", "ops::attention::split_q_gate"),
    reference!("rope", "ops::rope::rope"),
    reference!("norm_rope", "ops::rope::norm_rope"),
    reference!("sigmoid_mul", "ops::elementwise::sigmoid_mul"),
    reference!("gated_stream_mean", "ops::elementwise::gated_stream_mean"),
    reference!("indexer_select", "ops::indexer::select"),
    reference!("indexer_select_qk", "ops::indexer::select"),
    reference!("attention", "ops::attention::attend"),
    reference!("gated_attention", "ops::attention::attend"),
    reference!("moe_router", "ops::moe::route"),
    reference!("ple_ngram_ids", "ops::ple::ngram_ids"),
    reference!("ple_embed", "ops::embed::gather"),
    reference!("ple_gate", "ops::ple::gate"),
    reference!("ple_mix", "ops::ple::mix"),
    reference!("last_row", "ops::elementwise::last_row"),
    reference!("swiglu_linear", "ops::linear::swiglu"),
    reference!("stream_linear", "ops::linear::rows"),
    reference!("hc_mix", "ops::hyper::hc_mix"),
    reference!("hc_inject", "ops::hyper::hc_inject"),
    reference!("hc_read", "ops::hyper::hc_read"),
    reference!("sigmoid_gated_add", "ops::linear::sigmoid_gated_add"),
    reference!("linear_hc_write", "ops::linear::linear_hc_write"),
    reference!("linear_group", "ops::linear::rows"),
    reference!("moe_shared_write", "ops::linear::moe_shared_write"),
];
