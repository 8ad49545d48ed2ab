//! [`QuantWeight`]: one linear layer's weight as stored, borrowed zero-copy from the mmap, plus
//! [`Checkpoint::linear`], which finds it by module name and checks it against the shapes the
//! caller (i.e. the config) implies.
//!
//! Logical shape is always `[out, in]` (PyTorch `nn.Linear`: `y = x · Wᵀ`). Storage by the
//! dtype of `<module>.weight` (spec/model.md 2.1-2.5):
//!
//! | weight dtype | stored weight | siblings |
//! |---|---|---|
//! | BF16 / F32 | `[out, in]` | none |
//! | F8_E4M3 | `[out, in]` | `.scale` F8_E8M0 `[ceil(out/bo), ceil(in/bi)]`, block from config |
//! | I8 (official FP4) | `[out, in/2]`, low nibble = even element | `.scale` F8_E8M0 `[out, ceil(in/32)]` |
//! | U8 (NVFP4) | `[out, in/2]` | `.weight_scale` F8_E4M3 `[out, ceil(in/16)]`, `.weight_scale_2` F32 `[]` |
//!
//! NVFP4's `.input_scale` (a static activation scale for W4A4 kernels) is ignored. When the
//! module belongs to the release's expected inventory (spec section 3), its stored dtype must
//! also be the one the config and detected format imply, so a checkpoint that stores `wq_a` as
//! F32 fails here with a message instead of silently running another numerical path; modules
//! outside the inventory accept any of the storages above.

use super::dtype::Dtype;
use super::inventory::{FP4_GROUP, NVFP4_GROUP};
use super::reader::{wrong_dtype, Checkpoint, TensorInfo};
use super::CheckpointError;
use crate::numerics::formats::{
    bf16_bytes_to_f32, dequant_fp4_group, dequant_fp8_block, dequant_nvfp4, f32_bytes_to_f32,
};
use crate::numerics::FormatError;

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
                block: (bo, bi),
            } => {
                if bo != bi {
                    return Err(CheckpointError::NotImplemented {
                        what: format!("{what}: non-square FP8 blocks {bo}x{bi}"),
                    });
                }
                dequant_fp8_block(weight, scale, rows, cols, bo)
            }
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

impl Checkpoint {
    /// The weight of linear `module` (e.g. `layers.3.attn.wq_a`) with logical shape
    /// `[out_dim, in_dim]`, in whatever format it is stored (see the module doc).
    pub fn linear(
        &self,
        module: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<QuantWeight<'_>, CheckpointError> {
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
        let data = self.bytes_of(w);
        match w.dtype {
            Dtype::BF16 | Dtype::F32 => {
                self.check_shape(w, &[rows, cols], "")?;
                Ok(if w.dtype == Dtype::BF16 {
                    QuantWeight::Bf16 { data, rows, cols }
                } else {
                    QuantWeight::F32 { data, rows, cols }
                })
            }
            Dtype::F8E4M3 => {
                self.check_shape(w, &[rows, cols], "")?;
                let (bo, bi) = self.config().weight_block();
                let why = format!("E8M0 scale of a [{rows}, {cols}] weight in {bo}x{bi} blocks");
                let scale = self.sibling(
                    w,
                    module,
                    "scale",
                    Dtype::F8E8M0,
                    &[rows.div_ceil(bo), cols.div_ceil(bi)],
                    &why,
                )?;
                Ok(QuantWeight::Fp8Block {
                    weight: data,
                    scale,
                    rows,
                    cols,
                    block: (bo, bi),
                })
            }
            Dtype::I8 | Dtype::U8 => {
                let why = format!(" (packed FP4 of a [{rows}, {cols}] weight, two codes per byte)");
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
                    let why =
                        format!("E8M0 scale per {FP4_GROUP} inputs of a [{rows}, {cols}] weight");
                    let scale = self.sibling(
                        w,
                        module,
                        "scale",
                        Dtype::F8E8M0,
                        &[rows, cols.div_ceil(FP4_GROUP)],
                        &why,
                    )?;
                    return Ok(QuantWeight::Fp4Group {
                        packed: data,
                        scale,
                        rows,
                        cols,
                        group: FP4_GROUP,
                    });
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
                Ok(QuantWeight::Nvfp4 {
                    packed: data,
                    scale,
                    scale_2: f32::from_le_bytes(s2.try_into().expect("one f32")),
                    rows,
                    cols,
                })
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

    /// [`Checkpoint::linear`] decoded to f32 `[out_dim, in_dim]`.
    pub fn linear_f32(
        &self,
        module: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Vec<f32>, CheckpointError> {
        self.linear(module, out_dim, in_dim)?
            .decode_f32()
            .map_err(|e| match e {
                CheckpointError::Decode { tensor, source } => CheckpointError::Decode {
                    tensor: format!("{module}.weight ({tensor})"),
                    source,
                },
                other => other,
            })
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
    ) -> Result<&[u8], CheckpointError> {
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
        Ok(self.bytes_of(s))
    }
}
