//! Small safetensors files written by hand: block-scale indexing on odd shapes, FP4 nibble
//! order and NVFP4 scales, read through `Checkpoint::linear` exactly as the model would.

use needlescope::checkpoint::writer::write_safetensors;
use needlescope::checkpoint::{Checkpoint, Dtype, QuantWeight};
use needlescope::config::ModelConfig;
use needlescope::numerics::codecs::{e8m0_to_f32, E4M3_TO_F32};
use std::path::Path;

fn with_config(dir: &Path) {
    std::fs::write(
        dir.join("config.json"),
        ModelConfig::tiny().to_json_string(),
    )
    .unwrap();
}

/// A finite e4m3 code that differs from element to element.
fn code(r: usize, c: usize) -> u8 {
    let b = ((r * 7 + c * 3) % 0x7E) as u8 + 1;
    if r % 2 == 1 {
        b | 0x80
    } else {
        b
    }
}

#[test]
fn fp8_block_scales_apply_per_128x128_tile_on_odd_shapes() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    // [130, 300]: a [2, 3] grid of 128x128 tiles, the last row and column of tiles partial.
    let (rows, cols) = (130usize, 300usize);
    let w: Vec<u8> = (0..rows * cols).map(|i| code(i / cols, i % cols)).collect();
    // Row-major [2, 3] grid, a distinct power of two per tile.
    let scale = [120u8, 122, 124, 128, 130, 133];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("probe.proj.weight", Dtype::F8E4M3, &[rows, cols], &w),
            ("probe.proj.scale", Dtype::F8E8M0, &[2, 3], &scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let q = ckpt.linear("probe.proj", rows, cols).unwrap();
    assert!(matches!(
        q,
        QuantWeight::Fp8Block {
            block: (128, 128),
            ..
        }
    ));
    assert_eq!(q.stored_bytes(), rows * cols + 6);
    let got = q.decode_f32().unwrap();
    let corners = [
        (0, 0, 0),
        (0, 127, 0),
        (127, 0, 0),
        (127, 127, 0),
        (0, 128, 1),
        (127, 255, 1),
        (0, 256, 2),
        (127, 299, 2),
        (128, 0, 3),
        (129, 127, 3),
        (128, 128, 4),
        (129, 255, 4),
        (128, 256, 5),
        (129, 299, 5),
    ];
    for (r, c, tile) in corners {
        let want = E4M3_TO_F32[code(r, c) as usize] * e8m0_to_f32(scale[tile]);
        assert_eq!(got[r * cols + c], want, "element ({r}, {c}) of tile {tile}");
    }
}

#[test]
fn fp8_scale_of_the_wrong_grid_is_rejected_with_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    let w = vec![0x38u8; 130 * 300];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("probe.proj.weight", Dtype::F8E4M3, &[130, 300], &w),
            // The transposed grid: same element count, wrong layout.
            ("probe.proj.scale", Dtype::F8E8M0, &[3, 2], &[127; 6]),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt.linear("probe.proj", 130, 300).unwrap_err().to_string();
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert!(msg.contains("probe.proj.scale"), "{msg}");
    assert!(
        msg.contains("expected shape [2, 3]") && msg.contains("found [3, 2]"),
        "{msg}"
    );
}

#[test]
fn fp4_low_nibble_is_the_even_element_and_scales_are_per_32_inputs() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    // Logical [2, 64]: row 0 bytes 0x21 (codes 1, 2 -> 0.5, 1.0), row 1 bytes 0x9F (codes 15, 9
    // -> -6, -0.5). Scales: row 0 groups 2^0, 2^1; row 1 groups 2^-1, 2^2.
    let mut packed = vec![0x21u8; 32];
    packed.extend(vec![0x9Fu8; 32]);
    let scale = [127u8, 128, 126, 129];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("e.w1.weight", Dtype::I8, &[2, 32], &packed),
            ("e.w1.scale", Dtype::F8E8M0, &[2, 2], &scale),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let got = ckpt.linear_f32("e.w1", 2, 64).unwrap();
    assert_eq!(&got[0..2], &[0.5, 1.0]);
    assert_eq!(&got[32..34], &[1.0, 2.0]);
    assert_eq!(&got[64..66], &[-3.0, -0.25]);
    assert_eq!(&got[96..98], &[-24.0, -2.0]);
}

#[test]
fn nvfp4_uses_e4m3_group_scales_times_the_global_scale() {
    let dir = tempfile::tempdir().unwrap();
    with_config(dir.path());
    // Logical [1, 32]: all codes 2 (1.0); group scales e4m3 0x38 (1.0) and 0x40 (2.0); scale_2 0.5.
    let packed = vec![0x22u8; 16];
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("e.w2.weight", Dtype::U8, &[1, 16], &packed),
            ("e.w2.weight_scale", Dtype::F8E4M3, &[1, 2], &[0x38, 0x40]),
            (
                "e.w2.weight_scale_2",
                Dtype::F32,
                &[],
                &0.5f32.to_le_bytes(),
            ),
            ("e.w2.input_scale", Dtype::F32, &[], &3.0f32.to_le_bytes()),
        ],
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), needlescope::checkpoint::WeightFormat::Nvfp4);
    let got = ckpt.linear_f32("e.w2", 1, 32).unwrap();
    assert!(got[..16].iter().all(|&v| v == 0.5), "{got:?}");
    assert!(got[16..].iter().all(|&v| v == 1.0), "{got:?}");
}
