//! What a reader must return for values stored in each linear storage, by the numerics
//! encoders (the ones synth uses too, so a round trip checks names, offsets, shapes and
//! storage choices; the formats themselves are checked against hand-computed values in
//! `hand_written`, `v41_formats` and `engram`): shared by the round trips of every preset.

use needlescope::checkpoint::inventory::{LinearStorage, FP4_GROUP};
use needlescope::numerics::codecs::bf16_round;
use needlescope::numerics::formats::{
    dequant_fp4_group, dequant_fp8_block, dequant_nvfp4, quant_fp4_group, quant_fp8_block,
    quant_nvfp4,
};

/// What a reader must return for `x` stored as `storage` ([out, in] = `o`, `i`): the
/// square FP8 block, the FP4 group, NVFP4, and the Engram table's FP8 rows (1 x 32 blocks,
/// also decoded by hand in `synth_v41::v41_tiny_engram_tables_decode_by_hand`).
pub fn rounded(storage: LinearStorage, x: &[f32], o: usize, i: usize) -> Vec<f32> {
    match storage {
        LinearStorage::Bf16 => x.iter().map(|&v| bf16_round(v)).collect(),
        LinearStorage::Fp8Block { block: (1, g) } => x
            .chunks(i)
            .flat_map(|row| {
                let (w, s) = quant_fp8_block(row, 1, i, g).unwrap();
                dequant_fp8_block(&w, &s, 1, i, g).unwrap()
            })
            .collect(),
        LinearStorage::Fp8Block { block: (b, _) } => {
            let (w, s) = quant_fp8_block(x, o, i, b).unwrap();
            dequant_fp8_block(&w, &s, o, i, b).unwrap()
        }
        LinearStorage::Fp4Group => {
            let (w, s) = quant_fp4_group(x, o, i, FP4_GROUP).unwrap();
            dequant_fp4_group(&w, &s, o, i, FP4_GROUP).unwrap()
        }
        LinearStorage::Nvfp4 => {
            let (w, s, s2) = quant_nvfp4(x, o, i).unwrap();
            dequant_nvfp4(&w, &s, s2, o, i).unwrap()
        }
    }
}
