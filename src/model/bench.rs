//! The prefill benchmark behind `needlescope inspect` / bench reports: load the model, then time
//! one prefill of the given tokens (logits of the last position only, no observer). The CLI adds
//! the resident set size.

use super::forward::{Engine, EngineOptions, LogitsRequest};
use super::observer::NoObserver;
use super::EngineError;
use crate::backend::WeightResidency;
use crate::checkpoint::Checkpoint;
use std::time::Instant;

/// Timing of one prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchFigures {
    pub tokens: usize,
    /// Wall seconds of the prefill (loading excluded).
    pub seconds: f64,
    pub tokens_per_s: f64,
    /// Wall seconds spent loading (and, for `Decoded`, decoding) the weights.
    pub load_seconds: f64,
    /// The weight residency in force (`Auto` resolved).
    pub weights: WeightResidency,
}

/// Loads `ckpt` with `opts` and linears resident per `weights` on the CPU backend and times
/// the prefill of `tokens`.
pub fn bench_prefill(
    ckpt: &Checkpoint,
    opts: EngineOptions,
    weights: WeightResidency,
    tokens: &[u32],
) -> Result<BenchFigures, EngineError> {
    let t_load = Instant::now();
    let engine = Engine::load_weights(ckpt, opts, weights)?;
    let load_seconds = t_load.elapsed().as_secs_f64();
    let mut state = engine.new_sequence();
    let t0 = Instant::now();
    engine.forward(&mut state, tokens, &mut NoObserver, LogitsRequest::Last)?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(BenchFigures {
        tokens: tokens.len(),
        seconds,
        tokens_per_s: tokens.len() as f64 / seconds.max(1e-12),
        load_seconds,
        weights: engine.backend().weights(),
    })
}
