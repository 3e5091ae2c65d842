//! One node's launch: the kernels its program names, by op, with its inputs, weights and
//! states; and which of its inputs are ready before the node ahead of it has finished.

use super::*;

/// The inputs of `node` that its kernels may read before the node launched just before it
/// (`previous`) has finished: those that are not `previous`'s outputs, since under programmatic
/// launch every kernel that wrote them has finished by the time `node` starts
/// (`wait_for_producers_unless` in kernels/common.cuh). The graph files' node order decides how
/// often this holds (graphs/qwen4exp/moe.ron puts the shared expert between the router and the
/// routed experts so that both run ahead).
pub(super) fn ready_after(node: &crate::ir::Node, previous: &crate::ir::Node) -> ReadyInputs {
    if releases_early(previous) {
        return ReadyInputs::NONE;
    }
    ReadyInputs(
        node.inputs
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, i)| !previous.outputs.contains(i))
            .fold(0, |m, (k, _)| m | 1 << k),
    )
}

/// Whether a kernel of `node` lets the next node launch before it has waited for its own
/// producers (`release_dependents_early`, kernels/common.cuh): the causal conv's decode kernel, so
/// that the GDN recurrence after it starts loading its state while the input projection drains.
/// The node after it may then start while the node two back still runs: nothing of its inputs is
/// ready before its wait.
fn releases_early(node: &crate::ir::Node) -> bool {
    matches!(node.op, Op::CausalConv { .. })
}

/// The n-gram hashing of a PLE ids node (`PleNgramIds`, `PleEmbed`): its order and heads, the
/// program's eos and the node's hash table on the device.
fn ngram_hash<'w>(
    program: &Program,
    weights: &'w DeviceWeights,
    node: &crate::ir::Node,
) -> Result<launch::NgramHash<'w>, CudaError> {
    let (Op::PleNgramIds {
        ngram,
        heads_per_ngram,
        table,
    }
    | Op::PleEmbed {
        ngram,
        heads_per_ngram,
        table,
    }) = node.op
    else {
        unreachable!("called for the n-gram ops")
    };
    let [multipliers, sizes, offsets] = weights.ple.get(table).ok_or_else(|| CudaError::Shape {
        kernel: node.op.kind().into(),
        msg: format!(
            "node `{}` names PLE hash table {table}, which the program lacks",
            node.name
        ),
    })?;
    Ok(launch::NgramHash {
        eos: program.consts.ple_eos.unwrap_or(0),
        ngram,
        heads_per_ngram,
        multipliers,
        sizes,
        offsets,
    })
}

/// The row width of a gathered table (its declared `[rows, d]`; 1 for a table the program
/// does not declare, which the launchers' shape checks then refuse unless it fits).
fn table_width(program: &Program, name: &str) -> usize {
    program
        .weights
        .iter()
        .find(|x| x.name == name)
        .map(|x| x.shape[1])
        .unwrap_or(1)
}

/// Launches the kernels of one node; `bufs` are the node's states, in its declared order.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_node<'v>(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    node: &crate::ir::Node,
    arg: &dyn Fn(usize) -> &'v DVal,
    bufs: &mut [DevState],
    step: &CudaSlice<i64>,
    cap: usize,
) -> Result<Vec<DVal>, CudaError> {
    let eps = program.consts.rms_norm_eps;
    let theta = program.consts.rope_theta;
    let w = |i: usize| node.weights[i].as_str();
    // The variant the schedule chose, as the launcher's typed choice (`registry` lists them).
    let unknown = || CudaError::Shape {
        kernel: node.kernels.join(", "),
        msg: format!(
            "node `{}`: the CUDA executor has no variant `{}` of {}",
            node.name,
            node.variant,
            node.op.kind()
        ),
    };
    let variant = node.variant.as_str();
    Ok(match &node.op {
        Op::Embed => {
            let (ids, rows) = arg(0).i64();
            let table = weights.matrix(w(0))?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::embed(gpu, ids, table, d)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::EmbedStreams { streams } => {
            let (ids, rows) = arg(0).i64();
            let table = weights.matrix(w(0))?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::embed_streams(gpu, ids, rows, table, d, *streams)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::RepeatStreams { streams } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::repeat_streams(gpu, x, rows, *streams)?,
            }]
        }
        Op::RmsNorm { group, unit_offset } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::rms_norm(gpu, x, weights.vector(w(0))?, *group, *unit_offset, eps)?,
            }]
        }
        Op::Linear => {
            let (x, rows) = arg(0).f32();
            let m = weights.matrix(w(0))?;
            let k = x.len() / rows;
            let n = m.len() / k;
            let y = match variant {
                "rows" => launch::linear_rows(gpu, x, m, rows, k, n)?,
                "tiled" => launch::linear_tiled(gpu, x, m, rows, k, n)?,
                "mma" => launch::linear::linear_mma_with(gpu, x, m, rows, k, n, MmaTile::T64)?,
                "mma_wide" => {
                    launch::linear::linear_mma_with(gpu, x, m, rows, k, n, MmaTile::Wide)?
                }
                one => {
                    let v = OneToken::from_variant(one).ok_or_else(unknown)?;
                    launch::linear::linear_one_token(gpu, x, m, k, n, v)?
                }
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::HcRead { streams, inject } => {
            let (h, rows) = arg(0).f32();
            let gains = if *inject {
                Some(weights.matrix(w(3))?)
            } else {
                None
            };
            let (x, inj) = layout::hc_read(
                gpu,
                h,
                weights.vector(w(0))?,
                weights.matrix(w(1))?,
                weights.matrix(w(2))?,
                gains,
                rows,
                *streams,
                eps,
                layout::HcReadAct::from_variant(variant).ok_or_else(unknown)?,
            )?;
            std::iter::once(x)
                .chain(inj)
                .map(|buf| DVal::F32 { rows, buf })
                .collect()
        }
        Op::MoeSharedWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let (inj, x, sh, a) = (
                arg(1).f32().0,
                arg(2).f32().0,
                arg(3).f32().0,
                arg(4).f32().0,
            );
            vec![DVal::F32 {
                rows,
                buf: launch::linear::moe_shared_write(
                    gpu,
                    h,
                    inj,
                    x,
                    sh,
                    a,
                    weights.matrix(w(0))?,
                    weights.vector(w(1))?,
                    rows,
                    *streams,
                )?,
            }]
        }
        Op::LinearGroup { .. } => {
            let (x, rows) = arg(0).f32();
            let ms = (0..node.weights.len())
                .map(|i| weights.matrix(w(i)))
                .collect::<Result<Vec<_>, _>>()?;
            let how = launch::linear::GroupKernel::from_variant(variant).ok_or_else(unknown)?;
            launch::linear::linear_group(gpu, x, &ms, rows, how)?
                .into_iter()
                .map(|buf| DVal::F32 { rows, buf })
                .collect()
        }
        Op::DivBy { by } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::scalar(gpu, "div_by", x, *by as f32)?,
            }]
        }
        Op::MulBy { by } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::scalar(gpu, "mul_by", x, *by as f32)?,
            }]
        }
        Op::Silu | Op::Sigmoid => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::unary(gpu, node.op.kind(), x)?,
            }]
        }
        Op::Mul => {
            let ((a, rows), (b, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::mul(gpu, a, b, rows)?,
            }]
        }
        Op::Add => {
            let ((a, rows), (b, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::add(gpu, a, b)?,
            }]
        }
        Op::Slice { start: s, len } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::slice_cols(gpu, x, rows, *s, *len)?,
            }]
        }
        Op::StreamMean { streams } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::stream_mean(gpu, x, rows, *streams)?,
            }]
        }
        Op::HcWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let y = layout::hc_write(gpu, h, arg(1).f32().0, arg(2).f32().0, rows, *streams)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::LastRow => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows: 1,
                buf: layout::last_row(gpu, x, rows)?,
            }]
        }
        Op::CausalConv {
            kernel,
            dilation,
            silu,
        } => {
            let (x, rows) = arg(0).f32();
            let window = f32_state(&mut bufs[0]);
            let how = gdn::ConvKernel::from_variant(variant).ok_or_else(unknown)?;
            let y = gdn::causal_conv(
                gpu,
                x,
                window,
                weights.vector(w(0))?,
                rows,
                *kernel,
                *dilation,
                *silu,
                how,
            );
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GdnGates => {
            let (b, rows) = arg(0).f32();
            let heads = b.len() / rows;
            let (beta, g) = gdn::gdn_gates(
                gpu,
                b,
                arg(1).f32().0,
                weights.vector(w(0))?,
                weights.vector(w(1))?,
                rows,
                heads,
            )?;
            vec![DVal::F32 { rows, buf: beta }, DVal::F32 { rows, buf: g }]
        }
        Op::GdnRecurrence { .. } | Op::GdnGatedRecurrence { .. } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (x1, x2) = (arg(1).f32().0, arg(2).f32().0);
            let gates = match node.op {
                Op::GdnRecurrence { .. } => gdn::GdnGates::Given { beta: x1, g: x2 },
                _ => gdn::GdnGates::Raw {
                    b: x1,
                    a: x2,
                    a_log: weights.vector(w(0))?,
                    dt_bias: weights.vector(w(1))?,
                },
            };
            let st = f32_state(&mut bufs[0]);
            let layout = gdn::GdnLayout::from_variant(variant).ok_or_else(unknown)?;
            let y = gdn::gdn_recurrence_with(gpu, qkv, gates, st, rows, &shape, layout);
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GdnNormedRecurrence { value_dim, .. } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (b, a, z) = (arg(1).f32().0, arg(2).f32().0, arg(3).f32().0);
            let (a_log, dt_bias) = (weights.vector(w(0))?, weights.vector(w(1))?);
            let norm_w = weights.vector(w(2))?;
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            let st = f32_state(&mut bufs[0]);
            let y = match variant {
                "fused" => gdn::gdn_normed_recurrence(
                    gpu, qkv, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, sigmoid, eps,
                )?,
                "reference" => unfused_normed_recurrence(
                    gpu, qkv, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, *value_dim,
                    sigmoid, eps,
                )?,
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::GdnConvNormedRecurrence {
            value_dim, kernel, ..
        } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (b, a, z) = (arg(1).f32().0, arg(2).f32().0, arg(3).f32().0);
            let conv_w = weights.vector(w(0))?;
            let (a_log, dt_bias) = (weights.vector(w(1))?, weights.vector(w(2))?);
            let norm_w = weights.vector(w(3))?;
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            // The states in the fused node's order: the conv's window, then the recurrence's.
            let [window, st] = bufs else {
                unreachable!("the fused node carries the conv's and the recurrence's states")
            };
            let (window, st) = (f32_state(window), f32_state(st));
            let y = match variant {
                "fused" => gdn::gdn_conv_normed_recurrence(
                    gpu, qkv, conv_w, window, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape,
                    *kernel, sigmoid, eps,
                )?,
                "reference" => {
                    // The convolution (an intermediate: in scratch), then the unfused normed
                    // recurrence.
                    let x = gpu.intermediate(|| {
                        let how = gdn::ConvKernel::Reference;
                        gdn::causal_conv(gpu, qkv, window, conv_w, rows, *kernel, 1, true, how)
                    })?;
                    unfused_normed_recurrence(
                        gpu, &x, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, *value_dim,
                        sigmoid, eps,
                    )?
                }
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::GatedRmsNorm { head_dim } => {
            let (x, rows) = arg(0).f32();
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            let y = layout::gated_rms_norm(
                gpu,
                x,
                arg(1).f32().0,
                weights.vector(w(0))?,
                *head_dim,
                sigmoid,
                eps,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::SplitQGate { heads, head_dim } => {
            let (x, rows) = arg(0).f32();
            let (q, g) = layout::split_q_gate(gpu, x, rows, *heads, *head_dim)?;
            vec![DVal::F32 { rows, buf: q }, DVal::F32 { rows, buf: g }]
        }
        Op::Rope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: attention::rope(gpu, x, rows, step, *head_dim, *rotary_dim, theta)?,
            }]
        }
        Op::NormRope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = arg(0).f32();
            let w = weights.vector(w(0))?;
            vec![DVal::F32 {
                rows,
                buf: attention::norm_rope(
                    gpu,
                    x,
                    w,
                    rows,
                    step,
                    *head_dim,
                    *rotary_dim,
                    eps,
                    theta,
                )?,
            }]
        }
        Op::GatedStreamMean { streams } => {
            let ((up, rows), (hn, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: layout::gated_stream_mean(gpu, up, hn, rows, *streams)?,
            }]
        }
        Op::SigmoidMul => {
            let ((x, rows), (g, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::sigmoid_mul(gpu, x, g, rows)?,
            }]
        }
        Op::IndexerSelect { .. } | Op::IndexerSelectQk { .. } => {
            let shape = IndexerShape::of(&node.op).expect("an indexer op");
            let [raw, pooled] = &mut bufs[..] else {
                unreachable!("the template declares two states")
            };
            let (raw, pooled) = (f32_state(raw), f32_state(pooled));
            // The queries and keys ready, or the indexer's projection (IndexerSelectQk).
            let (x, rows) = arg(0).f32();
            let sel = if let Op::IndexerSelect { .. } = node.op {
                attention::indexer_select(
                    gpu,
                    x,
                    arg(1).f32().0,
                    weights.vector(w(0))?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    cap,
                    eps,
                    theta,
                )
            } else {
                attention::indexer_select_qk(
                    gpu,
                    x,
                    weights.vector(w(0))?,
                    weights.vector(w(1))?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    cap,
                    eps,
                    theta,
                )
            };
            vec![DVal::Sel { buf: sel? }]
        }
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            block,
        } => {
            let (q, rows) = arg(0).f32();
            let (sel, keep, kc, vc) = selection_and_caches(arg(3), rows, bufs);
            let attend = match variant {
                "split" => attention::attention_split,
                "reference" => attention::attention,
                _ => return Err(unknown()),
            };
            let y = attend(
                gpu,
                q,
                arg(1).f32().0,
                arg(2).f32().0,
                sel,
                kc,
                vc,
                rows,
                step,
                *heads,
                *kv_heads,
                *head_dim,
                cap,
                keep,
                *block,
            );
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GatedAttention {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block,
        } => {
            let (qg, rows) = arg(0).f32();
            let (sel, keep, kc, vc) = selection_and_caches(arg(3), rows, bufs);
            let x = attention::GatedAttentionInputs {
                qg,
                k_raw: arg(1).f32().0,
                v: arg(2).f32().0,
                sel,
                q_norm: weights.vector(w(0))?,
                k_norm: weights.vector(w(1))?,
            };
            let shape = attention::GatedAttentionShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
                rotary_dim: *rotary_dim,
                block: *block,
            };
            let attend = match variant {
                "split" => attention::gated_attention_split,
                "reference" => attention::gated_attention,
                _ => return Err(unknown()),
            };
            let y = attend(gpu, &x, kc, vc, rows, step, &shape, cap, keep, eps, theta);
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::MoeRouter { top_k } => {
            let (logits, rows) = arg(0).f32();
            let experts = logits.len() / rows;
            let form = moe::RouterKernel::from_variant(variant).ok_or_else(unknown)?;
            let (ids, ws) = moe::moe_router(
                gpu,
                logits,
                rows,
                experts,
                *top_k,
                program.consts.norm_topk_prob,
                form,
            )?;
            vec![DVal::I64 { rows, buf: ids }, DVal::F32 { rows, buf: ws }]
        }
        Op::MoeExperts { intermediate, .. } => {
            let (x, rows) = arg(0).f32();
            let (ids, _) = arg(1).i64();
            let k = ids.len() / rows;
            let hidden = x.len() / rows;
            let (ws, gate_up, down) =
                (arg(2).f32().0, weights.matrix(w(0))?, weights.matrix(w(1))?);
            let dims = [rows, k, hidden, *intermediate];
            let y = match variant {
                "token_major" | "token_major_rows" => moe::moe_experts_with_down(
                    gpu,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    dims,
                    variant == "token_major_rows",
                )?,
                "expert_major" | "expert_major_mma" => moe::moe_experts_expert_major(
                    gpu,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    rows,
                    k,
                    hidden,
                    *intermediate,
                    variant == "expert_major_mma",
                )?,
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::PleNgramIds { .. } => {
            let (toks, rows) = arg(0).i64();
            let hash = ngram_hash(program, weights, node)?;
            let ids = moe::ple_ngram_ids(gpu, toks, i64_state(&mut bufs[0]), &hash);
            vec![DVal::I64 { rows, buf: ids? }]
        }
        Op::PleEmbed { .. } => {
            let (toks, rows) = arg(0).i64();
            let hash = ngram_hash(program, weights, node)?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::ple_embed(
                gpu,
                toks,
                i64_state(&mut bufs[0]),
                &hash,
                weights.matrix(w(0))?,
                d,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::PleGate { streams } => {
            let (key, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::ple_gate(gpu, key, arg(1).f32().0, arg(2).f32().0, rows, *streams)?,
            }]
        }
        Op::PleMix {
            streams,
            kernel,
            dilation,
        } => {
            let (key_proj, rows) = arg(0).f32();
            let (h, value) = (arg(1).f32().0, arg(2).f32().0);
            let shape = ple::PleMixShape {
                rows,
                streams: *streams,
                kernel: *kernel,
                dilation: *dilation,
            };
            let (nk, nq, nc) = (
                weights.vector(w(0))?,
                weights.vector(w(1))?,
                weights.vector(w(2))?,
            );
            let conv_w = weights.vector(w(3))?;
            let window = f32_state(&mut bufs[0]);
            let y = ple::ple_mix(
                gpu, key_proj, h, value, nk, nq, nc, conv_w, window, shape, eps,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::SwigluLinear => {
            let (x, rows) = arg(0).f32();
            let (wg, wu) = (weights.matrix(w(0))?, weights.matrix(w(1))?);
            let k = x.len() / rows;
            let n = wg.len() / k;
            vec![DVal::F32 {
                rows,
                buf: layout::swiglu(gpu, x, wg, wu, rows, k, n, block_form(variant)?)?,
            }]
        }
        Op::HcMix { streams } => {
            let (hn, rows) = arg(0).f32();
            let y = layout::hc_mix(
                gpu,
                hn,
                weights.matrix(w(0))?,
                weights.matrix(w(1))?,
                rows,
                *streams,
                block_form(variant)?,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::LinearHcWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let (inj, x) = (arg(1).f32().0, arg(2).f32().0);
            vec![DVal::F32 {
                rows,
                buf: launch::linear_hc_write(
                    gpu,
                    h,
                    inj,
                    x,
                    weights.matrix(w(0))?,
                    rows,
                    *streams,
                    match variant {
                        "reference" => None,
                        one => Some(OneToken::from_variant(one).ok_or_else(unknown)?),
                    },
                )?,
            }]
        }
        Op::SigmoidGatedAdd => {
            let (x, rows) = arg(0).f32();
            let (b, a) = (arg(1).f32().0, arg(2).f32().0);
            vec![DVal::F32 {
                rows,
                buf: layout::sigmoid_gated_add(gpu, x, weights.vector(w(0))?, b, a, rows)?,
            }]
        }
        Op::HcInject { streams } => {
            let (hn, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::hc_inject(
                    gpu,
                    hn,
                    weights.matrix(w(0))?,
                    rows,
                    *streams,
                    block_form(variant)?,
                )?,
            }]
        }
    })
}

/// `Op::GdnNormedRecurrence`'s `reference` variant: the gated recurrence in its block layout
/// (an intermediate: in scratch), then the gated RMS norm.
#[allow(clippy::too_many_arguments)]
fn unfused_normed_recurrence(
    gpu: &Gpu,
    qkv: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    norm_w: &CudaSlice<f32>,
    st: &mut CudaSlice<f32>,
    rows: usize,
    shape: &GdnShape,
    value_dim: usize,
    sigmoid: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let gates = gdn::GdnGates::Raw {
        b,
        a,
        a_log,
        dt_bias,
    };
    let block = gdn::GdnLayout::Block;
    let o =
        gpu.intermediate(|| gdn::gdn_recurrence_with(gpu, qkv, gates, st, rows, shape, block))?;
    layout::gated_rms_norm(gpu, &o, z, norm_w, value_dim, sigmoid, eps)
}

/// Whether a node's variant is the block form (`block`) or the reference one, for the ops that
/// have those two.
fn block_form(variant: &str) -> Result<bool, CudaError> {
    match variant {
        "block" => Ok(true),
        "reference" => Ok(false),
        other => Err(CudaError::Shape {
            kernel: other.into(),
            msg: "expected the variant `block` or `reference`".into(),
        }),
    }
}

/// An attention node's selection (its fourth input), the blocks each row keeps, and its K and V
/// caches (its two states: `Attention`'s, carried by the `gated_attention` fusion).
fn selection_and_caches<'a>(
    sel: &'a DVal,
    rows: usize,
    bufs: &'a mut [DevState],
) -> (
    &'a CudaSlice<i32>,
    usize,
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
) {
    let DVal::Sel { buf: sel } = sel else {
        unreachable!("validated programs feed a selection")
    };
    let [kc, vc] = bufs else {
        unreachable!("the template declares two states")
    };
    (sel, sel.len() / rows - 2, f32_state(kc), f32_state(vc))
}

fn f32_state(buf: &mut DevState) -> &mut CudaSlice<f32> {
    match buf {
        DevState::F32(b) => b,
        DevState::I64(_) => unreachable!("state kinds follow the templates"),
    }
}

fn i64_state(buf: &mut DevState) -> &mut CudaSlice<i64> {
    match buf {
        DevState::I64(b) => b,
        DevState::F32(_) => unreachable!("state kinds follow the templates"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Device;
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    /// graphs/qwen4exp/moe.ron orders the MoE block so that, in a CUDA decode step, the shared
    /// expert's gate/up runs ahead of the router, the routed experts ahead of the shared expert,
    /// and the block's end takes the shared expert's down rows ahead of the routed experts (whose
    /// output it reads after its wait). A reordering that loses this shows up here.
    #[test]
    fn the_moe_block_runs_ahead_in_a_decode_step() {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/configs/qwen3.8-flash-next.json");
        let plan = ModelPlan::from_file(&config).unwrap();
        let opts = LowerOptions {
            device: Device::Cuda,
            ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
        };
        let program = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program;
        let nodes = &program.nodes;
        let mut checked = 0;
        for (i, node) in nodes.iter().enumerate().skip(1) {
            let ready = ready_after(node, &nodes[i - 1]);
            let ok = match node.op.kind() {
                "swiglu_linear" => ready.all(&[0]),
                "moe_experts" => ready.all(&[0, 1, 2]),
                "moe_shared_write" => ready.all(&[2, 3]) && !ready.all(&[4]),
                _ => continue,
            };
            assert!(
                ok,
                "{} ({}) after {}: {ready:?}",
                node.name,
                node.op.kind(),
                nodes[i - 1].name
            );
            checked += 1;
        }
        assert_eq!(checked, 3 * plan.layers.len(), "one of each a layer");
    }
}
