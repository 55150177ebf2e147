//! The key/value section of a GGUF file, in file order, with typed look-ups whose errors name the
//! key and what was expected.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::value::Value;

#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

fn wrong(key: &str, expected: &str, found: &Value) -> GgufError {
    GgufError::BadMetadata {
        key: key.to_string(),
        reason: format!("expected {expected}, found {:?}", found.value_type()),
    }
}

fn missing(key: &str) -> GgufError {
    GgufError::BadMetadata {
        key: key.to_string(),
        reason: "required but missing".to_string(),
    }
}

impl Metadata {
    /// Adds an entry; a key may appear once.
    pub fn insert(&mut self, key: String, value: Value) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Replaces the value of a key, or adds it at the end.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.index.get(key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.to_string(), self.entries.len());
                self.entries.push((key.to_string(), value));
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| wrong(key, "a string", v)))
            .transpose()
    }

    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| {
                v.as_u32()
                    .ok_or_else(|| wrong(key, "an unsigned 32-bit integer", v))
            })
            .transpose()
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| wrong(key, "an unsigned integer", v))
            })
            .transpose()
    }

    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| v.as_f32().ok_or_else(|| wrong(key, "a number", v)))
            .transpose()
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| wrong(key, "a bool", v)))
            .transpose()
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| wrong(key, "an array", v)))
            .transpose()
    }

    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?.ok_or_else(|| missing(key))
    }

    pub fn require_f32(&self, key: &str) -> Result<f32> {
        self.get_f32(key)?.ok_or_else(|| missing(key))
    }

    /// An array of strings, each element checked.
    pub fn get_strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(items) = self.get_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| wrong(key, "an array of strings", v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of integers as i64, each element checked.
    pub fn get_ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.get_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| wrong(key, "an array of integers", v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A key that is either one unsigned integer or an array of them (GGUF stores per-layer
    /// hyperparameters either way).
    pub fn get_u32_or_array(&self, key: &str) -> Result<Option<Vec<u32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array { items, .. }) => items
                .iter()
                .map(|v| {
                    v.as_u32()
                        .ok_or_else(|| wrong(key, "an array of unsigned integers", v))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => v
                .as_u32()
                .map(|x| Some(vec![x]))
                .ok_or_else(|| wrong(key, "an unsigned integer", v)),
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.require_str("general.architecture")
    }

    /// Looks up `{arch}.{suffix}` — the hyperparameter keys such as `qwen35.block_count`.
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{}", self.architecture()?, suffix))
    }
}
