//! The parity loop over the kernel registry (as llama.cpp's test-backend-ops does): every CUDA
//! variant of every op (`registry::cuda`), on every distinct node of CUDA programs lowered at tiny
//! and real shapes, against the CPU reference. The CPU executor runs each step and records what
//! every node read and wrote (`exec::cpu::record_step`); each variant that accepts the node (its
//! registry entry's `accepts`) then runs that node alone on the device from the same inputs and
//! states (`exec::cuda::executor::run_node`, through the executor's own node launchers, launching
//! exactly the kernels the variant names), and its outputs and states must match the record:
//! floats within the f32 bound, ids and selections exactly. A variant the loop never reaches
//! fails the test unless `UNREACHED` says why. Runs where a CUDA device is present
//! (`scripts/gpu_tests.sh`); elsewhere it says so.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use graphrun::exec::cpu::{self, NodeRecord, Val};
use graphrun::exec::cuda::executor::{run_node, DeviceWeights};
use graphrun::exec::cuda::Gpu;
use graphrun::exec::state::{SessionState, StateBuf};
use graphrun::ir::{Device, LogitsMode, Phase, Program};
use graphrun::lower::{lower, GraphSet, LowerOptions, ProgramKind};
use graphrun::ops::indexer::RowSel;
use graphrun::plan::ModelPlan;
use graphrun::registry::{self, DeviceFacts, NodeFacts, Placement, StorageFormats, WeightFormat};
use graphrun::runtime::{Model, ModelOptions};
use graphrun::weights::{Nvfp4Bank, WeightTensor, Weights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::gpu::{errors, F32_BOUND};

/// Variants no case reaches, with the reason (each must name a registry variant).
const UNREACHED: &[(&str, &str, &str)] = &[
    (
        "gdn_conv_normed_recurrence",
        "reference",
        "its fusion applies on the CPU only (graphs/fusions.ron); tests/gpu_gdn.rs checks it",
    ),
    (
        "gdn_conv_normed_recurrence",
        "fused",
        "its fusion applies on the CPU only (graphs/fusions.ron); tests/gpu_gdn.rs checks it",
    ),
];

/// The fusions that absorb the others' products (`hc_mix`, `hc_inject`, `norm_rope`,
/// `sigmoid_mul`): lowered without them, those nodes exist to be checked.
const OUTER_FUSIONS: [&str; 3] = ["hc_read", "hc_read_exit", "gated_attention"];

/// How a case is lowered: with every fusion of `fusions.ron` (what runs), with all but the
/// outer ones, and with none (the ops the fusions replace).
fn lowerings() -> Vec<Option<Vec<String>>> {
    let all: Vec<String> = GraphSet::embedded()
        .unwrap()
        .fusions
        .iter()
        .map(|f| f.name.clone())
        .collect();
    for outer in OUTER_FUSIONS {
        assert!(all.iter().any(|n| n == outer), "fusions.ron has no {outer}");
    }
    let inner = all
        .into_iter()
        .filter(|n| !OUTER_FUSIONS.contains(&n.as_str()))
        .collect();
    vec![None, Some(inner), Some(Vec::new())]
}

/// One model the loop lowers and steps through.
struct Case {
    label: String,
    plan: ModelPlan,
    /// The CPU reference's f32 weights, and the packed banks of NVFP4 experts beside them.
    weights: Weights,
    format: WeightFormat,
    /// How the device stores the routed experts (`format`, or NVFP4).
    expert_format: WeightFormat,
    /// The tokens of each step, in order (the first from position 0).
    steps: Vec<usize>,
    /// Where the device keeps the PLE n-gram table.
    ple_table: Placement,
    /// The trunk's programs, or the MTP draft head's (fed random hidden rows).
    kind: ProgramKind,
}

#[test]
fn every_cuda_variant_matches_the_cpu_reference_on_every_node_it_accepts() {
    let Some(gpu) = common::gpu::gpu_or_skip() else {
        return;
    };
    let facts = gpu.facts();
    let mut checked: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in cases() {
        for fusions in lowerings() {
            // The host gather is the fused `ple_embed`'s (lowering refuses the table on the host
            // without it: tests/lower.rs).
            let fused_ple = fusions
                .as_ref()
                .is_none_or(|f| f.iter().any(|n| n == "ple_embed"));
            if case.ple_table == Placement::Host && !fused_ple {
                continue;
            }
            run_case(
                &gpu,
                &facts,
                &case,
                fusions.as_deref(),
                &mut checked,
                &mut failures,
            );
        }
    }
    println!("variant                                  nodes checked");
    for ((op, variant), n) in &checked {
        println!("{:<40} {n}", format!("{op}.{variant}"));
    }
    let unreached: Vec<String> = registry::all(Device::Cuda)
        .iter()
        .flat_map(|vs| vs.iter())
        .filter(|v| !checked.contains_key(&(v.op.to_string(), v.name.to_string())))
        .filter(|v| {
            !UNREACHED
                .iter()
                .any(|(op, n, _)| *op == v.op && *n == v.name)
        })
        .map(|v| format!("{}.{}", v.op, v.name))
        .collect();
    for (op, name, why) in UNREACHED {
        assert!(
            registry::find(Device::Cuda, op, name).is_some(),
            "UNREACHED names {op}.{name}, which the registry lacks"
        );
        assert!(
            !checked.contains_key(&(op.to_string(), name.to_string())),
            "{op}.{name} is reached now: take it out of UNREACHED ({why})"
        );
    }
    let total: usize = checked.values().sum();
    println!("{total} checks of {} variants", checked.len());
    for f in &failures {
        println!("FAILED {f}");
    }
    assert!(
        failures.is_empty(),
        "{} checks failed (listed above)",
        failures.len()
    );
    assert!(
        unreached.is_empty(),
        "variants no case reached: {}",
        unreached.join(", ")
    );
}

/// The fixtures (f32 and bf16 checkpoints, one with a long context) and the real geometry cut
/// to two layers (one GDN, one QSA) with 16 experts, a 16k vocabulary and a small n-gram table,
/// stepped through prefills, a decode and the multi-row steps of verify and batched decode.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for dir in common::fixture_dirs() {
        let model = Model::load(&dir, ModelOptions::default()).unwrap();
        let format = WeightFormat::on(Device::Cuda, &model.weight_dtype);
        out.push(Case {
            label: dir.file_name().unwrap().to_string_lossy().to_string(),
            plan: model.plan.clone(),
            weights: model.weights.clone(),
            format,
            expert_format: format,
            steps: vec![7, 1, 2, 3, 8, 16, 1, 40, 1, 5],
            ple_table: Placement::Device,
            kind: ProgramKind::Trunk,
        });
    }
    // The n-gram table kept on the host: its rows gathered there (the real release on one GPU).
    let host = Case {
        label: format!("{}, n-gram table on the host", out[0].label),
        plan: out[0].plan.clone(),
        weights: out[0].weights.clone(),
        format: out[0].format,
        expert_format: out[0].expert_format,
        steps: vec![7, 1, 2, 1, 9, 1],
        ple_table: Placement::Host,
        kind: ProgramKind::Trunk,
    };
    out.push(host);
    let tiny = common::repo().join("models/tiny-qwen4exp/config.json");
    let plan = ModelPlan::from_json_str(&std::fs::read_to_string(tiny).unwrap(), "the tiny model")
        .unwrap();
    let mut weights = graphrun::synth::random_weights(&plan, 29).unwrap();
    round_to_bf16(&mut weights);
    with_nvfp4_experts(&mut weights);
    out.push(Case {
        label: "tiny model, NVFP4 experts".into(),
        plan,
        weights,
        format: WeightFormat::Bf16,
        expert_format: WeightFormat::Nvfp4,
        steps: vec![7, 1, 2, 3, 8, 1, 40, 1],
        ple_table: Placement::Device,
        kind: ProgramKind::Trunk,
    });
    // The MTP draft head's programs (`stream_linear`, imports, rotations one past the rows).
    let mtp = common::repo().join("models/tiny-qwen4exp-mtp/config.json");
    let plan =
        ModelPlan::from_json_str(&std::fs::read_to_string(mtp).unwrap(), "the tiny MTP model")
            .unwrap();
    out.push(Case {
        label: "tiny model's MTP draft head".into(),
        weights: graphrun::synth::random_weights(&plan, 31).unwrap(),
        plan,
        format: WeightFormat::F32,
        expert_format: WeightFormat::F32,
        steps: vec![7, 1, 2, 3, 8, 1],
        ple_table: Placement::Device,
        kind: ProgramKind::Draft,
    });
    let plan = real_geometry();
    let mut weights = graphrun::synth::random_weights(&plan, 23).unwrap();
    round_to_bf16(&mut weights);
    out.push(Case {
        label: "real geometry (2 layers, 16 experts)".into(),
        plan: plan.clone(),
        weights: weights.clone(),
        format: WeightFormat::Bf16,
        expert_format: WeightFormat::Bf16,
        steps: vec![64, 1, 2, 6, 8, 16, 32, 1],
        ple_table: Placement::Device,
        kind: ProgramKind::Trunk,
    });
    with_nvfp4_experts(&mut weights);
    out.push(Case {
        label: "real geometry (2 layers, 16 NVFP4 experts)".into(),
        plan,
        weights,
        format: WeightFormat::Bf16,
        expert_format: WeightFormat::Nvfp4,
        steps: vec![64, 1, 2, 6, 1],
        ple_table: Placement::Device,
        kind: ProgramKind::Trunk,
    });
    out
}

/// Each routed-expert bank packed as NVFP4 (with E4M3 NaN scale bytes among its groups), and
/// its f32 entry replaced by the packed bank's dequantisation: the device reads the bank, the
/// CPU computes with exactly its meaning.
fn with_nvfp4_experts(weights: &mut Weights) {
    let names: Vec<String> = weights
        .names()
        .filter(|n| n.ends_with("experts.gate_up_proj") || n.ends_with("experts.down_proj"))
        .map(str::to_string)
        .collect();
    assert!(!names.is_empty(), "the model has routed experts");
    for name in names {
        let t = weights.get(&name).unwrap().clone();
        let rows = t.shape[1];
        let per_tensor = if name.ends_with("gate_up_proj") {
            rows / 2
        } else {
            rows
        };
        let bank = Nvfp4Bank::quantize(&t.shape, &t.data, per_tensor, 29);
        weights.insert(
            name.clone(),
            WeightTensor {
                shape: t.shape.clone(),
                data: bank.dequantize(),
            },
        );
        weights.insert_nvfp4(name, bank);
    }
}

/// The real config with two layers, 16 experts (top-10 of them), a 16k vocabulary and a 1k
/// n-gram base: every per-row shape as the release's, small enough for the CPU reference.
fn real_geometry() -> ModelPlan {
    let path = common::repo().join("tests/data/configs/qwen3.8-flash-next.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let t = &mut config["text_config"];
    t["num_hidden_layers"] = 2.into();
    t["layer_types"] = serde_json::json!(["linear_attention", "full_attention"]);
    t["ple_layer_ids"] = serde_json::json!([1]);
    t["num_experts"] = 16.into();
    t["vocab_size"] = 16384.into();
    t["ngram_vocab_size_base"] = 1024.into();
    for (i, id) in ["eos_token_id", "bos_token_id"].into_iter().enumerate() {
        t[id] = (16000 + i).into();
    }
    for (i, id) in [
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    ]
    .into_iter()
    .enumerate()
    {
        config[id] = (16002 + i).into();
    }
    ModelPlan::from_json_str(&config.to_string(), "the cut real config").unwrap()
}

fn formats(case: &Case) -> StorageFormats {
    StorageFormats {
        matrices: case.format,
        experts: case.expert_format,
        ple_table: case.ple_table,
    }
}

/// Each weight rounded to bf16, as the device holds a bf16 checkpoint: the CPU then computes
/// with exactly the device's weights.
fn round_to_bf16(weights: &mut Weights) {
    let names: Vec<String> = weights.names().map(str::to_string).collect();
    for name in names {
        let mut t = weights.get(&name).unwrap().clone();
        for v in &mut t.data {
            *v = half::bf16::from_f32(*v).to_f32();
        }
        weights.insert(name, t);
    }
}

fn program(case: &Case, facts: &DeviceFacts, fusions: Option<&[String]>, tokens: usize) -> Program {
    let phase = if tokens == 1 {
        Phase::Decode
    } else {
        Phase::Prefill
    };
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(case.format),
        expert_format: Some(case.expert_format),
        device_facts: Some(*facts),
        fusions: fusions.map(|f| f.to_vec()),
        ple_table: case.ple_table,
        kind: case.kind,
        ..LowerOptions::new(phase, tokens, LogitsMode::Last)
    };
    lower(&case.plan, &GraphSet::embedded().unwrap(), &opts)
        .unwrap()
        .program
}

/// The same program with every node on its CPU reference variant.
fn on_the_cpu(program: &Program) -> Program {
    let mut p = program.clone();
    for node in &mut p.nodes {
        node.variant = registry::variants(Device::Cpu, node.op.kind())[0]
            .name
            .to_string();
    }
    p
}

fn run_case(
    gpu: &Gpu,
    facts: &DeviceFacts,
    case: &Case,
    fusions: Option<&[String]>,
    checked: &mut BTreeMap<(String, String), usize>,
    failures: &mut Vec<String>,
) {
    let capacity: usize = case.steps.iter().sum();
    let label = match fusions {
        None => case.label.clone(),
        Some([]) => format!("{} without fusions", case.label),
        Some(_) => format!("{} with the inner fusions", case.label),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut state = SessionState::default();
    let mut device_weights: Option<DeviceWeights> = None;
    let seen = std::cell::RefCell::new(BTreeSet::new());
    let vocab = case.plan.vocab_size;
    for &tokens in &case.steps {
        let program = program(case, facts, fusions, tokens);
        let dw = device_weights.get_or_insert_with(|| {
            DeviceWeights::upload(
                gpu,
                &program,
                &case.weights,
                case.format == WeightFormat::Bf16,
                case.ple_table,
            )
            .unwrap()
        });
        let rows = registry::node_rows(&program);
        let start = state.position;
        // One check per distinct node: op, facts and step position.
        let fresh = |i: usize| {
            let f = NodeFacts::of(&program, &program.nodes[i], rows[i], formats(case));
            seen.borrow_mut()
                .insert((f.op, format!("{:?}", f.dims), f.step, start))
        };
        let ids: Vec<i64> = (0..tokens)
            .map(|_| rng.random_range(0..vocab as i64))
            .collect();
        let cpu_program = on_the_cpu(&program);
        // A draft step's seeds: random hidden rows.
        let hidden: Vec<f32> = program
            .imports
            .iter()
            .flat_map(|i| {
                (0..tokens * i.width)
                    .map(|_| rng.random_range(-2.0..2.0))
                    .collect::<Vec<f32>>()
            })
            .collect();
        let imports: Vec<(&str, &[f32])> = program
            .imports
            .iter()
            .map(|i| (i.name.as_str(), &hidden[..]))
            .collect();
        assert!(program.imports.len() <= 1, "one import: hidden");
        let records = cpu::record_step_with(
            &cpu_program,
            &case.weights,
            &mut state,
            &ids,
            &imports,
            &fresh,
        )
        .unwrap();
        for record in &records {
            check_node(
                gpu,
                facts,
                &label,
                formats(case),
                &case.weights,
                &program,
                dw,
                record,
                rows[record.index],
                start,
                capacity,
                checked,
                failures,
            );
        }
    }
}

/// Every CUDA variant that accepts the recorded node, run from the record's inputs and states.
#[allow(clippy::too_many_arguments)]
fn check_node(
    gpu: &Gpu,
    facts: &DeviceFacts,
    label: &str,
    format: StorageFormats,
    host_weights: &Weights,
    program: &Program,
    weights: &DeviceWeights,
    record: &NodeRecord,
    rows: usize,
    start: usize,
    capacity: usize,
    checked: &mut BTreeMap<(String, String), usize>,
    failures: &mut Vec<String>,
) {
    let node = &program.nodes[record.index];
    let node_facts = NodeFacts::of(program, node, rows, format);
    for variant in registry::variants(Device::Cuda, node.op.kind()) {
        if (variant.accepts)(&node_facts, facts).is_err() {
            continue;
        }
        let mut n = node.clone();
        n.variant = variant.name.to_string();
        n.kernels = (variant.kernels)(&node_facts, facts);
        let what = format!(
            "{label} node {} ({}.{}, {} rows at {start}, kernels {})",
            node.name,
            node.op.kind(),
            variant.name,
            rows,
            n.kernels.join(", ")
        );
        let result = run_node(
            gpu,
            program,
            weights,
            &n,
            &record.inputs,
            &record.states_before,
            start,
            capacity,
        )
        .map_err(|e| e.to_string())
        .and_then(|(outputs, states)| {
            for (i, (got, want)) in outputs.iter().zip(&record.outputs).enumerate() {
                let few = few_dot_products(node, host_weights, record, want);
                match (few, got, want) {
                    (Some(scale), Val::F32 { data: g, .. }, Val::F32 { data: w, .. }) => {
                        within_summation_error(g, w, &scale)
                    }
                    _ => same_value(got, want),
                }
                .map_err(|e| format!("output {i}: {e}"))?;
            }
            for (i, (got, want)) in states.iter().zip(&record.states_after).enumerate() {
                same_state(got, want).map_err(|e| format!("state {}: {e}", node.states[i]))?;
            }
            Ok(())
        });
        if let Err(e) = result {
            failures.push(format!("{what}: {e}"));
            continue;
        }
        *checked
            .entry((node.op.kind().to_string(), variant.name.to_string()))
            .or_default() += 1;
    }
}

/// Outputs with fewer values than this are too few for a norm-relative error (one dot product
/// near zero has no relative accuracy at all).
const FEW_VALUES: usize = 16;

/// For a `linear` node whose output has fewer than [`FEW_VALUES`] values: each output's sum of
/// |x_i w_i| over its dot product, the scale its f32 summation error is relative to.
fn few_dot_products(
    node: &graphrun::ir::Node,
    weights: &Weights,
    record: &NodeRecord,
    want: &Val,
) -> Option<Vec<f32>> {
    let (Val::F32 { data: y, .. }, Val::F32 { data: x, rows }) = (want, record.inputs.first()?)
    else {
        return None;
    };
    if node.op.kind() != "linear" || y.len() >= FEW_VALUES {
        return None;
    }
    let w = weights.get(&node.weights[0])?;
    let (n, k) = (w.shape[0], w.shape[1]);
    let mut scale = Vec::with_capacity(rows * n);
    for r in 0..*rows {
        for j in 0..n {
            let dot = (0..k).map(|i| (x[r * k + i] * w.data[j * k + i]).abs());
            scale.push(dot.sum());
        }
    }
    Some(scale)
}

/// |got - want| within the f32 bound of each dot product's scale ([`few_dot_products`]).
fn within_summation_error(got: &[f32], want: &[f32], scale: &[f32]) -> Result<(), String> {
    if got.len() != want.len() || want.len() != scale.len() {
        return Err(format!(
            "{} values, the reference has {}",
            got.len(),
            want.len()
        ));
    }
    for (j, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let diff = (g - w).abs() as f64;
        if !g.is_finite() || diff > F32_BOUND * *s as f64 {
            return Err(format!("value {j}: {g} against {w}, scale {s}"));
        }
    }
    Ok(())
}

fn close(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} values, the reference has {}",
            got.len(),
            want.len()
        ));
    }
    if got.iter().any(|v| !v.is_finite()) {
        return Err("non-finite values".into());
    }
    let (rel, max) = errors(got, want);
    if rel <= F32_BOUND && max <= F32_BOUND * 10.0 {
        Ok(())
    } else {
        Err(format!("rel {rel:e}, max {max:e}"))
    }
}

fn same_value(got: &Val, want: &Val) -> Result<(), String> {
    match (got, want) {
        (Val::F32 { data: g, .. }, Val::F32 { data: w, .. }) => close(g, w),
        (Val::I64 { data: g, .. }, Val::I64 { data: w, .. }) if g == w => Ok(()),
        (Val::I64 { data: g, .. }, Val::I64 { data: w, .. }) => {
            let at = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(g.len());
            Err(format!("ids differ from index {at} ({} values)", w.len()))
        }
        (Val::Sel(g), Val::Sel(w)) => {
            if g.len() != w.len() {
                return Err(format!(
                    "{} selection rows, the reference has {}",
                    g.len(),
                    w.len()
                ));
            }
            match g
                .iter()
                .zip(w)
                .position(|(a, b)| selected(a) != selected(b))
            {
                None => Ok(()),
                Some(r) => Err(format!(
                    "selection row {r}: {:?}, the reference {:?}",
                    selected(&g[r]),
                    selected(&w[r])
                )),
            }
        }
        _ => Err("the device gave another kind of value".into()),
    }
}

/// A selection row's visible length and blocks (None: dense).
fn selected(r: &RowSel) -> (usize, Option<Vec<usize>>) {
    match r {
        RowSel::Dense { visible } => (*visible, None),
        RowSel::Sparse {
            visible, blocks, ..
        } => (*visible, Some(blocks.clone())),
    }
}

fn same_state(got: &StateBuf, want: &StateBuf) -> Result<(), String> {
    match (got, want) {
        (StateBuf::Fixed(g), StateBuf::Fixed(w)) => close(g, w),
        // The device's capacity past the rows the CPU holds is not the node's to write.
        (StateBuf::Rows { data: g, .. }, StateBuf::Rows { data: w, .. }) if g.len() >= w.len() => {
            close(&g[..w.len()], w)
        }
        (StateBuf::Tokens(g), StateBuf::Tokens(w)) if g == w => Ok(()),
        (StateBuf::Tokens(_), StateBuf::Tokens(_)) => Err("token history differs".into()),
        _ => Err("the device gave another kind or size of state".into()),
    }
}
