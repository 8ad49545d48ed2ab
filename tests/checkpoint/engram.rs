//! DeepSeek-V4.1 Engram tables (docs/spec/v41.md 4.1, 5.2) written by hand and read through
//! `Checkpoint::engram_table`: F8_E4M3 rows `[rows, 256]` with one F8_E8M0 scale per 32 columns
//! `[rows, 8]`, decoded one row (or a list of rows) at a time, and every malformed table refused
//! with the file, the tensor, what was expected and what was found.

use needlescope::checkpoint::engram::{engram_table_names, EngramPrecision, ENGRAM_GROUP};
use needlescope::checkpoint::writer::write_safetensors;
use needlescope::checkpoint::{Checkpoint, CheckpointError, Dtype};
use needlescope::config::ModelConfig;
use needlescope::numerics::codecs::{bf16_round, e8m0_to_f32, E4M3_TO_F32};
use std::path::Path;

const WIDTH: usize = 256;
const GROUPS: usize = WIDTH / ENGRAM_GROUP;

fn with_config(dir: &Path) {
    std::fs::write(
        dir.join("config.json"),
        ModelConfig::tiny().to_json_string(),
    )
    .unwrap();
}

/// A finite e4m3 code that differs from element to element (both signs, subnormals included).
fn code(r: usize, c: usize) -> u8 {
    let b = ((r * 31 + c * 7) % 0x7F) as u8; // 0x00 ..= 0x7E
    if (r * 3 + c).is_multiple_of(5) {
        b | 0x80
    } else {
        b
    }
}

/// A distinct scale code per (row, group), 2^-20 .. 2^19.
fn scale_code(r: usize, g: usize) -> u8 {
    107 + ((r * 11 + g * 5) % 40) as u8
}

/// Writes layer `layer`'s table of `rows` x `width` and returns (codes, scales).
fn write_table(dir: &Path, layer: usize, rows: usize, width: usize) -> (Vec<u8>, Vec<u8>) {
    let groups = width.div_ceil(ENGRAM_GROUP);
    let w: Vec<u8> = (0..rows * width)
        .map(|i| code(i / width, i % width))
        .collect();
    let s: Vec<u8> = (0..rows * groups)
        .map(|i| scale_code(i / groups, i % groups))
        .collect();
    let (wn, sn) = engram_table_names(layer);
    write_safetensors(
        &dir.join("model.safetensors"),
        &[
            (&wn, Dtype::F8E4M3, &[rows, width], &w),
            (&sn, Dtype::F8E8M0, &[rows, groups], &s),
        ],
    )
    .unwrap();
    (w, s)
}

fn want(w: &[u8], s: &[u8], width: usize, r: usize, c: usize) -> f32 {
    let groups = width.div_ceil(ENGRAM_GROUP);
    E4M3_TO_F32[w[r * width + c] as usize] * e8m0_to_f32(s[r * groups + c / ENGRAM_GROUP])
}

#[test]
fn every_row_decodes_element_by_element() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let rows = 11;
    let (w, s) = write_table(dir.path(), 14, rows, WIDTH);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.engram_table(14).unwrap();
    assert_eq!((t.rows(), t.width()), (rows, WIDTH));
    assert_eq!(t.weight_info().name, "layers.14.engram.embed.weight");
    assert_eq!(t.scale_info().shape, vec![rows, GROUPS]);
    t.expect_shape(rows, WIDTH).unwrap();
    for r in 0..rows {
        let got = t.decode_row(r, EngramPrecision::F32).unwrap();
        assert_eq!(got.len(), WIDTH);
        for (c, v) in got.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                want(&w, &s, WIDTH, r, c).to_bits(),
                "row {r} column {c}"
            );
        }
        let bf = t.decode_row(r, EngramPrecision::Bf16).unwrap();
        for (c, (b, v)) in bf.iter().zip(&got).enumerate() {
            assert_eq!(b.to_bits(), bf16_round(*v).to_bits(), "row {r} col {c}");
        }
    }
}

#[test]
fn a_list_of_row_ids_is_gathered_in_order_with_repeats() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    write_table(dir.path(), 1, 9, WIDTH);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.engram_table(1).unwrap();
    let ids = [8usize, 0, 3, 8];
    let got = t.decode_rows(&ids, EngramPrecision::Bf16).unwrap();
    assert_eq!(got.len(), ids.len() * WIDTH);
    for (k, &id) in ids.iter().enumerate() {
        let one = t.decode_row(id, EngramPrecision::Bf16).unwrap();
        assert_eq!(&got[k * WIDTH..(k + 1) * WIDTH], one.as_slice(), "id {id}");
    }
    let mut buf = vec![f32::NAN; WIDTH];
    t.decode_row_into(3, EngramPrecision::Bf16, &mut buf)
        .unwrap();
    assert_eq!(&got[2 * WIDTH..3 * WIDTH], buf.as_slice());
}

#[test]
fn a_ragged_width_uses_a_partial_last_scale_group() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let width = 80; // groups of 32, 32 and 16
    let (w, s) = write_table(dir.path(), 1, 4, width);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.engram_table(1).unwrap();
    assert_eq!(t.scale_info().shape, vec![4, 3]);
    let got = t.decode_rows(&[3, 1], EngramPrecision::F32).unwrap();
    for (k, r) in [3usize, 1].into_iter().enumerate() {
        for c in 0..width {
            assert_eq!(
                got[k * width + c].to_bits(),
                want(&w, &s, width, r, c).to_bits()
            );
        }
    }
}

#[test]
fn a_row_id_past_the_table_names_the_tensor_and_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    write_table(dir.path(), 1, 5, WIDTH);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.engram_table(1).unwrap();
    for err in [
        t.decode_row(5, EngramPrecision::F32).unwrap_err(),
        t.decode_rows(&[0, 4, 384_006_168], EngramPrecision::F32)
            .unwrap_err(),
    ] {
        assert!(matches!(
            err,
            CheckpointError::RowOutOfRange { rows: 5, .. }
        ));
        let msg = err.to_string();
        assert!(msg.contains("model.safetensors"), "{msg}");
        assert!(msg.contains("layers.1.engram.embed.weight"), "{msg}");
        assert!(msg.contains("below 5"), "{msg}");
    }
    let msg = t
        .decode_row(384_006_168, EngramPrecision::F32)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("row 384006168"), "{msg}");
}

#[test]
fn a_table_of_other_dimensions_than_the_config_is_named() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    write_table(dir.path(), 1, 5, WIDTH);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt
        .engram_table(1)
        .unwrap()
        .expect_shape(384_006_168, WIDTH)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("layers.1.engram.embed.weight"), "{msg}");
    assert!(
        msg.contains("expected shape [384006168, 256]") && msg.contains("found [5, 256]"),
        "{msg}"
    );
}

/// Writes the two tensors as given and returns the error of `engram_table(1)`.
fn refused(weight: (Dtype, &[usize], &[u8]), scale: Option<(Dtype, &[usize], &[u8])>) -> String {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let (wn, sn) = engram_table_names(1);
    let mut entries = vec![(wn.as_str(), weight.0, weight.1, weight.2)];
    if let Some((d, sh, b)) = scale {
        entries.push((sn.as_str(), d, sh, b));
    }
    write_safetensors(&dir.path().join("model.safetensors"), &entries).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt.engram_table(1).unwrap_err().to_string();
    assert!(msg.contains("model.safetensors"), "{msg}");
    msg
}

#[test]
fn malformed_tables_are_refused_with_file_tensor_expected_and_found() {
    let w = vec![0x38u8; 4 * WIDTH];
    let s = vec![127u8; 4 * GROUPS];
    // Weight stored as BF16 bytes of the same size: wrong dtype.
    let msg = refused(
        (Dtype::BF16, &[4, WIDTH / 2], &w),
        Some((Dtype::F8E8M0, &[4, 8], &s)),
    );
    assert!(
        msg.contains("layers.1.engram.embed.weight")
            && msg.contains("expected dtype F8_E4M3")
            && msg.contains("found BF16"),
        "{msg}"
    );
    // Scales stored as U8: wrong dtype.
    let msg = refused(
        (Dtype::F8E4M3, &[4, WIDTH], &w),
        Some((Dtype::U8, &[4, 8], &s)),
    );
    assert!(
        msg.contains("layers.1.engram.embed.scale")
            && msg.contains("expected dtype F8_E8M0")
            && msg.contains("found U8"),
        "{msg}"
    );
    // One scale per 16 columns: wrong scale columns.
    let s16 = vec![127u8; 4 * 16];
    let msg = refused(
        (Dtype::F8E4M3, &[4, WIDTH], &w),
        Some((Dtype::F8E8M0, &[4, 16], &s16)),
    );
    assert!(
        msg.contains("layers.1.engram.embed.scale")
            && msg.contains("expected shape [4, 8]")
            && msg.contains("found [4, 16]")
            && msg.contains("per 32 columns"),
        "{msg}"
    );
    // Scales for other rows than the table has.
    let msg = refused(
        (Dtype::F8E4M3, &[4, WIDTH], &w),
        Some((Dtype::F8E8M0, &[8, 4], &s)),
    );
    assert!(
        msg.contains("expected shape [4, 8]") && msg.contains("found [8, 4]"),
        "{msg}"
    );
    // A flat table.
    let msg = refused(
        (Dtype::F8E4M3, &[4 * WIDTH], &w),
        Some((Dtype::F8E8M0, &[4, 8], &s)),
    );
    assert!(
        msg.contains("layers.1.engram.embed.weight") && msg.contains("found [1024]"),
        "{msg}"
    );
    // No scale tensor at all.
    let msg = refused((Dtype::F8E4M3, &[4, WIDTH], &w), None);
    assert!(
        msg.contains("layers.1.engram.embed.scale missing") && msg.contains("F8_E8M0 [4, 8]"),
        "{msg}"
    );
}

#[test]
fn a_nan_scale_code_in_a_requested_row_is_refused_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let w = vec![0x38u8; 3 * WIDTH];
    let mut s = vec![127u8; 3 * GROUPS];
    s[GROUPS + 5] = 0xFF; // row 1, columns 160..192
    let (wn, sn) = engram_table_names(1);
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            (&wn, Dtype::F8E4M3, &[3, WIDTH], &w),
            (&sn, Dtype::F8E8M0, &[3, GROUPS], &s),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.engram_table(1).unwrap();
    // Rows 0 and 2 are untouched by row 1's bad code.
    assert_eq!(
        t.decode_rows(&[0, 2], EngramPrecision::F32).unwrap(),
        vec![1.0; 2 * WIDTH]
    );
    let msg = t
        .decode_row(1, EngramPrecision::F32)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("layers.1.engram.embed.scale")
            && msg.contains("[1, 5]")
            && msg.contains("NaN"),
        "{msg}"
    );
}
