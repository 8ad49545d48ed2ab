//! DeepSeek-V4.1's weight formats through V4's linear decode (docs/spec/v41.md 2.3, 4.1, 5.8):
//! FP8 e4m3 with E8M0 scales on the config's 32x32 block (ragged edges included) and the FP4
//! routed experts (I8, two e2m1 codes per byte along K, E8M0 per 32 along K) at V4.1's shapes
//! scaled down. Every tensor is written by hand and every element checked against the formula.

use needlescope::checkpoint::linear::LinearForm;
use needlescope::checkpoint::writer::write_safetensors;
use needlescope::checkpoint::{Checkpoint, Dtype, QuantWeight};
use needlescope::config::{ModelConfig, QuantizationConfig};
use needlescope::numerics::codecs::{e8m0_to_f32, E2M1_TO_F32, E4M3_TO_F32};
use std::path::Path;

/// The tiny config stored as V4.1 stores its weights: FP8 on `block` (`[32, 32]` released)
/// and FP4 routed experts.
fn with_block(dir: &Path, block: [usize; 2]) {
    let mut cfg = ModelConfig::tiny();
    cfg.expert_dtype = Some("fp4".into());
    cfg.quantization_config = Some(QuantizationConfig {
        weight_block_size: Some(block.to_vec()),
        ..QuantizationConfig::official()
    });
    std::fs::write(dir.join("config.json"), cfg.to_json_string()).unwrap();
}

/// A finite e4m3 code (never 0x7F/0xFF) that differs from element to element, both signs.
fn e4m3_code(r: usize, c: usize) -> u8 {
    let b = ((r * 13 + c * 5) % 0x7E) as u8 + 1;
    if (r + c).is_multiple_of(3) {
        b | 0x80
    } else {
        b
    }
}

/// A distinct scale code per tile (2^-10 .. 2^9), never the NaN code.
fn tile_scale(t: usize) -> u8 {
    117 + (t * 7 % 20) as u8
}

#[test]
fn fp8_scales_apply_per_32x32_tile_on_a_ragged_shape() {
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    // [70, 100]: a [3, 4] grid of 32x32 tiles; the last tile row is 6 rows tall and the last
    // tile column 4 columns wide.
    let (rows, cols) = (70usize, 100usize);
    let (gr, gc) = (rows.div_ceil(32), cols.div_ceil(32));
    assert_eq!((gr, gc), (3, 4));
    let w: Vec<u8> = (0..rows * cols)
        .map(|i| e4m3_code(i / cols, i % cols))
        .collect();
    let scale: Vec<u8> = (0..gr * gc).map(tile_scale).collect();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("probe.wq_a.weight", Dtype::F8E4M3, &[rows, cols], &w),
            ("probe.wq_a.scale", Dtype::F8E8M0, &[gr, gc], &scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let q = ckpt.linear("probe.wq_a", rows, cols).unwrap();
    assert_eq!(
        q.form(),
        LinearForm::Fp8Block { block: (32, 32) },
        "the block comes from config.json"
    );
    assert_eq!(q.row_alignment(), 32);
    let got = q.decode_f32().unwrap();
    for r in 0..rows {
        for c in 0..cols {
            let tile = (r / 32) * gc + c / 32;
            let want = E4M3_TO_F32[e4m3_code(r, c) as usize] * e8m0_to_f32(scale[tile]);
            assert_eq!(
                got[r * cols + c].to_bits(),
                want.to_bits(),
                "element ({r}, {c}) of tile {tile}"
            );
        }
    }
    // Row bands on 32-row tile boundaries (the last one ragged) decode to the same rows.
    let shared = ckpt.shared_linear("probe.wq_a", rows, cols).unwrap();
    for band in [0..32, 32..64, 64..70, 32..70] {
        let part = shared.decode_rows(band.clone()).unwrap();
        assert_eq!(part, got[band.start * cols..band.end * cols], "{band:?}");
    }
}

#[test]
fn fp8_known_values_in_four_32x32_tiles() {
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    // [64, 64], four tiles, every code 0x38 (1.0) except a few hand-picked ones; tile scales
    // 2^-3, 2^0, 2^5, 2^-7 (row-major).
    let (rows, cols) = (64usize, 64usize);
    let mut w = vec![0x38u8; rows * cols];
    w[0] = 0x40; // 2.0 in tile 0
    w[31 * cols + 31] = 0xC4; // -3.0, last element of tile 0
    w[32] = 0x7E; // 448 (e4m3 max), first column of tile 1
    w[32 * cols] = 0x01; // 2^-9 (smallest subnormal), tile 2
    w[63 * cols + 63] = 0x80; // -0.0, tile 3
    let scale = [124u8, 127, 132, 120];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("probe.wo_b.weight", Dtype::F8E4M3, &[rows, cols], &w),
            ("probe.wo_b.scale", Dtype::F8E8M0, &[2, 2], &scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let got = ckpt.linear_f32("probe.wo_b", rows, cols).unwrap();
    let at = |r: usize, c: usize| got[r * cols + c];
    assert_eq!(at(0, 0), 0.25);
    assert_eq!(at(0, 1), 0.125);
    assert_eq!(at(31, 31), -0.375);
    assert_eq!(at(0, 32), 448.0);
    assert_eq!(at(31, 63), 1.0);
    assert_eq!(at(32, 0), 2f32.powi(-9) * 32.0);
    assert_eq!(at(63, 31), 32.0);
    assert_eq!(at(32, 32), 2f32.powi(-7));
    assert_eq!(at(63, 63).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn a_128_block_scale_grid_is_refused_under_a_32_block_config() {
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    // V4's [1, 1] grid for a [70, 100] weight: under V4.1's block the grid is [3, 4].
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("probe.wkv.weight", Dtype::F8E4M3, &[70, 100], &[0x38; 7000]),
            ("probe.wkv.scale", Dtype::F8E8M0, &[1, 1], &[127]),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt.linear("probe.wkv", 70, 100).unwrap_err().to_string();
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert!(msg.contains("probe.wkv.scale"), "{msg}");
    assert!(
        msg.contains("expected shape [3, 4]") && msg.contains("found [1, 1]"),
        "{msg}"
    );
    assert!(msg.contains("32x32 blocks"), "{msg}");
}

#[test]
fn fp8_non_square_blocks_decode_by_their_own_edges() {
    // Not a released layout, but the block is the caller's: (16, 32) tiles on [40, 70].
    let (rows, cols, block) = (40usize, 70usize, (16usize, 32usize));
    let (gr, gc) = (rows.div_ceil(block.0), cols.div_ceil(block.1));
    let w: Vec<u8> = (0..rows * cols)
        .map(|i| e4m3_code(i / cols, i % cols))
        .collect();
    let scale: Vec<u8> = (0..gr * gc).map(tile_scale).collect();
    let q = QuantWeight::from_parts(LinearForm::Fp8Block { block }, &w, &scale, rows, cols);
    assert_eq!(q.row_alignment(), 16);
    let got = q.decode_f32().unwrap();
    for r in 0..rows {
        for c in 0..cols {
            let tile = (r / block.0) * gc + c / block.1;
            let want = E4M3_TO_F32[e4m3_code(r, c) as usize] * e8m0_to_f32(scale[tile]);
            assert_eq!(got[r * cols + c].to_bits(), want.to_bits(), "({r}, {c})");
        }
    }
    let band = q.row_band(16..40).decode_f32().unwrap();
    assert_eq!(band, got[16 * cols..]);
}

/// A packed FP4 weight `[rows, cols/2]` whose logical code at (r, c) is `code(r, c)`.
fn pack(rows: usize, cols: usize, code: impl Fn(usize, usize) -> u8) -> Vec<u8> {
    (0..rows)
        .flat_map(|r| (0..cols / 2).map(move |j| (r, j)))
        .map(|(r, j)| (code(r, 2 * j) & 0x0F) | ((code(r, 2 * j + 1) & 0x0F) << 4))
        .collect()
}

fn fp4_code(r: usize, c: usize) -> u8 {
    ((r * 5 + c * 3 + c / 7) % 16) as u8
}

#[test]
fn fp4_routed_expert_at_v41_shapes_scaled_down() {
    // V4.1's expert is w1/w3 [I, D] and w2 [D, I] with I = 2304 = 72·32, D = 5120 = 160·32:
    // here I = 96 (3 groups along K for w2) and D = 160 (5 groups along K for w1/w3).
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    let (i, d) = (96usize, 160usize);
    let shapes = [("w1", i, d), ("w3", i, d), ("w2", d, i)];
    let mut bytes = Vec::new();
    for (k, &(name, o, inn)) in shapes.iter().enumerate() {
        let packed = pack(o, inn, |r, c| fp4_code(r + k, c));
        let scale: Vec<u8> = (0..o * inn / 32)
            .map(|g| 120 + ((g * 3 + k) % 15) as u8)
            .collect();
        bytes.push((name, o, inn, packed, scale));
    }
    let names: Vec<(String, String)> = bytes
        .iter()
        .map(|(n, ..)| {
            (
                format!("layers.0.ffn.experts.7.{n}.weight"),
                format!("layers.0.ffn.experts.7.{n}.scale"),
            )
        })
        .collect();
    let shapes_w: Vec<[usize; 2]> = bytes.iter().map(|(_, o, inn, ..)| [*o, inn / 2]).collect();
    let shapes_s: Vec<[usize; 2]> = bytes.iter().map(|(_, o, inn, ..)| [*o, inn / 32]).collect();
    let mut entries: Vec<(&str, Dtype, &[usize], &[u8])> = Vec::new();
    for (k, (_, _, _, packed, scale)) in bytes.iter().enumerate() {
        entries.push((names[k].0.as_str(), Dtype::I8, &shapes_w[k], packed));
        entries.push((names[k].1.as_str(), Dtype::F8E8M0, &shapes_s[k], scale));
    }
    write_safetensors(&dir.path().join("model.safetensors"), &entries).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    for (k, (name, o, inn, _, scale)) in bytes.iter().enumerate() {
        let module = format!("layers.0.ffn.experts.7.{name}");
        let q = ckpt.linear(&module, *o, *inn).unwrap();
        assert_eq!(q.form(), LinearForm::Fp4Group { group: 32 }, "{module}");
        let got = q.decode_f32().unwrap();
        let groups = inn / 32;
        for r in 0..*o {
            for c in 0..*inn {
                let want = E2M1_TO_F32[fp4_code(r + k, c) as usize]
                    * e8m0_to_f32(scale[r * groups + c / 32]);
                assert_eq!(
                    got[r * inn + c].to_bits(),
                    want.to_bits(),
                    "{module} element ({r}, {c})"
                );
            }
        }
    }
}

#[test]
fn fp4_ragged_k_uses_a_partial_last_group() {
    // K = 80: groups of 32, 32 and 16; every code 2 (1.0), so each value is its group's scale.
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    let (o, k) = (3usize, 80usize);
    let packed = vec![0x22u8; o * k / 2];
    let scale = [127u8, 128, 129, 126, 125, 124, 130, 131, 132];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("e.w1.weight", Dtype::I8, &[o, k / 2], &packed),
            ("e.w1.scale", Dtype::F8E8M0, &[o, 3], &scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let got = ckpt.linear_f32("e.w1", o, k).unwrap();
    for r in 0..o {
        for c in 0..k {
            assert_eq!(
                got[r * k + c],
                e8m0_to_f32(scale[r * 3 + c / 32]),
                "({r}, {c})"
            );
        }
    }
}

#[test]
fn nvfp4_expert_of_the_v41_requantisation_decodes_to_the_mxfp4_values() {
    // docs/spec/v41.md 4.3: NVIDIA's V4.1 NVFP4 keeps every e2m1 nibble (I8 -> U8) and rewrites
    // each E8M0 scale per 32 as two equal e4m3 scales per 16 times an f32 global scale; V4's
    // NVFP4 decode must give back the MXFP4 values exactly. w2-shaped [D, I] = [160, 96].
    let dir = tempfile::tempdir().unwrap();
    with_block(dir.path(), [32, 32]);
    let (o, k) = (160usize, 96usize);
    let packed = pack(o, k, fp4_code);
    // E8M0 codes 121..=135 (2^-6 .. 2^8): with a global scale of 1.0 each is a normal e4m3
    // power of two, code (p + 7) << 3.
    let mx_scale: Vec<u8> = (0..o * k / 32).map(|g| 121 + (g * 7 % 15) as u8).collect();
    let nv_scale: Vec<u8> = mx_scale
        .iter()
        .flat_map(|&s| {
            let e4m3 = (s - 120) << 3;
            [e4m3, e4m3]
        })
        .collect();
    let one = 1.0f32.to_le_bytes();
    let input_scale = 0.004f32.to_le_bytes();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("mx.w2.weight", Dtype::I8, &[o, k / 2], &packed),
            ("mx.w2.scale", Dtype::F8E8M0, &[o, k / 32], &mx_scale),
            ("nv.w2.weight", Dtype::U8, &[o, k / 2], &packed),
            ("nv.w2.weight_scale", Dtype::F8E4M3, &[o, k / 16], &nv_scale),
            ("nv.w2.weight_scale_2", Dtype::F32, &[], &one),
            ("nv.w2.input_scale", Dtype::F32, &[], &input_scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let nv = ckpt.linear("nv.w2", o, k).unwrap();
    assert_eq!(nv.form(), LinearForm::Nvfp4 { scale_2: 1.0 });
    let mx = ckpt.linear_f32("mx.w2", o, k).unwrap();
    let got = nv.decode_f32().unwrap();
    for (i, (a, b)) in got.iter().zip(&mx).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "element ({}, {})", i / k, i % k);
    }
}
