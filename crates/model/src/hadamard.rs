//! Ternary-Bonsai-2's Hadamard rotation. Some matrices are stored folded, `W' = W·Rᵀ` with
//! `R = H·diag(signs)/√block` applied per block of the input; the engine therefore feeds them
//! `R·x` instead of `x`. The embedding is stored rotated and is un-rotated on lookup.

use std::collections::{HashMap, HashSet};

use gguf::Metadata;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::weights::Matrix;

const PREFIX: &str = "prism.hadamard";
const TRANSFORM: &str = "normalized-sylvester-walsh-hadamard";

#[derive(Clone, Debug)]
pub struct Hadamard {
    block: usize,
    /// Sign vector per input width.
    signs: HashMap<usize, Vec<f32>>,
    folded: HashSet<String>,
    embedding_inverse: bool,
    /// ssm_out's input is permuted from tiled to grouped value-head order before rotating.
    pub(crate) gdn_v_grouped: bool,
    key_heads: usize,
    heads_per_key: usize,
    value_dim: usize,
}

fn bad(msg: impl Into<String>) -> ModelError {
    ModelError::BadHadamard(msg.into())
}

/// In-place fast Walsh–Hadamard transform in natural (Sylvester) order, unnormalised:
/// `y[r] = Σ_c (−1)^popcount(r&c) x[c]`. `x.len()` must be a power of two.
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

impl Hadamard {
    /// `None` for files without `prism.hadamard.*` keys.
    pub fn from_metadata(md: &Metadata, c: &Config) -> Result<Option<Hadamard>> {
        let key = |s: &str| format!("{PREFIX}.{s}");
        let Some(version) = md.get_u32(&key("version"))? else {
            return Ok(None);
        };
        if version != 1 {
            return Err(bad(format!(
                "version {version} is not supported (niwaki knows version 1)"
            )));
        }
        let block = md
            .get_u32(&key("block_size"))?
            .ok_or_else(|| bad("block_size missing"))? as usize;
        if !block.is_power_of_two() || block < 2 {
            return Err(bad(format!("block_size {block} is not a power of two")));
        }
        if let Some(t) = md.get_str(&key("transform"))? {
            if t != TRANSFORM {
                return Err(bad(format!(
                    "transform {t:?} is not supported (niwaki knows {TRANSFORM:?})"
                )));
            }
        }
        if let Some(m) = md.get_str(&key("sign_mode"))? {
            if m != "explicit" {
                return Err(bad(format!(
                    "sign_mode {m:?} is not supported (niwaki knows \"explicit\")"
                )));
            }
        }
        let widths = md
            .get_ints(&key("sign_widths"))?
            .ok_or_else(|| bad("sign_widths missing"))?;
        let values = md
            .get_ints(&key("sign_values"))?
            .ok_or_else(|| bad("sign_values missing"))?;
        let total: i64 = widths.iter().sum();
        if widths
            .iter()
            .any(|&w| w <= 0 || !(w as usize).is_multiple_of(block))
            || total != values.len() as i64
        {
            return Err(bad(format!(
                "sign_widths {widths:?} must be positive multiples of {block} adding up to the {} sign values",
                values.len()
            )));
        }
        if let Some(v) = values.iter().find(|&&v| v != 1 && v != -1) {
            return Err(bad(format!("sign value {v} is not ±1")));
        }
        let mut signs = HashMap::new();
        let mut at = 0usize;
        for &w in &widths {
            let w = w as usize;
            let s = values[at..at + w].iter().map(|&v| v as f32).collect();
            if signs.insert(w, s).is_some() {
                return Err(bad(format!("width {w} has two sign vectors")));
            }
            at += w;
        }
        let folded: HashSet<String> = md
            .get_strings(&key("weight_names"))?
            .unwrap_or_default()
            .into_iter()
            .map(str::to_string)
            .collect();
        let inverse = md
            .get_strings(&key("inverse_weight_names"))?
            .unwrap_or_default();
        if let Some(other) = inverse.iter().find(|&&n| n != "token_embd.weight") {
            return Err(bad(format!(
                "inverse rotation of {other:?} is not supported"
            )));
        }
        let embedding_inverse = !inverse.is_empty();
        if embedding_inverse && !signs.contains_key(&c.hidden) {
            return Err(bad(format!(
                "no sign vector of width {} for the embedding",
                c.hidden
            )));
        }
        Ok(Some(Hadamard {
            block,
            signs,
            folded,
            embedding_inverse,
            gdn_v_grouped: md.get_bool(&key("gdn_v_grouped"))?.unwrap_or(false),
            key_heads: c.gdn_key_heads,
            heads_per_key: c.gdn_value_heads / c.gdn_key_heads,
            value_dim: c.gdn_value_dim,
        }))
    }

    pub fn is_folded(&self, m: &Matrix) -> bool {
        self.folded.contains(m.name())
    }

    /// Whether the tensor `name` is stored folded (reads rotated input).
    pub fn folds(&self, name: &str) -> bool {
        self.folded.contains(name)
    }

    /// Values per transform block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The sign vector of an input width, if the file has one.
    pub fn signs(&self, width: usize) -> Option<&[f32]> {
        self.signs.get(&width).map(Vec::as_slice)
    }

    /// Whether ssm_out's input goes from tiled to grouped value-head order before rotating.
    pub fn gdn_v_grouped(&self) -> bool {
        self.gdn_v_grouped
    }

    /// Checks at load that every folded matrix has a sign vector for its input width.
    pub fn check_matrix(&self, m: &Matrix) -> Result<()> {
        if self.is_folded(m) && !self.signs.contains_key(&m.cols) {
            return Err(bad(format!(
                "{} is folded but no sign vector has its input width {}",
                m.name(),
                m.cols
            )));
        }
        Ok(())
    }

    /// Tiled value-head order (head = key + key_heads·r) to grouped (r + heads_per_key·key).
    pub(crate) fn tiled_to_grouped(&self, x: &[f32]) -> Vec<f32> {
        let d = self.value_dim;
        let mut out = vec![0f32; x.len()];
        for k in 0..self.key_heads {
            for r in 0..self.heads_per_key {
                let src = (k + self.key_heads * r) * d;
                let dst = (r + self.heads_per_key * k) * d;
                out[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
        out
    }

    /// `R·x` for one vector: signs, then a normalised FWHT per block.
    pub(crate) fn rotate(&self, x: &mut [f32]) {
        let signs = &self.signs[&x.len()];
        x.iter_mut().zip(signs).for_each(|(v, s)| *v *= s);
        let norm = 1.0 / (self.block as f32).sqrt();
        for b in x.chunks_mut(self.block) {
            fwht(b);
            b.iter_mut().for_each(|v| *v *= norm);
        }
    }

    /// Whether the embedding is stored rotated (`unrotate_embedding` changes its rows).
    pub fn embedding_inverse(&self) -> bool {
        self.embedding_inverse
    }

    /// `Rᵀ·z` for an embedding row: normalised FWHT per block, then signs.
    pub fn unrotate_embedding(&self, z: &mut [f32]) {
        if !self.embedding_inverse {
            return;
        }
        let norm = 1.0 / (self.block as f32).sqrt();
        for b in z.chunks_mut(self.block) {
            fwht(b);
            b.iter_mut().for_each(|v| *v *= norm);
        }
        let signs = &self.signs[&z.len()];
        z.iter_mut().zip(signs).for_each(|(v, s)| *v *= s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fwht_matches_the_sylvester_matrix() {
        let n: usize = 16;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = x.clone();
        fwht(&mut y);
        for (r, &got) in y.iter().enumerate() {
            let want: f32 = (0..n)
                .map(|c| {
                    if (r & c).count_ones() % 2 == 0 {
                        x[c]
                    } else {
                        -x[c]
                    }
                })
                .sum();
            assert!((got - want).abs() < 1e-5, "row {r}");
        }
    }

    #[test]
    fn normalised_fwht_is_its_own_inverse() {
        let x: Vec<f32> = (0..1024).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y = x.clone();
        fwht(&mut y);
        fwht(&mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b / 1024.0).abs() < 1e-5);
        }
    }
}
