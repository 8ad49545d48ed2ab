//! [`QuantWeight`]: one linear layer's weight as stored, borrowed zero-copy from the mmap, plus
//! [`Checkpoint::linear`], which finds it by module name and checks it against the shapes the
//! caller (i.e. the config) implies.
//!
//! Logical shape is always `[out, in]` (PyTorch `nn.Linear`: `y = x · Wᵀ`). Storage by the
//! dtype of `<module>.weight` (docs/spec/model.md 2.1-2.5):
//!
//! | weight dtype | stored weight | siblings |
//! |---|---|---|
//! | BF16 / F32 | `[out, in]` | none |
//! | F8_E4M3 | `[out, in]` | `.scale` F8_E8M0 `[ceil(out/bo), ceil(in/bi)]`, block from config |
//! | I8 (official FP4) | `[out, in/2]`, low nibble = even element | `.scale` F8_E8M0 `[out, ceil(in/32)]` |
//! | U8 (NVFP4) | `[out, in/2]` | `.weight_scale` F8_E4M3 `[out, ceil(in/16)]`, `.weight_scale_2` F32 `[]` |
//!
//! The FP8 block `(bo, bi)` is never assumed: it is the config's
//! `quantization_config.weight_block_size` (128x128 in V4, 32x32 in V4.1; square or not), carried
//! in [`QuantWeight::Fp8Block`] and used by the decode, the row bands and the GPU kernels alike.
//!
//! NVFP4's `.input_scale` (a static activation scale for W4A4 kernels) is ignored. When the
//! module belongs to the release's expected inventory (spec section 3), its stored dtype must
//! also be the one the config and detected format imply, so a checkpoint that stores `wq_a` as
//! F32 fails here with a message instead of silently running another numerical path; modules
//! outside the inventory accept any of the storages above.
//!
//! [`Checkpoint::shared_linear`] returns the same weight as a [`SharedLinear`], which holds a
//! share of the shard's memory map instead of a borrow, so an engine can keep weights in their
//! stored format and decode them (whole, or by row bands with [`QuantWeight::row_band`]) when
//! it uses them, long after the `Checkpoint` is gone.

use super::dtype::Dtype;
use super::inventory::{FP4_GROUP, NVFP4_GROUP};
use super::reader::{wrong_dtype, Checkpoint, TensorInfo};
use super::CheckpointError;
use crate::numerics::formats::{
    bf16_bytes_to_f32, dequant_fp4_group, dequant_fp8_block_rect, dequant_nvfp4, f32_bytes_to_f32,
};
use crate::numerics::FormatError;
use memmap2::Mmap;
use std::ops::Range;
use std::sync::Arc;

/// A linear weight in its stored format (all slices borrow the checkpoint's mmap).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuantWeight<'a> {
    Bf16 {
        data: &'a [u8],
        rows: usize,
        cols: usize,
    },
    F32 {
        data: &'a [u8],
        rows: usize,
        cols: usize,
    },
    /// e4m3 codes `[rows, cols]`, e8m0 scales per `block` (rows x cols) tile.
    Fp8Block {
        weight: &'a [u8],
        scale: &'a [u8],
        rows: usize,
        cols: usize,
        block: (usize, usize),
    },
    /// Packed e2m1 `[rows, cols/2]`, e8m0 scales per `group` columns.
    Fp4Group {
        packed: &'a [u8],
        scale: &'a [u8],
        rows: usize,
        cols: usize,
        group: usize,
    },
    /// Packed e2m1 `[rows, cols/2]`, e4m3 scales per 16 columns, one f32 global scale.
    Nvfp4 {
        packed: &'a [u8],
        scale: &'a [u8],
        scale_2: f32,
        rows: usize,
        cols: usize,
    },
}

/// How a linear is stored, without its bytes: the variant of [`QuantWeight`] and its scale
/// parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinearForm {
    Bf16,
    F32,
    Fp8Block { block: (usize, usize) },
    Fp4Group { group: usize },
    Nvfp4 { scale_2: f32 },
}

impl<'a> QuantWeight<'a> {
    /// Assembles a weight from its form and bytes (`scale` is ignored by `Bf16` / `F32`).
    pub fn from_parts(
        form: LinearForm,
        weight: &'a [u8],
        scale: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Self {
        match form {
            LinearForm::Bf16 => QuantWeight::Bf16 {
                data: weight,
                rows,
                cols,
            },
            LinearForm::F32 => QuantWeight::F32 {
                data: weight,
                rows,
                cols,
            },
            LinearForm::Fp8Block { block } => QuantWeight::Fp8Block {
                weight,
                scale,
                rows,
                cols,
                block,
            },
            LinearForm::Fp4Group { group } => QuantWeight::Fp4Group {
                packed: weight,
                scale,
                rows,
                cols,
                group,
            },
            LinearForm::Nvfp4 { scale_2 } => QuantWeight::Nvfp4 {
                packed: weight,
                scale,
                scale_2,
                rows,
                cols,
            },
        }
    }

    /// The form of this weight (its variant and scale parameters).
    pub fn form(&self) -> LinearForm {
        match *self {
            QuantWeight::Bf16 { .. } => LinearForm::Bf16,
            QuantWeight::F32 { .. } => LinearForm::F32,
            QuantWeight::Fp8Block { block, .. } => LinearForm::Fp8Block { block },
            QuantWeight::Fp4Group { group, .. } => LinearForm::Fp4Group { group },
            QuantWeight::Nvfp4 { scale_2, .. } => LinearForm::Nvfp4 { scale_2 },
        }
    }

    /// Output rows that share one scale along the output dimension: FP8 blocks span `block.0`
    /// rows, every other format scales each row on its own (1). Row bands start on multiples.
    pub fn row_alignment(&self) -> usize {
        match *self {
            QuantWeight::Fp8Block { block, .. } => block.0.max(1),
            _ => 1,
        }
    }

    /// Rows `band` of this weight as a weight of its own, borrowing the same bytes; decoding it
    /// gives exactly those rows of [`QuantWeight::decode_f32`] (dequantisation is per element).
    /// `band.start` must be a multiple of [`QuantWeight::row_alignment`], and `band.end` too
    /// unless it is `rows()`; a band outside the weight or misaligned panics (a caller bug).
    pub fn row_band(&self, band: Range<usize>) -> QuantWeight<'a> {
        let (rows, cols, align) = (self.rows(), self.cols(), self.row_alignment());
        assert!(
            band.start <= band.end && band.end <= rows,
            "row band {band:?} outside a weight of {rows} rows"
        );
        assert!(
            band.start.is_multiple_of(align)
                && (band.end.is_multiple_of(align) || band.end == rows),
            "row band {band:?} not aligned to {align}-row scale blocks"
        );
        let n = band.len();
        let (r0, r1) = (band.start, band.end);
        match *self {
            QuantWeight::Bf16 { data, .. } => QuantWeight::Bf16 {
                data: &data[r0 * cols * 2..r1 * cols * 2],
                rows: n,
                cols,
            },
            QuantWeight::F32 { data, .. } => QuantWeight::F32 {
                data: &data[r0 * cols * 4..r1 * cols * 4],
                rows: n,
                cols,
            },
            QuantWeight::Fp8Block {
                weight,
                scale,
                block,
                ..
            } => {
                let sc = cols.div_ceil(block.1);
                QuantWeight::Fp8Block {
                    weight: &weight[r0 * cols..r1 * cols],
                    scale: &scale[(r0 / align) * sc..r1.div_ceil(align) * sc],
                    rows: n,
                    cols,
                    block,
                }
            }
            QuantWeight::Fp4Group {
                packed,
                scale,
                group,
                ..
            } => {
                let sc = cols.div_ceil(group);
                QuantWeight::Fp4Group {
                    packed: &packed[r0 * cols / 2..r1 * cols / 2],
                    scale: &scale[r0 * sc..r1 * sc],
                    rows: n,
                    cols,
                    group,
                }
            }
            QuantWeight::Nvfp4 {
                packed,
                scale,
                scale_2,
                ..
            } => {
                let sc = cols.div_ceil(NVFP4_GROUP);
                QuantWeight::Nvfp4 {
                    packed: &packed[r0 * cols / 2..r1 * cols / 2],
                    scale: &scale[r0 * sc..r1 * sc],
                    scale_2,
                    rows: n,
                    cols,
                }
            }
        }
    }
}

impl QuantWeight<'_> {
    /// Logical output dimension.
    pub fn rows(&self) -> usize {
        match *self {
            QuantWeight::Bf16 { rows, .. }
            | QuantWeight::F32 { rows, .. }
            | QuantWeight::Fp8Block { rows, .. }
            | QuantWeight::Fp4Group { rows, .. }
            | QuantWeight::Nvfp4 { rows, .. } => rows,
        }
    }

    /// Logical input dimension.
    pub fn cols(&self) -> usize {
        match *self {
            QuantWeight::Bf16 { cols, .. }
            | QuantWeight::F32 { cols, .. }
            | QuantWeight::Fp8Block { cols, .. }
            | QuantWeight::Fp4Group { cols, .. }
            | QuantWeight::Nvfp4 { cols, .. } => cols,
        }
    }

    /// Bytes held on disk (weight plus scales).
    pub fn stored_bytes(&self) -> usize {
        match *self {
            QuantWeight::Bf16 { data, .. } | QuantWeight::F32 { data, .. } => data.len(),
            QuantWeight::Fp8Block { weight, scale, .. } => weight.len() + scale.len(),
            QuantWeight::Fp4Group { packed, scale, .. } => packed.len() + scale.len(),
            QuantWeight::Nvfp4 { packed, scale, .. } => packed.len() + scale.len() + 4,
        }
    }

    /// Short name of the storage kind (`bf16`, `f32`, `fp8-block`, `fp4-group`, `nvfp4`).
    pub fn kind(&self) -> &'static str {
        match self {
            QuantWeight::Bf16 { .. } => "bf16",
            QuantWeight::F32 { .. } => "f32",
            QuantWeight::Fp8Block { .. } => "fp8-block",
            QuantWeight::Fp4Group { .. } => "fp4-group",
            QuantWeight::Nvfp4 { .. } => "nvfp4",
        }
    }

    /// Dequantises to f32 `[rows, cols]`, row-major.
    pub fn decode_f32(&self) -> Result<Vec<f32>, CheckpointError> {
        let what = format!("{} weight [{}, {}]", self.kind(), self.rows(), self.cols());
        let len_check = |data: &[u8], width: usize| {
            let expected = self.rows() * self.cols() * width;
            if data.len() == expected {
                Ok(())
            } else {
                Err(FormatError::Length {
                    what: "linear weight (bytes)",
                    expected,
                    found: data.len(),
                })
            }
        };
        let r = match *self {
            QuantWeight::Bf16 { data, .. } => {
                len_check(data, 2).and_then(|_| bf16_bytes_to_f32(data))
            }
            QuantWeight::F32 { data, .. } => {
                len_check(data, 4).and_then(|_| f32_bytes_to_f32(data))
            }
            QuantWeight::Fp8Block {
                weight,
                scale,
                rows,
                cols,
                block,
            } => dequant_fp8_block_rect(weight, scale, rows, cols, block),
            QuantWeight::Fp4Group {
                packed,
                scale,
                rows,
                cols,
                group,
            } => dequant_fp4_group(packed, scale, rows, cols, group),
            QuantWeight::Nvfp4 {
                packed,
                scale,
                scale_2,
                rows,
                cols,
            } => dequant_nvfp4(packed, scale, scale_2, rows, cols),
        };
        r.map_err(|source| CheckpointError::Decode {
            tensor: what,
            source,
        })
    }
}

/// One tensor's bytes inside a shard's memory map, keeping the map alive.
#[derive(Clone)]
pub(super) struct MappedBytes {
    pub(super) map: Arc<Mmap>,
    pub(super) range: Range<usize>,
}

impl MappedBytes {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// A linear weight in its stored format holding a share of the checkpoint's memory maps (not a
/// borrow): what an engine keeps to decode the weight on use. [`SharedLinear::view`] is the
/// same [`QuantWeight`] that [`Checkpoint::linear`] returns.
#[derive(Clone)]
pub struct SharedLinear {
    pub(super) module: String,
    pub(super) form: LinearForm,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) weight: MappedBytes,
    pub(super) scale: Option<MappedBytes>,
}

impl SharedLinear {
    /// The module name (`layers.3.attn.wq_a`).
    pub fn module(&self) -> &str {
        &self.module
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The weight as stored, borrowing the shared map.
    pub fn view(&self) -> QuantWeight<'_> {
        let scale = self.scale.as_ref().map_or(&[][..], MappedBytes::bytes);
        QuantWeight::from_parts(self.form, self.weight.bytes(), scale, self.rows, self.cols)
    }

    /// Decoded to f32 `[rows, cols]` (as [`Checkpoint::linear_f32`]).
    pub fn decode_f32(&self) -> Result<Vec<f32>, CheckpointError> {
        self.view()
            .decode_f32()
            .map_err(|e| name_decode_error(&self.module, e))
    }

    /// See [`QuantWeight::row_alignment`].
    pub fn row_alignment(&self) -> usize {
        self.view().row_alignment()
    }

    /// Rows `band` decoded to f32 `[band.len(), cols]`: exactly those rows of
    /// [`SharedLinear::decode_f32`]. Alignment as for [`QuantWeight::row_band`].
    pub fn decode_rows(&self, band: Range<usize>) -> Result<Vec<f32>, CheckpointError> {
        self.view()
            .row_band(band)
            .decode_f32()
            .map_err(|e| name_decode_error(&self.module, e))
    }
}

impl std::fmt::Debug for SharedLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLinear")
            .field("module", &self.module)
            .field("form", &self.form)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// Prefixes a decode error's tensor description with the module's weight name.
pub(super) fn name_decode_error(module: &str, e: CheckpointError) -> CheckpointError {
    match e {
        CheckpointError::Decode { tensor, source } => CheckpointError::Decode {
            tensor: format!("{module}.weight ({tensor})"),
            source,
        },
        other => other,
    }
}

mod lookup {
    //! Finding a linear layer in a checkpoint (a part of `linear.rs`): [`Checkpoint::linear`],
    //! [`Checkpoint::shared_linear`] and friends locate `<module>.weight` and its scale siblings,
    //! check the stored dtype and shapes against the `[out, in]` the config implies (and, inside the
    //! release inventory, against the detected format), and check the scale codes.

    use super::*;

    /// Where a validated linear lives: its weight and scale tensors and its form.
    struct Located<'c> {
        weight: &'c TensorInfo,
        scale: Option<&'c TensorInfo>,
        form: LinearForm,
        rows: usize,
        cols: usize,
    }

    impl<C: crate::checkpoint::CheckpointConfig> Checkpoint<C> {
        /// The weight of linear `module` (e.g. `layers.3.attn.wq_a`) with logical shape
        /// `[out_dim, in_dim]`, in whatever format it is stored (see the module doc).
        pub fn linear(
            &self,
            module: &str,
            out_dim: usize,
            in_dim: usize,
        ) -> Result<QuantWeight<'_>, CheckpointError> {
            let l = self.locate(module, out_dim, in_dim)?;
            let scale = l.scale.map_or(&[][..], |s| self.bytes_of(s));
            Ok(QuantWeight::from_parts(
                l.form,
                self.bytes_of(l.weight),
                scale,
                l.rows,
                l.cols,
            ))
        }

        /// [`Checkpoint::linear`] as a [`SharedLinear`], which keeps the shard maps alive on its
        /// own (same checks, same bytes).
        pub fn shared_linear(
            &self,
            module: &str,
            out_dim: usize,
            in_dim: usize,
        ) -> Result<SharedLinear, CheckpointError> {
            let l = self.locate(module, out_dim, in_dim)?;
            Ok(self.share(module, l))
        }

        /// [`Checkpoint::shared_linear`] for a weight about to be loaded: also refuses a scale
        /// tensor holding a NaN code (`Checkpoint::check_scale_codes`, one pass over the scale
        /// bytes, which loading reads anyway). Inspecting shapes (e.g. `bench`'s parameter count)
        /// uses `shared_linear` and reads no scale.
        pub fn loaded_linear(
            &self,
            module: &str,
            out_dim: usize,
            in_dim: usize,
        ) -> Result<SharedLinear, CheckpointError> {
            let l = self.locate(module, out_dim, in_dim)?;
            if let Some(scale) = l.scale {
                self.check_scale_codes(scale)?;
            }
            Ok(self.share(module, l))
        }

        fn share(&self, module: &str, l: Located<'_>) -> SharedLinear {
            let mapped = |t: &TensorInfo| MappedBytes {
                map: Arc::clone(self.shard_map(t)),
                range: t.data_offsets.clone(),
            };
            SharedLinear {
                module: module.to_string(),
                form: l.form,
                rows: l.rows,
                cols: l.cols,
                weight: mapped(l.weight),
                scale: l.scale.map(mapped),
            }
        }

        /// Finds and checks the tensors of linear `module` (see the module doc).
        fn locate(
            &self,
            module: &str,
            out_dim: usize,
            in_dim: usize,
        ) -> Result<Located<'_>, CheckpointError> {
            let wname = format!("{module}.weight");
            let w = self.require(&wname)?;
            if let Some(exp) = self.expected(&wname) {
                if exp.dtype != w.dtype {
                    let expected = format!(
                        "{} (what config.json implies in the {} format)",
                        exp.dtype,
                        self.format()
                    );
                    return Err(wrong_dtype(w, &expected, w.dtype));
                }
            }
            let (rows, cols) = (out_dim, in_dim);
            let located = |scale, form| Located {
                weight: w,
                scale,
                form,
                rows,
                cols,
            };
            match w.dtype {
                Dtype::BF16 | Dtype::F32 => {
                    self.check_shape(w, &[rows, cols], "")?;
                    Ok(located(
                        None,
                        if w.dtype == Dtype::BF16 {
                            LinearForm::Bf16
                        } else {
                            LinearForm::F32
                        },
                    ))
                }
                Dtype::F8E4M3 => {
                    self.check_shape(w, &[rows, cols], "")?;
                    let (bo, bi) = self.config().weight_block();
                    let why =
                        format!("E8M0 scale of a [{rows}, {cols}] weight in {bo}x{bi} blocks");
                    let scale = self.sibling(
                        w,
                        module,
                        "scale",
                        Dtype::F8E8M0,
                        &[rows.div_ceil(bo), cols.div_ceil(bi)],
                        &why,
                    )?;
                    Ok(located(
                        Some(scale),
                        LinearForm::Fp8Block { block: (bo, bi) },
                    ))
                }
                Dtype::I8 | Dtype::U8 => {
                    let why =
                        format!(" (packed FP4 of a [{rows}, {cols}] weight, two codes per byte)");
                    if cols % 2 != 0 {
                        return Err(CheckpointError::Unsupported {
                            file: w.file.clone(),
                            tensor: wname,
                            what: format!(
                                "packed FP4 needs an even in_dim, expected even, found {cols}"
                            ),
                        });
                    }
                    self.check_shape(w, &[rows, cols / 2], &why)?;
                    if w.dtype == Dtype::I8 {
                        let why = format!(
                            "E8M0 scale per {FP4_GROUP} inputs of a [{rows}, {cols}] weight"
                        );
                        let scale = self.sibling(
                            w,
                            module,
                            "scale",
                            Dtype::F8E8M0,
                            &[rows, cols.div_ceil(FP4_GROUP)],
                            &why,
                        )?;
                        return Ok(located(
                            Some(scale),
                            LinearForm::Fp4Group { group: FP4_GROUP },
                        ));
                    }
                    let why = format!(
                        "NVFP4 e4m3 scale per {NVFP4_GROUP} inputs of a [{rows}, {cols}] weight"
                    );
                    let scale = self.sibling(
                        w,
                        module,
                        "weight_scale",
                        Dtype::F8E4M3,
                        &[rows, cols.div_ceil(NVFP4_GROUP)],
                        &why,
                    )?;
                    let s2 = self.sibling(
                        w,
                        module,
                        "weight_scale_2",
                        Dtype::F32,
                        &[],
                        "NVFP4 global scale",
                    )?;
                    self.check_scale_codes(s2)?;
                    let s2 = self.bytes_of(s2);
                    Ok(located(
                        Some(scale),
                        LinearForm::Nvfp4 {
                            scale_2: f32::from_le_bytes(s2.try_into().expect("one f32")),
                        },
                    ))
                }
                other => Err(CheckpointError::Unsupported {
                    file: w.file.clone(),
                    tensor: wname,
                    what: format!(
                        "dtype {other} cannot hold a linear weight; expected BF16, F32, F8_E4M3 \
                     (+ .scale), I8 (+ .scale) or U8 (+ .weight_scale, .weight_scale_2)"
                    ),
                }),
            }
        }

        /// Layer `layer`'s Engram table (`layers.{layer}.engram.embed.weight`, `[rows, width]`)
        /// as a linear weight, so that a backend gathers its rows as it gathers embedding rows:
        /// F8_E4M3 with one E8M0 `.scale` per 32 columns of a row is FP8 in blocks of
        /// `(1, 32)`; BF16 and F32 tables are plain. Scale codes are checked as at any load.
        pub fn engram_table_linear(
            &self,
            layer: usize,
            rows: usize,
            width: usize,
        ) -> Result<SharedLinear, CheckpointError> {
            let module = format!("layers.{layer}.engram.embed");
            let w = self.require(&format!("{module}.weight"))?;
            self.check_shape(w, &[rows, width], " (an Engram table)")?;
            let located = |scale, form| Located {
                weight: w,
                scale,
                form,
                rows,
                cols: width,
            };
            let l = match w.dtype {
                Dtype::BF16 => located(None, LinearForm::Bf16),
                Dtype::F32 => located(None, LinearForm::F32),
                Dtype::F8E4M3 => {
                    let group = crate::checkpoint::inventory::ENGRAM_GROUP;
                    let scale = self.sibling(
                        w,
                        &module,
                        "scale",
                        Dtype::F8E8M0,
                        &[rows, width.div_ceil(group)],
                        "one E8M0 scale per 32 columns of an Engram row",
                    )?;
                    self.check_scale_codes(scale)?;
                    located(Some(scale), LinearForm::Fp8Block { block: (1, group) })
                }
                found => {
                    return Err(wrong_dtype(
                        w,
                        "F8_E4M3 (+ .scale), BF16 or F32 (an Engram table)",
                        found,
                    ))
                }
            };
            Ok(self.share(&module, l))
        }

        /// [`Checkpoint::linear`] decoded to f32 `[out_dim, in_dim]`.
        pub fn linear_f32(
            &self,
            module: &str,
            out_dim: usize,
            in_dim: usize,
        ) -> Result<Vec<f32>, CheckpointError> {
            self.linear(module, out_dim, in_dim)?
                .decode_f32()
                .map_err(|e| name_decode_error(module, e))
        }

        /// The scale sibling `<module>.<suffix>` of weight `w`, checked for dtype and shape
        /// (a scalar `[]` also accepts `[1]`).
        fn sibling(
            &self,
            w: &TensorInfo,
            module: &str,
            suffix: &str,
            dtype: Dtype,
            shape: &[usize],
            why: &str,
        ) -> Result<&TensorInfo, CheckpointError> {
            let name = format!("{module}.{suffix}");
            let Some(s) = self.info(&name) else {
                return Err(CheckpointError::MissingScale {
                    file: w.file.clone(),
                    weight: w.name.clone(),
                    dtype: w.dtype,
                    scale: name,
                    expected: format!("{dtype} {shape:?}: {why}"),
                });
            };
            if s.dtype != dtype {
                return Err(wrong_dtype(s, &format!("{dtype} ({why})"), s.dtype));
            }
            let scalar_ok = shape.is_empty() && s.shape == [1];
            if !scalar_ok {
                self.check_shape(s, shape, &format!(" ({why})"))?;
            }
            Ok(s)
        }

        /// Refuses a scale tensor holding a NaN code (E8M0 0xFF; e4m3 S.1111.111; a non-finite f32
        /// global scale): it would turn its whole block of weights into NaN and surface, far
        /// away, as NaN scores or logits. One pass over the scale bytes ([`Checkpoint::loaded_linear`]
        /// at load): 1/16 of the packed weight bytes for MXFP4, 1/8 for NVFP4, 1/16,384 for FP8; the
        /// NVFP4 global scale (one value) is checked whenever the linear is located.
        fn check_scale_codes(&self, s: &TensorInfo) -> Result<(), CheckpointError> {
            let bytes = self.bytes_of(s);
            let bad = match s.dtype {
                Dtype::F8E8M0 => bytes.iter().position(|&b| b == 0xFF),
                Dtype::F8E4M3 => bytes.iter().position(|&b| b & 0x7F == 0x7F),
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .position(|c| !f32::from_le_bytes(c.try_into().expect("4 bytes")).is_finite()),
                _ => None,
            };
            let Some(i) = bad else { return Ok(()) };
            let mut at = vec![0; s.shape.len()];
            let mut rest = i;
            for (d, &n) in s.shape.iter().enumerate().rev() {
                at[d] = rest % n.max(1);
                rest /= n.max(1);
            }
            let code = match s.dtype {
                Dtype::F32 => format!(
                    "{}",
                    f32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
                ),
                _ => format!("code 0x{:02X} (NaN)", bytes[i]),
            };
            Err(CheckpointError::BadScale {
                file: s.file.clone(),
                tensor: s.name.clone(),
                dtype: s.dtype,
                at,
                code,
            })
        }
    }
}
