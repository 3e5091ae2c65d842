//! How a checkpoint says its weights are quantised: ModelOpt's `hf_quant_config.json`
//! (`{"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}}`)
//! and/or `quantization_config` in config.json (`quant_method: "modelopt"`, the same keys, with
//! `ignore` accepted for `exclude_modules`). Both present must agree.

use std::path::Path;

use serde_json::Value;
use thiserror::Error;

use super::nvfp4;

/// The quantisation formats graphrun reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantAlgo {
    Nvfp4,
}

/// A checkpoint's quantisation.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    pub algo: QuantAlgo,
    /// Inputs per scale (16 for NVFP4).
    pub group_size: usize,
    /// Module name patterns left unquantised (`*` matches any run of characters, `?` one).
    pub exclude: Vec<String>,
    /// Where it was read (for errors).
    pub origin: String,
}

#[derive(Debug, Error, PartialEq)]
pub enum QuantConfigError {
    #[error("{origin}: {msg}")]
    Invalid { origin: String, msg: String },
    #[error("{file}: cannot read it: {msg}")]
    Io { file: String, msg: String },
    #[error(
        "the quantisation of hf_quant_config.json ({a}) and config.json's quantization_config ({b}) disagree"
    )]
    Disagree { a: String, b: String },
}

impl QuantConfig {
    /// The quantisation of the checkpoint in `dir` (`None`: not quantised).
    pub fn from_model_dir(dir: &Path) -> Result<Option<QuantConfig>, QuantConfigError> {
        let read = |name: &str| -> Result<Option<Value>, QuantConfigError> {
            let path = dir.join(name);
            if !path.exists() {
                return Ok(None);
            }
            let file = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| QuantConfigError::Io {
                file: file.clone(),
                msg: e.to_string(),
            })?;
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| QuantConfigError::Invalid {
                    origin: file,
                    msg: format!("not JSON: {e}"),
                })
        };
        let hf = match read("hf_quant_config.json")? {
            Some(v) => {
                let origin = dir.join("hf_quant_config.json").display().to_string();
                let section = v
                    .get("quantization")
                    .ok_or_else(|| QuantConfigError::Invalid {
                        origin: origin.clone(),
                        msg: "no `quantization` object".into(),
                    })?;
                Some(QuantConfig::from_section(section, &origin)?)
            }
            None => None,
        };
        let in_config = match read("config.json")? {
            Some(v) => match v.get("quantization_config") {
                Some(section) => {
                    let origin =
                        format!("{} quantization_config", dir.join("config.json").display());
                    Some(QuantConfig::from_section(section, &origin)?)
                }
                None => None,
            },
            None => None,
        };
        match (hf, in_config) {
            (Some(a), Some(b)) if !a.same_as(&b) => Err(QuantConfigError::Disagree {
                a: a.summary(),
                b: b.summary(),
            }),
            (Some(a), _) => Ok(Some(a)),
            (None, b) => Ok(b),
        }
    }

    /// From one quantisation object (`hf_quant_config.json`'s `quantization`, or config.json's
    /// `quantization_config`).
    pub fn from_section(section: &Value, origin: &str) -> Result<QuantConfig, QuantConfigError> {
        let invalid = |msg: String| QuantConfigError::Invalid {
            origin: origin.to_string(),
            msg,
        };
        if let Some(method) = section.get("quant_method") {
            if method.as_str() != Some("modelopt") {
                return Err(invalid(format!(
                    "quant_method {method} is not supported (graphrun reads ModelOpt checkpoints: \"modelopt\")"
                )));
            }
        }
        let algo = match section.get("quant_algo") {
            None => return Err(invalid("quant_algo is missing".into())),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("nvfp4") => QuantAlgo::Nvfp4,
            Some(other) => {
                return Err(invalid(format!(
                    "quant_algo {other} is not supported (graphrun reads NVFP4)"
                )))
            }
        };
        let group_size = match section.get("group_size") {
            None => nvfp4::GROUP,
            Some(v) => v
                .as_u64()
                .map(|g| g as usize)
                .ok_or_else(|| invalid(format!("group_size {v} is not a whole number")))?,
        };
        if group_size != nvfp4::GROUP {
            return Err(invalid(format!(
                "group_size {group_size}: NVFP4 scales groups of {} inputs",
                nvfp4::GROUP
            )));
        }
        let patterns = match (section.get("exclude_modules"), section.get("ignore")) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid("exclude_modules and ignore differ".into()));
            }
            (Some(v), _) | (None, Some(v)) => Some(v),
            (None, None) => None,
        };
        let exclude = match patterns {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|p| {
                    p.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid(format!("exclude_modules holds {p}, not a name")))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(invalid(format!("exclude_modules is {other}, not a list"))),
        };
        Ok(QuantConfig {
            algo,
            group_size,
            exclude,
            origin: origin.to_string(),
        })
    }

    /// Whether the module `name` (a tensor name without its last part: `...experts.3.gate_proj`)
    /// is left unquantised.
    pub fn excludes(&self, module: &str) -> Option<&str> {
        self.exclude
            .iter()
            .find(|p| wildcard(p, module))
            .map(|p| p.as_str())
    }

    fn same_as(&self, other: &QuantConfig) -> bool {
        (self.algo, self.group_size, &self.exclude)
            == (other.algo, other.group_size, &other.exclude)
    }

    fn summary(&self) -> String {
        format!(
            "{:?}, group {}, {} excluded patterns",
            self.algo,
            self.group_size,
            self.exclude.len()
        )
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters and `?` any one
/// (fnmatch without classes, as ModelOpt's readers match `exclude_modules`).
pub fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Greedy with backtracking to the last star: linear in practice, never exponential.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn section(v: Value) -> Result<QuantConfig, QuantConfigError> {
        QuantConfig::from_section(&v, "q.json")
    }

    #[test]
    fn reads_the_modelopt_section() {
        let q = section(json!({
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "*.mlp.gate", "mtp*"]
        }))
        .unwrap();
        assert_eq!(q.algo, QuantAlgo::Nvfp4);
        assert_eq!(
            q.excludes("model.language_model.layers.3.mlp.gate"),
            Some("*.mlp.gate")
        );
        assert_eq!(
            q.excludes("mtp.layers.0.mlp.experts.1.up_proj"),
            Some("mtp*")
        );
        assert_eq!(
            q.excludes("model.language_model.layers.3.mlp.experts.1.up_proj"),
            None
        );
        let q = section(
            json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}),
        )
        .unwrap();
        assert_eq!(q.exclude, vec!["lm_head".to_string()]);
    }

    #[test]
    fn refusals_name_the_key() {
        let cases = [
            (
                json!({"quant_algo": "FP8"}),
                "quant_algo \"FP8\" is not supported",
            ),
            (json!({}), "quant_algo is missing"),
            (
                json!({"quant_algo": "NVFP4", "group_size": 32}),
                "group_size 32",
            ),
            (
                json!({"quant_algo": "NVFP4", "group_size": "x"}),
                "group_size \"x\"",
            ),
            (
                json!({"quant_algo": "NVFP4", "exclude_modules": "lm_head"}),
                "not a list",
            ),
            (
                json!({"quant_algo": "NVFP4", "exclude_modules": [1]}),
                "holds 1",
            ),
            (
                json!({"quant_method": "gptq", "quant_algo": "NVFP4"}),
                "quant_method \"gptq\"",
            ),
        ];
        for (v, want) in cases {
            let e = section(v).unwrap_err().to_string();
            assert!(e.starts_with("q.json: ") && e.contains(want), "{e}");
        }
    }

    #[test]
    fn wildcards_match_as_fnmatch() {
        assert!(wildcard("*", ""));
        assert!(wildcard("a*c", "abbbc"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("a?c", "ac"));
        assert!(wildcard(
            "*.experts.*.down_proj",
            "m.layers.1.experts.7.down_proj"
        ));
        assert!(!wildcard(
            "*.experts.*.down_proj",
            "m.layers.1.experts.7.up_proj"
        ));
        assert!(wildcard("lm_head", "lm_head"));
        assert!(!wildcard("lm_head", "lm_head2"));
    }

    #[test]
    fn both_files_must_agree() {
        let dir = std::env::temp_dir().join(format!("graphrun-quant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hf = json!({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}});
        std::fs::write(dir.join("hf_quant_config.json"), hf.to_string()).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let q = QuantConfig::from_model_dir(&dir).unwrap().unwrap();
        assert_eq!(q.exclude, vec!["lm_head".to_string()]);
        let cfg = json!({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": []}});
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let e = QuantConfig::from_model_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("disagree"), "{e}");
        std::fs::remove_file(dir.join("hf_quant_config.json")).unwrap();
        assert!(QuantConfig::from_model_dir(&dir)
            .unwrap()
            .unwrap()
            .exclude
            .is_empty());
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert_eq!(QuantConfig::from_model_dir(&dir).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
