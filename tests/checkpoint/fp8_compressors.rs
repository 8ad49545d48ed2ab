//! Compressor and indexer linears stored as FP8 blocks (docs/spec/model.md section 9: the Flash
//! release stores them BF16, a Flash-Base checkpoint is reported to store them FP8; "trust the
//! safetensors dtype"). A checkpoint holding them FP8 must audit clean, run, and compute exactly
//! what the same model with those weights stored as their dequantised BF16 values computes; a
//! checkpoint mixing both storages for one kind is refused, naming the tensor.

use needlescope_testkit::cli as cli_support;

use cli_support::{inspect_model, rebuild, trace_cpu, Entry};
use needlescope::checkpoint::inventory::CompressorLinear;
use needlescope::checkpoint::Checkpoint;
use needlescope::numerics::codecs::bf16_round;
use std::path::Path;

/// The BF16 entry holding the exact dequantised values of the FP8 linear `weight` of `ckpt`.
fn dequantised_bf16(ckpt: &Checkpoint, weight: &Entry) -> Entry {
    let (rows, cols) = (weight.shape[0], weight.shape[1]);
    let module = weight.name.strip_suffix(".weight").unwrap();
    let values = ckpt.linear_f32(module, rows, cols).unwrap();
    let mut bytes = Vec::with_capacity(2 * values.len());
    for v in values {
        // e4m3 times a power of two is exact in BF16 (3 mantissa bits of 7).
        assert_eq!(
            bf16_round(v).to_bits(),
            v.to_bits(),
            "{} not exact",
            weight.name
        );
        bytes.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    Entry {
        name: weight.name.clone(),
        dtype: "BF16".into(),
        shape: weight.shape.clone(),
        bytes,
    }
}

/// Copies checkpoint `from` to `to`, storing the FP8 compressor / indexer weights accepted by
/// `convert` as BF16 (their exact dequantised values, `.scale` dropped).
fn with_bf16_compressors(from: &Path, to: &Path, convert: impl Fn(&str) -> bool) -> usize {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    let ckpt = Checkpoint::open(from).unwrap();
    let mut converted = 0;
    rebuild(&to.join("model.safetensors"), |entries| {
        let chosen: Vec<String> = entries
            .iter()
            .filter(|e| e.dtype == "F8_E4M3" && CompressorLinear::of_weight(&e.name).is_some())
            .filter(|e| convert(&e.name))
            .map(|e| e.name.clone())
            .collect();
        for name in &chosen {
            let scale = format!("{}.scale", name.strip_suffix(".weight").unwrap());
            entries.retain(|e| e.name != scale);
            let e = entries.iter_mut().find(|e| &e.name == name).unwrap();
            *e = dequantised_bf16(&ckpt, e);
        }
        converted = chosen.len();
    });
    converted
}

/// The tensors of a trace file (header entries without metadata, and the data section).
fn trace_tensors(path: &Path) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let mut raw = cli_support::read_raw(path);
    raw.header.remove("__metadata__");
    (raw.header, raw.data)
}

#[test]
fn fp8_compressor_linears_run_as_their_exact_dequantised_values() {
    let tmp = tempfile::tempdir().unwrap();
    let fp8 = tmp.path().join("fp8");
    let bf16 = tmp.path().join("bf16");
    let release = tmp.path().join("release");
    cli_support::synth_tiny(&fp8, &["--fp8-compressors"])
        .stdout_has(&["official format with FP8 compressors"]);
    cli_support::synth_tiny(&release, &[]);
    // tiny: 2 CSA layers x 5 kinds + 1 HCA layer x 2 + the MTP layer's.
    let converted = with_bf16_compressors(&fp8, &bf16, |_| true);
    assert!(converted >= 12, "only {converted} FP8 compressor weights");

    inspect_model(&fp8).ok().stdout_has(&[
        "inventory   OK",
        "FP8 blocks + E8M0 scales, not the release's BF16, for attn.compressor.wkv, \
         attn.compressor.wgate, attn.indexer.weights_proj, attn.indexer.compressor.wkv, \
         attn.indexer.compressor.wgate",
    ]);
    let plain = inspect_model(&bf16).ok();
    assert!(plain.stdout.contains("inventory   OK"), "{}", plain.dump());
    assert!(
        !plain.stdout.contains("FP8 blocks + E8M0"),
        "{}",
        plain.dump()
    );

    let tokens = tmp.path().join("tokens.txt");
    let ids: Vec<String> = (0..96)
        .map(|i| ((i * 37 + 11) % 4000).to_string())
        .collect();
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    let trace = |model: &Path| {
        let out = tmp.path().join(format!(
            "{}.st",
            model.file_name().unwrap().to_string_lossy()
        ));
        trace_cpu(model, &tokens, &out).ok();
        trace_tensors(&out)
    };
    let (fp8_header, fp8_data) = trace(&fp8);
    let (bf16_header, bf16_data) = trace(&bf16);
    assert_eq!(fp8_header, bf16_header);
    assert!(
        fp8_data == bf16_data,
        "FP8 compressors did not compute what their dequantised BF16 values compute"
    );
    // The FP8 weights are really used: the release (BF16 compressors of the same generated
    // values, rounded differently) scores differently.
    let (_, release_data) = trace(&release);
    assert!(
        release_data != fp8_data,
        "the compressor storage changed nothing"
    );
}

#[test]
fn a_kind_stored_both_fp8_and_bf16_is_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let fp8 = tmp.path().join("fp8");
    let mixed = tmp.path().join("mixed");
    cli_support::synth_tiny(&fp8, &["--fp8-compressors"]);
    let converted = with_bf16_compressors(&fp8, &mixed, |name| {
        name == "layers.3.attn.indexer.compressor.wgate.weight"
    });
    assert_eq!(converted, 1);

    inspect_model(&mixed).fails().no_panic().stdout_has(&[
        "inventory   MISMATCH",
        "mismatched layers.3.attn.indexer.compressor.wgate.weight",
        "expected F8_E4M3 [64, 64], found BF16 [64, 64]",
    ]);
    let tokens = tmp.path().join("tokens.txt");
    std::fs::write(&tokens, "1 2 3 4 5 6 7 8 9 10").unwrap();
    trace_cpu(&mixed, &tokens, &tmp.path().join("t.st"))
        .fails()
        .no_panic()
        .stderr_has(&[
            "layers.3.attn.indexer.compressor.wgate.weight",
            "F8_E4M3",
            "BF16",
        ]);
}

#[test]
fn fp8_compressors_are_refused_for_the_planted_preset() {
    let tmp = tempfile::tempdir().unwrap();
    let r = cli_support::run(&[
        "synth".to_string(),
        "--preset".into(),
        "planted".into(),
        "--fp8-compressors".into(),
        "--out".into(),
        tmp.path().join("p").display().to_string(),
    ])
    .fails()
    .no_panic();
    r.stderr_has(&["--fp8-compressors applies to --preset tiny and flash"]);
}
