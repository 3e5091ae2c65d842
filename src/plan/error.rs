//! The one error type of the plan module.
//!
//! Every variant names the config it came from (`origin`: the file path, or whatever the caller
//! passed to `ModelPlan::from_json_str`) and, where a field is at fault, the field as a JSON path
//! (`text_config.hc_count`, `text_config.layer_types[5]`) together with the offending value as it
//! was written, so a user can go straight to the line to fix.

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file could not be read: missing, unreadable, not UTF-8.
    #[error("config {path}: cannot read it: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The text is not JSON.
    #[error("config {origin}: malformed JSON at line {line}, column {column}: {message}")]
    Json {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },

    /// A field we need is absent (or `null`) and has no default.
    #[error("config {origin}: field {field} is missing: {reason}")]
    Missing {
        origin: String,
        field: String,
        reason: String,
    },

    /// A field holds the wrong kind of JSON value (a string where an integer belongs, ...).
    #[error("config {origin}: field {field} = {value}: expected {expected}")]
    WrongType {
        origin: String,
        field: String,
        value: String,
        expected: String,
    },

    /// A field has the right type but breaks a rule of the model (HF's or the runtime's).
    #[error("config {origin}: field {field} = {value}: {reason}")]
    Invalid {
        origin: String,
        field: String,
        value: String,
        reason: String,
    },

    /// A legal HF setting that graphrun does not implement (another activation, another rope).
    #[error("config {origin}: field {field} = {value}: unsupported: {reason}")]
    Unsupported {
        origin: String,
        field: String,
        value: String,
        reason: String,
    },

    /// An entry of `layer_types` that names no layer type we know.
    #[error(
        "config {origin}: field {field} = {value}: unknown type for layer {index}; accepted: {accepted}"
    )]
    UnknownLayerType {
        origin: String,
        field: String,
        index: usize,
        value: String,
        accepted: String,
    },
}

impl PlanError {
    /// Wraps a serde_json syntax error, keeping its line and column as separate fields.
    pub(super) fn json(origin: &str, err: &serde_json::Error) -> PlanError {
        let (line, column) = (err.line(), err.column());
        // serde_json's Display appends " at line L column C"; we print those ourselves.
        let full = err.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        PlanError::Json {
            origin: origin.to_string(),
            line,
            column,
            message,
        }
    }
}

/// Renders a JSON value for an error message: compact JSON, cut short if long (a 48-entry
/// `layer_types` list would drown the message).
pub(super) fn show(value: &Value) -> String {
    const MAX_CHARS: usize = 60;
    let text = value.to_string();
    if text.chars().count() <= MAX_CHARS {
        text
    } else {
        let head: String = text.chars().take(MAX_CHARS).collect();
        format!("{head}...")
    }
}

/// A number as JSON writes it (`1e-60`, `0.25`), not as Rust's `{}` does (`0.000...001`).
pub(super) fn number(x: f64) -> String {
    Value::from(x).to_string()
}

/// A string as JSON writes it (quoted, escaped), for messages about string fields.
pub(super) fn quote(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}
