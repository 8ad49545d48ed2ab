//! DeepSeek-V4.1's Engram gate (docs/spec/v41.md 5.2): how one token's looked-up key and value
//! enter its residual streams. The hashing and the table lookup are the model's
//! (`model::v41::ngram`, `model::v41::engram`); this is the per-token arithmetic a backend
//! evaluates.
//!
//! For a token with streams `X [n, D]` and the projected lookup `kv [(n + 1)·D]` (n keys, then
//! one value shared by every stream), per stream c:
//! `dot_c = Σ_i X_c,i · w_c,i · key_c,i · rsqrt(mean X_c² + ε) · rsqrt(mean key_c² + ε) / √D`,
//! `g_c = σ(sign(dot_c) · √max(|dot_c|, 1e-6))`, `X_c ← X_c + g_c · value`, where
//! `w = q_weight ⊙ k_weight` (`[n, D]`; the two only ever appear as their product). Everything is
//! f32, as the reference computes it; the two mean squares are accumulated in f64 (then used
//! as f32) so that they do not depend on summation order. ε is the config's `rms_norm_eps`.

/// The floor of `|dot|` under the gate's square root.
pub const GATE_FLOOR: f32 = 1e-6;

/// `1 / sqrt(mean(v²) + eps)`, the mean accumulated in f64.
pub fn rsqrt_mean_square(v: &[f32], eps: f32) -> f32 {
    let sum: f64 = v.iter().map(|&a| (a as f64) * (a as f64)).sum();
    let mean = if v.is_empty() {
        0.0
    } else {
        sum / v.len() as f64
    };
    (1.0 / (mean + eps as f64).sqrt()) as f32
}

/// The gate `σ(sign(dot) · √max(|dot|, 1e-6))`.
pub fn gate(dot: f32) -> f32 {
    let root = dot.abs().max(GATE_FLOOR).sqrt();
    super::mhc::sigmoid(root.copysign(dot))
}

/// Adds the gated value to one token's streams `x [n, D]` in place (module doc); `kv` is
/// `[(n + 1)·D]`, `qk` the product weight `[n, D]`. Returns the n gates.
pub fn inject_token(x: &mut [f32], kv: &[f32], qk: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let d = x.len() / n;
    debug_assert_eq!(x.len(), n * d, "engram: streams are not [n, D]");
    debug_assert_eq!(kv.len(), (n + 1) * d, "engram: kv is not [(n + 1) D]");
    let value = &kv[n * d..];
    let inv_sqrt_d = (1.0 / (d as f64).sqrt()) as f32;
    (0..n)
        .map(|c| {
            let (xs, key, w) = (
                &x[c * d..(c + 1) * d],
                &kv[c * d..(c + 1) * d],
                &qk[c * d..(c + 1) * d],
            );
            let rstd = rsqrt_mean_square(xs, eps) * rsqrt_mean_square(key, eps);
            let dot: f32 = xs
                .iter()
                .zip(w)
                .zip(key)
                .map(|((&h, &w), &k)| h * w * k)
                .sum();
            let g = gate(dot * rstd * inv_sqrt_d);
            for (h, &v) in x[c * d..(c + 1) * d].iter_mut().zip(value) {
                *h += g * v;
            }
            g
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_by_hand() {
        // dot 0.25: sqrt = 0.5, sigma(0.5); dot -0.25: sigma(-0.5); tiny dots hit the floor.
        assert_eq!(gate(0.25), super::super::mhc::sigmoid(0.5));
        assert_eq!(gate(-0.25), super::super::mhc::sigmoid(-0.5));
        assert_eq!(gate(1e-20), super::super::mhc::sigmoid(1e-3));
        assert_eq!(gate(-1e-20), super::super::mhc::sigmoid(-1e-3));
    }

    #[test]
    fn inject_one_token_by_hand() {
        // n = 1, D = 4: x = [1, 1, 1, 1] (rms 1), key = [2, 2, 2, 2] (rms 2 -> rsqrt 1/2),
        // w = 1: dot = 8 · 1 · 0.5 / 2 = 2 -> gate sigma(sqrt 2); value = [1, 2, 3, 4].
        let mut x = vec![1.0f32; 4];
        let kv = [2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 3.0, 4.0];
        let g = inject_token(&mut x, &kv, &[1.0; 4], 1, 1e-20);
        let want = super::super::mhc::sigmoid(2f32.sqrt());
        assert!((g[0] - want).abs() < 1e-6, "{g:?}");
        for (i, v) in x.iter().enumerate() {
            assert!((v - (1.0 + want * (i + 1) as f32)).abs() < 1e-6);
        }
    }
}
