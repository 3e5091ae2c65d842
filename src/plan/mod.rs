//! `config.json` → a validated [`ModelPlan`]: every dimension of a Qwen4Exp (HF `qwen4_exp`)
//! text model, named once, with every HF config invariant (and the few the runtime adds)
//! checked up front.
//!
//! Loading reads the composite config (`model_type: "qwen4_exp"` with a `text_config`) or the
//! flat text config (`model_type: "qwen4_exp_text"`). Missing fields take the HF defaults of
//! `Qwen4ExpTextConfig`; unknown fields (`mtp`, `mamba_ssm_dtype`, `vision_config`, ...) are
//! ignored. Errors name the file, the field as a JSON path and the bad value
//! (`config /x/config.json: field text_config.hc_count = 1: Qwen4Exp requires hc_count > 1`).
//! No input makes this module panic.
//!
//! After loading, everything downstream reads sizes from the plan: graph templates through
//! [`ModelPlan::dims`], the checkpoint contract and the executors through the typed fields.
//!
//! Files: `fields.rs` typed field reads, `validate.rs` the rules and the plan assembly,
//! `ple_tables.rs` the PLE n-gram tables (primes, offsets, hash multipliers), `error.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

mod error;
mod fields;
mod ple_tables;
mod validate;

pub use error::PlanError;

/// Everything the runtime needs to know about one Qwen4Exp text model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelPlan {
    pub config_kind: ConfigKind,
    pub vocab_size: usize,
    /// `H`
    pub hidden_size: usize,
    pub num_layers: usize,
    /// One per decoder layer, in order.
    pub layers: Vec<LayerPlan>,
    pub rms_norm_eps: f32,
    pub hc: HcPlan,
    pub gdn: GdnPlan,
    pub attn: AttnPlan,
    /// `Some` iff the five `indexer_*` fields are set (required when any QSA layer exists).
    pub indexer: Option<IndexerPlan>,
    pub moe: MoePlan,
    /// `Some` iff `ple_layer_ids` is non-empty.
    pub ple: Option<PlePlan>,
    /// Generation stops on any of these; the PLE pads its n-gram history with the first.
    /// Empty only when there is no PLE and the config names none.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Decoder layers of the MTP draft head (`mtp_num_hidden_layers`; 0: none): QSA layers over
    /// the trunk's final hyper state (`graphs/qwen4exp/mtp.ron`).
    pub mtp_layers: usize,
}

/// Which shape of config.json the plan came from (weights are prefixed accordingly:
/// `model.language_model.` for composite checkpoints, `model.` for flat ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConfigKind {
    /// `model_type: "qwen4_exp"` with a nested `text_config`.
    Composite,
    /// `model_type: "qwen4_exp_text"`, all fields at the top level.
    Flat,
}

/// The token mixer of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    Gdn,
    /// Full attention with the QSA block-sparse indexer (`full_attention`, `indexed_attention`, ...).
    Qsa,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerPlan {
    /// Zero-indexed decoder layer.
    pub index: usize,
    pub kind: LayerKind,
    /// The `layer_types` entry as written (or as derived when the config has none).
    pub type_name: String,
    /// Index into [`PlePlan::tables`] when this layer carries a PLE block.
    pub ple: Option<usize>,
}

/// Hyper connections: the residual stream is `C` parallel copies of width `H`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HcPlan {
    /// `C` (`hc_count`, > 1)
    pub count: usize,
    /// `R` (`hc_lowrank`)
    pub lowrank: usize,
}

/// Output-gate activation of the GDN gated RMSNorm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GateAct {
    Sigmoid,
    Silu,
}

/// Gated DeltaNet (`linear_attention`) geometry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GdnPlan {
    /// `Kc` (`linear_conv_kernel_dim`)
    pub conv_kernel: usize,
    /// `dk`
    pub key_head_dim: usize,
    /// `dv`
    pub value_head_dim: usize,
    /// `Kh`
    pub num_key_heads: usize,
    /// `Vh` (a multiple of `Kh`)
    pub num_value_heads: usize,
    /// `output_gate_type`, else `hidden_act`
    pub gate_act: GateAct,
}

/// Attention (QSA layer) geometry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttnPlan {
    /// `nh`
    pub num_heads: usize,
    /// `nkv` (divides `nh`)
    pub num_kv_heads: usize,
    /// `hd`
    pub head_dim: usize,
    /// `int(hd * partial_rotary_factor)`, even and > 0
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
}

/// The QSA indexer (`indexer_kv_heads` is always 1, so it is not stored).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexerPlan {
    /// `iH`
    pub n_heads: usize,
    /// `iD` (>= rotary_dim)
    pub head_dim: usize,
    /// Tokens attended per query.
    pub budget: usize,
    /// Tokens per key block; `budget / compress_ratio` blocks are selected.
    pub compress_ratio: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoePlan {
    /// `E`
    pub num_experts: usize,
    /// `k`
    pub top_k: usize,
    /// `I` (per routed expert)
    pub intermediate: usize,
    /// `Is` (the shared expert)
    pub shared_intermediate: usize,
    pub norm_topk_prob: bool,
}

/// Per-layer n-gram embeddings (spec §3.4).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlePlan {
    /// One-indexed layer ids, sorted and deduplicated (as HF).
    pub layer_ids: Vec<usize>,
    /// `P`
    pub embed_dim: usize,
    /// `kp`
    pub conv_kernel: usize,
    /// `n`
    pub ngram_size: usize,
    /// `hpn`
    pub heads_per_ngram: usize,
    /// `nH = (n-1) * hpn`
    pub num_heads: usize,
    /// `P / nH`
    pub head_dim: usize,
    pub vocab_base: u64,
    pub divisible_by: u64,
    pub seed: u64,
    /// Shard count of each n-gram table in checkpoints.
    pub split_parts: usize,
    /// One per PLE layer, in sorted layer-id order.
    pub tables: Vec<PleTables>,
}

/// The static hashing tables of one PLE layer (HF's three int64 buffers plus the row count).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PleTables {
    /// Zero-indexed decoder layer.
    pub layer: usize,
    /// `[n]`
    pub multipliers: Vec<i64>,
    /// `[nH]` consecutive primes
    pub head_sizes: Vec<i64>,
    /// `[nH]` exclusive prefix sums of `head_sizes`
    pub head_offsets: Vec<i64>,
    /// Rows of the n-gram embedding table (total rounded up to the divisor).
    pub padded_rows: usize,
}

impl ModelPlan {
    /// Parses and validates config text; `origin` names the file in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<ModelPlan, PlanError> {
        let root: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanError::json(origin, &e))?;
        validate::plan_from_json(&root, origin)
    }

    pub fn from_file(path: &Path) -> Result<ModelPlan, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
            path: path.display().to_string(),
            source,
        })?;
        ModelPlan::from_json_str(&text, &path.display().to_string())
    }

    /// Loads `dir/config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<ModelPlan, PlanError> {
        ModelPlan::from_file(&dir.join("config.json"))
    }

    /// The token the PLE pads its n-gram history with (HF uses `eos_token_id[0]`).
    pub fn ple_eos(&self) -> Option<u32> {
        self.eos_token_ids.first().copied()
    }

    pub fn num_qsa_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.kind == LayerKind::Qsa)
            .count()
    }

    pub fn num_gdn_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.kind == LayerKind::Gdn)
            .count()
    }

    /// Named dimensions for symbolic shapes in graph templates. The names are a contract with
    /// `graphs/`; indexer names appear only with an indexer, PLE names only with PLE.
    pub fn dims(&self) -> BTreeMap<String, usize> {
        // Validation keeps every product far below usize::MAX; saturating math only makes a
        // hand-built plan unable to panic here.
        fn mul(a: usize, b: usize) -> usize {
            a.saturating_mul(b)
        }
        let mut d = BTreeMap::new();
        let mut put = |name: &str, value: usize| {
            d.insert(name.to_string(), value);
        };

        put("H", self.hidden_size);
        put("V", self.vocab_size);
        put("C", self.hc.count);
        put("R", self.hc.lowrank);
        put("CH", mul(self.hc.count, self.hidden_size));

        let g = &self.gdn;
        let key_dim = mul(g.num_key_heads, g.key_head_dim);
        let value_dim = mul(g.num_value_heads, g.value_head_dim);
        put("Kc", g.conv_kernel);
        put("dk", g.key_head_dim);
        put("dv", g.value_head_dim);
        put("Kh", g.num_key_heads);
        put("Vh", g.num_value_heads);
        put("key_dim", key_dim);
        put("value_dim", value_dim);
        put("conv_dim", mul(2, key_dim).saturating_add(value_dim));

        let a = &self.attn;
        put("nh", a.num_heads);
        put("nkv", a.num_kv_heads);
        put("hd", a.head_dim);
        put("q_dim", mul(a.num_heads, a.head_dim));
        // The q projection also yields the output gate, hence twice the width.
        put("qg_dim", mul(2, mul(a.num_heads, a.head_dim)));
        put("kv_dim", mul(a.num_kv_heads, a.head_dim));
        put("rot", a.rotary_dim);

        if let Some(ix) = &self.indexer {
            put("iH", ix.n_heads);
            put("iD", ix.head_dim);
            // iH query heads plus the one shared key head, from one projection.
            put("iqk_dim", mul(ix.n_heads.saturating_add(1), ix.head_dim));
            put("ibudget", ix.budget);
            put("icr", ix.compress_ratio);
            put(
                "iblocks",
                ix.budget.checked_div(ix.compress_ratio).unwrap_or(0),
            );
        }

        let m = &self.moe;
        put("E", m.num_experts);
        put("k", m.top_k);
        put("I", m.intermediate);
        put("I2", mul(2, m.intermediate));
        put("Is", m.shared_intermediate);

        if let Some(p) = &self.ple {
            put("P", p.embed_dim);
            put("nH", p.num_heads);
            put("Pd", p.head_dim);
            put("kp", p.conv_kernel);
            put("n", p.ngram_size);
            put("ple_ctx", p.ngram_size.saturating_sub(1));
            // The PLE conv is dilated by n, so it remembers (kp-1)*n normalised inputs.
            put(
                "ple_state",
                mul(p.conv_kernel.saturating_sub(1), p.ngram_size),
            );
            put("ple_rows", p.tables.first().map_or(0, |t| t.padded_rows));
        }
        d
    }

    /// `GDN x36, QSA x12 (layers 3,7,...,47)`.
    fn layer_pattern(&self) -> String {
        let qsa: Vec<String> = self
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Qsa)
            .map(|l| l.index.to_string())
            .collect();
        let gdn = self.num_gdn_layers();
        match (gdn, qsa.len()) {
            (g, 0) => format!("GDN x{g}"),
            (0, q) => format!("QSA x{q} (all layers)"),
            (g, q) => format!("GDN x{g}, QSA x{q} (layers {})", qsa.join(",")),
        }
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayerKind::Gdn => "GDN",
            LayerKind::Qsa => "QSA",
        })
    }
}

impl fmt::Display for GateAct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GateAct::Sigmoid => "sigmoid",
            GateAct::Silu => "silu",
        })
    }
}

/// A short summary for `graphrun inspect`.
impl fmt::Display for ModelPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.config_kind {
            ConfigKind::Composite => "composite qwen4_exp",
            ConfigKind::Flat => "flat qwen4_exp_text",
        };
        writeln!(f, "Qwen4Exp model plan ({kind} config)")?;
        writeln!(
            f,
            "  geometry:  H={} vocab={} layers={} max_positions={} rms_norm_eps={:e} tie_word_embeddings={}",
            self.hidden_size,
            self.vocab_size,
            self.num_layers,
            self.max_position_embeddings,
            self.rms_norm_eps,
            self.tie_word_embeddings
        )?;
        writeln!(
            f,
            "  streams:   C={} hyper-connection streams (CH={}), lowrank R={}",
            self.hc.count,
            self.hc.count.saturating_mul(self.hidden_size),
            self.hc.lowrank
        )?;
        writeln!(f, "  layers:    {}", self.layer_pattern())?;
        let g = &self.gdn;
        writeln!(
            f,
            "  GDN:       key heads {}x{}, value heads {}x{}, conv {}, gate {}",
            g.num_key_heads,
            g.key_head_dim,
            g.num_value_heads,
            g.value_head_dim,
            g.conv_kernel,
            g.gate_act
        )?;
        let a = &self.attn;
        writeln!(
            f,
            "  attention: {} q heads / {} kv heads x {}, rotary {} (factor {}), rope_theta {}",
            a.num_heads,
            a.num_kv_heads,
            a.head_dim,
            a.rotary_dim,
            a.partial_rotary_factor,
            a.rope_theta
        )?;
        match &self.indexer {
            Some(ix) => writeln!(
                f,
                "  indexer:   {} heads x {}, budget {} tokens, {} tokens per block ({} blocks)",
                ix.n_heads,
                ix.head_dim,
                ix.budget,
                ix.compress_ratio,
                ix.budget.checked_div(ix.compress_ratio).unwrap_or(0)
            )?,
            None => writeln!(f, "  indexer:   none")?,
        }
        let m = &self.moe;
        writeln!(
            f,
            "  MoE:       {} experts, top-{}, intermediate {}, shared expert {}, norm_topk_prob={}",
            m.num_experts, m.top_k, m.intermediate, m.shared_intermediate, m.norm_topk_prob
        )?;
        match &self.ple {
            Some(p) => {
                let layers: Vec<String> = p.tables.iter().map(|t| t.layer.to_string()).collect();
                let rows: Vec<String> =
                    p.tables.iter().map(|t| t.padded_rows.to_string()).collect();
                writeln!(
                    f,
                    "  PLE:       layers {} (ids {:?}), P={} as {} heads x {}, n={}, conv {}, table rows {}, seed {}",
                    layers.join(","),
                    p.layer_ids,
                    p.embed_dim,
                    p.num_heads,
                    p.head_dim,
                    p.ngram_size,
                    p.conv_kernel,
                    rows.join(","),
                    p.seed
                )?;
            }
            None => writeln!(f, "  PLE:       none")?,
        }
        let show = |id: Option<u32>| id.map_or("none".to_string(), |t| t.to_string());
        write!(
            f,
            "  tokens:    eos {:?}, bos {}, pad {}",
            self.eos_token_ids,
            show(self.bos_token_id),
            show(self.pad_token_id)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = include_str!("../../tests/data/configs/qwen3.8-flash-next.json");
    const TINY: &str = include_str!("../../tests/data/configs/tiny_flat.json");

    fn real() -> ModelPlan {
        ModelPlan::from_json_str(REAL, "qwen3.8-flash-next/config.json").unwrap()
    }

    fn tiny() -> ModelPlan {
        ModelPlan::from_json_str(TINY, "tiny_flat.json").unwrap()
    }

    /// A fresh directory under the system temp dir, unique per test and process.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("graphrun-plan-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn real_config_dims() {
        let plan = real();
        let d = plan.dims();
        let expect = [
            ("H", 2560),
            ("V", 248_320),
            ("C", 4),
            ("R", 320),
            ("CH", 10240),
            ("Kc", 4),
            ("dk", 128),
            ("dv", 128),
            ("Kh", 16),
            ("Vh", 48),
            ("key_dim", 2048),
            ("value_dim", 6144),
            ("conv_dim", 10240),
            ("nh", 24),
            ("nkv", 2),
            ("hd", 256),
            ("q_dim", 6144),
            ("qg_dim", 12288),
            ("kv_dim", 512),
            ("rot", 64),
            ("iH", 4),
            ("iD", 128),
            ("iqk_dim", 640),
            ("ibudget", 2048),
            ("icr", 4),
            ("iblocks", 512),
            ("E", 512),
            ("k", 10),
            ("I", 640),
            ("I2", 1280),
            ("Is", 640),
            ("P", 2560),
            ("nH", 16),
            ("Pd", 160),
            ("kp", 4),
            ("n", 3),
            ("ple_ctx", 2),
            ("ple_state", 9),
            ("ple_rows", 320_001_536),
        ];
        for (name, value) in expect {
            assert_eq!(d.get(name), Some(&value), "dim {name}");
        }
        assert_eq!(d.len(), expect.len(), "unexpected extra dims: {d:?}");
    }

    #[test]
    fn real_config_plan() {
        let plan = real();
        assert_eq!(plan.config_kind, ConfigKind::Composite);
        assert_eq!(plan.num_layers, 48);
        assert_eq!(plan.layers.len(), 48);
        assert_eq!(plan.num_gdn_layers(), 36);
        assert_eq!(plan.num_qsa_layers(), 12);
        let qsa: Vec<usize> = plan
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Qsa)
            .map(|l| l.index)
            .collect();
        assert_eq!(qsa, (3..48).step_by(4).collect::<Vec<_>>());
        assert!(plan.layers.iter().all(|l| l.type_name
            == if l.kind == LayerKind::Qsa {
                "full_attention"
            } else {
                "linear_attention"
            }));
        // ple_layer_ids [2] is one-indexed: the PLE sits on decoder layer 1.
        let with_ple: Vec<usize> = plan
            .layers
            .iter()
            .filter(|l| l.ple.is_some())
            .map(|l| l.index)
            .collect();
        assert_eq!(with_ple, [1]);
        assert_eq!(plan.layers[1].ple, Some(0));

        let ple = plan.ple.as_ref().unwrap();
        assert_eq!(ple.layer_ids, [2]);
        assert_eq!(ple.seed, 1234);
        assert_eq!(ple.split_parts, 128);
        assert_eq!(ple.vocab_base, 20_000_000);
        assert_eq!(ple.tables.len(), 1);
        assert_eq!(ple.tables[0].layer, 1);
        assert_eq!(
            ple.tables[0].multipliers,
            [23703573157769, 20109073645365, 8052911324071]
        );
        assert_eq!(ple.tables[0].head_sizes.iter().sum::<i64>(), 320_001_446);

        assert_eq!(plan.gdn.gate_act, GateAct::Sigmoid);
        assert_eq!(plan.attn.rope_theta, 1e7);
        assert_eq!(plan.attn.partial_rotary_factor, 0.25);
        assert_eq!(plan.rms_norm_eps, 1e-6);
        assert!(plan.moe.norm_topk_prob);
        assert_eq!(plan.eos_token_ids, [248_044]);
        assert_eq!(plan.ple_eos(), Some(248_044));
        assert_eq!(plan.bos_token_id, Some(248_044));
        assert_eq!(plan.pad_token_id, None);
        assert!(!plan.tie_word_embeddings);
        assert_eq!(plan.max_position_embeddings, 262_144);
    }

    #[test]
    fn real_config_display() {
        let text = real().to_string();
        assert!(text.contains("GDN x36, QSA x12 (layers 3,7,11,15,19,23,27,31,35,39,43,47)"));
        assert!(text.contains("PLE:       layers 1 (ids [2])"));
        assert!(text.contains("512 experts, top-10"));
        assert!(text.contains("budget 2048 tokens"));
        assert!(text.contains("rms_norm_eps=1e-6"));
        assert!(!text.ends_with('\n'));
    }

    #[test]
    fn tiny_flat_config_plan() {
        let plan = tiny();
        assert_eq!(plan.config_kind, ConfigKind::Flat);
        assert_eq!(plan.num_layers, 2);
        assert_eq!(plan.layers[0].kind, LayerKind::Gdn);
        assert_eq!(plan.layers[1].kind, LayerKind::Qsa);
        assert_eq!(plan.layers[0].ple, Some(0));
        assert_eq!(plan.layers[1].ple, None);
        assert_eq!(plan.gdn.gate_act, GateAct::Silu); // no output_gate_type: hidden_act
        assert_eq!(plan.attn.rotary_dim, 4);
        assert_eq!(plan.attn.rope_theta, 10000.0); // the default
        assert_eq!(plan.max_position_embeddings, 32768); // the HF default
        assert_eq!(plan.eos_token_ids, [2]);
        assert_eq!(plan.bos_token_id, Some(1));
        assert_eq!(plan.pad_token_id, Some(0));
        assert_eq!(
            plan.indexer,
            Some(IndexerPlan {
                n_heads: 2,
                head_dim: 8,
                budget: 4,
                compress_ratio: 2
            })
        );
        let ple = plan.ple.as_ref().unwrap();
        assert_eq!(
            ple.tables,
            [PleTables {
                layer: 0,
                multipliers: vec![73077407744147129, 4156873792259893, 23288516139688959],
                head_sizes: vec![31, 37, 41, 43],
                head_offsets: vec![0, 31, 68, 109],
                padded_rows: 152,
            }]
        );
        let d = plan.dims();
        assert_eq!(d["CH"], 64);
        assert_eq!(d["conv_dim"], 2 * 64 + 128);
        assert_eq!(d["qg_dim"], 64);
        assert_eq!(d["iqk_dim"], 24);
        assert_eq!(d["iblocks"], 2);
        assert_eq!(d["Pd"], 4);
        assert_eq!(d["ple_state"], 3);
        assert_eq!(d["ple_rows"], 152);
    }

    #[test]
    fn dims_without_indexer_or_ple_omit_their_names() {
        let mut plan = tiny();
        plan.indexer = None;
        plan.ple = None;
        let d = plan.dims();
        for name in ["iH", "iD", "iqk_dim", "ibudget", "icr", "iblocks"] {
            assert!(!d.contains_key(name), "{name}");
        }
        for name in [
            "P",
            "nH",
            "Pd",
            "kp",
            "n",
            "ple_ctx",
            "ple_state",
            "ple_rows",
        ] {
            assert!(!d.contains_key(name), "{name}");
        }
        assert!(d.contains_key("H") && d.contains_key("Is"));
    }

    #[test]
    fn from_model_dir_reads_config_json() {
        let dir = temp_dir("ok");
        std::fs::write(dir.join("config.json"), TINY).unwrap();
        let plan = ModelPlan::from_model_dir(&dir).unwrap();
        assert_eq!(plan, tiny());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_config_names_the_path() {
        let dir = temp_dir("missing");
        let err = ModelPlan::from_model_dir(&dir).unwrap_err();
        let path = dir.join("config.json").display().to_string();
        assert!(matches!(&err, PlanError::Read { path: p, .. } if *p == path));
        assert!(err.to_string().contains(&path), "{err}");
        let err = ModelPlan::from_file(&dir.join("nope.json")).unwrap_err();
        assert!(err.to_string().contains("nope.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_from_a_file_name_the_file() {
        let dir = temp_dir("bad");
        let path = dir.join("config.json");
        std::fs::write(&path, TINY.replace("\"hc_count\": 2", "\"hc_count\": 1")).unwrap();
        let err = ModelPlan::from_file(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "config {}: field hc_count = 1: Qwen4Exp requires hc_count > 1",
                path.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_json_reports_line_and_column() {
        let text = "{\n  \"model_type\": \"qwen4_exp_text\",\n  \"vocab_size\": 99,,\n}";
        let err = ModelPlan::from_json_str(text, "/x/config.json").unwrap_err();
        match &err {
            PlanError::Json { line, column, .. } => assert_eq!((*line, *column), (3, 20)),
            other => panic!("expected a JSON error, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.starts_with("config /x/config.json: malformed JSON at line 3, column 20: "));
        // An empty file is malformed too, not a panic.
        assert!(matches!(
            ModelPlan::from_json_str("", "empty.json"),
            Err(PlanError::Json { .. })
        ));
    }

    #[test]
    fn composite_error_uses_the_text_config_path() {
        let text = REAL.replace("\"hc_count\": 4", "\"hc_count\": 1");
        let err = ModelPlan::from_json_str(&text, "/x/config.json").unwrap_err();
        assert_eq!(
            err.to_string(),
            "config /x/config.json: field text_config.hc_count = 1: Qwen4Exp requires hc_count > 1"
        );
    }

    #[test]
    fn plan_serializes() {
        let json = serde_json::to_value(tiny()).unwrap();
        assert_eq!(json["config_kind"], "Flat");
        assert_eq!(json["layers"][1]["kind"], "Qsa");
        assert_eq!(json["ple"]["tables"][0]["padded_rows"], 152);
    }
}
