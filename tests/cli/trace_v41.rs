//! `trace` on a DeepSeek-V4.1 checkpoint through the binary (run::trace_v41): the file holds
//! every index source's scores and picks, the consumers' unconstrained ones, the candidate
//! stage's blocks and the dumped inputs, and they agree with each other; what V4.1 cannot do
//! yet (`--device cuda`) or ever (V4's `--kv fp8`, rotating profiles) and a budget too small for
//! the top-k are refused by name before anything is written.

use cli_support::{run, synth_v41_tiny, tensor_f32 as tensor};
use needlescope_testkit::cli as cli_support;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A bf16 v41-tiny and a token file of `n` ids in `tmp`.
fn setup(tmp: &Path, n: usize) -> (PathBuf, PathBuf) {
    let model = tmp.join("v41");
    synth_v41_tiny(&model);
    let ids: Vec<String> = (0..n)
        .map(|i| (3 + (i * 7919 + 17) % 129_000).to_string())
        .collect();
    let tokens = tmp.join("tokens.txt");
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    (model, tokens)
}

#[test]
fn trace_v41_records_both_stages_and_the_dump_recomputes_the_scores() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, tokens) = setup(tmp.path(), 200);
    let out = tmp.path().join("t.safetensors");
    run(&[
        "trace",
        "--model",
        &s(&model),
        "--tokens",
        &s(&tokens),
        "--positions",
        "all",
        "--candidate-blocks",
        "12",
        "--dump-indexer-inputs",
        "--logits",
        "top:3",
        "--out",
        &s(&out),
    ])
    .ok()
    .stdout_has(&["traced 200 tokens, 200 positions, 5 index sources"]);
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["family"], "deepseek_v41");
    assert_eq!(meta["candidate_blocks"], "12");
    let (k, block, t) = (64usize, 8usize, 200usize);
    // Layer 6 (the candidate source, ratio 1): 200 rows, 25 blocks.
    let (shape, kept) = tensor(&st, "layers.6.candidates.kept_blocks");
    assert_eq!(shape, vec![t, 25]);
    for q in 0..t {
        let row = &kept[q * 25..(q + 1) * 25];
        let visible_blocks = (q + 1).div_ceil(block);
        let n: usize = row.iter().filter(|&&v| v == 1.0).count();
        assert_eq!(n, visible_blocks.min(12), "query {q}: kept blocks");
        assert_eq!(row[q / block], 1.0, "query {q}: the newest block is pinned");
    }
    // Layer 8 (a consumer): scores are -inf outside the kept blocks, its picks inside them,
    // and the unconstrained picks are the top-k of the unconstrained scores.
    let (_, scores) = tensor(&st, "layers.8.indexer.scores");
    let (_, free) = tensor(&st, "layers.8.indexer.scores_unconstrained");
    let (_, topk) = tensor(&st, "layers.8.indexer.topk");
    let (_, topk_free) = tensor(&st, "layers.8.indexer.topk_unconstrained");
    let mut differs = 0;
    for q in 0..t {
        for r in 0..t {
            let in_kept = kept[q * 25 + r / block] == 1.0 && r <= q;
            let sc = scores[q * t + r];
            if in_kept {
                assert_eq!(sc, free[q * t + r], "query {q} row {r}");
            } else {
                assert_eq!(sc, f32::NEG_INFINITY, "query {q} row {r}");
            }
        }
        let picks = &topk[q * k..(q + 1) * k];
        for &p in picks.iter().filter(|&&p| p >= 0.0) {
            assert!(
                scores[q * t + p as usize].is_finite(),
                "query {q} picked {p}"
            );
        }
        let best = free[q * t + topk_free[q * k] as usize];
        let max = free[q * t..q * t + q + 1]
            .iter()
            .copied()
            .fold(f32::MIN, f32::max);
        assert_eq!(
            best, max,
            "query {q}: the first unconstrained pick is the best row"
        );
        differs += usize::from(picks != &topk_free[q * k..(q + 1) * k]);
    }
    assert!(
        differs > 50,
        "the candidate mask changed {differs} selections"
    );
    // The dump recomputes layer 2's exact scores: Σ_h w_h · S · ReLU(q_h · k_j).
    let (_, q) = tensor(&st, "layers.2.indexer.q");
    let (_, w) = tensor(&st, "layers.2.indexer.weights");
    let (kshape, keys) = tensor(&st, "layers.2.indexer.keys");
    let (_, sc2) = tensor(&st, "layers.2.indexer.scores");
    let (heads, dim, rows) = (4usize, 32usize, kshape[0]);
    assert_eq!(kshape, vec![100, dim]);
    let scale: f32 = meta["index_weight_scale"].parse().unwrap();
    for pos in [1usize, 99, 199] {
        // Rows visible at ratio 2: floor((pos + 1) / 2).
        let visible = pos.div_ceil(2);
        for r in 0..visible {
            let want: f32 = (0..heads)
                .map(|h| {
                    let qh = &q[(pos * heads + h) * dim..(pos * heads + h + 1) * dim];
                    let kr = &keys[r * dim..(r + 1) * dim];
                    let dot: f32 = qh.iter().zip(kr).map(|(a, b)| a * b).sum();
                    w[pos * heads + h] * scale * dot.max(0.0)
                })
                .sum();
            let got = sc2[pos * rows + r];
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1e-3),
                "pos {pos} row {r}: {got} vs {want}"
            );
        }
        if visible < rows {
            assert_eq!(
                sc2[pos * rows + visible],
                f32::NEG_INFINITY,
                "pos {pos}: next row hidden"
            );
        }
    }
}

#[test]
fn trace_v41_refuses_what_it_cannot_do_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, tokens) = setup(tmp.path(), 40);
    let out = tmp.path().join("t.safetensors");
    let base = |extra: &[&str]| {
        let mut a = vec![
            "trace".to_string(),
            "--model".into(),
            s(&model),
            "--tokens".into(),
            s(&tokens),
            "--out".into(),
            s(&out),
        ];
        a.extend(extra.iter().map(|x| x.to_string()));
        run(&a).fails()
    };
    base(&["--device", "cuda"]).stderr_has(&["--device cuda", "DeepSeek-V4.1 runs on the CPU"]);
    base(&["--kv", "fp8"]).stderr_has(&["kv is fp8", "exact or release"]);
    base(&["--index", "official-fp4"]).stderr_has(&["official-fp4", "without a Hadamard rotation"]);
    base(&["--candidate-blocks", "4"]).stderr_has(&[
        "candidate-blocks",
        "candidate-blocks is 4",
        "at least 8 blocks of 8 rows",
    ]);
    // --candidate-blocks on a DeepSeek-V4 model is refused by name.
    let v4 = tmp.path().join("tiny");
    cli_support::synth_tiny(&v4, &[]).ok();
    run(&[
        "trace",
        "--model",
        &s(&v4),
        "--tokens",
        &s(&tokens),
        "--candidate-blocks",
        "16",
        "--out",
        &s(&out),
    ])
    .fails()
    .stderr_has(&["--candidate-blocks is a DeepSeek-V4.1 what-if"]);
    // V4.1's numerics on a DeepSeek-V4 model are refused by name too.
    let small = tmp.path().join("small.txt");
    std::fs::write(&small, "0 5 9 11 400 3000").unwrap();
    for (flag, value, needle) in [
        ("--index", "v41-fp4", "index is v41-fp4"),
        ("--kv", "release", "kv is release"),
    ] {
        run(&[
            "trace",
            "--model",
            &s(&v4),
            "--tokens",
            &s(&small),
            flag,
            value,
            "--out",
            &s(&out),
        ])
        .fails()
        .stderr_has(&[needle]);
    }
    assert!(!out.exists(), "nothing written");
}

#[test]
fn trace_v41_renders_a_prompt_with_the_v41_encoder_and_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = setup(tmp.path(), 1);
    let prompt = tmp.path().join("p.json");
    std::fs::write(
        &prompt,
        r#"{"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Where is the key?"}],
            "chat_template_kwargs": {"thinking": true}, "reasoning_effort": "max"}"#,
    )
    .unwrap();
    let out = tmp.path().join("t.safetensors");
    let r = run(&[
        "trace",
        "--model",
        &s(&model),
        "--prompt",
        &s(&prompt),
        "--out",
        &s(&out),
    ])
    .ok();
    assert!(
        r.stderr
            .contains("using the bundled DeepSeek-V4 tokenizer with <｜System｜> at id 128799"),
        "{}",
        r.dump()
    );
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids: Vec<i64> = st
        .tensor("tokens")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // BOS, <｜System｜> (one id), then "Reasoning Effort: 100 ..." (thinking, effort max).
    assert_eq!(&ids[..2], &[0, 128_799], "{ids:?}");
    let tok = needlescope::tokenizer::V4Tokenizer::builtin_v41().unwrap();
    let text = tok
        .decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>())
        .unwrap();
    assert!(
        text.contains("Reasoning Effort: 100 (range 1-100"),
        "{text}"
    );
    assert!(
        text.ends_with("Where is the key?<｜Assistant｜><think>"),
        "{text}"
    );
}
