//! [`EngramTable`]: one DeepSeek-V4.1 Engram lookup table as stored, borrowed zero-copy, and the
//! decode of single rows of it (docs/spec/v41.md 4.1, 5.2).
//!
//! Storage (layers 1 and 14 of the release):
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `layers.{L}.engram.embed.weight` | F8_E4M3 | `[rows, width]` (width 256) |
//! | `layers.{L}.engram.embed.scale` | F8_E8M0 | `[rows, ceil(width / 32)]` (8) |
//!
//! Element `(r, c)` is `e4m3(W[r, c]) · 2^(S[r, c / 32] − 127)`: one power-of-two scale per 32
//! consecutive columns of one row (a 1x32 block; the last block of a row may be partial).
//!
//! Each table of the release is about 98 GB (384M rows of 264 bytes) and memory-mapped: a view
//! is built from the two tensors' headers and byte slices without reading them, and a row decode
//! touches that row's `width` weight bytes and `ceil(width / 32)` scale bytes only. Nothing here
//! copies, scans or checksums a whole table (`inspect --verify` reads every value, in bounded
//! pieces, when asked to).
//!
//! **Rounding.** The reference dequantises the 24 rows a token looks up and casts them to bf16
//! before the `wkv` projection (spec 5.2). [`EngramPrecision::Bf16`] gives exactly that (RNE of
//! the f32 value); [`EngramPrecision::F32`] gives the dequantised value itself. The two differ only
//! where `e4m3 · 2^k` falls below bf16's normal range (|x| < 2^-126) or overflows; a forward
//! that follows the reference asks for `Bf16`.
//!
//! A scale code of 0xFF (E8M0 NaN) in a requested row is refused, as [`Checkpoint::loaded_linear`]
//! refuses one in a linear's scales; only the requested rows are checked.

use super::dtype::Dtype;
use super::reader::{wrong_dtype, Checkpoint, TensorInfo};
use super::CheckpointError;
use crate::numerics::codecs::{bf16_round, e4m3_to_f32, e8m0_to_f32};

/// Columns that share one E8M0 scale in an Engram row (the inventory's rule).
pub use super::inventory::ENGRAM_GROUP;

/// The weight and scale tensor names of layer `layer`'s Engram table.
pub fn engram_table_names(layer: usize) -> (String, String) {
    (
        format!("layers.{layer}.engram.embed.weight"),
        format!("layers.{layer}.engram.embed.scale"),
    )
}

/// What a decoded row is rounded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngramPrecision {
    /// `e4m3 · 2^(e − 127)` in f32.
    F32,
    /// The f32 value rounded to the nearest bf16 (ties to even), as the reference feeds the rows
    /// to `wkv` (docs/spec/v41.md 5.2).
    Bf16,
}

/// A borrowed view of one Engram table: F8_E4M3 rows with one F8_E8M0 scale per 32 columns.
#[derive(Clone, Copy, Debug)]
pub struct EngramTable<'a> {
    weight_info: &'a TensorInfo,
    scale_info: &'a TensorInfo,
    weight: &'a [u8],
    scale: &'a [u8],
    rows: usize,
    width: usize,
    groups: usize,
}

impl<'a> EngramTable<'a> {
    /// Builds the view from the two tensors' headers and their stored bytes (as
    /// [`Checkpoint::raw_bytes`] gives them), checking dtypes (F8_E4M3 and F8_E8M0), shapes
    /// (`[rows, width]` and `[rows, ceil(width / 32)]`) and byte lengths. Reads no element.
    pub fn new(
        weight_info: &'a TensorInfo,
        weight: &'a [u8],
        scale_info: &'a TensorInfo,
        scale: &'a [u8],
    ) -> Result<Self, CheckpointError> {
        if weight_info.dtype != Dtype::F8E4M3 {
            return Err(wrong_dtype(
                weight_info,
                "F8_E4M3 (an Engram table: e4m3 rows)",
                weight_info.dtype,
            ));
        }
        if scale_info.dtype != Dtype::F8E8M0 {
            return Err(wrong_dtype(
                scale_info,
                &format!(
                    "F8_E8M0 (the power-of-two scales of Engram table {})",
                    weight_info.name
                ),
                scale_info.dtype,
            ));
        }
        let &[rows, width] = weight_info.shape.as_slice() else {
            return Err(CheckpointError::Unsupported {
                file: weight_info.file.clone(),
                tensor: weight_info.name.clone(),
                what: format!(
                    "an Engram table is two-dimensional, expected shape [rows, width], found {:?}",
                    weight_info.shape
                ),
            });
        };
        let groups = width.div_ceil(ENGRAM_GROUP);
        if scale_info.shape != [rows, groups] {
            return Err(CheckpointError::WrongShape {
                file: scale_info.file.clone(),
                tensor: scale_info.name.clone(),
                expected: vec![rows, groups],
                found: scale_info.shape.clone(),
                why: format!(
                    " (one E8M0 scale per {ENGRAM_GROUP} columns of {} [{rows}, {width}])",
                    weight_info.name
                ),
            });
        }
        for (info, bytes, expected) in [
            (weight_info, weight, rows * width),
            (scale_info, scale, rows * groups),
        ] {
            if bytes.len() != expected {
                return Err(CheckpointError::Unsupported {
                    file: info.file.clone(),
                    tensor: info.name.clone(),
                    what: format!(
                        "view given {} bytes, expected {expected} (one byte per element of {} \
                         {:?})",
                        bytes.len(),
                        info.dtype,
                        info.shape
                    ),
                });
            }
        }
        Ok(EngramTable {
            weight_info,
            scale_info,
            weight,
            scale,
            rows,
            width,
            groups,
        })
    }

    /// Checks the table against the shape the config implies (`engram_num_embeddings[i]` rows
    /// of `engram_head_dim` columns), naming the weight tensor when it differs.
    pub fn expect_shape(&self, rows: usize, width: usize) -> Result<(), CheckpointError> {
        if (self.rows, self.width) == (rows, width) {
            return Ok(());
        }
        Err(CheckpointError::WrongShape {
            file: self.weight_info.file.clone(),
            tensor: self.weight_info.name.clone(),
            expected: vec![rows, width],
            found: vec![self.rows, self.width],
            why: " (engram_num_embeddings rows of engram_head_dim columns, from config.json)"
                .into(),
        })
    }

    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of one row (256 in the release).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The weight tensor's header (name, file, dtype, shape).
    pub fn weight_info(&self) -> &'a TensorInfo {
        self.weight_info
    }

    /// The scale tensor's header.
    pub fn scale_info(&self) -> &'a TensorInfo {
        self.scale_info
    }

    /// Row `row` decoded into `out` (`width` values). Reads that row's bytes only.
    ///
    /// Panics if `out.len() != self.width()` (a caller bug); a row out of range or a NaN scale
    /// code is an error.
    pub fn decode_row_into(
        &self,
        row: usize,
        precision: EngramPrecision,
        out: &mut [f32],
    ) -> Result<(), CheckpointError> {
        assert_eq!(
            out.len(),
            self.width,
            "an Engram row of {} has {} values",
            self.weight_info.name,
            self.width
        );
        if row >= self.rows {
            return Err(CheckpointError::RowOutOfRange {
                file: self.weight_info.file.clone(),
                tensor: self.weight_info.name.clone(),
                row,
                rows: self.rows,
            });
        }
        let codes = &self.weight[row * self.width..(row + 1) * self.width];
        let scales = &self.scale[row * self.groups..(row + 1) * self.groups];
        if let Some(g) = scales.iter().position(|&s| s == 0xFF) {
            return Err(CheckpointError::BadScale {
                file: self.scale_info.file.clone(),
                tensor: self.scale_info.name.clone(),
                dtype: Dtype::F8E8M0,
                at: vec![row, g],
                code: "code 0xFF (NaN)".into(),
            });
        }
        for ((o, c), s) in out
            .chunks_mut(ENGRAM_GROUP)
            .zip(codes.chunks(ENGRAM_GROUP))
            .zip(scales)
        {
            let s = e8m0_to_f32(*s);
            for (o, &b) in o.iter_mut().zip(c) {
                *o = e4m3_to_f32(b) * s;
            }
        }
        if precision == EngramPrecision::Bf16 {
            for o in out.iter_mut() {
                *o = bf16_round(*o);
            }
        }
        Ok(())
    }

    /// Row `row` decoded (`width` values).
    pub fn decode_row(
        &self,
        row: usize,
        precision: EngramPrecision,
    ) -> Result<Vec<f32>, CheckpointError> {
        let mut out = vec![0.0; self.width];
        self.decode_row_into(row, precision, &mut out)?;
        Ok(out)
    }

    /// Rows `ids` (in that order, repeats allowed) decoded into one row-major
    /// `[ids.len(), width]` buffer: the gather a token's 24 hashed lookups need.
    pub fn decode_rows(
        &self,
        ids: &[usize],
        precision: EngramPrecision,
    ) -> Result<Vec<f32>, CheckpointError> {
        let mut out = vec![0.0; ids.len() * self.width];
        if self.width > 0 {
            for (&row, o) in ids.iter().zip(out.chunks_mut(self.width)) {
                self.decode_row_into(row, precision, o)?;
            }
        } else if let Some(&row) = ids.iter().find(|&&r| r >= self.rows) {
            // Nothing to decode, but an id past the table is still an error.
            self.decode_row_into(row, precision, &mut [])?;
        }
        Ok(out)
    }
}

impl<C: super::CheckpointConfig> Checkpoint<C> {
    /// The Engram table of layer `layer` (`layers.{layer}.engram.embed.{weight,scale}`), checked
    /// as [`EngramTable::new`] does; check it against the config with
    /// [`EngramTable::expect_shape`].
    pub fn engram_table(&self, layer: usize) -> Result<EngramTable<'_>, CheckpointError> {
        let (wname, sname) = engram_table_names(layer);
        let w = self.require(&wname)?;
        let Some(s) = self.info(&sname) else {
            let groups = w.shape.get(1).map(|c| c.div_ceil(ENGRAM_GROUP));
            let rows = w.shape.first();
            return Err(CheckpointError::MissingScale {
                file: w.file.clone(),
                weight: wname,
                dtype: w.dtype,
                scale: sname,
                expected: format!(
                    "F8_E8M0 [{}, {}]: one power-of-two scale per {ENGRAM_GROUP} columns",
                    rows.map_or("rows".into(), |r| r.to_string()),
                    groups.map_or("ceil(width/32)".into(), |g| g.to_string())
                ),
            });
        };
        EngramTable::new(w, self.bytes_of(w), s, self.bytes_of(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn info(name: &str, dtype: Dtype, shape: &[usize]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            file: PathBuf::from("model-00047-of-00048.safetensors"),
            dtype,
            shape: shape.to_vec(),
            data_offsets: 0..0,
            shard: 0,
        }
    }

    #[test]
    fn a_row_is_its_codes_times_one_scale_per_32_columns() {
        // [3, 40]: two scale groups per row, the second one 8 columns wide.
        let (w, s) = (
            info("t.weight", Dtype::F8E4M3, &[3, 40]),
            info("t.scale", Dtype::F8E8M0, &[3, 2]),
        );
        let codes: Vec<u8> = (0..120)
            .map(|i| [0x38u8, 0xB8, 0x40, 0x30][i % 4])
            .collect();
        let scales = [127u8, 128, 125, 130, 0, 254];
        let t = EngramTable::new(&w, &codes, &s, &scales).unwrap();
        assert_eq!((t.rows(), t.width()), (3, 40));
        let row1 = t.decode_row(1, EngramPrecision::F32).unwrap();
        for (c, &v) in row1.iter().enumerate() {
            let scale = if c < 32 { 0.25 } else { 8.0 };
            assert_eq!(v, e4m3_to_f32(codes[40 + c]) * scale, "column {c}");
        }
        // Extreme scales: 2^-127 keeps f32 subnormals that bf16 flushes to its own grid;
        // 2^127 times 2.0 overflows to infinity in both.
        let row2 = t.decode_row(2, EngramPrecision::F32).unwrap();
        assert_eq!(row2[0], 2f32.powi(-127));
        assert!(row2[34].is_infinite());
        let row2_bf16 = t.decode_row(2, EngramPrecision::Bf16).unwrap();
        for (a, b) in row2.iter().zip(&row2_bf16) {
            assert_eq!(bf16_round(*a).to_bits(), b.to_bits());
        }
    }

    #[test]
    fn decoding_a_row_reads_no_other_row() {
        // A NaN scale code in row 0 does not stop row 1 from decoding: nothing scans the table.
        let (w, s) = (
            info("t.weight", Dtype::F8E4M3, &[2, 32]),
            info("t.scale", Dtype::F8E8M0, &[2, 1]),
        );
        let t = EngramTable::new(&w, &[0x38; 64], &s, &[0xFF, 127]).unwrap();
        assert_eq!(
            t.decode_row(1, EngramPrecision::F32).unwrap(),
            vec![1.0; 32]
        );
        let msg = t
            .decode_row(0, EngramPrecision::F32)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("t.scale") && msg.contains("[0, 0]"), "{msg}");
    }

    #[test]
    fn views_over_slices_of_the_wrong_length_are_refused() {
        let (w, s) = (
            info("t.weight", Dtype::F8E4M3, &[2, 32]),
            info("t.scale", Dtype::F8E8M0, &[2, 1]),
        );
        let msg = EngramTable::new(&w, &[0; 63], &s, &[127; 2])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("t.weight") && msg.contains("63") && msg.contains("expected 64"),
            "{msg}"
        );
        let three_d = info("t.weight", Dtype::F8E4M3, &[2, 4, 8]);
        let msg = EngramTable::new(&three_d, &[0; 64], &s, &[127; 2])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("[2, 4, 8]"), "{msg}");
    }

    #[test]
    fn zero_width_tables_still_check_row_ids() {
        let (w, s) = (
            info("t.weight", Dtype::F8E4M3, &[2, 0]),
            info("t.scale", Dtype::F8E8M0, &[2, 0]),
        );
        let t = EngramTable::new(&w, &[], &s, &[]).unwrap();
        assert!(t
            .decode_rows(&[0, 1], EngramPrecision::F32)
            .unwrap()
            .is_empty());
        assert!(t.decode_rows(&[2], EngramPrecision::F32).is_err());
    }
}
