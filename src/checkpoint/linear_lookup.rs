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

impl Checkpoint {
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
                let why = format!("E8M0 scale of a [{rows}, {cols}] weight in {bo}x{bi} blocks");
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
