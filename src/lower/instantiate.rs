//! Templates → one flat program for a plan and a phase.
//!
//! Walks the model composition (prologue, each layer, epilogue), instantiates each applicable
//! block with its dimensions resolved, renames its values `blk.{i}.{instance}.{value}`, its
//! weights to canonical tensor names (prefix + template name) and its states
//! `blk.{i}.{instance}.{state}`. Shapes are inferred node by node with the op shape rules.

use std::collections::{BTreeMap, HashMap};

use crate::ir::dims::{self, Dims};
use crate::ir::{
    Consts, Export, GateActivation, Import, LogitsMode, Node, Op, PleTable, Program, StateInfo,
    StateKind, Sym, ValueInfo, ValueType, WeightClass, WeightInfo,
};
use crate::ops::shape;
use crate::plan::{GateAct, LayerKind, LayerPlan, ModelPlan};

use super::error::LowerError;
use super::graphset::GraphSet;
use super::template::{Block, Instance, ModelDecl, StateDecl, When};
use super::{LowerOptions, ProgramKind};

/// The program input: token ids.
pub const INPUT: &str = "tokens";

/// The program `opts.kind` names: the trunk (`model.ron` over the plan's layers) or the MTP
/// draft head (`mtp.ron` over its `mtp_layers` QSA layers).
pub fn instantiate(
    plan: &ModelPlan,
    graphs: &GraphSet,
    opts: &LowerOptions,
) -> Result<Program, LowerError> {
    match opts.kind {
        ProgramKind::Trunk => compose(
            plan,
            graphs,
            opts,
            (&graphs.model, "graphs/qwen4exp/model.ron"),
            &plan.layers,
        ),
        ProgramKind::Draft => {
            let decl = graphs.draft.as_ref().ok_or_else(|| {
                LowerError::graph(
                    "graphs/qwen4exp/mtp.ron",
                    "file is missing: the graphs describe no draft head",
                )
            })?;
            if plan.mtp_layers == 0 {
                return Err(LowerError::Options(
                    "the config declares no MTP draft layers (mtp_num_hidden_layers)".into(),
                ));
            }
            compose(
                plan,
                graphs,
                opts,
                (decl, "graphs/qwen4exp/mtp.ron"),
                &draft_layers(plan),
            )
        }
    }
}

/// The draft head's decoder layers: QSA layers numbered from 0 (their tensors are
/// `mtp.layers.{i}.*`), without PLE.
pub fn draft_layers(plan: &ModelPlan) -> Vec<LayerPlan> {
    (0..plan.mtp_layers)
        .map(|index| LayerPlan {
            index,
            kind: LayerKind::Qsa,
            type_name: "full_attention".into(),
            ple: None,
        })
        .collect()
}

fn compose(
    plan: &ModelPlan,
    graphs: &GraphSet,
    opts: &LowerOptions,
    (decl, decl_file): (&ModelDecl, &str),
    layers: &[LayerPlan],
) -> Result<Program, LowerError> {
    let mut b = Builder {
        plan,
        graphs,
        opts,
        program: empty_program(plan, opts),
        value_index: HashMap::new(),
        weight_index: HashMap::new(),
    };
    b.program.consts.rope_offset = decl.rope_offset;
    b.push_value(ValueInfo {
        name: INPUT.into(),
        ty: ValueType::I64,
        width: 1,
        rows: 0,
        bytes: 0,
        offset: 0,
    });
    let mut env: BTreeMap<String, String> =
        BTreeMap::from([(INPUT.to_string(), INPUT.to_string())]);
    let base = base_dims(plan);
    for import in &decl.imports {
        let width = dims::eval(&import.width, &base)
            .map_err(|m| LowerError::graph(decl_file, format!("import `{}`: {m}", import.name)))?;
        b.push_value(ValueInfo {
            name: import.name.clone(),
            ty: ValueType::F32,
            width,
            rows: 0,
            bytes: 0,
            offset: 0,
        });
        b.program.imports.push(Import {
            name: import.name.clone(),
            width,
        });
        env.insert(import.name.clone(), import.name.clone());
    }
    for inst in &decl.prologue {
        b.instance(inst, None, &base, &mut env)?;
    }
    for layer in layers {
        let mut d = base.clone();
        if let Some(t) = layer.ple {
            let table = &plan
                .ple
                .as_ref()
                .expect("a PLE layer implies a PLE plan")
                .tables[t];
            d.insert("ple_rows".into(), table.padded_rows);
            d.insert("ple_table".into(), t);
        }
        for inst in &decl.layer {
            b.instance(inst, Some(layer), &d, &mut env)?;
        }
    }
    for inst in &decl.epilogue {
        b.instance(inst, None, &base, &mut env)?;
    }
    b.program.output = env
        .get("logits")
        .cloned()
        .ok_or_else(|| LowerError::graph(decl_file, "the model never defines `logits`"))?;
    // The draft always returns its exports (its carrier seeds the next chained step); the
    // trunk only when asked (a speculative session reads its final hyper state).
    if opts.kind == ProgramKind::Draft || opts.exports {
        for (name, value) in &decl.exports {
            let value = env.get(value).cloned().ok_or_else(|| {
                LowerError::graph(
                    decl_file,
                    format!("export `{name}` names model value `{value}`, which is never defined"),
                )
            })?;
            b.program.exports.push(Export {
                name: name.clone(),
                value,
            });
        }
    }
    Ok(b.program)
}

fn empty_program(plan: &ModelPlan, opts: &LowerOptions) -> Program {
    let ple_tables = plan
        .ple
        .as_ref()
        .map(|p| {
            p.tables
                .iter()
                .map(|t| PleTable {
                    layer: t.layer,
                    multipliers: t.multipliers.clone(),
                    head_sizes: t.head_sizes.clone(),
                    head_offsets: t.head_offsets.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Program {
        phase: opts.phase,
        tokens: opts.tokens,
        logits: opts.logits,
        device: opts.device,
        consts: Consts {
            rms_norm_eps: plan.rms_norm_eps,
            rope_theta: plan.attn.rope_theta,
            gate_activation: match plan.gdn.gate_act {
                GateAct::Sigmoid => GateActivation::Sigmoid,
                GateAct::Silu => GateActivation::Silu,
            },
            norm_topk_prob: plan.moe.norm_topk_prob,
            ple_eos: plan.ple.as_ref().and(plan.ple_eos()).map(|e| e as i64),
            ple_tables,
            rope_offset: 0,
        },
        input: INPUT.into(),
        output: String::new(),
        imports: Vec::new(),
        exports: Vec::new(),
        arena_bytes: 0,
        segments: Vec::new(),
        values: Vec::new(),
        weights: Vec::new(),
        states: Vec::new(),
        nodes: Vec::new(),
    }
}

/// The plan's named dimensions plus those only lowering needs.
fn base_dims(plan: &ModelPlan) -> Dims {
    let mut d = plan.dims();
    if let Some(p) = &plan.ple {
        d.insert("hpn".into(), p.heads_per_ngram);
    }
    d
}

struct Builder<'a> {
    plan: &'a ModelPlan,
    graphs: &'a GraphSet,
    opts: &'a LowerOptions,
    program: Program,
    /// Each value's index in `program.values` (the first of a name, as `Program::value` finds),
    /// so that lowering looks values up in constant time instead of scanning every value.
    value_index: HashMap<String, usize>,
    /// Each weight's index in `program.weights` (names are unique there).
    weight_index: HashMap<String, usize>,
}

impl Builder<'_> {
    fn push_value(&mut self, info: ValueInfo) {
        self.value_index
            .entry(info.name.clone())
            .or_insert(self.program.values.len());
        self.program.values.push(info);
    }

    fn applies(&self, when: When, layer_plan: Option<&LayerPlan>) -> bool {
        match when {
            When::Always => true,
            When::Gdn => layer_plan.is_some_and(|l| l.kind == LayerKind::Gdn),
            When::Qsa => layer_plan.is_some_and(|l| l.kind == LayerKind::Qsa),
            When::Ple => layer_plan.is_some_and(|l| l.ple.is_some()),
            When::LogitsLast => self.opts.logits == LogitsMode::Last,
            When::TiedEmbeddings => self.plan.tie_word_embeddings,
            When::UntiedEmbeddings => !self.plan.tie_word_embeddings,
        }
    }

    fn instance(
        &mut self,
        inst: &Instance,
        layer_plan: Option<&LayerPlan>,
        dims: &Dims,
        env: &mut BTreeMap<String, String>,
    ) -> Result<(), LowerError> {
        if !self.applies(inst.when, layer_plan) {
            return Ok(());
        }
        let layer = layer_plan.map(|l| l.index);
        let block: &Block = &self.graphs.blocks[&inst.block];
        let file = format!("graphs/qwen4exp/{}.ron", inst.block);
        let scope = match layer {
            Some(i) => format!("blk.{i}.{}", inst.name),
            None => inst.name.clone(),
        };
        let prefix = match layer {
            Some(i) => inst.prefix.replace("{i}", &i.to_string()),
            None => inst.prefix.clone(),
        };
        let resolve = |s: &Sym, what: &str| -> Result<usize, LowerError> {
            dims::eval(s, dims).map_err(|m| LowerError::graph(&file, format!("{what}: {m}")))
        };

        // Local names → program names.
        let mut local: BTreeMap<String, String> = BTreeMap::new();
        for input in &block.inputs {
            let model_name = &inst.bind[input];
            let value = env.get(model_name).ok_or_else(|| {
                LowerError::graph(
                    "graphs/qwen4exp/model.ron",
                    format!(
                        "instance `{}` reads model value `{model_name}` before it is defined",
                        inst.name
                    ),
                )
            })?;
            local.insert(input.clone(), value.clone());
        }
        let mut weights: BTreeMap<String, String> = BTreeMap::new();
        for w in &block.weights {
            let name = format!("{prefix}{}", w.tensor);
            let shape = w
                .shape
                .iter()
                .map(|s| resolve(s, &format!("weight `{}`", w.name)))
                .collect::<Result<Vec<_>, _>>()?;
            if !self.weight_index.contains_key(&name) {
                self.weight_index
                    .insert(name.clone(), self.program.weights.len());
                self.program.weights.push(WeightInfo {
                    name: name.clone(),
                    shape,
                    class: if w.int64 {
                        WeightClass::I64
                    } else {
                        WeightClass::Float
                    },
                    optional: w.optional,
                });
            }
            weights.insert(w.name.clone(), name);
        }
        let mut states: BTreeMap<String, String> = BTreeMap::new();
        for s in &block.states {
            let name = format!("{scope}.{}", s.name());
            let what = format!("state `{}`", s.name());
            let kind = match s {
                StateDecl::Window { rows, width, .. } => StateKind::Window {
                    rows: resolve(rows, &what)?,
                    width: resolve(width, &what)?,
                },
                StateDecl::Zeros { len, .. } => StateKind::Zeros {
                    len: resolve(len, &what)?,
                },
                StateDecl::Append { width, .. } => StateKind::Append {
                    width: resolve(width, &what)?,
                },
                StateDecl::Tokens { len, .. } => StateKind::Tokens {
                    len: resolve(len, &what)?,
                },
            };
            self.program.states.push(StateInfo {
                name: name.clone(),
                kind,
            });
            states.insert(s.name().to_string(), name);
        }

        for decl in &block.nodes {
            let node_name = format!("{scope}.{}", decl.out[0]);
            let op: Op<usize> = decl
                .op
                .map_dims(|s| resolve(s, &format!("node `{node_name}`")))?;
            let inputs: Vec<String> = decl.args.iter().map(|a| local[a].clone()).collect();
            let weight_names: Vec<String> =
                decl.weights.iter().map(|w| weights[w].clone()).collect();
            let in_info: Vec<(ValueType, usize)> = inputs
                .iter()
                .map(|v| {
                    let i = *self
                        .value_index
                        .get(v.as_str())
                        .expect("inputs are defined before use");
                    let info = &self.program.values[i];
                    (info.ty, info.width)
                })
                .collect();
            let weight_shapes: Vec<Vec<usize>> = weight_names
                .iter()
                .map(|w| self.program.weights[self.weight_index[w]].shape.clone())
                .collect();
            let out_info = shape::infer(&op, &in_info, &weight_shapes)
                .map_err(|m| LowerError::graph(&file, format!("node `{node_name}`: {m}")))?;
            let mut outputs = Vec::new();
            for (o, (ty, width)) in decl.out.iter().zip(out_info) {
                let name = format!("{scope}.{o}");
                self.push_value(ValueInfo {
                    name: name.clone(),
                    ty,
                    width,
                    rows: 0,
                    bytes: 0,
                    offset: 0,
                });
                local.insert(o.clone(), name.clone());
                outputs.push(name);
            }
            self.program.nodes.push(Node {
                name: node_name,
                op,
                inputs,
                outputs,
                weights: weight_names,
                states: decl.states.iter().map(|s| states[s].clone()).collect(),
                variant: String::new(),
                rule: String::new(),
                kernels: Vec::new(),
                fused: None,
                last_use: Vec::new(),
            });
        }
        for (out, model_name) in &inst.results {
            env.insert(model_name.clone(), local[out].clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny model stretched to `layers` layers (every fourth one attention).
    fn deep(layers: usize) -> ModelPlan {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/models/tiny-qwen4exp/config.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        config["num_hidden_layers"] = layers.into();
        config.as_object_mut().unwrap().remove("layer_types");
        ModelPlan::from_json_str(&config.to_string(), "deep").unwrap()
    }

    /// Values and weights are found by name in maps, so four times the layers take about four
    /// times as long to instantiate; scanning every value for each input took 35 times as long
    /// from 256 to 1024 layers. The best of three runs, to keep other load out of the ratio.
    #[test]
    fn instantiating_is_linear_in_the_layers() {
        let graphs = GraphSet::embedded().unwrap();
        let opts = LowerOptions::new(crate::ir::Phase::Prefill, 4, LogitsMode::All);
        let seconds = |layers: usize| {
            let plan = deep(layers);
            (0..3)
                .map(|_| {
                    let t = std::time::Instant::now();
                    instantiate(&plan, &graphs, &opts).unwrap();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let (short, long) = (seconds(256), seconds(1024));
        assert!(
            long < 10.0 * short,
            "1024 layers took {long:.3} s, 256 layers {short:.3} s"
        );
    }
}
