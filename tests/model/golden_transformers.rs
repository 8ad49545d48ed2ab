//! Golden test: the CPU engine against HF transformers' `deepseek_v4` run in float32.
//!
//! `tests/fixtures/tiny_golden.safetensors` was written by `tests/reference/make_golden.py`
//! (see tests/reference/README.md) from `needlescope synth --preset tiny --format bf16
//! --seed 0`. This test rebuilds that checkpoint, checks that it is byte-identical to the one
//! the fixture was made from (otherwise the fixture is stale and must be regenerated), runs
//! the same token ids through the engine with `--index exact --kv exact` three ways (one call in
//! chunks of 128, one call per token as in decoding, irregular calls mostly not aligned to 4 or
//! 128),
//! and demands of each:
//! - indexer scores of every visible row: error < 1e-4 relative to the layer's largest score;
//! - identical top-k sets, except at positions whose fixture margin (k-th minus (k+1)-th
//!   score) is below 1e-5;
//! - the 4-stream residual state after every layer and the logits: error < 1e-3 relative to
//!   the tensor's largest magnitude.
//!
//! On failure it names the first diverging layer and tensor and shows the first differing value.

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::forward::{LogitsRequest, Model, ModelOptions};
use needlescope::model::Observer;
use needlescope::synth::{synth, Preset, SynthOptions};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny_golden.safetensors"
);
const REGEN: &str = "regenerate it: see tests/reference/README.md \
    (needlescope synth --preset tiny --format bf16 --seed 0 --out /tmp/tiny-bf16; \
    python tests/reference/make_golden.py --model /tmp/tiny-bf16 --out tests/fixtures/tiny_golden.safetensors)";

struct Fixture {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
    metadata: BTreeMap<String, String>,
}

impl Fixture {
    fn load() -> Fixture {
        let bytes = std::fs::read(FIXTURE).expect("fixture exists");
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("fixture header");
        let metadata = meta
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let st = SafeTensors::deserialize(&bytes).expect("fixture parses");
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f64> = match view.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                safetensors::Dtype::I32 => data
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                safetensors::Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("fixture tensor {name} has unexpected dtype {other:?}"),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Fixture { tensors, metadata }
    }

    fn get(&self, name: &str) -> &(Vec<usize>, Vec<f64>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("fixture lacks tensor {name}"))
    }
}

/// Collects the named intermediates the comparison needs, keyed by name then position.
#[derive(Default)]
struct Collector {
    rows: BTreeMap<String, BTreeMap<usize, Vec<f32>>>,
}

impl Observer for Collector {
    fn wants_intermediate(&self, name: &str) -> bool {
        name.ends_with(".hidden")
            || name.ends_with(".indexer.scores")
            || name.ends_with(".indexer.topk")
            || name == "logits"
    }
    fn intermediate(&mut self, name: &str, first_pos: usize, shape: &[usize], data: &[f32]) {
        // Every position gets its row, an empty one too (indexer scores of a call whose
        // queries see no compressed row yet are [T, 0]).
        let per = shape[1..].iter().product::<usize>();
        let entry = self.rows.entry(name.to_string()).or_default();
        for i in 0..shape[0] {
            entry.insert(first_pos + i, data[i * per..(i + 1) * per].to_vec());
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Max |a-b| over max |b| of two equal-length slices, with the index of the largest difference.
fn normalised_error(ours: &[f64], reference: &[f64]) -> (f64, usize) {
    let scale = reference
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(1e-30);
    let mut worst = (0.0, 0);
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        let d = (a - b).abs();
        if d > worst.0 || d.is_nan() {
            worst = (d, i);
        }
    }
    (worst.0 / scale, worst.1)
}

#[test]
fn engine_matches_transformers_float32_on_tiny() {
    let fixture = Fixture::load();

    // The checkpoint the fixture was made from, rebuilt bit for bit.
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, dir.path());
    opts.seed = 0;
    synth(&opts, None).expect("synth tiny");
    let config_hash = sha256_hex(&std::fs::read(dir.path().join("config.json")).unwrap());
    let weights_hash = sha256_hex(&std::fs::read(dir.path().join("model.safetensors")).unwrap());
    assert_eq!(
        Some(&config_hash),
        fixture.metadata.get("config_sha256"),
        "synth tiny config.json differs from the fixture's: the fixture is stale; {REGEN}"
    );
    assert_eq!(
        Some(&weights_hash),
        fixture.metadata.get("sha256:model.safetensors"),
        "synth tiny weights differ from the fixture's: the fixture is stale; {REGEN}"
    );
    let ckpt = Checkpoint::open(dir.path()).expect("open tiny");
    let cfg = ckpt.config().clone();

    let tokens: Vec<u32> = fixture.get("tokens").1.iter().map(|&v| v as u32).collect();
    let t_len = tokens.len();
    let logit_positions: Vec<usize> = fixture
        .get("logit_positions")
        .1
        .iter()
        .map(|&v| v as usize)
        .collect();

    // One call in chunks of 128 (the chunked state machine); one call per token (the decode
    // step of docs/spec/attention.md 8.3 at every position); irregular calls, mostly not aligned to 4 or
    // 128, each cut into chunks of 5.
    let one_call = [t_len];
    let per_token = vec![1; t_len];
    let irregular = [1, 2, 3, 7, 119, 1, 128, 39];
    assert_eq!(
        irregular.iter().sum::<usize>(),
        t_len,
        "pieces cover the fixture"
    );
    for (what, chunk, pieces) in [
        ("chunks of 128", 128, &one_call[..]),
        ("one token per call", 2048, &per_token[..]),
        ("irregular calls", 5, &irregular[..]),
    ] {
        eprintln!("-- {what}");
        let engine = Model::load(
            &ckpt,
            ModelOptions {
                chunk,
                ..ModelOptions::default()
            },
        )
        .expect("engine loads");
        compare(
            &fixture,
            &cfg,
            &engine,
            &tokens,
            &logit_positions,
            pieces,
            what,
        );
    }
}

/// Runs `tokens` through `engine` in calls of `pieces` tokens and compares with the fixture.
fn compare(
    fixture: &Fixture,
    cfg: &needlescope::config::ModelConfig,
    engine: &Model,
    tokens: &[u32],
    logit_positions: &[usize],
    pieces: &[usize],
    what: &str,
) {
    let t_len = tokens.len();
    let mut state = engine.new_sequence();
    let mut collector = Collector::default();
    let mut logits = Vec::new();
    let mut at = 0;
    for &n in pieces {
        let wanted = logit_positions
            .iter()
            .copied()
            .filter(|p| (at..at + n).contains(p))
            .collect();
        let out = engine
            .forward(
                &mut state,
                &tokens[at..at + n],
                &mut collector,
                LogitsRequest::Positions(wanted),
            )
            .expect("forward");
        logits.extend(out.logits);
        at += n;
    }
    let out = needlescope::model::forward::ForwardOutput { logits };

    let k = cfg.index_topk;
    for layer in 0..cfg.num_hidden_layers {
        let scores_name = format!("layers.{layer}.indexer.scores");
        if let Some(ours) = collector.rows.get(&scores_name) {
            let (shape, reference) = fixture.get(&scores_name);
            let rows = shape[1];
            // Compare visible entries only (w < floor((t+1)/4)).
            let (mut a, mut b, mut at) = (Vec::new(), Vec::new(), Vec::new());
            for t in 0..t_len {
                let visible = (t + 1) / 4;
                let row = &ours[&t];
                for w in 0..visible.min(rows) {
                    a.push(row[w] as f64);
                    b.push(reference[t * rows + w]);
                    at.push((t, w));
                }
            }
            let (err, i) = normalised_error(&a, &b);
            eprintln!("layer {layer} {scores_name}: normalised error {err:.3e}");
            assert!(
                err < 1e-4,
                "{what}: first divergence: layer {layer} tensor {scores_name}: normalised error {err:.3e} \
                 at query {} row {}: ours {} vs transformers {}",
                at[i].0,
                at[i].1,
                a[i],
                b[i]
            );

            let topk_name = format!("layers.{layer}.indexer.topk");
            let (_, ref_topk) = fixture.get(&topk_name);
            let (_, margins) = fixture.get(&format!("layers.{layer}.indexer.margin"));
            let ours_topk = &collector.rows[&topk_name];
            let mut compared = 0;
            for t in 0..t_len {
                if margins[t] < 1e-5 {
                    continue;
                }
                let mut mine: Vec<i64> = ours_topk[&t].iter().map(|&v| v as i64).collect();
                let mut theirs: Vec<i64> = ref_topk[t * k..(t + 1) * k]
                    .iter()
                    .map(|&v| v as i64)
                    .collect();
                mine.sort_unstable();
                theirs.sort_unstable();
                assert_eq!(
                    mine, theirs,
                    "{what}: first divergence: layer {layer} tensor {topk_name}: selected rows differ \
                     at query {t} (margin {})",
                    margins[t]
                );
                compared += 1;
            }
            assert!(
                compared > t_len / 2,
                "{what}: too few positions compared: {compared}"
            );
        }

        let hidden_name = format!("layers.{layer}.hidden");
        let ours = collector
            .rows
            .get(&hidden_name)
            .unwrap_or_else(|| panic!("engine did not emit {hidden_name}"));
        let (_, reference) = fixture.get(&hidden_name);
        let a: Vec<f64> = (0..t_len)
            .flat_map(|t| ours[&t].iter().map(|&v| v as f64))
            .collect();
        assert_eq!(a.len(), reference.len(), "{hidden_name} size");
        let (err, i) = normalised_error(&a, reference);
        let per_pos = a.len() / t_len;
        eprintln!("layer {layer} {hidden_name}: normalised error {err:.3e}");
        assert!(
            err < 1e-3,
            "{what}: first divergence: layer {layer} tensor {hidden_name}: normalised error {err:.3e} at \
             position {} element {}: ours {} vs transformers {}",
            i / per_pos,
            i % per_pos,
            a[i],
            reference[i]
        );
    }

    let (_, ref_logits) = fixture.get("logits");
    let vocab = cfg.vocab_size;
    assert_eq!(out.logits.len(), logit_positions.len());
    for (j, (pos, logits)) in out.logits.iter().enumerate() {
        assert_eq!(*pos, logit_positions[j]);
        let a: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let (err, i) = normalised_error(&a, &ref_logits[j * vocab..(j + 1) * vocab]);
        eprintln!("logits at {pos}: normalised error {err:.3e}");
        assert!(
            err < 1e-3,
            "{what}: first divergence: logits at position {pos}: normalised error {err:.3e} at token {i}: \
             ours {} vs transformers {}",
            a[i],
            ref_logits[j * vocab + i]
        );
    }
}
