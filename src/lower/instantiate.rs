//! Templates → one flat program for a plan and a phase.
//!
//! Walks the model composition (prologue, each layer, epilogue), instantiates each applicable
//! block with its dimensions resolved, renames its values `blk.{i}.{instance}.{value}`, its
//! weights to canonical tensor names (prefix + template name) and its states
//! `blk.{i}.{instance}.{state}`. Shapes are inferred node by node with the op shape rules.

use std::collections::BTreeMap;

use crate::ir::dims::{self, Dims};
use crate::ir::{
    Consts, GateActivation, LogitsMode, Node, Op, PleTable, Program, StateInfo, StateKind, Sym,
    ValueInfo, ValueType, WeightClass, WeightInfo,
};
use crate::ops::shape;
use crate::plan::{GateAct, LayerKind, ModelPlan};

use super::error::LowerError;
use super::graphset::GraphSet;
use super::template::{Block, Instance, StateDecl, When};
use super::LowerOptions;

/// The program input: token ids.
pub const INPUT: &str = "tokens";

pub fn instantiate(
    plan: &ModelPlan,
    graphs: &GraphSet,
    opts: &LowerOptions,
) -> Result<Program, LowerError> {
    let mut b = Builder {
        plan,
        graphs,
        opts,
        program: empty_program(plan, opts),
    };
    b.program.values.push(ValueInfo {
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
    for inst in &graphs.model.prologue {
        b.instance(inst, None, &base, &mut env)?;
    }
    for layer in &plan.layers {
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
        for inst in &graphs.model.layer {
            b.instance(inst, Some(layer.index), &d, &mut env)?;
        }
    }
    for inst in &graphs.model.epilogue {
        b.instance(inst, None, &base, &mut env)?;
    }
    b.program.output = env.get("logits").cloned().ok_or_else(|| {
        LowerError::graph(
            "graphs/qwen4exp/model.ron",
            "the model never defines `logits`",
        )
    })?;
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
        },
        input: INPUT.into(),
        output: String::new(),
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
}

impl Builder<'_> {
    fn applies(&self, when: When, layer: Option<usize>) -> bool {
        let layer_plan = layer.map(|i| &self.plan.layers[i]);
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
        layer: Option<usize>,
        dims: &Dims,
        env: &mut BTreeMap<String, String>,
    ) -> Result<(), LowerError> {
        if !self.applies(inst.when, layer) {
            return Ok(());
        }
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
            if !self.program.weights.iter().any(|x| x.name == name) {
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
                    let info = self
                        .program
                        .value(v)
                        .expect("inputs are defined before use");
                    (info.ty, info.width)
                })
                .collect();
            let weight_shapes: Vec<Vec<usize>> = weight_names
                .iter()
                .map(|w| {
                    self.program
                        .weights
                        .iter()
                        .find(|x| &x.name == w)
                        .unwrap()
                        .shape
                        .clone()
                })
                .collect();
            let out_info = shape::infer(&op, &in_info, &weight_shapes)
                .map_err(|m| LowerError::graph(&file, format!("node `{node_name}`: {m}")))?;
            let mut outputs = Vec::new();
            for (o, (ty, width)) in decl.out.iter().zip(out_info) {
                let name = format!("{scope}.{o}");
                self.program.values.push(ValueInfo {
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
