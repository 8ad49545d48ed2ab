//! RoPE frequency tables, one per layer (attention.md 3.3, generalised to any rope dim d_r).
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
//! Numerical choice: REF's fp32 pipeline (attention.md 3.3), so long-context angles carry the
//! same rounding as the model's own table: `freq_i = fp32(1 / fp32(base^fp32(2i/d_r)))`, the
//! YaRN blend in fp32 one operation at a time, angle `fp32(fp32(pos) · freq'_i)`, then cos / sin
//! of that f32 angle evaluated in f64 and rounded (correctly rounded; REF's GPU `cosf` / `sinf`
//! may differ in the last ulp). An f64 angle would differ from every engine by up to
//! `pos · 2^-24` rad (4e-3 just below 128k) on the fast pairs, more than a bf16 step of cos / sin.
//! Angles are evaluated on the fly per position (d_r/2 sin/cos pairs), so there is no table
//! length limit.

use crate::config::{LayerKind, ModelConfig, RopeScaling};

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
    pub fn yarn(rope_dim: usize, base: f64, scaling: &RopeScaling) -> Self {
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

    /// The table a layer of `kind` uses under `cfg`.
    pub fn for_layer(cfg: &ModelConfig, kind: LayerKind) -> Self {
        let d_r = cfg.qk_rope_head_dim;
        match (kind, &cfg.rope_scaling) {
            (LayerKind::Swa, _) => Self::plain(d_r, cfg.rope_theta),
            (_, Some(scaling)) => Self::yarn(d_r, cfg.compress_rope_theta, scaling),
            (_, None) => Self::plain(d_r, cfg.compress_rope_theta),
        }
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
pub fn yarn_correction_range(rope_dim: usize, base: f64, scaling: &RopeScaling) -> (f64, f64) {
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

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn flash_compress_table_matches_attention_md_examples() {
        let cfg = ModelConfig::flash();
        let t = RopeTable::for_layer(&cfg, LayerKind::Csa);
        let f = t.frequencies();
        assert_eq!(f.len(), 32);
        for (i, want) in [
            (0, 1.0),
            (15, 3.6355e-3),
            (16, 2.2656e-3),
            (20, 2.9698e-4),
            (31, 5.6805e-7),
        ] {
            assert!(
                close(f[i] as f64, want, 1e-4),
                "freq'_{i} = {} want {want}",
                f[i]
            );
        }
        let (low, high) = yarn_correction_range(64, 160000.0, cfg.rope_scaling.as_ref().unwrap());
        assert_eq!((low, high), (15.0, 25.0));
    }

    #[test]
    fn hca_layers_share_the_compress_table_and_swa_is_plain() {
        let cfg = ModelConfig::flash();
        assert_eq!(
            RopeTable::for_layer(&cfg, LayerKind::Hca),
            RopeTable::for_layer(&cfg, LayerKind::Csa)
        );
        let swa = RopeTable::for_layer(&cfg, LayerKind::Swa);
        // f32 steps: within an ulp or two of the exact value.
        assert!(close(
            swa.frequencies()[31] as f64,
            10000f64.powf(-62.0 / 64.0),
            2.5e-7
        ));
    }

    /// The angle is REF's f32 product `fp32(pos) · freq'_i` (torch.outer on an f32 table), not
    /// the exact one: at position 100,003 they are 3.4e-3 rad apart on pair 1 of the Flash
    /// compress table, which moves cos by 3.3e-3, nearly a bf16 step at 1.
    #[test]
    fn angles_are_f32_products_of_position_and_frequency() {
        let t = RopeTable::for_layer(&ModelConfig::flash(), LayerKind::Csa);
        let (mut c, mut s) = (vec![0.0; 32], vec![0.0; 32]);
        let pos = 100_003usize;
        t.cos_sin(pos, &mut c, &mut s);
        let f1 = t.frequencies()[1];
        let f32_angle = (pos as f32 * f1) as f64;
        let exact_angle = pos as f64 * f1 as f64;
        assert!(
            (f32_angle - exact_angle).abs() > 2e-3,
            "{f32_angle} vs {exact_angle}"
        );
        assert_eq!(
            (c[1], s[1]),
            (f32_angle.cos() as f32, f32_angle.sin() as f32)
        );
        assert!((c[1] as f64 - exact_angle.cos()).abs() > 1e-3);
        // Pair 0 has freq 1: the angle is the position itself.
        assert_eq!(t.frequencies()[0], 1.0);
        assert_eq!(c[0], (pos as f64).cos() as f32);
    }

    #[test]
    fn tiny_yarn_ramp_is_inside_the_rope_dims() {
        let cfg = ModelConfig::tiny();
        let (low, high) = yarn_correction_range(16, 160000.0, cfg.rope_scaling.as_ref().unwrap());
        assert_eq!((low, high), (3.0, 7.0));
        let t = RopeTable::for_layer(&cfg, LayerKind::Csa);
        assert_eq!(t.frequencies().len(), 8);
        assert_eq!(t.frequencies()[0], 1.0);
    }

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
