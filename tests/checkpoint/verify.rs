//! `checkpoint::verify` on synthetic checkpoints: every format and sharding reads clean, damaged
//! values are found in the tensor that holds them with their counts and first position, and the
//! piece size changes nothing (a value split across pieces, a tensor across many).

use needlescope::checkpoint::verify::{verify, verify_in_chunks, VerifyReport};
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::synth::{synth, Preset, SynthOptions};
use needlescope_testkit::cli::rebuild;
use std::path::Path;

/// An additive bias: all zero is a valid value, listed apart, not a finding.
const SINK: &str = "layers.0.attn.attn_sink";

fn tiny(dir: &Path, format: WeightFormat, shards: usize) {
    let mut o = SynthOptions::new(Preset::Tiny, format, dir);
    o.shards = shards;
    synth(&o, None).unwrap();
}

fn verified(dir: &Path) -> VerifyReport {
    let ckpt = Checkpoint::open(dir).unwrap();
    let mut last = (0, 0);
    let report = verify(&ckpt, &mut |done, total| {
        assert!(done >= last.0 && done <= total);
        last = (done, total);
    })
    .unwrap();
    assert_eq!(last, (ckpt.payload_bytes(), ckpt.payload_bytes()));
    assert_eq!(report.tensors, ckpt.len());
    assert_eq!(report.bytes, ckpt.payload_bytes());
    report
}

#[test]
fn synthetic_checkpoints_of_every_format_verify_clean() {
    let tmp = tempfile::tempdir().unwrap();
    for (format, shards) in [
        (WeightFormat::Bf16, 1),
        (WeightFormat::Official, 3),
        (WeightFormat::Nvfp4, 1),
    ] {
        let dir = tmp.path().join(format!("{format}-{shards}"));
        tiny(&dir, format, shards);
        let report = verified(&dir);
        assert!(report.clean(), "{format}: {:?}", report.findings);
    }
}

#[test]
fn damaged_values_are_found_in_their_tensor_whatever_the_piece_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("official");
    tiny(&dir, WeightFormat::Official, 1);
    let file = dir.join("model.safetensors");
    let (nan_t, inf_t, zero_t, fp8_t, e8m0_t, fp4_t) = (
        "layers.1.attn.indexer.compressor.wkv.weight",
        "layers.0.attn_norm.weight",
        "embed.weight",
        "layers.1.attn.wq_b.weight",
        "layers.2.ffn.experts.3.w2.scale",
        "layers.2.ffn.experts.1.w1.weight",
    );
    rebuild(&file, |entries| {
        for e in entries.iter_mut() {
            let b = &mut e.bytes;
            match e.name.as_str() {
                n if n == nan_t => {
                    assert_eq!(e.dtype, "BF16");
                    // Elements 3 and 10 (bf16 NaN), one inf.
                    b[6..8].copy_from_slice(&0x7FC0u16.to_le_bytes());
                    b[20..22].copy_from_slice(&0x7FC0u16.to_le_bytes());
                    b[24..26].copy_from_slice(&0xFF80u16.to_le_bytes());
                }
                n if n == inf_t => b[2..4].copy_from_slice(&0x7F80u16.to_le_bytes()),
                n if n == zero_t || n == SINK => b.fill(0),
                n if n == fp8_t => {
                    assert_eq!(e.dtype, "F8_E4M3");
                    b[5] = 0x7F;
                    b[9] = 0xFF;
                }
                n if n == e8m0_t => {
                    assert_eq!(e.dtype, "F8_E8M0");
                    b[1] = 0xFF;
                }
                n if n == fp4_t => {
                    assert_eq!(e.dtype, "I8");
                    // Signed zeros in both nibbles: still every value zero.
                    for (i, x) in b.iter_mut().enumerate() {
                        *x = [0x00, 0x80, 0x08, 0x88][i % 4];
                    }
                }
                _ => {}
            }
        }
    });
    let ckpt = Checkpoint::open(&dir).unwrap();
    let whole = verified(&dir);
    for chunk in [8, 24, 1000, 1 << 20] {
        let r = verify_in_chunks(&ckpt, chunk, &mut |_, _| {}).unwrap();
        assert_eq!(r, whole, "pieces of {chunk} bytes");
    }
    let names: Vec<&str> = whole.findings.iter().map(|f| f.tensor.as_str()).collect();
    let mut want = vec![nan_t, inf_t, zero_t, fp8_t, e8m0_t, fp4_t];
    want.sort_by_key(|n| ckpt.info(n).unwrap().data_offsets.start);
    assert_eq!(names, want);
    assert_eq!(whole.zero_biases, [SINK]);
    let find = |n: &str| whole.findings.iter().find(|f| f.tensor == n).unwrap();
    let f = find(nan_t);
    assert_eq!((f.nan, f.inf, f.all_zero), (2, 1, false));
    let cols = ckpt.info(nan_t).unwrap().shape[1];
    assert_eq!(f.first_non_finite, Some(vec![3 / cols, 3 % cols]));
    assert_eq!(f.file, file);
    assert_eq!(f.dtype.as_str(), "BF16");
    assert_eq!((find(inf_t).nan, find(inf_t).inf), (0, 1));
    let z = find(zero_t);
    assert!(z.all_zero && z.nan == 0 && z.first_non_finite.is_none());
    let f = find(fp8_t);
    assert_eq!((f.nan, f.inf), (2, 0));
    assert_eq!(find(e8m0_t).nan, 1);
    assert!(find(fp4_t).all_zero);
    let text = find(nan_t).to_string();
    assert!(
        text.contains(nan_t)
            && text.contains("model.safetensors")
            && text.contains("2 NaN, 1 infinite"),
        "{text}"
    );
}
