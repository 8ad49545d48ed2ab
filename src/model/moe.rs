//! The MoE block of one layer (docs/spec/model.md 5): router, routed experts, shared expert.
//!
//! Input `u [T, D]` (the ffn_norm output), output `[T, D]`:
//! - scores `s = sqrtsoftplus(u · gateᵀ)` `[T, E]` (f32, as REF);
//! - hash layers (`layer < num_hash_layers`): the experts are `tid2eid[token]`, independent of
//!   the hidden state; score layers: top-k of `s + bias` (bias for selection only; ties to the
//!   lower expert index — torch.topk leaves them unspecified);
//! - weights: `w_i = s_i / Σ_{chosen} s × routed_scaling_factor` (bias never included; REF
//!   renormalises whenever the score function is not softmax, so `norm_topk_prob` is not
//!   consulted);
//! - `out = Σ_i w_i · Expert_i(u) + Shared(u)`, SwiGLU clamped at `swiglu_limit` in both.

use super::observer::Observer;
use super::{load_matrix, ModelError};
use crate::backend::{Backend, FfnWeights, Routes};
use crate::checkpoint::{Checkpoint, CheckpointConfig};
use crate::config::{ModelConfig, RouterKind};
use rayon::prelude::*;

/// One layer's MoE weights.
pub struct Moe<M> {
    gate: M,
    /// Score routers: `[E]` selection bias.
    bias: Option<Vec<f32>>,
    /// Hash routers: `[V, k]` expert ids per token id.
    tid2eid: Option<Vec<usize>>,
    experts: Vec<FfnWeights<M>>,
    shared: Option<FfnWeights<M>>,
    top_k: usize,
    n_experts: usize,
    scaling: f32,
    limit: f32,
}

fn load_ffn<B: Backend, C: CheckpointConfig>(
    backend: &B,
    ckpt: &Checkpoint<C>,
    prefix: &str,
    d: usize,
    inter: usize,
) -> Result<FfnWeights<B::Matrix>, ModelError> {
    Ok(FfnWeights {
        w1: load_matrix(backend, ckpt, &format!("{prefix}.w1"), inter, d)?,
        w2: load_matrix(backend, ckpt, &format!("{prefix}.w2"), d, inter)?,
        w3: load_matrix(backend, ckpt, &format!("{prefix}.w3"), inter, d)?,
    })
}

/// The sizes and rules of one layer's MoE, from either family's config.
#[derive(Clone, Copy, Debug)]
pub struct MoeSpec {
    pub hidden: usize,
    pub intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
    pub shared_experts: usize,
    pub scaling: f32,
    pub swiglu_limit: f32,
    pub router: RouterKind,
    /// Token ids a hash router's `tid2eid` covers.
    pub vocab: usize,
}

impl MoeSpec {
    /// Layer `layer` of a DeepSeek-V4 config.
    pub fn v4(cfg: &ModelConfig, layer: usize) -> Self {
        MoeSpec {
            hidden: cfg.hidden_size,
            intermediate: cfg.moe_intermediate_size,
            experts: cfg.n_routed_experts,
            top_k: cfg.num_experts_per_tok,
            shared_experts: cfg.n_shared_experts,
            scaling: cfg.routed_scaling_factor as f32,
            swiglu_limit: cfg.swiglu_limit as f32,
            router: cfg.router_kind(layer),
            vocab: cfg.vocab_size,
        }
    }
}

impl<M> Moe<M> {
    /// Loads `layers.{layer}.ffn.*` of a DeepSeek-V4 checkpoint; checks every `tid2eid` entry
    /// names an expert.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        layer: usize,
    ) -> Result<Self, ModelError> {
        Self::load_spec(backend, ckpt, &MoeSpec::v4(cfg, layer), layer)
    }

    /// Loads `layers.{layer}.ffn.*` of any checkpoint under `spec`.
    pub fn load_spec<B: Backend<Matrix = M>, C: CheckpointConfig>(
        backend: &B,
        ckpt: &Checkpoint<C>,
        spec: &MoeSpec,
        layer: usize,
    ) -> Result<Self, ModelError> {
        let p = format!("layers.{layer}.ffn");
        let (d, inter, e, k) = (spec.hidden, spec.intermediate, spec.experts, spec.top_k);
        let (bias, tid2eid) = match spec.router {
            RouterKind::Score => (
                Some(ckpt.f32_tensor(&format!("{p}.gate.bias"), &[e])?),
                None,
            ),
            RouterKind::Hash => {
                let name = format!("{p}.gate.tid2eid");
                let raw = ckpt.i64_tensor(&name, &[spec.vocab, k])?;
                if let Some(at) = raw
                    .iter()
                    .position(|&v| usize::try_from(v).map_or(true, |u| u >= e))
                {
                    return Err(ModelError::BadTensor {
                        file: ckpt.info(&name).map(|t| t.file.clone()).unwrap_or_default(),
                        tensor: name.clone(),
                        problem: format!(
                            "expected expert ids in 0..{e}, found {} at [token {}, slot {}]",
                            raw[at],
                            at / k,
                            at % k
                        ),
                    });
                }
                let ids: Vec<usize> = raw.iter().map(|&v| v as usize).collect();
                (None, Some(ids))
            }
        };
        let experts = (0..e)
            .map(|i| load_ffn(backend, ckpt, &format!("{p}.experts.{i}"), d, inter))
            .collect::<Result<Vec<_>, _>>()?;
        let shared = if spec.shared_experts > 0 {
            Some(load_ffn(
                backend,
                ckpt,
                &format!("{p}.shared_experts"),
                d,
                inter,
            )?)
        } else {
            None
        };
        Ok(Moe {
            gate: load_matrix(backend, ckpt, &format!("{p}.gate"), e, d)?,
            bias,
            tid2eid,
            experts,
            shared,
            top_k: k,
            n_experts: e,
            scaling: spec.scaling,
            limit: spec.swiglu_limit,
        })
    }

    /// MoE output `[T, D]` for `u [T, D]` whose input token ids are `tokens [T]` at positions
    /// `first_pos..` of layer `layer`; the observer may replace the chosen experts
    /// ([`Observer::replace_routes`], a parity harness's replay).
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        u: &B::Act,
        tokens: &[u32],
        (layer, first_pos): (usize, usize),
        observer: &mut dyn Observer,
    ) -> B::Act {
        let t = tokens.len();
        let mut scores = vec![0.0f32; t * self.n_experts];
        backend.router_scores(u, &self.gate, &mut scores);
        let mut experts = self.choose(&scores, tokens);
        observer.replace_routes(layer, first_pos, self.top_k, &mut experts);
        let weights = self.weigh(&scores, &experts);
        let routes = Routes {
            per_token: self.top_k,
            experts: &experts,
            weights: &weights,
        };
        let mut out = backend.act_zeros(backend.act_len(u));
        backend.moe_experts(u, &routes, &self.experts, self.limit, &mut out);
        if let Some(shared) = &self.shared {
            let mut s = backend.act_zeros(backend.act_len(u));
            backend.ffn(u, shared, self.limit, &mut s);
            backend.add_assign(&mut out, &s);
        }
        out
    }

    /// Chosen experts and weights `[T, k]` from the router scores `[T, E]` (what `forward`
    /// does when the observer keeps the model's routes).
    #[cfg(test)]
    fn route(&self, scores: &[f32], tokens: &[u32]) -> (Vec<usize>, Vec<f32>) {
        let experts = self.choose(scores, tokens);
        let weights = self.weigh(scores, &experts);
        (experts, weights)
    }

    /// Chosen experts `[T, k]` from the router scores `[T, E]` (hash table or biased top-k).
    fn choose(&self, scores: &[f32], tokens: &[u32]) -> Vec<usize> {
        let (e, k) = (self.n_experts, self.top_k);
        let mut experts = vec![0usize; tokens.len() * k];
        if k == 0 {
            return experts;
        }
        let no_bias = vec![0.0; if self.bias.is_none() { e } else { 0 }];
        let (tid2eid, bias) = (&self.tid2eid, &self.bias);
        // Tokens in parallel (the GPU waits for the routes).
        experts
            .par_chunks_mut(k)
            .zip(tokens.par_iter())
            .enumerate()
            .for_each(|(i, (out, &tok))| {
                let s = &scores[i * e..(i + 1) * e];
                match (tid2eid, bias) {
                    (Some(table), _) => {
                        out.copy_from_slice(&table[tok as usize * k..(tok as usize + 1) * k])
                    }
                    (None, Some(bias)) => out.copy_from_slice(&top_k_biased(s, bias, k)),
                    (None, None) => out.copy_from_slice(&top_k_biased(s, &no_bias, k)),
                }
            });
        experts
    }

    /// Weights `[T, k]` of the chosen experts: their unbiased scores renormalised, scaled.
    fn weigh(&self, scores: &[f32], experts: &[usize]) -> Vec<f32> {
        let (e, k) = (self.n_experts, self.top_k);
        let mut weights = Vec::with_capacity(experts.len());
        for (i, chosen) in experts.chunks(k.max(1)).enumerate() {
            let s = &scores[i * e..(i + 1) * e];
            let sum: f32 = chosen.iter().map(|&x| s[x]).sum();
            weights.extend(chosen.iter().map(|&x| s[x] / sum * self.scaling));
        }
        weights
    }
}

/// Indices of the k largest `scores + bias`, descending, ties to the lower index (keys ordered
/// by `f32::total_cmp`, so the result is defined for every input, NaN included).
///
/// One pass keeping the best k so far in order: a later expert enters only when its key beats
/// the current k-th, so equal keys keep the lower index. O(E·k) at worst, about O(E) in
/// practice; sorting all E experts per token (what this replaced) cost 50-85 ms per 2,048
/// tokens at E = 256 on the host, with the GPU idle.
pub fn top_k_biased(scores: &[f32], bias: &[f32], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (i, (s, b)) in scores.iter().zip(bias).enumerate() {
        let key = s + b;
        if best.len() == k && best.last().is_some_and(|l| key.total_cmp(&l.0).is_le()) {
            continue;
        }
        let at = best.partition_point(|&(v, _)| v.total_cmp(&key).is_ge());
        best.insert(at, (key, i));
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_only_selects_and_ties_go_to_the_lower_expert() {
        let s = [0.5, 0.9, 0.7, 0.7];
        assert_eq!(top_k_biased(&s, &[0.0; 4], 2), vec![1, 2]);
        assert_eq!(top_k_biased(&s, &[1.0, 0.0, 0.0, 0.0], 2), vec![0, 1]);
    }

    /// The definition: sort every expert by key (descending, `total_cmp`), then by index.
    fn top_k_by_sorting(scores: &[f32], bias: &[f32], k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        let key = |i: usize| scores[i] + bias[i];
        idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        idx.truncate(k);
        idx
    }

    #[test]
    fn one_pass_top_k_equals_sorting_with_ties_nan_and_infinities() {
        // Keys from a small set so ties are common; NaN, infinities and -0.0 among them.
        let palette = [
            0.5,
            0.25,
            -0.0,
            0.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.75,
            0.5,
        ];
        let mut rng = crate::numerics::rng::Rng::new(7);
        for case in 0..400 {
            let e = 1 + case % 37;
            let scores: Vec<f32> = (0..e).map(|_| *rng.pick(&palette)).collect();
            let bias: Vec<f32> = (0..e).map(|_| *rng.pick(&[0.0, 0.25, -0.25])).collect();
            for k in [0, 1, 2, 6, e, e + 3] {
                assert_eq!(
                    top_k_biased(&scores, &bias, k),
                    top_k_by_sorting(&scores, &bias, k),
                    "case {case}: k {k}, scores {scores:?}, bias {bias:?}"
                );
            }
        }
    }

    fn router(bias: Option<Vec<f32>>, tid2eid: Option<Vec<usize>>) -> Moe<()> {
        Moe {
            gate: (),
            bias,
            tid2eid,
            experts: Vec::new(),
            shared: None,
            top_k: 2,
            n_experts: 4,
            scaling: 1.5,
            limit: 10.0,
        }
    }

    #[test]
    fn weights_renormalise_unbiased_scores_over_the_chosen_experts() {
        let scores = [0.5, 0.9, 0.7, 0.2];
        let moe = router(Some(vec![0.0, 0.0, 0.0, 1.0]), None);
        let (e, w) = moe.route(&scores, &[0]);
        assert_eq!(e, vec![3, 1]);
        assert!((w[0] - 0.2 / 1.1 * 1.5).abs() < 1e-6 && (w[1] - 0.9 / 1.1 * 1.5).abs() < 1e-6);
    }

    #[test]
    fn hash_routing_follows_the_token_id() {
        let moe = router(None, Some(vec![0, 1, 2, 3, 3, 0]));
        let scores = [1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 3.0];
        let (e, w) = moe.route(&scores, &[1, 2]);
        assert_eq!(e, vec![2, 3, 3, 0]);
        assert!((w[0] - 0.375).abs() < 1e-6 && (w[1] - 1.125).abs() < 1e-6);
        assert!((w[2] - 1.125).abs() < 1e-6 && (w[3] - 0.375).abs() < 1e-6);
    }

    /// The config's `swiglu_limit` reaches both the routed and the shared experts: with a limit
    /// small enough to clamp the tiny model's activations, `forward` equals the ops called with
    /// that limit by hand, and differs from the default limit (which never clamps here).
    #[test]
    fn forward_clamps_routed_and_shared_experts_at_the_config_limit() {
        use crate::backend::cpu::CpuBackend;
        use crate::model::NoObserver;
        let (_dir, ckpt) = crate::synth::tiny_for_tests();
        let mut cfg = ckpt.config().clone();
        cfg.swiglu_limit = 0.05;
        let cpu = CpuBackend::new();
        let layer = 3; // score router, routed and shared experts
        let moe = Moe::load(&cpu, &ckpt, &cfg, layer).unwrap();
        assert!(moe.shared.is_some());
        let d = cfg.hidden_size;
        let tokens = [5u32, 17, 99];
        let host: Vec<f32> = (0..tokens.len() * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.04)
            .collect();
        let u = cpu.act_from(host);
        let got = moe.forward(&cpu, &u, &tokens, (layer, 0), &mut NoObserver);

        let mut scores = vec![0.0f32; tokens.len() * moe.n_experts];
        cpu.router_scores(&u, &moe.gate, &mut scores);
        let (experts, weights) = moe.route(&scores, &tokens);
        let routes = Routes {
            per_token: moe.top_k,
            experts: &experts,
            weights: &weights,
        };
        let by_hand = |routed_limit: f32, shared_limit: f32| {
            let mut out = cpu.act_zeros(tokens.len() * d);
            cpu.moe_experts(&u, &routes, &moe.experts, routed_limit, &mut out);
            let mut shared = cpu.act_zeros(tokens.len() * d);
            cpu.ffn(&u, moe.shared.as_ref().unwrap(), shared_limit, &mut shared);
            cpu.add_assign(&mut out, &shared);
            out
        };
        let default_limit = ModelConfig::tiny().swiglu_limit as f32;
        assert_eq!(got, by_hand(0.05, 0.05));
        // Each part clamps on its own: leaving either at the default limit changes the result.
        assert_ne!(got, by_hand(default_limit, 0.05));
        assert_ne!(got, by_hand(0.05, default_limit));
    }
}
