//! Golden test: the DeepSeek-V4.1 CPU forward against SGLang's pure-torch V4.1 reference
//! modules run in float32 (exact mode: no fake quantisation).
//!
//! `tests/fixtures/v41_tiny_golden.safetensors` was written by
//! `tests/reference/make_golden_v41.py` (tests/reference/README.md) from `needlescope synth
//! --preset v41-tiny --format bf16 --seed 0` with a candidate budget of 16 blocks (the what-if
//! `candidate_blocks`), so that a 320-token prompt drops blocks at the consumers. The test
//! rebuilds that checkpoint, checks it is the one the fixture was made from, runs the same ids
//! one-shot, in irregular chunks and token by token, and demands of each:
//! - the residual streams after every layer at the sampled positions and the logits: error
//!   < 1e-3 relative to the tensor's largest magnitude;
//! - every index source's ranked scores: the same -inf pattern (visibility and, on the
//!   consumers, the candidate mask) and error < 1e-4 relative to the row's largest score;
//! - the candidate source's kept blocks and every index source's selected rows as sets, except
//!   at queries whose cut-off is near-tied (the reference's torch.topk order is unspecified);
//! - layer 8's unconstrained scores against a reference run without the candidate stage.

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::forward::LogitsRequest;
use needlescope::model::v41::{ModelV41, V41Options};
use needlescope::synth::v41::synth_v41;
use needlescope::synth::{Preset, SynthOptions};
use needlescope::tokenizer::V4Tokenizer;
use needlescope_testkit::cli::tensor_f32;
use needlescope_testkit::engine::Recorder;
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/v41_tiny_golden.safetensors"
);

struct Fixture {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
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
        let tensors = st
            .names()
            .into_iter()
            .map(|name| (name.to_string(), tensor_f32(&st, name)))
            .collect();
        Fixture { tensors, metadata }
    }

    fn get(&self, name: &str) -> &(Vec<usize>, Vec<f32>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("fixture lacks tensor {name}"))
    }

    fn row(&self, name: &str, i: usize) -> &[f32] {
        let (shape, v) = self.get(name);
        let w: usize = shape[1..].iter().product();
        &v[i * w..(i + 1) * w]
    }
}

fn sha256_hex(path: &std::path::Path) -> String {
    let mut h = Sha256::new();
    h.update(std::fs::read(path).expect("readable"));
    format!("{:x}", h.finalize())
}

/// `|got - want| <= rel · max|want|` elementwise, -inf exactly where the fixture has it.
fn check_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_infinite() || g.is_infinite() {
            assert_eq!(g, w, "{what}: -inf pattern differs at index {i}");
            continue;
        }
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}: index {i}: got {g}, want {w} (scale {scale})"
        );
    }
}

/// Whether the cut-off between the k-th and (k+1)-th best finite values of `row` is within
/// `tol` (the set of the best k is then not defined by the reference).
fn near_tie(row: &[f32], k: usize, tol: f32) -> bool {
    let mut v: Vec<f32> = row.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() <= k {
        return false;
    }
    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
    v[k - 1] - v[k] <= tol
}

fn set_of(v: &[f32]) -> Vec<i64> {
    let mut s: Vec<i64> = v.iter().filter(|&&x| x >= 0.0).map(|&x| x as i64).collect();
    s.sort_unstable();
    s
}

#[test]
fn v41_forward_matches_the_sglang_reference_in_every_chunking() {
    let fx = Fixture::load();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v41");
    let opts = SynthOptions::new(Preset::V41Tiny, WeightFormat::Bf16, &out);
    synth_v41(&opts, None, &mut |_, _| {}).expect("synth v41-tiny");
    let regen = "the fixture is stale: regenerate it (tests/reference/README.md, V4.1)";
    assert_eq!(
        sha256_hex(&out.join("config.json")),
        fx.metadata["config_sha256"],
        "{regen}"
    );
    assert_eq!(
        sha256_hex(&out.join("model.safetensors")),
        fx.metadata["safetensors_sha256"],
        "{regen}"
    );
    let ckpt = Checkpoint::open_v41(&out).expect("open v41");
    let tok = V4Tokenizer::builtin().unwrap();
    let blocks: usize = fx.metadata["candidate_blocks"].parse().unwrap();
    let tokens: Vec<u32> = fx.get("tokens").1.iter().map(|&v| v as u32).collect();
    let t_len = tokens.len();
    let positions: Vec<usize> = fx.get("positions").1.iter().map(|&v| v as usize).collect();
    let logit_pos: Vec<usize> = fx
        .get("logit_positions")
        .1
        .iter()
        .map(|&v| v as usize)
        .collect();
    let cfg = ckpt.config().clone();
    let text = &cfg.text;
    let k = text.index_topk;
    let src = cfg.candidate_source().unwrap();
    let block = text.candidate_block_size;

    // (chunk sizes of the calls, what)
    let plans: [(&[usize], &str); 3] = [
        (&[t_len], "one-shot"),
        (&[7, 50, 1, 129, 133], "irregular chunks"),
        (&[1; 320], "token by token"),
    ];
    let model_opts = V41Options {
        candidate_blocks: Some(blocks),
        chunk: 64,
        ..V41Options::default()
    };
    let model = ModelV41::load(&ckpt, &tok, model_opts).expect("load v41");
    for (calls, what) in plans {
        assert_eq!(
            calls.iter().sum::<usize>(),
            t_len,
            "{what}: plan covers the prompt"
        );
        let mut state = model.new_sequence();
        let mut rec = Recorder::all(&["layers."]);
        let mut logits = BTreeMap::new();
        let mut at = 0;
        for &n in calls {
            let want: Vec<usize> = logit_pos
                .iter()
                .copied()
                .filter(|p| (at..at + n).contains(p))
                .collect();
            let o = model
                .forward(
                    &mut state,
                    &tokens[at..at + n],
                    &mut rec,
                    LogitsRequest::Positions(want),
                )
                .unwrap();
            logits.extend(o.logits);
            at += n;
        }
        let mut dropped = 0;
        let mut tied = 0;
        for &l in &text.index_source_layer_ids {
            let sname = format!("layers.{l}.indexer.scores");
            for t in 0..t_len {
                let want = fx.row(&sname, t);
                let got = rec.row(&sname, t);
                // Rows the chunk had not emitted yet are absent from ours: pad with -inf.
                let mut g = vec![f32::NEG_INFINITY; want.len()];
                g[..got.len().min(want.len())].copy_from_slice(&got[..got.len().min(want.len())]);
                // A consumer's mask follows the candidate source's kept blocks, which a
                // near-tie at the source's cut-off may legitimately flip.
                let src_row = fx.row(&format!("layers.{src}.indexer.scores"), t);
                let blocks_tied = {
                    let mut bs: Vec<f32> = src_row
                        .chunks(block)
                        .map(|c| c.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                        .collect();
                    let n_t = t + 1;
                    let pinned = (n_t - 1) / block;
                    bs[pinned] = f32::NEG_INFINITY;
                    near_tie(&bs, blocks - 1, 1e-5)
                };
                let is_consumer = l > src;
                if is_consumer && blocks_tied {
                    tied += 1;
                    continue;
                }
                check_close(&g, want, 1e-4, &format!("{what}: {sname} query {t}"));
                let tname = format!("layers.{l}.indexer.topk");
                if near_tie(want, k, 1e-5) {
                    tied += 1;
                    continue;
                }
                assert_eq!(
                    set_of(rec.row(&tname, t)),
                    set_of(fx.row(&format!("layers.{l}.indexer.selected"), t)),
                    "{what}: layer {l} query {t}: selected rows differ"
                );
            }
        }
        let kname = format!("layers.{src}.candidates.kept_blocks");
        for t in 0..t_len {
            let want = fx.row(&format!("layers.{src}.candidates.kept"), t);
            let got = rec.row(&kname, t);
            let n = want.len().min(got.len());
            let visible = (t + 1).div_ceil(block);
            dropped += visible - want[..visible].iter().filter(|&&v| v == 1.0).count();
            let src_row = fx.row(&format!("layers.{src}.indexer.scores"), t);
            let mut bs: Vec<f32> = src_row
                .chunks(block)
                .map(|c| c.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                .collect();
            bs[t / block] = f32::NEG_INFINITY;
            if !near_tie(&bs, blocks - 1, 1e-5) {
                assert_eq!(&got[..n], &want[..n], "{what}: kept blocks of query {t}");
            }
        }
        let first: usize = fx.metadata["first_consumer"].parse().unwrap();
        let fname = format!("layers.{first}.indexer.scores_unconstrained");
        for t in 0..t_len {
            let want = fx.row(&fname, t);
            let got = rec.row(&fname, t);
            let mut g = vec![f32::NEG_INFINITY; want.len()];
            g[..got.len()].copy_from_slice(got);
            check_close(&g, want, 1e-4, &format!("{what}: {fname} query {t}"));
        }
        for (i, &p) in positions.iter().enumerate() {
            for l in 0..text.num_hidden_layers {
                let name = format!("layers.{l}.hidden");
                check_close(
                    rec.row(&name, p),
                    fx.row(&name, i),
                    1e-3,
                    &format!("{what}: {name} at {p}"),
                );
            }
        }
        for (i, &p) in logit_pos.iter().enumerate() {
            check_close(
                &logits[&p],
                fx.row("logits", i),
                1e-3,
                &format!("{what}: logits at {p}"),
            );
        }
        assert!(
            dropped > 1000,
            "{what}: the candidate stage dropped {dropped} visible blocks"
        );
        assert!(tied < t_len, "{what}: {tied} near-tied queries skipped");
    }
}

#[test]
fn engram_token_classes_of_the_bundled_tokenizer_match_the_reference_map() {
    // 99,092 classes is the release's engram_compressed_vocab_size; the sha256 is of the
    // reference's `build_compressed_token_map` over the same tokenizer (u32 little-endian).
    let tok = V4Tokenizer::builtin().unwrap();
    let (classes, count) = tok.engram_classes().unwrap();
    assert_eq!(count, 99_092);
    let mut h = Sha256::new();
    for c in &classes {
        h.update(c.to_le_bytes());
    }
    assert_eq!(
        format!("{:x}", h.finalize()),
        "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481"
    );
}

#[test]
fn v41_quantisers_match_the_reference_on_their_own_inputs() {
    // tests/fixtures/v41_quant_golden.safetensors: SGLang's torch_quant (the quantisers of its
    // V4.1 reference modules) on inputs spanning every binade, zeros, ties and overflow
    // (tests/reference/make_quant_golden_v41.py). Equal bit for bit.
    use needlescope::numerics::quant::{fp4_sim_e4m3_scale, fp4_sim_pow2_rne, fp8_sim_pow2};
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/v41_quant_golden.safetensors"
    ))
    .unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |n: &str| tensor_f32(&st, n).1;
    let x = get("x");
    type Quantiser<'a> = &'a dyn Fn(&mut [f32]);
    let cases: [(&str, Quantiser); 3] = [
        ("window_fp8", &|r| fp8_sim_pow2(r, 32)),
        ("index_fp4", &|r| fp4_sim_pow2_rne(r, 32)),
        ("compressed_fp4", &|r| fp4_sim_e4m3_scale(r, 16)),
    ];
    for (name, f) in cases {
        let want = get(name);
        let mut got = x.clone();
        for row in got.chunks_mut(512) {
            f(row);
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (*g == 0.0 && *w == 0.0),
                "{name}: element {i} (x = {}): got {g}, want {w}",
                x[i]
            );
        }
    }
}

#[test]
fn the_v41_tokenizer_has_its_system_token_and_the_same_engram_classes() {
    // DeepSeek-V4.1's tokenizer as far as it is known: V4's with 128799 named <｜System｜>
    // (docs/spec/v41.md 6). Renaming a unique special token keeps every Engram class id.
    let (v4, v41) = (
        V4Tokenizer::builtin().unwrap(),
        V4Tokenizer::builtin_v41().unwrap(),
    );
    assert!(!v4.has_v41_system_token());
    assert!(v41.has_v41_system_token());
    assert_eq!(v41.encode("a<｜System｜>b").unwrap().len(), 3);
    let (c4, n4) = v4.engram_classes().unwrap();
    let (c41, n41) = v41.engram_classes().unwrap();
    assert_eq!((n4, n41), (99_092, 99_092));
    assert_eq!(c4, c41);
}
