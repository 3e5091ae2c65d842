//! The op catalogue: a closed set of operations, each with its inputs, outputs, weights and state.
//!
//! `Op<D>` is generic over how a dimension is written: templates (`graphs/qwen4exp/*.ron`) write
//! dimensions as symbols (`"CH"`, `"hd"`, `2`), the lowered program holds them as numbers. The
//! same enum serves both so that a template node and a program node read alike.
//!
//! Activations are matrices `[T, width]`: one row per token of the step, channels in the width
//! (heads are contiguous slices of the width). The math of every op is its CPU reference in
//! `src/ops/`; this file only names the ops and their parameters.

use serde::{Deserialize, Serialize};

/// A dimension in a template: a plan symbol (`"CH"`) or a literal (`2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Sym {
    Lit(usize),
    Name(String),
}

impl std::fmt::Display for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sym::Lit(n) => write!(f, "{n}"),
            Sym::Name(s) => write!(f, "{s}"),
        }
    }
}

/// One operation. `D` is `Sym` in templates and `usize` in lowered programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Op<D> {
    /// Gather rows of a table `[rows, d]` for each id of an i64 input `[T, n]` → `[T, n*d]`.
    /// Token embedding (n = 1) and the PLE n-gram lookup (n = heads) alike.
    Embed,
    /// `[T, H]` → `[T, streams*H]`, every stream a copy of the input.
    RepeatStreams {
        streams: D,
    },
    /// `Embed` then `RepeatStreams` as one op (fusion `embed_streams`): ids `[T, n]` (i64), table
    /// `[rows, d]` → `[T, streams*n*d]`, every stream of a row a copy of its `n` table rows (the
    /// token embedding entering the hyper-connection streams).
    EmbedStreams {
        streams: D,
    },
    /// RMS over groups of `group` channels; weight is `[width]` or `[group]` (shared by groups).
    /// `unit_offset`: scale by `(1 + w)` instead of `w`. eps comes from the program constants.
    RmsNorm {
        group: D,
        unit_offset: bool,
    },
    /// `x [T, K] · Wᵀ`, `W [N, K]` → `[T, N]`; no bias.
    Linear,
    /// `Linear` on each of `streams` slices of a row: `x [T, streams*K]`, `W [N, K]` →
    /// `[T, streams*N]` (the MTP head's `fc_hidden` on every hyper-connection stream). In memory
    /// this is `Linear` over `T * streams` rows.
    StreamLinear {
        streams: D,
    },
    /// Elementwise `x / by`.
    DivBy {
        by: D,
    },
    /// Elementwise `x * by`.
    MulBy {
        by: D,
    },
    Silu,
    Sigmoid,
    /// Elementwise product; the second input may have width 1 (broadcast over the row).
    Mul,
    /// Elementwise sum of two inputs of equal width.
    Add,
    /// Columns `[start, start+len)` of the input.
    Slice {
        start: D,
        len: D,
    },
    /// `[T, streams*H]` → `[T, H]`: the mean over streams.
    StreamMean {
        streams: D,
    },
    /// Hyper-connection write: `h [T, C*H] + inj [T, C] ⊗ y [T, H]` → `[T, C*H]`.
    HcWrite {
        streams: D,
    },
    /// Causal depthwise conv over time with `kernel` taps spaced `dilation` apart, carrying the
    /// last `(kernel-1)*dilation` inputs in its state; optional SiLU on the output.
    CausalConv {
        kernel: D,
        dilation: D,
        silu: bool,
    },
    /// GDN gates: `b, a [T, Vh]`, weights `A_log, dt_bias [Vh]` → `beta = sigmoid(b)`,
    /// `g = -exp(A_log) * softplus(a + dt_bias)`.
    GdnGates,
    /// Gated delta rule over the conv output `[T, 2*Kh*dk + Vh*dv]` with `beta, g [T, Vh]`,
    /// state `[Vh, dk, dv]` → `o [T, Vh*dv]`. Includes the q/k l2norm and the dk^-0.5 scale.
    GdnRecurrence {
        key_heads: D,
        value_heads: D,
        key_dim: D,
        value_dim: D,
    },
    /// `GdnGates` then `GdnRecurrence` as one op (fusion `gdn_gated_recurrence`): inputs the conv
    /// output and `b, a [T, Vh]`, weights `A_log, dt_bias [Vh]`, state `[Vh, dk, dv]` → `o`.
    GdnGatedRecurrence {
        key_heads: D,
        value_heads: D,
        key_dim: D,
        value_dim: D,
    },
    /// `GdnGatedRecurrence` then `GatedRmsNorm` over each value head as one op (fusion
    /// `gdn_normed_recurrence`): inputs the conv output, `b, a [T, Vh]` and the norm's gate
    /// `z [T, Vh*dv]`; weights `A_log, dt_bias [Vh]` and the norm weight `[dv]`; state
    /// `[Vh, dk, dv]` → the normed `o [T, Vh*dv]` (the recurrence's own `o` is never stored).
    GdnNormedRecurrence {
        key_heads: D,
        value_heads: D,
        key_dim: D,
        value_dim: D,
    },
    /// `CausalConv { kernel, dilation: 1, silu: true }` then `GdnNormedRecurrence` as one op
    /// (fusion `gdn_conv_normed_recurrence`): inputs the raw projection `qkv [T, 2*Kh*dk +
    /// Vh*dv]`, `b, a [T, Vh]` and `z [T, Vh*dv]`; weights the conv weight `[2*Kh*dk + Vh*dv, 1,
    /// kernel]`, `A_log, dt_bias [Vh]` and the norm weight `[dv]`; states the conv window
    /// (`kernel - 1` rows of the projection) then `[Vh, dk, dv]` → the normed `o [T, Vh*dv]` (the
    /// conv output is never stored).
    GdnConvNormedRecurrence {
        key_heads: D,
        value_heads: D,
        key_dim: D,
        value_dim: D,
        kernel: D,
    },
    /// Per-head RMS norm with a plain weight `[head_dim]`, times `act(gate)`; act from constants.
    GatedRmsNorm {
        head_dim: D,
    },
    /// `[T, heads*2*head_dim]` (per head: q then gate) → `q, gate [T, heads*head_dim]`.
    SplitQGate {
        heads: D,
        head_dim: D,
    },
    /// NeoX rotate-half RoPE on the first `rotary_dim` channels of each head, at the step's positions.
    Rope {
        head_dim: D,
        rotary_dim: D,
    },
    /// `RmsNorm { group: head_dim, unit_offset: true }` then `Rope` as one op (fusion
    /// `norm_rope`): each head normalised with `(1 + w)`, `w` `[head_dim]` or `[width]`, then
    /// rotated at the step's positions.
    NormRope {
        head_dim: D,
        rotary_dim: D,
    },
    /// `stream_mean(sigmoid(up) * hn)`: `up, hn [T, streams*H]` → `[T, H]` (fusion
    /// `gated_stream_mean`: the hyper-connection mix's tail where its projections are GEMMs).
    GatedStreamMean {
        streams: D,
    },
    /// `x * sigmoid(gate)`, the gate of x's width or one per row as `Mul`'s second input
    /// (fusion `sigmoid_mul`: QSA's output gate).
    SigmoidMul,
    /// QSA indexer: normalised+roped queries `[T, heads*head_dim]` and raw keys `[T, head_dim]`,
    /// weight `k_layernorm [head_dim]`; appends raw keys to its state, pools complete blocks of
    /// `block` keys, scores them, keeps the top `budget/block` blocks plus the tail → selection.
    IndexerSelect {
        heads: D,
        head_dim: D,
        rotary_dim: D,
        budget: D,
        block: D,
    },
    /// `IndexerSelect` over the indexer's projection `qk [T, heads*head_dim + head_dim]` (the
    /// query heads, then the key) with the queries' RMS norm (scale `1 + w`) and RoPE folded in
    /// (fusion `indexer_select_qk`: the two slices and `NormRope` of the unfused chain); weights
    /// the query norm `[head_dim]`, then `k_layernorm [head_dim]`; states as `IndexerSelect`.
    IndexerSelectQk {
        heads: D,
        head_dim: D,
        rotary_dim: D,
        budget: D,
        block: D,
    },
    /// GQA attention over the KV cache (appends `k, v` first) restricted to the selection,
    /// whose block ids count blocks of `block` positions.
    Attention {
        heads: D,
        kv_heads: D,
        head_dim: D,
        block: D,
    },
    /// QSA's attention chain as one op (fusion `gated_attention`): `SplitQGate` of `qg
    /// [T, heads*2*head_dim]` (per head: q then gate), `NormRope` of q (weight `q_norm`) and of
    /// `k_raw [T, kv_heads*head_dim]` (weight `k_norm`; each `[head_dim]` or the row's width),
    /// `Attention` of those with `v` and the selection (appending k, v to the states `k_cache`,
    /// `v_cache` first), then `SigmoidMul` by the gate: inputs `qg, k_raw, v, selection`,
    /// weights `q_norm, k_norm` → `[T, heads*head_dim]` (q, k and the ungated output never stored).
    GatedAttention {
        heads: D,
        kv_heads: D,
        head_dim: D,
        rotary_dim: D,
        block: D,
    },
    /// Router: softmax over logits `[T, E]`, top-k (ties: lower expert id first), renormalised when
    /// the constants say `norm_topk_prob` → ids (i64), weights.
    MoeRouter {
        top_k: D,
    },
    /// Routed experts: `x [T, H]`, ids/weights `[T, k]`, weights `gate_up [E, 2I, H]`,
    /// `down [E, H, I]` → `Σ_j w_j · down_e (silu(G) * U)`.
    MoeExperts {
        experts: D,
        intermediate: D,
    },
    /// PLE n-gram ids `[T, nH]` (i64) from the tokens and the cached last `ngram-1` ids;
    /// hash tables come from the program constants (`ple_tables[table]`), eos too.
    PleNgramIds {
        ngram: D,
        heads_per_ngram: D,
        table: D,
    },
    /// `PleNgramIds` then `Embed` as one op (fusion `ple_embed`): the tokens' n-gram ids
    /// (history state, hash tables and eos as `PleNgramIds`), each id's row of the table
    /// `[rows, d]` → `[T, (ngram-1)*heads_per_ngram*d]`; the ids are never stored.
    PleEmbed {
        ngram: D,
        heads_per_ngram: D,
        table: D,
    },
    /// PLE gate: `key, query [T, C*H]`, `value [T, H]` → `sigmoid(ssqrt(<k,q>_s / sqrt(H))) * value`.
    PleGate {
        streams: D,
    },
    /// The PLE block's tail as one op (fusion `ple_mix`): `key = RmsNorm(key_proj)`, `query =
    /// RmsNorm(h)` (groups of H, scale `1 + w`), `gv = PleGate(key, query, value)`, then
    /// `h + (gv + CausalConv { kernel, dilation, silu: true }(RmsNorm(gv)))`: args `key_proj,
    /// h [T, streams*H]`, `value [T, H]`; weights `norm_key, norm_query, norm_conv` (`[streams*H]`
    /// or `[H]`) and the conv weight `[streams*H, 1, kernel]`; state the conv window
    /// (`(kernel-1)*dilation` rows of `streams*H`, as the unfused conv's) → `h_out [T, streams*H]`.
    PleMix {
        streams: D,
        kernel: D,
        dilation: D,
    },
    /// The last row of the input (logits of the last position only).
    LastRow,
    /// Fused `silu(x·Wgᵀ) * (x·Wuᵀ)` (gate, up and SiLU of an expert).
    SwigluLinear,
    /// Fused hyper-connection read chain over the normalised streams `hn`:
    /// `mean_s(sigmoid(silu(hn·Wdownᵀ / C)·Wupᵀ) * hn)`.
    HcMix {
        streams: D,
    },
    /// Fused hyper-connection read: `hn = rms_norm(h)` per stream (unit offset) feeding both
    /// `HcMix` and `HcInject`, in one node with two outputs `x [T, H]` and `inj [T, C]`: arg
    /// `h [T, C*H]`; weights `norm [C*H or H]`, `down [R, C*H]`, `up [C*H, R]`, `inject [C, C*H]`.
    /// Without `inject` (fusion `hc_read_exit`: the model's final mixer, which has no gains) the
    /// node has the first three weights and the one output `x`.
    HcRead {
        streams: D,
        inject: bool,
    },
    /// Fused injection gate: `2 * sigmoid(hn·Winjᵀ / C)`.
    HcInject {
        streams: D,
    },
    /// Fused linear layer and hyper-connection write: `h + inj ⊗ (x·Wᵀ)`: args `h [T, C*H]`,
    /// `inj [T, C]`, `x [T, K]`, weight `W [H, K]` (a block's output projection and its residual
    /// write in one pass: the matrix-vector product's epilogue writes the C streams).
    LinearHcWrite {
        streams: D,
    },
    /// Fused end of the MoE block: `h + inj ⊗ (a + sigmoid(x·wgᵀ) * (s·Wdᵀ))`, the shared
    /// expert's down projection, its gated sum with the routed experts' output and the residual
    /// write in one pass: args `h [T, C*H]`, `inj [T, C]`, `x [T, H]`, `s [T, I]`, `a [T, H]`;
    /// weights `Wd [H, I]`, `wg [1, H]`.
    MoeSharedWrite {
        streams: D,
    },
    /// Sibling linear layers over one input, computed together (a horizontal fusion,
    /// `graphs/groups.ron`): `x [T, K]`, weights `W_i [N_i, K]` → `parts` outputs `x·W_iᵀ [T, N_i]`.
    LinearGroup {
        parts: D,
    },
    /// Fused gated sum `a + sigmoid(x·wᵀ) * b`: args `x [T, H]`, `b [T, D]`, `a [T, D]`,
    /// weight `w [1, H]` (the shared expert's gate: one logit per token).
    SigmoidGatedAdd,
}

/// The element type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueType {
    F32,
    I64,
    /// Per-row attention selection (QSA).
    Selection,
}

/// `Op::map_dims`'s body: each field-less variant, then each variant with its dimension fields
/// (mapped through `f`) and, after `;`, its other fields (copied). The match it makes is
/// exhaustive, so a new op fails to compile until it is listed here.
macro_rules! map_op_dims {
    ($op:expr, $f:ident;
     units: [$($unit:ident),* $(,)?];
     dims: [$($v:ident { $($d:ident),* $(; $($c:ident),*)? }),* $(,)?]) => {
        match $op {
            $(Op::$unit => Op::$unit,)*
            $(Op::$v { $($d,)* $($($c,)*)? } => Op::$v { $($d: $f($d)?,)* $($($c: *$c,)*)? },)*
        }
    };
}

impl<D> Op<D> {
    /// The snake_case kind name used in rules, fusions and (later) kernel names.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Embed => "embed",
            Op::RepeatStreams { .. } => "repeat_streams",
            Op::EmbedStreams { .. } => "embed_streams",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Linear => "linear",
            Op::StreamLinear { .. } => "stream_linear",
            Op::DivBy { .. } => "div_by",
            Op::MulBy { .. } => "mul_by",
            Op::Silu => "silu",
            Op::Sigmoid => "sigmoid",
            Op::Mul => "mul",
            Op::Add => "add",
            Op::Slice { .. } => "slice",
            Op::StreamMean { .. } => "stream_mean",
            Op::HcWrite { .. } => "hc_write",
            Op::CausalConv { .. } => "causal_conv",
            Op::GdnGates => "gdn_gates",
            Op::GdnRecurrence { .. } => "gdn_recurrence",
            Op::GdnGatedRecurrence { .. } => "gdn_gated_recurrence",
            Op::GdnNormedRecurrence { .. } => "gdn_normed_recurrence",
            Op::GdnConvNormedRecurrence { .. } => "gdn_conv_normed_recurrence",
            Op::GatedRmsNorm { .. } => "gated_rms_norm",
            Op::SplitQGate { .. } => "split_q_gate",
            Op::Rope { .. } => "rope",
            Op::NormRope { .. } => "norm_rope",
            Op::SigmoidMul => "sigmoid_mul",
            Op::GatedStreamMean { .. } => "gated_stream_mean",
            Op::IndexerSelect { .. } => "indexer_select",
            Op::IndexerSelectQk { .. } => "indexer_select_qk",
            Op::Attention { .. } => "attention",
            Op::GatedAttention { .. } => "gated_attention",
            Op::MoeRouter { .. } => "moe_router",
            Op::MoeExperts { .. } => "moe_experts",
            Op::PleNgramIds { .. } => "ple_ngram_ids",
            Op::PleEmbed { .. } => "ple_embed",
            Op::PleGate { .. } => "ple_gate",
            Op::PleMix { .. } => "ple_mix",
            Op::LastRow => "last_row",
            Op::SwigluLinear => "swiglu_linear",
            Op::HcMix { .. } => "hc_mix",
            Op::HcInject { .. } => "hc_inject",
            Op::HcRead { .. } => "hc_read",
            Op::SigmoidGatedAdd => "sigmoid_gated_add",
            Op::LinearHcWrite { .. } => "linear_hc_write",
            Op::LinearGroup { .. } => "linear_group",
            Op::MoeSharedWrite { .. } => "moe_shared_write",
        }
    }

    /// Whether the host must read this op's result before the next op can be launched (a
    /// segment ends after it: `passes::segment`). No op does: routing, selections and positions
    /// stay on the device.
    pub fn needs_host(&self) -> bool {
        false
    }

    /// Number of outputs the op produces.
    /// Whether weight `index` of this op is a matrix read by the matrix kernels (a device stores
    /// it bf16 for a bf16 checkpoint); every other weight is a small f32 vector. A fused op's
    /// weight keeps the kind it has unfused, since longer steps may run the unfused ops on the
    /// same weights: `MoeSharedWrite`'s gate weight (read by `SigmoidGatedAdd`) and `HcRead`'s
    /// norm weight (read by `RmsNorm`) are vectors.
    pub fn weight_is_matrix(&self, index: usize) -> bool {
        match self {
            Op::Linear
            | Op::StreamLinear { .. }
            | Op::SwigluLinear
            | Op::HcMix { .. }
            | Op::HcInject { .. }
            | Op::LinearHcWrite { .. }
            | Op::LinearGroup { .. }
            | Op::MoeExperts { .. }
            | Op::Embed
            | Op::EmbedStreams { .. }
            | Op::PleEmbed { .. } => true,
            Op::MoeSharedWrite { .. } => index == 0,
            Op::HcRead { .. } => index != 0,
            _ => false,
        }
    }

    /// `None` for an op whose output count is one of its dimensions (`LinearGroup`'s parts).
    pub fn num_outputs(&self) -> Option<usize> {
        match self {
            Op::GdnGates
            | Op::SplitQGate { .. }
            | Op::MoeRouter { .. }
            | Op::HcRead { inject: true, .. } => Some(2),
            Op::LinearGroup { .. } => None,
            _ => Some(1),
        }
    }

    /// Maps every dimension through `f`, keeping the op and its flags.
    pub fn map_dims<E, Err>(&self, mut f: impl FnMut(&D) -> Result<E, Err>) -> Result<Op<E>, Err> {
        Ok(map_op_dims!(self, f;
            units: [
                Embed,
                Linear,
                Silu,
                Sigmoid,
                Mul,
                Add,
                GdnGates,
                SigmoidMul,
                LastRow,
                SwigluLinear,
                SigmoidGatedAdd,
            ];
            dims: [
                RepeatStreams { streams },
                StreamLinear { streams },
                EmbedStreams { streams },
                RmsNorm { group; unit_offset },
                DivBy { by },
                MulBy { by },
                Slice { start, len },
                StreamMean { streams },
                HcWrite { streams },
                CausalConv { kernel, dilation; silu },
                GdnRecurrence { key_heads, value_heads, key_dim, value_dim },
                GdnGatedRecurrence { key_heads, value_heads, key_dim, value_dim },
                GdnNormedRecurrence { key_heads, value_heads, key_dim, value_dim },
                GdnConvNormedRecurrence { key_heads, value_heads, key_dim, value_dim, kernel },
                GatedRmsNorm { head_dim },
                SplitQGate { heads, head_dim },
                Rope { head_dim, rotary_dim },
                NormRope { head_dim, rotary_dim },
                GatedStreamMean { streams },
                IndexerSelect { heads, head_dim, rotary_dim, budget, block },
                IndexerSelectQk { heads, head_dim, rotary_dim, budget, block },
                Attention { heads, kv_heads, head_dim, block },
                GatedAttention { heads, kv_heads, head_dim, rotary_dim, block },
                MoeRouter { top_k },
                MoeExperts { experts, intermediate },
                PleNgramIds { ngram, heads_per_ngram, table },
                PleEmbed { ngram, heads_per_ngram, table },
                PleGate { streams },
                PleMix { streams, kernel, dilation },
                HcMix { streams },
                HcInject { streams },
                HcRead { streams; inject },
                LinearHcWrite { streams },
                LinearGroup { parts },
                MoeSharedWrite { streams },
            ]
        ))
    }
}

/// Every op kind, as [`Op::kind`] names them.
pub const KINDS: &[&str] = &[
    "embed",
    "repeat_streams",
    "embed_streams",
    "rms_norm",
    "linear",
    "stream_linear",
    "div_by",
    "mul_by",
    "silu",
    "sigmoid",
    "mul",
    "add",
    "slice",
    "stream_mean",
    "hc_write",
    "causal_conv",
    "gdn_gates",
    "gdn_recurrence",
    "gdn_gated_recurrence",
    "gdn_normed_recurrence",
    "gdn_conv_normed_recurrence",
    "gated_rms_norm",
    "split_q_gate",
    "rope",
    "norm_rope",
    "sigmoid_mul",
    "gated_stream_mean",
    "indexer_select",
    "indexer_select_qk",
    "attention",
    "gated_attention",
    "moe_router",
    "moe_experts",
    "ple_ngram_ids",
    "ple_embed",
    "ple_gate",
    "ple_mix",
    "last_row",
    "swiglu_linear",
    "hc_mix",
    "hc_inject",
    "hc_read",
    "sigmoid_gated_add",
    "linear_hc_write",
    "linear_group",
    "moe_shared_write",
];
