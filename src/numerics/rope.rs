//! RoPE frequency tables (docs/spec/attention.md 3.3, generalised to any rope dim d_r). Which table a layer
//! uses is the config's business ([`crate::config::ModelConfig::rope_table`]); this file owns the
//! arithmetic.
//!
//! - Ratio-0 (SWA) layers: `freq_i = rope_theta^(-2i/d_r)`, i = 0..d_r/2, no YaRN.
//! - Ratio-4 / 128 layers: base `compress_rope_theta` with YaRN (no mscale, so cos/sin keep unit
//!   magnitude and the softmax scale is unchanged). Every rope of such a layer uses it: q,
//!   window kv, compressed rows, index q and index keys.
//!   `corr(n) = d_r·ln(orig / (2π n)) / (2 ln base)`, `low = max(floor(corr(beta_fast)), 0)`,
//!   `high = min(ceil(corr(beta_slow)), d_r - 1)`, `ramp_i = clamp((i - low)/(high - low), 0, 1)`
//!   (high is nudged by 0.001 when equal to low, as REF does), and
//!   `freq'_i = freq_i/factor · ramp_i + freq_i · (1 - ramp_i)`.
//!   Without `rope_scaling` in the config the compress base is used plainly.
//!
//! Numerical choice: REF's fp32 pipeline (docs/spec/attention.md 3.3), so long-context angles carry the
//! same rounding as the model's own table: `freq_i = fp32(1 / fp32(base^fp32(2i/d_r)))`, the
//! YaRN blend in fp32 one operation at a time, angle `fp32(fp32(pos) · freq'_i)`, then cos / sin
//! of that f32 angle evaluated in f64 and rounded (correctly rounded; REF's GPU `cosf` / `sinf`
//! may differ in the last ulp). An f64 angle would differ from every engine by up to
//! `pos · 2^-24` rad (4e-3 just below 128k) on the fast pairs, more than a bf16 step of cos / sin.
//! Angles are evaluated on the fly per position (d_r/2 sin/cos pairs), so there is no table
//! length limit.

/// The YaRN parameters of a table (config.json's `rope_scaling`, without its kind).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: u64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// The rotary frequencies of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    rope_dim: usize,
    inv_freq: Vec<f32>,
}

impl RopeTable {
    /// Plain RoPE: `freq_i = 1 / base^(2i/rope_dim)`, each step rounded to f32 as REF does.
    pub fn plain(rope_dim: usize, base: f64) -> Self {
        assert!(
            rope_dim.is_multiple_of(2) && rope_dim > 0,
            "rope dim must be even and positive"
        );
        let base = base as f32 as f64;
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / rope_dim as f32;
                1.0 / (base.powf(exponent as f64) as f32)
            })
            .collect();
        RopeTable { rope_dim, inv_freq }
    }

    /// RoPE with YaRN frequency blending (no mscale).
    pub fn yarn(rope_dim: usize, base: f64, scaling: &Yarn) -> Self {
        let mut table = Self::plain(rope_dim, base);
        let (low, high) = yarn_correction_range(rope_dim, base, scaling);
        let span = if high == low { 0.001 } else { high - low } as f32;
        let factor = scaling.factor as f32;
        for (i, f) in table.inv_freq.iter_mut().enumerate() {
            // REF: smooth = 1 - ramp; freq / factor * (1 - smooth) + freq * smooth, in f32.
            let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
            let smooth = 1.0 - ramp;
            *f = *f / factor * (1.0 - smooth) + *f * smooth;
        }
        table
    }

    /// Number of rotated dims (the trailing `rope_dim` of each vector).
    pub fn rope_dim(&self) -> usize {
        self.rope_dim
    }

    /// `freq'_i` for i = 0..rope_dim/2.
    pub fn frequencies(&self) -> &[f32] {
        &self.inv_freq
    }

    /// cos and sin of the f32 angle `fp32(pos) · freq'_i`, each `[rope_dim/2]` (the sin / cos
    /// themselves in f64, rounded to f32).
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let pos = pos as f32;
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (s, c) = ((pos * f) as f64).sin_cos();
            cos[i] = c as f32;
            sin[i] = s as f32;
        }
    }
}

/// `(low, high)` pair indices of the YaRN ramp (floats, already floored / ceiled and clamped).
pub fn yarn_correction_range(rope_dim: usize, base: f64, scaling: &Yarn) -> (f64, f64) {
    let orig = scaling.original_max_position_embeddings as f64;
    let corr = |rotations: f64| {
        rope_dim as f64 * (orig / (2.0 * std::f64::consts::PI * rotations)).ln() / (2.0 * base.ln())
    };
    let low = corr(scaling.beta_fast).floor().max(0.0);
    let high = corr(scaling.beta_slow).ceil().min(rope_dim as f64 - 1.0);
    (low, high)
}

/// Rotates the interleaved pairs of `tail` (the last rope dims of one vector) by the given
/// cos / sin; `inverse` uses -sin. Pair i is `(tail[2i], tail[2i+1])`.
#[inline]
pub fn rotate_pairs(tail: &mut [f32], cos: &[f32], sin: &[f32], inverse: bool) {
    for (i, pair) in tail.chunks_exact_mut(2).enumerate() {
        let (c, s) = (cos[i], if inverse { -sin[i] } else { sin[i] });
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_rotation_undoes_forward() {
        let t = RopeTable::plain(8, 10000.0);
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        t.cos_sin(1234, &mut c, &mut s);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 * 0.37 - 1.0).collect();
        let mut v = orig.clone();
        rotate_pairs(&mut v, &c, &s, false);
        assert!(v.iter().zip(&orig).any(|(a, b)| (a - b).abs() > 1e-3));
        rotate_pairs(&mut v, &c, &s, true);
        for (a, b) in v.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
