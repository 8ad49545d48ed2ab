//! `needlescope trace` through the binary: the file layout of docs/outputs.md, scores that
//! can be recomputed from the dumped raw inputs under any profile, and a top-k that agrees with
//! the scores.

use needlescope::checkpoint::WeightFormat;
use needlescope::numerics::profiles::{prepare_key_row, prepare_query, score, IndexProfile};
use needlescope::synth::{synth, Preset, SynthOptions};
use safetensors::SafeTensors;
use std::process::Command;

fn f32s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let v = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("trace lacks {name}"));
    let data = v
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (v.shape().to_vec(), data)
}

fn i32s(st: &SafeTensors, name: &str) -> Vec<i32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A bf16 `tiny` checkpoint in `dir/tiny`.
fn tiny_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("tiny");
    synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, &model),
        None,
    )
    .unwrap();
    model
}

/// `trace --positions all` of `tokens` through `model` into `out`.
fn trace_all_positions(
    model: &std::path::Path,
    tokens: &std::path::Path,
    out: &std::path::Path,
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["trace", "--model"])
        .arg(model)
        .arg("--tokens")
        .arg(tokens)
        .args(["--positions", "all", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

fn run_trace(
    model: &std::path::Path,
    tokens: &std::path::Path,
    profile: &str,
    out: &std::path::Path,
) {
    let output = Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["trace", "--model"])
        .arg(model)
        .arg("--tokens")
        .arg(tokens)
        .args([
            "--positions",
            "5,150,299",
            "--index",
            profile,
            "--dump-indexer-inputs",
            "--chunk",
            "64",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "trace failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn trace_scores_recompute_from_dumped_inputs_under_each_profile() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Official, &model),
        None,
    )
    .unwrap();
    let tokens_file = dir.path().join("ids.json");
    let ids: Vec<String> = (0..300u32)
        .map(|i| ((i.wrapping_mul(2654435761u32)) % 4093 + 3).to_string())
        .collect();
    std::fs::write(&tokens_file, format!("[{}]", ids.join(", "))).unwrap();

    for profile in ["exact", "fp8", "official-fp4"] {
        let out = dir.path().join(format!("trace-{profile}.safetensors"));
        run_trace(&model, &tokens_file, profile, &out);
        let bytes = std::fs::read(&out).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap();
        let p: IndexProfile = profile.parse().unwrap();
        assert_eq!(meta["profile"], p.name());
        // tiny: 16 index heads of 32, so the scale is 2^-4.5 (2^-6.5 only at Flash dims).
        let scale: f32 = meta["index_weight_scale"].parse().unwrap();
        assert_eq!(scale, (1.0 / 512f64.sqrt()) as f32);
        let positions: Vec<usize> = [5usize, 150, 299].to_vec();
        for layer in [1usize, 3] {
            let (sshape, scores) = f32s(&st, &format!("layers.{layer}.indexer.scores"));
            assert_eq!(sshape, vec![3, 75]);
            let (qshape, q) = f32s(&st, &format!("layers.{layer}.indexer.q"));
            let (_, w) = f32s(&st, &format!("layers.{layer}.indexer.weights"));
            let (kshape, keys) = f32s(&st, &format!("layers.{layer}.indexer.keys"));
            let topk = i32s(&st, &format!("layers.{layer}.indexer.topk"));
            let (heads, dim) = (qshape[1], qshape[2]);
            assert_eq!(kshape, vec![75, dim]);
            for (i, &t) in positions.iter().enumerate() {
                let visible = (t + 1) / 4;
                let pq = prepare_query(
                    p,
                    &q[i * heads * dim..(i + 1) * heads * dim],
                    &w[i * heads..(i + 1) * heads],
                    heads,
                    dim,
                );
                let mut prepared = vec![0.0f32; dim];
                for row in 0..75 {
                    let got = scores[i * 75 + row];
                    if row >= visible {
                        assert_eq!(
                            got,
                            f32::NEG_INFINITY,
                            "{profile} layer {layer} t {t} row {row} must be invisible"
                        );
                        continue;
                    }
                    let s = prepare_key_row(p, &keys[row * dim..(row + 1) * dim], &mut prepared);
                    let want = score(p, &pq, &prepared, s);
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{profile} layer {layer} t {t} row {row}: trace {got} vs recomputed {want}"
                    );
                }
                // The selection is the top of the scores, ties to the lower row, -1 padding.
                let mut order: Vec<usize> = (0..visible).collect();
                order.sort_by(|&a, &b| {
                    scores[i * 75 + b]
                        .total_cmp(&scores[i * 75 + a])
                        .then(a.cmp(&b))
                });
                let k = topk.len() / 3;
                let want: Vec<i32> = (0..k)
                    .map(|j| order.get(j).map_or(-1, |&r| r as i32))
                    .collect();
                assert_eq!(
                    &topk[i * k..(i + 1) * k],
                    &want[..],
                    "{profile} layer {layer} t {t} top-k"
                );
            }
        }
    }
}

#[test]
fn trace_rejects_a_token_id_outside_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens_file = dir.path().join("ids.txt");
    std::fs::write(&tokens_file, "0 5 99999 7").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["trace", "--model"])
        .arg(&model)
        .arg("--tokens")
        .arg(&tokens_file)
        .arg("--out")
        .arg(dir.path().join("t.safetensors"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("the token at position 2 (0-based) is id 99999")
            && stderr.contains("vocab_size 4096")
            && stderr.contains("ids.txt"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Fewer than four tokens: no compressed row is visible yet, so the indexer tensors have zero
/// rows (zero bytes); the trace is still written whole, readable, with the shapes docs/outputs.md
/// gives, and no `.partial` file is left beside it.
#[test]
fn trace_of_fewer_than_four_tokens_has_empty_indexer_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    for count in [1usize, 3] {
        let tokens_file = dir.path().join(format!("ids{count}.txt"));
        let ids: Vec<String> = (0..count).map(|i| (5 + i).to_string()).collect();
        std::fs::write(&tokens_file, ids.join(" ")).unwrap();
        let out = dir.path().join(format!("t{count}.safetensors"));
        let output = trace_all_positions(&model, &tokens_file, &out);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{count} tokens: {stderr}");
        // The closing line counts in words that agree with the numbers, and says the size.
        let said = String::from_utf8_lossy(&output.stdout);
        let words = if count == 1 {
            "traced 1 token, 1 position, "
        } else {
            "traced 3 tokens, 3 positions, "
        };
        let size = std::fs::metadata(&out).unwrap().len();
        assert!(
            said.contains(words) && said.contains(&needlescope::units::human_bytes(size)),
            "{said}"
        );
        let bytes = std::fs::read(&out).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let scores: Vec<String> = st
            .names()
            .into_iter()
            .filter(|n| n.ends_with("indexer.scores"))
            .map(|n| n.to_string())
            .collect();
        assert!(!scores.is_empty(), "tiny has CSA layers");
        for name in scores {
            let (shape, data) = f32s(&st, &name);
            assert_eq!(shape, vec![count, 0], "{name}");
            assert!(data.is_empty());
            let topk = name.replace("scores", "topk");
            let t = st.tensor(&topk).unwrap();
            assert_eq!(t.shape()[0], count, "{topk}");
            // No row is visible: every slot is the -1 padding.
            assert!(i32s(&st, &topk).iter().all(|&r| r == -1), "{topk}");
        }
        let (shape, _) = f32s(&st, "logits");
        assert_eq!(shape, vec![count, 4096]);
        let mut partial = out.clone().into_os_string();
        partial.push(".partial");
        assert!(!std::path::Path::new(&partial).exists());
    }
}

/// Inputs that would be overwritten, shadowed or misread are refused before anything runs,
/// naming the flag: --out as the token file, inside the model directory, or a directory; a
/// position given twice; an empty entry in the token file; a top-k past every row.
#[test]
fn trace_refuses_outputs_over_its_inputs_and_ambiguous_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens_file = dir.path().join("ids.txt");
    std::fs::write(&tokens_file, "5 6 7 8 9 10").unwrap();
    let weights: Vec<_> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let before: Vec<Vec<u8>> = weights.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let trace = |out: &std::path::Path, tokens: &std::path::Path, extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_needlescope"))
            .args(["trace", "--device", "cpu", "--model"])
            .arg(&model)
            .arg("--tokens")
            .arg(tokens)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        // 1: refused by the command; 2: a flag value clap refuses (usage error).
        assert!(matches!(output.status.code(), Some(1 | 2)), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let e = trace(&tokens_file, &tokens_file, &[]);
    assert!(e.contains("is the token file given to --tokens"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&tokens_file).unwrap(),
        "5 6 7 8 9 10"
    );
    let e = trace(&model.join("model.safetensors"), &tokens_file, &[]);
    assert!(e.contains("inside the model directory"), "{e}");
    let e = trace(&model.join("new.safetensors"), &tokens_file, &[]);
    assert!(e.contains("inside the model directory"), "{e}");
    // Also under folders that do not exist yet (none is made), and no `..` among those
    // folders can step around the check.
    let e = trace(&model.join("sub/new.safetensors"), &tokens_file, &[]);
    assert!(e.contains("inside the model directory"), "{e}");
    assert!(!model.join("sub").exists());
    // A file where a folder of --out should be is named as such (not "File exists").
    let e = trace(&tokens_file.join("a.safetensors"), &tokens_file, &[]);
    assert!(e.contains("ids.txt is a file, expected a folder"), "{e}");
    let around = dir.path().join("new/../tiny/model.safetensors");
    let e = trace(&around, &tokens_file, &[]);
    assert!(
        e.contains("`..` or `.` among the folders still to be made"),
        "{e}"
    );
    assert!(!dir.path().join("new").exists());
    // A refused trace makes no folder and no file.
    let e = trace(&dir.path().join("x/y/t.safetensors"), &tokens_file, &[]);
    assert!(e.contains("x/y does not exist"), "{e}");
    assert!(!dir.path().join("x").exists());
    let e = trace(
        &dir.path().join("t99.safetensors"),
        &tokens_file,
        &["--positions", "99"],
    );
    assert!(e.contains("position 99 is outside"), "{e}");
    assert!(!dir.path().join("t99.safetensors").exists());
    let after: Vec<Vec<u8>> = weights.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(before == after, "the model directory is untouched");
    let out_dir = dir.path().join("a-dir");
    std::fs::create_dir(&out_dir).unwrap();
    let e = trace(&out_dir, &tokens_file, &[]);
    assert!(e.contains("is a directory"), "{e}");
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
    assert!(!dir.path().join("a-dir.partial").exists());

    let out = dir.path().join("t.safetensors");
    let e = trace(&out, &tokens_file, &["--positions", "3,5,3"]);
    assert!(
        e.contains("--positions: expected each value once, found 3 twice"),
        "{e}"
    );
    let gappy = dir.path().join("gappy.txt");
    std::fs::write(&gappy, "5,6,,7").unwrap();
    let e = trace(&out, &gappy, &[]);
    assert!(e.contains("gappy.txt") && e.contains("empty entry"), "{e}");
    let e = trace(&out, &tokens_file, &["--topk", "100000000"]);
    assert!(e.contains("--topk 100000000: expected at most"), "{e}");
    assert!(!out.exists());

    // A folder of --out that does not exist is refused by name, and none is made.
    let nested = dir.path().join("n1/n2/t.safetensors");
    let refused = Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["trace", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--tokens")
        .arg(&tokens_file)
        .arg("--out")
        .arg(&nested)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("n1/n2") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(!dir.path().join("n1").exists(), "no folder made");
}

/// The file a trace writes, and what it holds in memory before that, are what
/// `TraceLayout` computes before the model runs (which is what the room check relies on):
/// tensor names, shapes and order, data bytes, and the bytes of the recorded vectors.
#[test]
fn trace_size_is_known_before_the_run() {
    use needlescope::checkpoint::Checkpoint;
    use needlescope::model::forward::{Model, ModelOptions};
    use needlescope::run::trace::{LogitsMode, TraceLayout};
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let ckpt = Checkpoint::open(&model).unwrap();
    let cfg = ckpt.config().clone();
    let tokens: Vec<u32> = (0..203u32).map(|i| (i * 37) % 4000 + 3).collect();
    let engine = Model::load(
        &ckpt,
        ModelOptions {
            chunk: 64,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let all: Vec<usize> = (0..tokens.len()).collect();
    for (positions, dump) in [(vec![5usize, 150, 202], true), (all, false)] {
        let mut progress = Vec::new();
        let result = needlescope::run::trace::run_trace(
            &engine,
            &tokens,
            &positions,
            dump,
            LogitsMode::All,
            &mut |d, t| progress.push((d, t)),
        )
        .unwrap();
        // One report per engine chunk of 64 tokens.
        assert_eq!(progress, [(64, 203), (128, 203), (192, 203), (203, 203)]);
        // The logits of a chunk-by-chunk trace equal one forward's over all tokens.
        let mut state = engine.new_sequence();
        let whole = engine
            .forward(
                &mut state,
                &tokens,
                &mut needlescope::model::observer::NoObserver,
                needlescope::model::LogitsRequest::Positions(positions.clone()),
            )
            .unwrap();
        let whole: Vec<Vec<f32>> = whole.logits.into_iter().map(|(_, l)| l).collect();
        assert!(whole == result.logits, "dump {dump}");
        let layout = TraceLayout::for_config(
            &cfg,
            tokens.len(),
            positions.len(),
            engine.topk(),
            dump,
            LogitsMode::All,
        );
        let recorded: usize = result
            .indexer
            .values()
            .flatten()
            .map(|(s, sel)| 4 * (s.len() + sel.len()))
            .chain(
                result
                    .inputs
                    .values()
                    .flatten()
                    .map(|(q, w)| 4 * (q.len() + w.len())),
            )
            .chain(result.keys.values().map(|k| 4 * k.len()))
            .chain(result.logits.iter().map(|l| 4 * l.len()))
            .sum();
        assert_eq!(
            layout.memory_bytes(&positions),
            recorded as u64,
            "dump {dump}"
        );

        let out = dir.path().join(format!("t-{dump}.safetensors"));
        needlescope::run::trace::write_trace(&out, &result, Default::default()).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(
            (bytes.len() - 8 - header) as u64,
            layout.file_bytes(),
            "dump {dump}"
        );
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut stored: Vec<_> = st.tensors();
        stored.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
        let stored: Vec<(String, Vec<usize>)> = stored
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec()))
            .collect();
        let expected: Vec<(String, Vec<usize>)> = layout
            .tensors()
            .into_iter()
            .filter(|t| t.bytes() > 0)
            .map(|t| (t.name, t.shape))
            .collect();
        let stored_nonempty: Vec<_> = stored
            .into_iter()
            .filter(|(_, s)| s.iter().product::<usize>() > 0)
            .collect();
        assert_eq!(stored_nonempty, expected, "dump {dump}");
    }
}

/// A trace whose file or records cannot fit (here `--positions all` over a million tokens of
/// a two-million-word vocabulary: terabytes of logits) is refused before the model runs,
/// naming --out and --positions, and leaves no file.
#[test]
fn trace_that_cannot_fit_is_refused_before_the_model_runs() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = model.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["vocab_size"] = serde_json::json!(2_000_000);
    v["max_position_embeddings"] = serde_json::json!(1 << 20);
    std::fs::write(&config, v.to_string()).unwrap();
    let tokens_file = dir.path().join("ids.txt");
    std::fs::write(&tokens_file, "5 ".repeat(1_000_000)).unwrap();
    let out = dir.path().join("huge.safetensors");
    let output = trace_all_positions(&model, &tokens_file, &out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for part in [
        "--out",
        "1,000,000 positions over 1,000,000 tokens does not fit",
        "TiB",
        "--positions last",
    ] {
        assert!(stderr.contains(part), "missing {part:?} in: {stderr}");
    }
    assert!(!out.exists());
}

// ---------------------------------------------------------------------------------------------
// --logits and the size line
// ---------------------------------------------------------------------------------------------

/// `trace --device cpu` of `tokens` through `model` into `out`, plus `extra` flags.
fn trace_with(
    model: &std::path::Path,
    tokens: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["trace", "--device", "cpu", "--model"])
        .arg(model)
        .arg("--tokens")
        .arg(tokens)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// A token file of `n` ids inside tiny's vocabulary, in `dir`.
fn token_file(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let path = dir.join(format!("ids{n}.txt"));
    let ids: Vec<String> = (0..n).map(|i| ((i * 37) % 4000 + 3).to_string()).collect();
    std::fs::write(&path, ids.join(" ")).unwrap();
    path
}

/// The trace file's metadata entry `key`.
fn meta(bytes: &[u8], key: &str) -> String {
    let (_, m) = SafeTensors::read_metadata(bytes).unwrap();
    m.metadata().clone().unwrap()[key].clone()
}

/// The size line `trace` prints on stderr.
fn size_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("trace: ") && l.contains(" to write to "))
        .collect();
    assert_eq!(lines.len(), 1, "one size line in: {stderr}");
    lines[0]
}

/// Up to 16 recorded positions keep every logit; more keep the top 20 with their token ids,
/// unless `--logits` says otherwise; the mode is in the metadata and the closing line.
#[test]
fn trace_logits_default_to_all_up_to_16_positions_else_top_20() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens = token_file(dir.path(), 40);
    let sixteen: Vec<String> = (0..16).map(|p| (p * 2).to_string()).collect();
    let sixteen = sixteen.join(",");
    for (positions, rows, mode) in [(sixteen.as_str(), 16usize, "all"), ("all", 40, "top:20")] {
        let out = dir.path().join(format!("t-{rows}.safetensors"));
        let output = trace_with(&model, &tokens, &out, &["--positions", positions]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(stdout.contains(&format!("logits {mode})")), "{stdout}");
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(meta(&bytes, "logits"), mode);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let logits: Vec<String> = st
            .names()
            .into_iter()
            .filter(|n| n.starts_with("logits"))
            .map(str::to_string)
            .collect();
        if mode == "all" {
            assert_eq!(logits, ["logits"]);
            assert_eq!(st.tensor("logits").unwrap().shape(), [rows, 4096]);
        } else {
            let values = st.tensor("logits.top.values").unwrap();
            let ids = st.tensor("logits.top.ids").unwrap();
            assert_eq!(logits.len(), 2, "{logits:?}");
            assert_eq!(values.shape(), [rows, 20]);
            assert_eq!(values.dtype(), safetensors::Dtype::F32);
            assert_eq!(ids.shape(), [rows, 20]);
            assert_eq!(ids.dtype(), safetensors::Dtype::I64);
        }
    }
}

/// `--logits top:N` keeps, per position, exactly the N largest of the logits `--logits all`
/// writes for the same input (values bit for bit, descending, ties to the lower token id) and
/// their token ids; everything else in the file is the same.
#[test]
fn trace_top_logits_are_the_top_of_the_full_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens = token_file(dir.path(), 40);
    let (all, top) = (
        dir.path().join("all.safetensors"),
        dir.path().join("top.safetensors"),
    );
    for (out, mode) in [(&all, "all"), (&top, "top:7")] {
        let output = trace_with(
            &model,
            &tokens,
            out,
            &["--positions", "all", "--logits", mode],
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let (all_bytes, top_bytes) = (std::fs::read(&all).unwrap(), std::fs::read(&top).unwrap());
    let (all_st, top_st) = (
        SafeTensors::deserialize(&all_bytes).unwrap(),
        SafeTensors::deserialize(&top_bytes).unwrap(),
    );
    assert_eq!(meta(&top_bytes, "logits"), "top:7");
    let (shape, full) = f32s(&all_st, "logits");
    assert_eq!(shape, [40, 4096]);
    let (tshape, values) = f32s(&top_st, "logits.top.values");
    assert_eq!(tshape, [40, 7]);
    let ids: Vec<i64> = top_st
        .tensor("logits.top.ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for p in 0..40 {
        let row = &full[p * 4096..(p + 1) * 4096];
        let mut order: Vec<usize> = (0..4096).collect();
        // Stable: equal values keep the lower token id first.
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        for j in 0..7 {
            let (id, value) = (ids[p * 7 + j], values[p * 7 + j]);
            assert_eq!(id, order[j] as i64, "position {p}, rank {j}");
            assert_eq!(
                value.to_bits(),
                row[order[j]].to_bits(),
                "position {p}, rank {j}"
            );
        }
    }
    // The indexer tensors do not depend on the logits kept.
    for (name, view) in all_st.tensors() {
        if !name.starts_with("logits") {
            assert_eq!(top_st.tensor(&name).unwrap().data(), view.data(), "{name}");
        }
    }
}

/// `--logits none` writes no logits tensor, and says so in the size line and the metadata.
#[test]
fn trace_logits_none_writes_no_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens = token_file(dir.path(), 40);
    let out = dir.path().join("none.safetensors");
    let output = trace_with(&model, &tokens, &out, &["--logits", "none"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(size_line(&stderr).contains("logits none"), "{stderr}");
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(meta(&bytes, "logits"), "none");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<&str> = st.names();
    assert!(names.iter().all(|n| !n.starts_with("logits")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("indexer.scores")));
}

/// Before the model runs, one line on stderr gives the size of the file and what it holds:
/// logits and indexer to the byte of what is then written, the total within the header's
/// estimate. A trace refused for room prints it too, before the refusal (so before anything
/// is written).
#[test]
fn trace_prints_the_file_size_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens = token_file(dir.path(), 40);
    for (mode, label) in [("all", "(all: 40 x 4,096)"), ("top:3", "(top:3: 40 x 3 ")] {
        let out = dir.path().join(format!("t-{mode}.safetensors"));
        let output = trace_with(
            &model,
            &tokens,
            &out,
            &[
                "--positions",
                "all",
                "--logits",
                mode,
                "--dump-indexer-inputs",
            ],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let line = size_line(&stderr);
        let bytes = std::fs::read(&out).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let sum = |keep: &dyn Fn(&str) -> bool| -> u64 {
            st.tensors()
                .iter()
                .filter(|(n, _)| keep(n))
                .map(|(_, v)| v.data().len() as u64)
                .sum()
        };
        let human = needlescope::units::human_bytes;
        let logits = sum(&|n| n.starts_with("logits"));
        let indexer = sum(&|n| n.starts_with("layers."));
        let inputs = sum(&|n| {
            n.starts_with("layers.")
                && (n.ends_with(".q") || n.ends_with(".keys") || n.ends_with(".weights"))
        });
        assert!(inputs > 0);
        for part in [
            format!("logits {} {label}", human(logits)),
            format!("indexer {} (raw inputs {})", human(indexer), human(inputs)),
            format!(" to write to {}", out.display()),
        ] {
            assert!(line.contains(&part), "{part:?} not in: {line}");
        }
        let len = bytes.len() as u64;
        let total = line
            .strip_prefix("trace: ")
            .and_then(|l| l.split(" to write to ").next())
            .unwrap();
        assert!(
            (len - 256..=len + 256).any(|n| human(n) == total),
            "total {total} vs the file's {len} bytes: {line}"
        );
    }

    // Refused for room (terabytes of indexer scores): the size line comes first.
    let config = model.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["max_position_embeddings"] = serde_json::json!(1 << 20);
    std::fs::write(&config, v.to_string()).unwrap();
    let huge = dir.path().join("huge.txt");
    std::fs::write(&huge, "5 ".repeat(1_000_000)).unwrap();
    let out = dir.path().join("huge.safetensors");
    let output = trace_with(&model, &huge, &out, &["--positions", "all"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let line = size_line(&stderr);
    assert!(
        line.contains("TiB to write to") && line.contains("top:20: 1,000,000 x 20"),
        "{line}"
    );
    let refusal = stderr.find("does not fit").expect("refused");
    assert!(stderr.find(line).unwrap() < refusal, "{stderr}");
    assert!(stderr.contains("--logits top:20 now"), "{stderr}");
    assert!(!out.exists());
}

/// Bad `--logits` values are refused naming the flag and what it accepts (a usage error, exit
/// 2); a top:N past the vocabulary names the vocabulary size (exit 1). Nothing is written.
#[test]
fn trace_refuses_bad_logits_values() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let tokens = token_file(dir.path(), 8);
    let out = dir.path().join("t.safetensors");
    for (value, code, words) in [
        ("foo", 2, &["--logits", "expected none, all or top:N"][..]),
        ("top:0", 2, &["--logits", "top:0", "at least 1"][..]),
        ("top:x", 2, &["--logits", "top:x", "not a whole number"][..]),
        ("top:4097", 1, &["--logits top:4097", "vocab_size 4096"][..]),
    ] {
        let output = trace_with(&model, &tokens, &out, &["--logits", value]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for w in words {
            assert!(stderr.contains(w), "{value}: {w:?} not in: {stderr}");
        }
        assert!(!out.exists());
    }
    // top:N equal to the vocabulary is every logit, sorted.
    let output = trace_with(&model, &tokens, &out, &["--logits", "top:4096"]);
    assert!(output.status.success());
}

/// What `TraceLayout` computes before the run holds under every `--logits` mode: the bytes
/// the recorded trace holds in memory, the file's data bytes, tensor names and shapes.
#[test]
fn trace_layout_follows_the_logits_mode() {
    use needlescope::checkpoint::Checkpoint;
    use needlescope::model::forward::{Model, ModelOptions};
    use needlescope::run::trace::{run_trace, write_trace, LogitsMode, TraceLayout};
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let ckpt = Checkpoint::open(&model).unwrap();
    let cfg = ckpt.config().clone();
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 37) % 4000 + 3).collect();
    let engine = Model::load(&ckpt, ModelOptions::default()).unwrap();
    let positions: Vec<usize> = (0..tokens.len()).collect();
    for mode in [LogitsMode::None, LogitsMode::Top(5), LogitsMode::All] {
        let result = run_trace(&engine, &tokens, &positions, false, mode, &mut |_, _| {}).unwrap();
        let layout = TraceLayout::for_config(&cfg, 70, 70, engine.topk(), false, mode);
        let recorded: usize = result
            .indexer
            .values()
            .flatten()
            .map(|(s, sel)| 4 * (s.len() + sel.len()))
            .chain(result.logits.iter().map(|l| 4 * l.len()))
            .chain(
                result
                    .top_logits
                    .iter()
                    .map(|t| 4 * t.values.len() + 4 * t.ids.len()),
            )
            .sum();
        assert_eq!(layout.memory_bytes(&positions), recorded as u64, "{mode}");
        let sizes = layout.sizes();
        assert_eq!(
            sizes.logits + sizes.indexer + sizes.indexer_inputs + sizes.other,
            layout.file_bytes()
        );
        let out = dir
            .path()
            .join(format!("t-{mode}.safetensors").replace(':', "-"));
        write_trace(&out, &result, Default::default()).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(
            (bytes.len() - 8 - header) as u64,
            layout.file_bytes(),
            "{mode}"
        );
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut stored: Vec<(String, Vec<usize>)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec()))
            .collect();
        stored.sort();
        let mut expected: Vec<(String, Vec<usize>)> = layout
            .tensors()
            .into_iter()
            .map(|t| (t.name, t.shape))
            .collect();
        expected.sort();
        assert_eq!(stored, expected, "{mode}");
        let logits_bytes: u64 = layout
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with("logits"))
            .map(|t| t.bytes())
            .sum();
        assert_eq!(sizes.logits, logits_bytes, "{mode}");
        match mode {
            LogitsMode::None => assert_eq!(sizes.logits, 0),
            LogitsMode::Top(n) => assert_eq!(sizes.logits, 70 * n as u64 * 12),
            LogitsMode::All => assert_eq!(sizes.logits, 70 * 4096 * 4),
        }
    }
}
