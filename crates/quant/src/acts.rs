//! Activations quantized to int8 for the integer dot kernels.
//!
//! # The choice
//! Blocks of [`ACT_BLOCK`] = 32 consecutive values, each with an **f32** scale `d = amax / 127`
//! and codes `q = round(x / d)` (half away from zero) in −127..=127. The codes are exactly the ones
//! llama.cpp's Q8_0 writes (it computes `1/d` from the same f32 `d`); the only difference is that
//! Q8_0 then stores `d` as fp16, which adds up to 2⁻¹¹ relative error per block on top of the
//! rounding of the codes. Keeping the f32 scale removes that error at no cost in the kernels
//! (activations live in cache; their scales are read once per 32 values). Finer blocks would cut
//! the rounding error further but double the float work per value in the kernels, which already
//! bounds their speed; coarser blocks (64 or 128, matching a weight block) would be cheaper but
//! measurably *less* accurate than Q8_0 on Gaussian data (the block maximum grows with the block).
//! See [`QuantizedActs::dequantize`] and the `act_quant_accuracy` test for the measurement.
//!
//! # The layout kernels read
//! Besides the codes and per-block scales, every group of four consecutive values (one 32-bit
//! lane of a `vpdpbusd`) carries its block's scale (`lane_scale`) and the negated sum of its four
//! codes (`neg_lane_sum`). Kernels start each lane's integer accumulator at `neg_lane_sum·k` to
//! turn unsigned weight codes `c` into the signed weight `c − k`, and multiply lane sums by
//! `lane_scale`, so any 4-aligned span of lanes can be combined without knowing where blocks start.
//! Codes are zero-padded to a multiple of 64 values so 512-bit loads never run past the end.

/// Values per activation block (one f32 scale each).
pub const ACT_BLOCK: usize = 32;

/// Codes are padded to a multiple of this many values.
const PAD: usize = 64;

/// One activation vector: the f32 values (for the float weight formats) and their int8
/// quantization in blocks of [`ACT_BLOCK`] (for every block format).
#[derive(Clone, Debug)]
pub struct QuantizedActs {
    x: Vec<f32>,
    q: Vec<i8>,
    scale: Vec<f32>,
    sum: Vec<i32>,
    lane_scale: Vec<f32>,
    neg_lane_sum: Vec<i32>,
}

/// The quantizer of one block: `(d, codes)` with `d = amax/127` (f32) and `q = round(x/d)`.
/// Non-finite inputs give unspecified but memory-safe codes (NaN codes become 0).
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(x) {
        // `as` saturates and maps NaN to 0; finite values already lie in −127..=127.
        *o = ((v * id).round() as i32).clamp(-127, 127) as i8;
    }
    d
}

impl QuantizedActs {
    /// Quantizes `x`. A final partial block is quantized over the values present (the padding
    /// codes are zero); block formats only ever read whole weight blocks, which are multiples
    /// of 32 values.
    pub fn new(x: &[f32]) -> QuantizedActs {
        let n = x.len();
        let padded = n.div_ceil(PAD) * PAD;
        let blocks = padded / ACT_BLOCK;
        let mut q = vec![0i8; padded];
        let mut scale = vec![0.0f32; blocks];
        let mut sum = vec![0i32; blocks];
        for (b, (xs, qs)) in x.chunks(ACT_BLOCK).zip(q.chunks_mut(ACT_BLOCK)).enumerate() {
            scale[b] = quantize_block(xs, &mut qs[..xs.len()]);
            sum[b] = qs.iter().map(|&v| i32::from(v)).sum();
        }
        Self::with_codes(x.to_vec(), q, scale, sum)
    }

    /// Builds activations from codes and per-block scales directly (`codes.len()` values,
    /// `scales.len() == codes.len().div_ceil(32)`). The f32 values are set to the dequantized
    /// codes. Meant for tests that need exact scales (e.g. powers of two) and for callers that
    /// quantize elsewhere.
    ///
    /// # Panics
    /// When the scale count does not match.
    pub fn from_codes(codes: &[i8], scales: &[f32]) -> QuantizedActs {
        let n = codes.len();
        assert_eq!(
            scales.len(),
            n.div_ceil(ACT_BLOCK),
            "one scale per {ACT_BLOCK} codes"
        );
        let padded = n.div_ceil(PAD) * PAD;
        let blocks = padded / ACT_BLOCK;
        let mut q = vec![0i8; padded];
        q[..n].copy_from_slice(codes);
        let mut scale = vec![0.0f32; blocks];
        scale[..scales.len()].copy_from_slice(scales);
        let sum = q
            .chunks_exact(ACT_BLOCK)
            .map(|b| b.iter().map(|&v| i32::from(v)).sum())
            .collect();
        let x = (0..n)
            .map(|i| f32::from(q[i]) * scale[i / ACT_BLOCK])
            .collect();
        Self::with_codes(x, q, scale, sum)
    }

    fn with_codes(x: Vec<f32>, q: Vec<i8>, scale: Vec<f32>, sum: Vec<i32>) -> QuantizedActs {
        let lane_scale = (0..q.len() / 4).map(|l| scale[l * 4 / ACT_BLOCK]).collect();
        let neg_lane_sum = q
            .chunks_exact(4)
            .map(|l| -l.iter().map(|&v| i32::from(v)).sum::<i32>())
            .collect();
        QuantizedActs {
            x,
            q,
            scale,
            sum,
            lane_scale,
            neg_lane_sum,
        }
    }

    /// Number of activation values.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// The f32 values this was built from.
    pub fn values(&self) -> &[f32] {
        &self.x
    }

    /// The int8 codes (zero-padded to a multiple of 64).
    pub fn codes(&self) -> &[i8] {
        &self.q
    }

    /// One f32 scale per block of [`ACT_BLOCK`] codes (padding blocks have scale 0).
    pub fn scales(&self) -> &[f32] {
        &self.scale
    }

    /// `Σ q` of each block.
    pub(crate) fn block_sums(&self) -> &[i32] {
        &self.sum
    }

    pub(crate) fn lane_scales(&self) -> &[f32] {
        &self.lane_scale
    }

    pub(crate) fn neg_lane_sums(&self) -> &[i32] {
        &self.neg_lane_sum
    }

    /// The values the codes stand for, `q·d`, into `out` (`out.len() == self.len()`).
    pub fn dequantize(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.len(), "dequantize: output length");
        for (i, o) in out.iter_mut().enumerate() {
            *o = f32::from(self.q[i]) * self.scale[i / ACT_BLOCK];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_tables_agree_with_the_blocks() {
        let x: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let a = QuantizedActs::new(&x);
        assert_eq!(a.codes().len(), 128);
        assert_eq!(a.scales().len(), 4);
        for l in 0..32 {
            assert_eq!(a.lane_scales()[l], a.scales()[l / 8]);
            let s: i32 = a.codes()[4 * l..4 * l + 4]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(a.neg_lane_sums()[l], -s);
        }
        for b in 0..4 {
            let s: i32 = a.codes()[32 * b..32 * b + 32]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(a.block_sums()[b], s);
        }
        assert!(a.codes()[100..].iter().all(|&v| v == 0));
    }

    #[test]
    fn a_zero_block_has_zero_scale_and_codes() {
        let a = QuantizedActs::new(&[0.0; 64]);
        assert!(a.scales().iter().all(|&d| d == 0.0));
        assert!(a.codes().iter().all(|&q| q == 0));
    }

    #[test]
    fn the_block_maximum_maps_to_127() {
        let mut x = vec![0.5f32; 32];
        x[7] = -4.0;
        let a = QuantizedActs::new(&x);
        assert_eq!(a.codes()[7], -127);
        assert_eq!(a.scales()[0], 4.0 / 127.0);
        assert_eq!(a.codes()[0], 16); // 0.5·127/4 = 15.875
    }
}
