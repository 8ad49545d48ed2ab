//! Checkpoint conventions checked against hand-built bytes whose decoded values come
//! from the reference formats (not from this crate's tables or encoders), plus reader
//! robustness against malformed safetensors headers.
//!
//! References: official DeepSeek-V4 `inference/model.py` (FP8 weight [out,in] + E8M0 `.scale`
//! [ceil(out/128), ceil(in/128)]; FP4 int8 [out,in/2] + E8M0 `.scale` [out,in/32]),
//! `inference/convert.py::cast_e2m1fn_to_e4m3fn` (low nibble first, FP4_TABLE), ModelOpt
//! `NVFP4QTensor.quantize` (packed = odd<<4 | even; x / (weight_scale * weight_scale_2)),
//! safetensors `Metadata::validate` (offsets contiguous from 0).

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::config::ModelConfig;
use std::path::Path;

fn with_config(dir: &Path) {
    std::fs::write(
        dir.join("config.json"),
        ModelConfig::tiny().to_json_string(),
    )
    .unwrap();
}

/// A safetensors file built byte by byte: `header` is the literal JSON, `data` the data section.
fn raw_file(path: &Path, header: &str, data: &[u8]) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

#[test]
fn fp8_e4m3_codes_and_e8m0_scales_decode_to_reference_values() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    // Weight [1, 16] (one 128x128 tile), scale E8M0 code 127 -> 2^0; values by hand from the
    // OCP e4m3fn definition (bias 7, subnormals m/8 * 2^-6, 0x7E = 448).
    let codes: [u8; 16] = [
        0x00, 0x80, 0x01, 0x07, 0x08, 0x38, 0x39, 0x40, 0xC0, 0x7E, 0xFE, 0x30, 0x48, 0x3C, 0x44,
        0x77,
    ];
    let want: [f32; 16] = [
        0.0,
        -0.0,
        0.001953125,
        0.013671875,
        0.015625,
        1.0,
        1.125,
        2.0,
        -2.0,
        448.0,
        -448.0,
        0.5,
        4.0,
        1.5,
        3.0,
        240.0,
    ];
    let header = r#"{"p.w.weight":{"dtype":"F8_E4M3","shape":[1,16],"data_offsets":[0,16]},"p.w.scale":{"dtype":"F8_E8M0","shape":[1,1],"data_offsets":[16,17]}}"#;
    let mut data = codes.to_vec();
    data.push(127);
    raw_file(&dir.path().join("model.safetensors"), header, &data);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let got = ckpt.linear_f32("p.w", 1, 16).unwrap();
    for i in 0..16 {
        assert_eq!(
            got[i].to_bits(),
            want[i].to_bits(),
            "code {:#04x}",
            codes[i]
        );
    }
}

#[test]
fn fp8_scale_grid_rows_are_the_output_dimension() {
    // W [256, 128]: two row blocks, one column block; scale [2, 1] = [2^1, 2^-2].
    // If the reader took the scale's rows as the input dimension it would need [1, 2].
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let (r, c) = (256usize, 128usize);
    let header = format!(
        r#"{{"p.w.weight":{{"dtype":"F8_E4M3","shape":[{r},{c}],"data_offsets":[0,{n}]}},"p.w.scale":{{"dtype":"F8_E8M0","shape":[2,1],"data_offsets":[{n},{m}]}}}}"#,
        n = r * c,
        m = r * c + 2
    );
    let mut data = vec![0x38u8; r * c]; // every weight 1.0
    data.extend([128u8, 125u8]); // 2^1, 2^-2
    raw_file(&dir.path().join("model.safetensors"), &header, &data);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let got = ckpt.linear_f32("p.w", r, c).unwrap();
    assert_eq!(got[127 * c + 127], 2.0);
    assert_eq!(got[128 * c], 0.25);
    assert_eq!(got[255 * c + 5], 0.25);
    // The transposed grid must be refused, not silently re-read.
    assert!(ckpt.linear_f32("p.w", c, r).is_err());
}

#[test]
fn mxfp4_bytes_decode_low_nibble_first_with_per_32_e8m0_scales() {
    // Logical [1, 64]: bytes 0x72 (low 2 -> 1.0, high 7 -> 6.0) then 0xF9 (low 9 -> -0.5, high
    // F -> -6.0), repeated; group 0 scale code 128 (x2), group 1 scale code 124 (x1/8).
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let mut packed = Vec::new();
    for _ in 0..16 {
        packed.extend([0x72u8, 0xF9]);
    }
    let header = r#"{"x.w1.weight":{"dtype":"I8","shape":[1,32],"data_offsets":[0,32]},"x.w1.scale":{"dtype":"F8_E8M0","shape":[1,2],"data_offsets":[32,34]}}"#;
    let mut data = packed.clone();
    data.extend([128u8, 124]);
    raw_file(&dir.path().join("model.safetensors"), header, &data);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), WeightFormat::Official);
    let got = ckpt.linear_f32("x.w1", 1, 64).unwrap();
    assert_eq!(&got[0..4], &[2.0, 12.0, -1.0, -12.0]);
    assert_eq!(&got[32..36], &[0.125, 0.75, -0.0625, -0.75]);
    // Code 8 is -0 in e2m1 (FP4_TABLE reads it as 0.0; equal either way).
    let table = [
        0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    for (code, want) in table.iter().enumerate() {
        assert_eq!(
            needlescope::numerics::codecs::e2m1_to_f32(code as u8),
            *want,
            "e2m1 code {code}"
        );
    }
}

#[test]
fn nvfp4_bytes_decode_as_code_times_e4m3_scale_times_scale_2() {
    // Logical [1, 32]: byte 0x35 -> codes 5 (3.0) then 3 (1.5); group scales e4m3 0x30 (0.5)
    // and 0x48 (4.0); weight_scale_2 = 0.25 stored as [] F32; input_scale [] F32 ignored.
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let header = r#"{"x.w2.weight":{"dtype":"U8","shape":[1,16],"data_offsets":[0,16]},"x.w2.weight_scale":{"dtype":"F8_E4M3","shape":[1,2],"data_offsets":[16,18]},"x.w2.weight_scale_2":{"dtype":"F32","shape":[],"data_offsets":[18,22]},"x.w2.input_scale":{"dtype":"F32","shape":[],"data_offsets":[22,26]}}"#;
    let mut data = vec![0x35u8; 16];
    data.extend([0x30u8, 0x48]);
    data.extend(0.25f32.to_le_bytes());
    data.extend(7.0f32.to_le_bytes());
    raw_file(&dir.path().join("model.safetensors"), header, &data);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), WeightFormat::Nvfp4);
    let got = ckpt.linear_f32("x.w2", 1, 32).unwrap();
    assert_eq!(&got[0..2], &[0.375, 0.1875]);
    assert_eq!(&got[16..18], &[3.0, 1.5]);
}

// ---------------------------------------------------------------------------------------------
// Robustness

fn open_msg(dir: &Path) -> Result<usize, String> {
    Checkpoint::open(dir)
        .map(|c| c.len())
        .map_err(|e| e.to_string())
}

#[test]
fn overlapping_data_offsets_are_an_error() {
    // Two F32 [2] tensors sharing bytes 4..8: the safetensors reference (Metadata::validate,
    // `s != start`) refuses this; reading it hands `b` half of `a`'s bytes.
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    raw_file(&dir.path().join("model.safetensors"), header, &[0u8; 12]);
    let m = open_msg(dir.path()).expect_err("overlapping offsets accepted");
    assert!(
        m.contains("model.safetensors") && m.contains("tensor b") && m.contains("expected 8"),
        "{m}"
    );
}

#[test]
fn duplicate_name_inside_one_header_is_an_error() {
    // JSON with the same tensor twice: serde keeps the last silently; the reference crate fails
    // on the hole this leaves (InvalidOffset). Either way it must not load silently.
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let mut data = 1.0f32.to_le_bytes().to_vec();
    data.extend(2.0f32.to_le_bytes());
    raw_file(&dir.path().join("model.safetensors"), header, &data);
    let m = open_msg(dir.path()).expect_err("duplicate tensor name in one header accepted");
    assert!(
        m.contains("model.safetensors") && m.contains("tensor a"),
        "{m}"
    );
}

#[test]
fn huge_header_length_and_reversed_offsets_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let p = dir.path().join("model.safetensors");
    let mut b = u64::MAX.to_le_bytes().to_vec();
    b.extend(b"{}");
    std::fs::write(&p, b).unwrap();
    let m = open_msg(dir.path()).unwrap_err();
    assert!(m.contains("model.safetensors"), "{m}");
    raw_file(
        &p,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}"#,
        &[0u8; 8],
    );
    let m = open_msg(dir.path()).unwrap_err();
    assert!(
        m.contains("model.safetensors") && m.contains("tensor a"),
        "{m}"
    );
    // Offsets past the end (a truncated shard).
    raw_file(
        &p,
        r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &[0u8; 9],
    );
    let m = open_msg(dir.path()).unwrap_err();
    assert!(
        m.contains("model.safetensors") && m.contains("tensor a"),
        "{m}"
    );
    // Empty file.
    std::fs::write(&p, b"").unwrap();
    let m = open_msg(dir.path()).unwrap_err();
    assert!(m.contains("model.safetensors"), "{m}");
}

#[test]
fn index_problems_name_the_index_the_shard_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    raw_file(&dir.path().join("s1.safetensors"), h, &[0u8; 4]);
    raw_file(&dir.path().join("s2.safetensors"), h, &[0u8; 4]);
    let idx = dir.path().join("model.safetensors.index.json");
    // Same tensor in two indexed shards.
    std::fs::write(
        &idx,
        r#"{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}"#,
    )
    .unwrap();
    let m = open_msg(dir.path()).unwrap_err();
    assert!(
        m.contains("tensor a") && m.contains("s1") && m.contains("s2"),
        "{m}"
    );
    // A shard the index names that is not there.
    std::fs::write(&idx, r#"{"weight_map":{"a":"s9.safetensors"}}"#).unwrap();
    let m = open_msg(dir.path()).unwrap_err();
    assert!(
        m.contains("s9.safetensors") && m.contains("tensor a"),
        "{m}"
    );
    // A path outside the directory.
    std::fs::write(&idx, r#"{"weight_map":{"a":"../s1.safetensors"}}"#).unwrap();
    assert!(open_msg(dir.path()).is_err());
}

#[test]
fn a_repeated_name_is_an_error_whatever_the_order_of_its_offsets() {
    // The second "a" takes bytes 0..4, the first 4..8: keeping the last entry leaves no hole at
    // the start, so only a check of the keys themselves catches it.
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    raw_file(&dir.path().join("model.safetensors"), header, &[0u8; 8]);
    let m = open_msg(dir.path()).expect_err("a name given twice was accepted");
    assert!(
        m.contains("model.safetensors") && m.contains("tensor a") && m.contains("twice"),
        "{m}"
    );
}

#[test]
fn bytes_after_the_last_tensor_and_a_gap_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let p = dir.path().join("model.safetensors");
    raw_file(
        &p,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0u8; 6],
    );
    let m = open_msg(dir.path()).expect_err("trailing bytes accepted");
    assert!(
        m.contains("model.safetensors") && m.contains("6 bytes") && m.contains("end at 4"),
        "{m}"
    );
    raw_file(
        &p,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#,
        &[0u8; 12],
    );
    let m = open_msg(dir.path()).expect_err("a gap between tensors accepted");
    assert!(
        m.contains("tensor b") && m.contains("start at 8") && m.contains("expected 4"),
        "{m}"
    );
}

#[test]
fn null_metadata_is_read_as_empty() {
    // The safetensors crate accepts (and some writers emit) `"__metadata__": null`.
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    raw_file(
        &dir.path().join("model.safetensors"),
        r#"{"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &1.5f32.to_le_bytes(),
    );
    assert_eq!(open_msg(dir.path()), Ok(1));
}
