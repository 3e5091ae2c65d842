//! Typed reads of one JSON object of the config, with errors that name the field.
//!
//! We read field by field from a `serde_json::Value` instead of deriving `Deserialize` on a
//! struct: serde's own messages say "invalid type: string, expected usize at line 9 column 20"
//! but not *which* field, and we want every message to carry the JSON path
//! (`text_config.hc_count`). Unknown fields are simply never looked at.

use serde_json::{Map, Value};

use super::error::{show, PlanError};

/// One JSON object of the config and where it sits in the file.
#[derive(Debug, Clone)]
pub(super) struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// JSON path of this object plus a dot (`"text_config."`), or `""` at the top level.
    prefix: String,
    origin: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>, prefix: &str, origin: &'a str) -> Fields<'a> {
        Fields {
            map,
            prefix: prefix.to_string(),
            origin,
        }
    }

    /// The JSON path of a field of this object, as errors print it.
    pub fn path(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    /// The raw value. JSON `null` counts as absent, the way Python's `None` means "not given"
    /// for an HF config argument.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A non-negative integer that fits `usize`.
    pub fn usize(&self, name: &str) -> Result<Option<usize>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => as_usize(v)
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "a non-negative integer")),
        }
    }

    /// A non-negative integer that fits `u64`.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "a non-negative integer")),
        }
    }

    /// Any integer in i64 or u64 range, as its two's-complement u64 bit pattern. Python masks
    /// negative values with `& (2**64 - 1)` in the same way, so e.g. a negative seed hashes alike.
    pub fn u64_bits(&self, name: &str) -> Result<Option<u64>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                let bits = v.as_u64().or_else(|| v.as_i64().map(|i| i as u64));
                bits.map(Some)
                    .ok_or_else(|| self.wrong_type(&self.path(name), v, "an integer"))
            }
        }
    }

    /// Any JSON number.
    pub fn f64(&self, name: &str) -> Result<Option<f64>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "a number")),
        }
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "true or false")),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "a string")),
        }
    }

    pub fn list(&self, name: &str) -> Result<Option<&'a Vec<Value>>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&self.path(name), v, "a list")),
        }
    }

    /// A nested object, whose own errors will name paths under this field.
    pub fn object(&self, name: &str) -> Result<Option<Fields<'a>>, PlanError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_object() {
                Some(map) => Ok(Some(Fields::new(
                    map,
                    &format!("{}.", self.path(name)),
                    self.origin,
                ))),
                None => Err(self.wrong_type(&self.path(name), v, "an object")),
            },
        }
    }

    // ---- errors about fields of this object ----

    /// `path` is a full JSON path, so list elements (`layer_types[3]`) can be named too.
    pub fn wrong_type(&self, path: &str, value: &Value, expected: &str) -> PlanError {
        PlanError::WrongType {
            origin: self.origin.to_string(),
            field: path.to_string(),
            value: show(value),
            expected: expected.to_string(),
        }
    }

    pub fn missing(&self, name: &str, reason: impl Into<String>) -> PlanError {
        PlanError::Missing {
            origin: self.origin.to_string(),
            field: self.path(name),
            reason: reason.into(),
        }
    }

    /// `name` may carry an index suffix (`ple_layer_ids[0]`); `value` is printed as given.
    pub fn invalid(
        &self,
        name: &str,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> PlanError {
        PlanError::Invalid {
            origin: self.origin.to_string(),
            field: self.path(name),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn unsupported(
        &self,
        name: &str,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> PlanError {
        PlanError::Unsupported {
            origin: self.origin.to_string(),
            field: self.path(name),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn unknown_layer_type(&self, index: usize, value: &Value, accepted: &[&str]) -> PlanError {
        PlanError::UnknownLayerType {
            origin: self.origin.to_string(),
            field: self.path(&format!("layer_types[{index}]")),
            index,
            value: show(value),
            accepted: accepted.join(", "),
        }
    }
}

/// A JSON value as a `usize`: only non-negative integers written without a fraction or exponent
/// count (serde_json stores `4.0` and `4e0` as floats, and we reject those).
pub(super) fn as_usize(value: &Value) -> Option<usize> {
    value.as_u64().and_then(|n| usize::try_from(n).ok())
}
