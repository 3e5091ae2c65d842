//! Loads the graph files: block templates, the model composition, fusions, rules and step
//! rules.
//!
//! The files in the repository's `graphs/` are embedded at build time, so the binary works from
//! anywhere; `GraphSet::load_dir` reads an edited copy instead (`--graphs DIR`), which is how a
//! user tries a fusion or a rule without rebuilding.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::error::LowerError;
use super::template::{Block, Fusion, Grouping, ModelDecl, Rule};
use crate::rules::speculative::{self, SpecRule};
use crate::rules::steps::{self, StepRule};

/// Every graph file, as loaded and checked.
#[derive(Debug, Clone)]
pub struct GraphSet {
    pub model: ModelDecl,
    /// The MTP draft head's composition (`qwen4exp/mtp.ron`; optional in a `--graphs`
    /// directory: without it, no draft program can be lowered).
    pub draft: Option<ModelDecl>,
    pub blocks: BTreeMap<String, Block>,
    pub fusions: Vec<Fusion>,
    /// Horizontal fusions (`groups.ron`; optional in a `--graphs` directory).
    pub groups: Vec<Grouping>,
    pub rules: Vec<Rule>,
    /// How many tokens a prefill step takes (`steps.ron`; optional in a `--graphs` directory:
    /// without it, every prefill is one step).
    pub steps: Vec<StepRule>,
    /// Speculative decoding's cost model (`speculative.ron`; optional in a `--graphs`
    /// directory: without it, rounds are priced by `SpecRule`'s defaults).
    pub speculative: Vec<SpecRule>,
}

const MODEL_DIR: &str = "qwen4exp";

/// The repository's graph files, embedded by `build.rs`: (path relative to `graphs/`, text).
const EMBEDDED: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/embedded_graphs.rs"));

impl GraphSet {
    /// The graph files built into the binary.
    pub fn embedded() -> Result<GraphSet, LowerError> {
        let files: Vec<(String, String)> = EMBEDDED
            .iter()
            .map(|(p, t)| (format!("graphs/{p}"), t.to_string()))
            .collect();
        Self::from_files(&files)
    }

    /// Reads `dir/qwen4exp/*.ron`, `dir/fusions.ron`, `dir/rules.ron` and, when present,
    /// `dir/groups.ron`, `dir/steps.ron` and `dir/speculative.ron`.
    pub fn load_dir(dir: &Path) -> Result<GraphSet, LowerError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| LowerError::Io {
                file: p.display().to_string(),
                msg: e.to_string(),
            })
        };
        let mut files = Vec::new();
        let model_dir = dir.join(MODEL_DIR);
        let entries = std::fs::read_dir(&model_dir).map_err(|e| LowerError::Io {
            file: model_dir.display().to_string(),
            msg: e.to_string(),
        })?;
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        {
            files.push((p.display().to_string(), read(&p)?));
        }
        for name in ["fusions.ron", "rules.ron"] {
            let p = dir.join(name);
            files.push((p.display().to_string(), read(&p)?));
        }
        for name in ["groups.ron", "steps.ron", "speculative.ron"] {
            let p = dir.join(name);
            if p.exists() {
                files.push((p.display().to_string(), read(&p)?));
            }
        }
        Self::from_files(&files)
    }

    /// Parses a set of (path, text) files; block names are the file stems under `qwen4exp/`.
    fn from_files(files: &[(String, String)]) -> Result<GraphSet, LowerError> {
        let mut model = None;
        let mut draft = None;
        let mut blocks = BTreeMap::new();
        let mut fusions = None;
        let mut groups = None;
        let mut rules = None;
        let mut step_rules = None;
        let mut spec_rules = None;
        for (path, text) in files {
            let stem = Path::new(path)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            let in_model_dir = Path::new(path)
                .parent()
                .and_then(|p| p.file_name())
                .is_some_and(|n| n == MODEL_DIR);
            match (in_model_dir, stem) {
                (true, "model") => model = Some(parse::<ModelDecl>(path, text)?),
                (true, "mtp") => draft = Some(parse::<ModelDecl>(path, text)?),
                (true, _) => {
                    blocks.insert(stem.to_string(), parse::<Block>(path, text)?);
                }
                (false, "fusions") => fusions = Some(parse::<Vec<Fusion>>(path, text)?),
                (false, "rules") => rules = Some(parse::<Vec<Rule>>(path, text)?),
                (false, "groups") => groups = Some(parse::<Vec<Grouping>>(path, text)?),
                (false, "steps") => {
                    let parsed = parse::<Vec<StepRule>>(path, text)?;
                    steps::check(&parsed).map_err(|msg| LowerError::graph(path, msg))?;
                    step_rules = Some(parsed);
                }
                (false, "speculative") => {
                    let parsed = parse::<Vec<SpecRule>>(path, text)?;
                    speculative::check(&parsed).map_err(|msg| LowerError::graph(path, msg))?;
                    spec_rules = Some(parsed);
                }
                _ => {}
            }
        }
        let set = GraphSet {
            model: model
                .ok_or_else(|| LowerError::graph("graphs/qwen4exp/model.ron", "file is missing"))?,
            draft,
            blocks,
            fusions: fusions.unwrap_or_default(),
            groups: groups.unwrap_or_default(),
            rules: rules.unwrap_or_default(),
            steps: step_rules.unwrap_or_default(),
            speculative: spec_rules.unwrap_or_default(),
        };
        set.check_references()?;
        Ok(set)
    }

    /// Blocks named by the compositions exist; their nodes only use declared names.
    fn check_references(&self) -> Result<(), LowerError> {
        let draft = self.draft.iter().map(|d| (d, "graphs/qwen4exp/mtp.ron"));
        for (decl, decl_file) in
            std::iter::once((&self.model, "graphs/qwen4exp/model.ron")).chain(draft)
        {
            self.check_composition(decl, decl_file)?;
        }
        Ok(())
    }

    fn check_composition(&self, decl: &ModelDecl, decl_file: &str) -> Result<(), LowerError> {
        let instances = decl
            .prologue
            .iter()
            .chain(&decl.layer)
            .chain(&decl.epilogue);
        for inst in instances {
            let block = self.blocks.get(&inst.block).ok_or_else(|| {
                LowerError::graph(
                    decl_file,
                    format!(
                        "instance `{}` names block `{}`, which has no file",
                        inst.name, inst.block
                    ),
                )
            })?;
            let file = format!("graphs/{MODEL_DIR}/{}.ron", inst.block);
            for input in &block.inputs {
                if !inst.bind.contains_key(input) {
                    return Err(LowerError::graph(
                        decl_file,
                        format!(
                            "instance `{}` does not bind block input `{input}`",
                            inst.name
                        ),
                    ));
                }
            }
            for out in inst.results.keys() {
                if !block.outputs.contains(out) {
                    return Err(LowerError::graph(
                        decl_file,
                        format!(
                            "instance `{}` takes result `{out}`, which {file} does not output",
                            inst.name
                        ),
                    ));
                }
            }
            block_check(block, &file)?;
        }
        Ok(())
    }
}

fn block_check(block: &Block, file: &str) -> Result<(), LowerError> {
    let mut defined: Vec<&str> = block.inputs.iter().map(|s| s.as_str()).collect();
    for node in &block.nodes {
        for arg in &node.args {
            if !defined.contains(&arg.as_str()) {
                return Err(LowerError::graph(
                    file,
                    format!(
                        "node `{}` reads `{arg}` before it is defined",
                        node.out.join(",")
                    ),
                ));
            }
        }
        for w in &node.weights {
            if !block.weights.iter().any(|d| &d.name == w) {
                return Err(LowerError::graph(
                    file,
                    format!("node `{}` uses undeclared weight `{w}`", node.out.join(",")),
                ));
            }
        }
        for s in &node.states {
            if !block.states.iter().any(|d| d.name() == s) {
                return Err(LowerError::graph(
                    file,
                    format!("node `{}` uses undeclared state `{s}`", node.out.join(",")),
                ));
            }
        }
        if let Some(n) = node.op.num_outputs().filter(|&n| n != node.out.len()) {
            return Err(LowerError::graph(
                file,
                format!(
                    "node `{}`: op {} has {n} output(s), the node names {}",
                    node.out.join(","),
                    node.op.kind(),
                    node.out.len()
                ),
            ));
        }
        for o in &node.out {
            if defined.contains(&o.as_str()) {
                return Err(LowerError::graph(
                    file,
                    format!("value `{o}` is defined twice"),
                ));
            }
            defined.push(o);
        }
    }
    for out in &block.outputs {
        if !defined.contains(&out.as_str()) {
            return Err(LowerError::graph(
                file,
                format!("output `{out}` is never defined"),
            ));
        }
    }
    Ok(())
}

/// RON text → T, with file, line and column on failure.
pub fn parse<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, LowerError> {
    let opts =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    opts.from_str(text)
        .map_err(|e: ron::error::SpannedError| LowerError::Ron {
            file: file.to_string(),
            line: e.span.start.line,
            col: e.span.start.col,
            msg: e.code.to_string(),
        })
}
