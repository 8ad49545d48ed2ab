//! Whole-forward parity: the same prompt through an model on the backend under test and an
//! model on the CPU reference, for several (index profile, KV mode, chunk) cases, comparing the
//! logits of every position, the indexer scores of every CSA layer at every position, and the
//! selected row sets (near-ties aside: a row selected by one side only counts when its
//! reference score is further than the score tolerance from the reference's k-th score).
//!
//! The reference replays the tested model's discrete decisions (`Observer::replace_selection`,
//! `Observer::replace_routes`): it computes and reports its own scores, top-k and routes, but
//! attends to the rows and runs the experts the tested model picked. Under a rounding profile
//! a one-ulp difference in a GEMM's summation order can flip one key's rounding and move one
//! row across the cut-off (or one expert across the router's); without the replay that single
//! legitimate flip changes the output at that position, then every later layer and position
//! (on `tiny`, 1,500 tokens: logits off by 0.16-0.31 on an H200, from one row of 88,000). With
//! it, each layer is compared on the same inputs, and the selection checks still compare both
//! models' own top-k. The tested model's scores are also recomputed on the host from its own
//! raw query, weights and keys (`probe::observe::rescore`), which no upstream flip can move.
//! Under `--kv fp8` the reference also replays the tested model's main KV rows before their
//! e4m3 rounding (`Observer::replace_kv_input`), checked first to agree within `kv_inputs`:
//! both then round the same values to the same codes, and the logits are held to the same
//! bound as with exact KV.

use crate::backend::parity::{normalised_error, Check};
use crate::backend::{Backend, CpuBackend};
use crate::model::{
    IndexerObservation, KvRows, LogitsRequest, Model, ModelError, ModelOptions, Observer,
};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::observe::rescore;
use std::collections::BTreeMap;

/// One forward configuration.
#[derive(Clone, Copy, Debug)]
pub struct ForwardCase {
    pub profile: IndexProfile,
    pub kv: KvMode,
    pub chunk: usize,
}

/// Thresholds of the forward comparison (normalised errors; `selection` is the largest allowed
/// fraction of selected rows that differ beyond near-ties).
///
/// `scores` bounds the tested model's index scores against the same scores recomputed on the
/// host from its own raw query, weights and keys (every profile: given the same inputs the
/// rounding is deterministic), and, under the `exact` profile, against the reference's scores.
/// Under a rounding profile the reference's scores can legitimately differ by more: an f32
/// difference of one ulp upstream can flip an e4m3 / e2m1 / bf16 rounding of a key or query
/// element. There the largest difference must stay within `rounding_step` (a few code steps)
/// and a flip may move at most `rounding_flips` of the selected rows across the cut-off.
///
/// With fp8 KV the main KV rows are rounded to e4m3 too, where a flipped element would move by
/// one code step (up to 1/8 of its value) and every later layer and position with it. So the
/// reference replays the tested model's KV rows *before* rounding
/// (`Observer::replace_kv_input`) once they agree to `kv_inputs`, and the logits are then held
/// to `logits` under both KV modes.
#[derive(Clone, Copy, Debug)]
pub struct ForwardTolerance {
    pub logits: f64,
    /// Largest difference between the two models' main KV rows before the fp8 rounding (each
    /// layer's window rows and compressed rows of each chunk), which the reference then replays.
    pub kv_inputs: f64,
    /// Largest fraction of (layer, position) MoE routes the reference had to replay.
    pub routes: f64,
    pub scores: f64,
    pub selection: f64,
    pub rounding_flips: f64,
    pub rounding_step: f64,
}

impl ForwardTolerance {
    /// For f32 GEMMs (the CPU's arithmetic up to summation order). `rounding_flips` 3%: the
    /// CPU itself changes about 3% of its top-k lists between chunk sizes under official-fp4 +
    /// fp8 KV (summation order alone; tests/model/invariants.rs); an H200 against the CPU
    /// moved at most 0.09% (tiny, 1,500 tokens). Before the KV rows were replayed, fp8 KV
    /// logits differed by up to 1.3e-2 on the emulator (one flipped e4m3 code under the GEMM
    /// attention on tiny) and by 3.2e-3 on an H200 (Flash 4 layers, 300 tokens).
    pub const F32: ForwardTolerance = ForwardTolerance {
        logits: 1e-4,
        kv_inputs: 1e-4,
        routes: 0.01,
        scores: 1e-4,
        selection: 0.0,
        rounding_flips: 0.03,
        rounding_step: 5e-2,
    };
    /// For bf16 GEMMs (activations and weights rounded to bf16, f32 accumulation).
    pub const BF16: ForwardTolerance = ForwardTolerance {
        logits: 5e-2,
        kv_inputs: 5e-2,
        routes: 0.05,
        scores: 5e-2,
        selection: 0.02,
        rounding_flips: 0.05,
        rounding_step: 1e-1,
    };
}

/// Scores and selections per (CSA layer, position).
type Seen = BTreeMap<(usize, usize), (Vec<f32>, Vec<i32>)>;

/// Routed experts per (layer, position).
type Routed = BTreeMap<(usize, usize), Vec<usize>>;

/// Main KV rows before the fp8 rounding per (layer, chunk's first position, which rows).
type KvInputs = BTreeMap<(usize, usize, KvRows), Vec<f32>>;

/// What one forward decided: index scores and selections of every CSA layer at every position,
/// and the routed experts of every MoE layer, as the model computed them.
#[derive(Default)]
struct Decisions {
    seen: Seen,
    routes: Routed,
    kv: KvInputs,
}

/// Records an model's [`Decisions`]; with `replay`, attention and the MoE layers then use the
/// replayed model's selections and routes instead of their own (the recorded ones stay the
/// model's own).
#[derive(Default)]
struct IndexRecorder<'r> {
    seen: Seen,
    routes: Routed,
    replay: Option<&'r Decisions>,
    /// Positions (over all CSA layers) whose replayed selection differed from the model's own.
    replaced: usize,
    /// Positions (over all MoE layers) whose replayed experts differed from the model's own.
    rerouted: usize,
    /// With a profile: every observed position's scores are recomputed on the host from the
    /// model's own raw query, head weights and keys (`probe::observe::rescore`), and
    /// `own[layer]` collects (largest |difference|, largest |score|).
    rescore: Option<IndexProfile>,
    own: BTreeMap<usize, (f64, f64)>,
    /// The model's own unrounded KV rows (recorded without `replay`).
    kv: KvInputs,
    /// With `replay`: KV row sets replaced by the replayed model's, the largest normalised
    /// difference between own and replayed rows, and sets the replay did not have.
    kv_replayed: usize,
    kv_error: f64,
    kv_missing: usize,
}

impl Observer for IndexRecorder<'_> {
    fn wants_position(&self, _pos: usize) -> bool {
        true
    }
    fn indexer(&mut self, obs: &IndexerObservation<'_>) {
        self.seen.insert(
            (obs.layer, obs.query_pos),
            (obs.scores.to_vec(), obs.selected.to_vec()),
        );
        if let Some(profile) = self.rescore {
            let want = rescore(profile, obs);
            let e = self.own.entry(obs.layer).or_insert((0.0, 0.0));
            for (&g, &w) in obs.scores.iter().zip(&want) {
                let diff = if g.is_nan() != w.is_nan() {
                    f64::INFINITY
                } else {
                    (g as f64 - w as f64).abs()
                };
                e.0 = e.0.max(if diff.is_nan() { 0.0 } else { diff });
                e.1 = e.1.max((w as f64).abs());
            }
            if obs.scores.len() != want.len() {
                e.0 = f64::INFINITY;
            }
        }
    }
    fn replace_routes(&mut self, layer: usize, first_pos: usize, k: usize, experts: &mut [usize]) {
        for (i, own) in experts.chunks_mut(k.max(1)).enumerate() {
            let key = (layer, first_pos + i);
            self.routes.insert(key, own.to_vec());
            let theirs = self.replay.and_then(|r| r.routes.get(&key));
            if let Some(theirs) = theirs.filter(|t| t.len() == own.len() && *t != own) {
                own.copy_from_slice(theirs);
                self.rerouted += 1;
            }
        }
    }
    fn wants_kv_inputs(&self) -> bool {
        true
    }
    fn replace_kv_input(
        &mut self,
        layer: usize,
        first_pos: usize,
        which: KvRows,
        rows: &mut [f32],
    ) -> bool {
        let key = (layer, first_pos, which);
        let Some(replay) = self.replay else {
            self.kv.insert(key, rows.to_vec());
            return false;
        };
        match replay.kv.get(&key) {
            Some(theirs) if theirs.len() == rows.len() => {
                self.kv_error = self.kv_error.max(normalised_error(theirs, rows));
                rows.copy_from_slice(theirs);
                self.kv_replayed += 1;
                true
            }
            _ => {
                self.kv_missing += 1;
                false
            }
        }
    }
    fn replace_selection(
        &mut self,
        layer: usize,
        first_pos: usize,
        k: usize,
        selected: &mut [i32],
    ) {
        let Some(replay) = self.replay else { return };
        for (i, own) in selected.chunks_mut(k.max(1)).enumerate() {
            if let Some((_, theirs)) = replay.seen.get(&(layer, first_pos + i)) {
                if theirs.len() == own.len() && theirs != own {
                    own.copy_from_slice(theirs);
                    self.replaced += 1;
                }
            }
        }
    }
}

/// Logits of every position (position, vocab values).
type AllLogits = Vec<(usize, Vec<f32>)>;

fn run<'r, B: Backend>(
    model: &mut Model<B>,
    case: &ForwardCase,
    tokens: &[u32],
    steps: usize,
    replay: Option<&'r Decisions>,
) -> Result<(AllLogits, IndexRecorder<'r>), ModelError> {
    let topk = model.options().topk;
    model.set_options(ModelOptions {
        index: case.profile,
        kv: case.kv,
        topk,
        chunk: case.chunk,
    })?;
    let mut rec = IndexRecorder {
        replay,
        // The tested model's scores, recomputed from its own inputs.
        rescore: replay.is_none().then_some(case.profile),
        ..IndexRecorder::default()
    };
    let mut state = model.new_sequence();
    // The prompt in one call, then the last `steps` tokens one call each (decode steps on the
    // sequence state the prefill left).
    let split = tokens.len() - steps.min(tokens.len());
    let mut logits = Vec::new();
    if split > 0 {
        let out = model.forward(&mut state, &tokens[..split], &mut rec, LogitsRequest::All)?;
        logits.extend(out.logits);
    }
    for t in &tokens[split..] {
        let out = model.forward(
            &mut state,
            std::slice::from_ref(t),
            &mut rec,
            LogitsRequest::All,
        )?;
        logits.extend(out.logits);
    }
    Ok((logits, rec))
}

/// Selected rows that differ beyond near-ties, and the number of selected rows compared.
fn selection_mismatch(
    ref_scores: &[f32],
    ref_sel: &[i32],
    got_sel: &[i32],
    tol: f64,
) -> (usize, usize) {
    let a: std::collections::BTreeSet<i32> = ref_sel.iter().copied().filter(|&r| r >= 0).collect();
    let b: std::collections::BTreeSet<i32> = got_sel.iter().copied().filter(|&r| r >= 0).collect();
    let scale = ref_scores
        .iter()
        .filter(|s| s.is_finite())
        .fold(0f32, |m, s| m.max(s.abs())) as f64;
    let kth = ref_sel
        .iter()
        .rev()
        .find(|&&r| r >= 0)
        .map(|&r| ref_scores[r as usize] as f64);
    let mut bad = 0;
    for &r in a.symmetric_difference(&b) {
        let s = ref_scores.get(r as usize).copied().unwrap_or(f32::NAN) as f64;
        let near = kth.is_some_and(|k| (s - k).abs() <= tol * scale.max(1e-30));
        if !near {
            bad += 1;
        }
    }
    (bad, a.len().max(1))
}

/// Runs every case on both models and compares them. The models must hold the same
/// checkpoint; their options are changed (top-k kept).
pub fn check_forward<B: Backend>(
    model: &mut Model<B>,
    reference: &mut Model<CpuBackend>,
    tokens: &[u32],
    cases: &[ForwardCase],
    tol: ForwardTolerance,
) -> Result<Vec<Check>, ModelError> {
    check_forward_decode(model, reference, tokens, 0, cases, tol)
}

/// [`check_forward`] with the last `steps` tokens fed one `forward` call each after the rest
/// (decode steps: every layer's caches, compressors and index keys carried in the sequence
/// state from the prefill and grown a token at a time); every call's logits and every
/// position's scores and selections are compared.
pub fn check_forward_decode<B: Backend>(
    model: &mut Model<B>,
    reference: &mut Model<CpuBackend>,
    tokens: &[u32],
    steps: usize,
    cases: &[ForwardCase],
    tol: ForwardTolerance,
) -> Result<Vec<Check>, ModelError> {
    let mut out = Vec::new();
    for case in cases {
        let label = format!(
            "{} kv {} chunk {} ({} tokens{})",
            case.profile.name(),
            case.kv,
            case.chunk,
            tokens.len(),
            if steps > 0 {
                format!(", last {steps} decoded")
            } else {
                String::new()
            }
        );
        let (lg, rg) = run(model, case, tokens, steps, None)?;
        for (layer, (diff, scale)) in &rg.own {
            out.push(Check {
                what: format!("L{layer} index scores from the model's own inputs, {label}"),
                error: diff / scale.max(1e-30),
                threshold: tol.scores,
            });
        }
        let tested = Decisions {
            seen: rg.seen,
            routes: rg.routes,
            kv: rg.kv,
        };
        let (lc, rc) = run(reference, case, tokens, steps, Some(&tested))?;
        let rg = &tested;
        let flat = |l: &[(usize, Vec<f32>)]| -> Vec<f32> {
            l.iter().flat_map(|(_, v)| v.iter().copied()).collect()
        };
        out.push(Check {
            what: format!("logits, {label}"),
            error: normalised_error(&flat(&lg), &flat(&lc)),
            threshold: tol.logits,
        });
        if case.kv == KvMode::Fp8 {
            // Every set replayed, and at least one (else the hook is not wired).
            let complete =
                rc.kv_missing == 0 && rc.kv_replayed > 0 && rc.kv_replayed == rg.kv.len();
            out.push(Check {
                what: format!(
                    "KV rows before fp8 rounding (largest error; {} sets replayed), {label}",
                    rc.kv_replayed
                ),
                error: if complete { rc.kv_error } else { f64::INFINITY },
                threshold: tol.kv_inputs,
            });
        }
        out.push(Check {
            what: format!("MoE routes replayed, {label}"),
            error: rc.rerouted as f64 / rc.routes.len().max(1) as f64,
            threshold: tol.routes,
        });
        let layers: std::collections::BTreeSet<usize> = rc.seen.keys().map(|k| k.0).collect();
        for layer in layers {
            // Errors are normalised by the layer's largest score over all positions (a position
            // with one small visible row would otherwise dominate).
            let (mut all_got, mut all_want) = (Vec::new(), Vec::new());
            let (mut bad, mut total, mut missing) = (0usize, 0usize, 0usize);
            for ((l, pos), (sc, selc)) in rc.seen.range((layer, 0)..(layer + 1, 0)) {
                let Some((sg, selg)) = rg.seen.get(&(*l, *pos)) else {
                    missing += 1;
                    continue;
                };
                if sg.len() != sc.len() {
                    missing += 1;
                    continue;
                }
                all_got.extend_from_slice(sg);
                all_want.extend_from_slice(sc);
                let (b, t) = selection_mismatch(sc, selc, selg, tol.scores);
                bad += b;
                total += t;
            }
            let worst = normalised_error(&all_got, &all_want);
            let missing = if missing > 0 { f64::INFINITY } else { 0.0 };
            if case.profile == IndexProfile::Exact {
                out.push(Check {
                    what: format!("L{layer} index scores, {label}"),
                    error: worst + missing,
                    threshold: tol.scores,
                });
            } else {
                out.push(Check {
                    what: format!("L{layer} index scores (largest error), {label}"),
                    error: worst + missing,
                    threshold: tol.rounding_step,
                });
            }
            // A rounding flip can move a row across the cut-off by more than a near-tie.
            let selection = if case.profile == IndexProfile::Exact {
                tol.selection
            } else {
                tol.selection.max(tol.rounding_flips)
            };
            out.push(Check {
                what: format!("L{layer} selected rows (near-ties aside), {label}"),
                error: bad as f64 / total.max(1) as f64,
                threshold: selection,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tested model's unrounded KV rows are recorded; the reference measures how far its
    /// own are from them, then rounds the tested model's; a set the replay lacks is counted.
    #[test]
    fn kv_rows_are_recorded_then_replayed_with_their_difference_measured() {
        let mut tested = IndexRecorder::default();
        assert!(tested.wants_kv_inputs());
        let mut rows = vec![1.0f32, -2.0, 4.0];
        assert!(!tested.replace_kv_input(2, 8, KvRows::Window, &mut rows));
        assert_eq!(rows, [1.0, -2.0, 4.0], "recording leaves the rows alone");
        let decisions = Decisions {
            kv: std::mem::take(&mut tested.kv),
            ..Decisions::default()
        };
        let mut reference = IndexRecorder {
            replay: Some(&decisions),
            ..IndexRecorder::default()
        };
        let mut own = vec![1.0f32, -2.0, 4.004];
        assert!(reference.replace_kv_input(2, 8, KvRows::Window, &mut own));
        assert_eq!(own, [1.0, -2.0, 4.0], "the tested model's rows are rounded");
        assert!(
            (reference.kv_error - 1e-3).abs() < 1e-6,
            "{}",
            reference.kv_error
        );
        assert_eq!((reference.kv_replayed, reference.kv_missing), (1, 0));
        let mut other = vec![0.5f32; 3];
        assert!(!reference.replace_kv_input(2, 8, KvRows::Compressed, &mut other));
        assert_eq!(other, [0.5; 3]);
        assert_eq!((reference.kv_replayed, reference.kv_missing), (1, 1));
    }

    #[test]
    fn near_ties_do_not_count_as_mismatches() {
        let scores = [5.0f32, 4.0, 3.0, 2.9999, 1.0];
        // Reference picks rows 0,1,2; the other side picks 0,1,3: a near-tie.
        assert_eq!(
            selection_mismatch(&scores, &[0, 1, 2], &[0, 1, 3], 1e-3),
            (0, 3)
        );
        // Picking row 4 instead of 2 is a real difference: row 4 (far below the k-th score)
        // counts; row 2 is the k-th row itself, a near-tie by definition.
        assert_eq!(
            selection_mismatch(&scores, &[0, 1, 2], &[0, 1, 4], 1e-3),
            (1, 3)
        );
        assert_eq!(
            selection_mismatch(&scores, &[0, 1, -1], &[0, 1, -1], 0.0),
            (0, 2)
        );
    }
}
