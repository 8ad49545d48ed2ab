//! Shared helpers of the `engine_*` integration tests: synthetic checkpoints in a tempdir, a
//! recording observer, token generators and closeness checks that print the first difference.

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::{AttentionObservation, IndexerObservation, Observer};
use needlescope::synth::{synth, Preset, SynthOptions};
use std::collections::BTreeMap;

/// A synthetic checkpoint kept alive with its directory.
pub struct SynthModel {
    pub dir: tempfile::TempDir,
    pub ckpt: Checkpoint,
}

/// Writes a synthetic checkpoint and opens it.
pub fn synth_model(
    preset: Preset,
    format: WeightFormat,
    layers: Option<usize>,
    experts: Option<usize>,
) -> SynthModel {
    synth_model_with(preset, format, layers, experts, |_| {})
}

/// [`synth_model`] with further synth options set by `edit`.
pub fn synth_model_with(
    preset: Preset,
    format: WeightFormat,
    layers: Option<usize>,
    experts: Option<usize>,
    edit: impl FnOnce(&mut SynthOptions),
) -> SynthModel {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = SynthOptions::new(preset, format, dir.path());
    opts.layers = layers;
    opts.experts = experts;
    edit(&mut opts);
    synth(&opts, None).expect("synth writes the checkpoint");
    let ckpt = Checkpoint::open(dir.path()).expect("synthetic checkpoint opens");
    SynthModel { dir, ckpt }
}

/// The tiny model in bf16 format.
pub fn tiny() -> SynthModel {
    synth_model(Preset::Tiny, WeightFormat::Bf16, None, None)
}

/// Deterministic pseudo-random token ids in `[0, vocab)`.
pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = needlescope::numerics::rng::Rng::new(seed);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// One recorded indexer observation.
#[derive(Clone, Debug)]
pub struct IndexerRecord {
    pub q_raw: Vec<f32>,
    pub weights_raw: Vec<f32>,
    pub keys_raw: Vec<f32>,
    pub scores: Vec<f32>,
    pub selected: Vec<i32>,
    pub heads: usize,
    pub head_dim: usize,
}

/// One recorded attention observation.
#[derive(Clone, Debug)]
pub struct AttentionRecord {
    pub window_positions: Vec<usize>,
    pub compressed_rows: Vec<usize>,
    pub probs: Vec<f32>,
    pub sink_probs: Vec<f32>,
}

/// Records everything for the wanted positions (`None` = all) and intermediates whose name
/// starts with one of `prefixes`, split into per-position rows.
#[derive(Default)]
pub struct Recorder {
    pub positions: Option<Vec<usize>>,
    pub prefixes: Vec<String>,
    pub indexer: BTreeMap<(usize, usize), IndexerRecord>,
    pub attention: BTreeMap<(usize, usize), AttentionRecord>,
    pub rows: BTreeMap<String, BTreeMap<usize, Vec<f32>>>,
}

impl Recorder {
    pub fn all(prefixes: &[&str]) -> Self {
        Recorder {
            positions: None,
            prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    pub fn at(positions: &[usize], prefixes: &[&str]) -> Self {
        Recorder {
            positions: Some(positions.to_vec()),
            ..Recorder::all(prefixes)
        }
    }

    /// The recorded row of intermediate `name` at `pos`.
    pub fn row(&self, name: &str, pos: usize) -> &[f32] {
        &self.rows[name][&pos]
    }
}

impl Observer for Recorder {
    fn wants_position(&self, pos: usize) -> bool {
        self.positions.as_ref().is_none_or(|p| p.contains(&pos))
    }
    fn wants_intermediate(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
    fn indexer(&mut self, o: &IndexerObservation<'_>) {
        self.indexer.insert(
            (o.layer, o.query_pos),
            IndexerRecord {
                q_raw: o.q_raw.to_vec(),
                weights_raw: o.weights_raw.to_vec(),
                keys_raw: o.keys_raw.to_vec(),
                scores: o.scores.to_vec(),
                selected: o.selected.to_vec(),
                heads: o.heads,
                head_dim: o.head_dim,
            },
        );
    }
    fn attention(&mut self, o: &AttentionObservation<'_>) {
        self.attention.insert(
            (o.layer, o.query_pos),
            AttentionRecord {
                window_positions: o.window_positions.to_vec(),
                compressed_rows: o.compressed_rows.to_vec(),
                probs: o.probs.to_vec(),
                sink_probs: o.sink_probs.to_vec(),
            },
        );
    }
    fn intermediate(&mut self, name: &str, first_pos: usize, shape: &[usize], data: &[f32]) {
        let per = data.len() / shape[0].max(1);
        let map = self.rows.entry(name.to_string()).or_default();
        for i in 0..shape[0] {
            map.insert(first_pos + i, data[i * per..(i + 1) * per].to_vec());
        }
    }
}

/// Drops trailing -inf entries (padding of `layers.L.indexer.scores` rows).
pub fn trim_neg_inf(row: &[f32]) -> &[f32] {
    let n = row
        .iter()
        .rposition(|v| *v != f32::NEG_INFINITY)
        .map_or(0, |i| i + 1);
    &row[..n]
}

/// Asserts `got ≈ want` relative to the vector's scale: `|g - w| <= rel · max(|w|, max|want|)`
/// (f32 summation-order noise is relative to the magnitudes being summed, not to each result).
pub fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g == w {
            continue;
        }
        let tol = rel * w.abs().max(scale);
        assert!(
            (g - w).abs() <= tol,
            "{what}: first difference at index {i}: got {g}, want {w} (|diff| {} > tol {tol})",
            (g - w).abs()
        );
    }
}
