//! Every stored value of a checkpoint read once (`inspect --model DIR --verify`): tensors
//! holding NaN or infinite values, and tensors whose every value is zero, named with their shard,
//! dtype and counts. The inventory check reads headers only, so it passes a checkpoint whose
//! weights were damaged in place; this reads the data.
//!
//! Reading: shard by shard, tensors in file order, each in pieces of at most a chunk (8 MiB by
//! default) read into one reused buffer with plain file reads, never through the memory map,
//! so memory stays bounded by the chunk whatever the shard's size (a mapped 4 GiB shard read
//! end to end would count 4 GiB in the process's resident set).
//!
//! What counts, per stored dtype ([`scan`]):
//!
//! | dtype | NaN | infinite | zero |
//! |---|---|---|---|
//! | F64, F32, F16, BF16 | exponent all ones, mantissa not 0 | exponent all ones, mantissa 0 | ±0 |
//! | F8_E5M2 | `0x7D-0x7F`, `0xFD-0xFF` | `0x7C`, `0xFC` | `0x00`, `0x80` |
//! | F8_E4M3 (e4m3fn) | `0x7F`, `0xFF` | none (no infinity) | `0x00`, `0x80` |
//! | F8_E8M0 (scales) | `0xFF` | none | `0x00` (2^-127: no zero exists; every code `0x00` is a zero-filled region, not scales) |
//! | I8, U8 (packed FP4 e2m1, two per byte) | none | none | nibbles `0x0`, `0x8` (±0) |
//! | BOOL, I16, U16, I32, U32, I64, U64 | none | none | 0 |
//!
//! V4 checkpoints store packed FP4 as I8 (official) or U8 (NVFP4) and no other I8 / U8 tensors,
//! so those two are read as FP4 (`crate::checkpoint::dtype`). A tensor of no elements is never
//! all-zero.
//!
//! An all-zero tensor is a finding (a zero-filled region: a sparse or interrupted download, a
//! tensor never written), except for the additive biases of the inventory, where zero is a
//! valid value (the `planted` model's compressor `ape` is zero by construction): the
//! compressor position bias `ape`, the attention sink `attn_sink` and the router's selection
//! bias `ffn.gate.bias` ([`TensorRole::Ape`], [`TensorRole::AttnSink`], [`TensorRole::GateBias`]). Those are
//! listed apart ([`VerifyReport::zero_biases`]) and do not fail the check.

use super::dtype::{numel, Dtype};
use super::inventory::{logical_inventory, TensorRole};
use super::reader::Checkpoint;
use super::CheckpointError;
use serde::Serialize;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// The piece of a tensor read at once by [`verify`].
pub const CHUNK_BYTES: usize = 8 << 20;

/// What [`scan`] counted over (pieces of) one tensor's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Values scanned (a packed FP4 byte is two).
    pub values: u64,
    pub nan: u64,
    pub inf: u64,
    /// Whether any value is not zero.
    pub nonzero: bool,
    /// Index of the first NaN or infinite element, in stored elements (row-major).
    pub first_non_finite: Option<u64>,
}

impl Scan {
    /// Values scanned, every one zero.
    pub fn all_zero(&self) -> bool {
        self.values > 0 && !self.nonzero
    }
}

/// Counts the NaN, infinite and non-zero values of `bytes`, whole elements of `dtype` (a
/// multiple of its size), and adds them to `scan`; `first` is the element index of `bytes[0]`
/// within its tensor.
pub fn scan(dtype: Dtype, bytes: &[u8], first: u64, scan: &mut Scan) {
    let (nan, inf, nonzero, values) = match dtype {
        Dtype::F64 => count(bytes, |b: [u8; 8]| {
            let x = u64::from_le_bytes(b) & !(1 << 63);
            let exp = 0x7ff << 52;
            (x > exp, x == exp, x != 0)
        }),
        Dtype::F32 => count(bytes, |b: [u8; 4]| {
            let x = u32::from_le_bytes(b) & 0x7fff_ffff;
            (x > 0x7f80_0000, x == 0x7f80_0000, x != 0)
        }),
        Dtype::F16 => count(bytes, |b: [u8; 2]| {
            let x = u16::from_le_bytes(b) & 0x7fff;
            (x > 0x7c00, x == 0x7c00, x != 0)
        }),
        Dtype::BF16 => count(bytes, |b: [u8; 2]| {
            let x = u16::from_le_bytes(b) & 0x7fff;
            (x > 0x7f80, x == 0x7f80, x != 0)
        }),
        Dtype::F8E5M2 => count(bytes, |[b]: [u8; 1]| {
            let x = b & 0x7f;
            (x > 0x7c, x == 0x7c, x != 0)
        }),
        Dtype::F8E4M3 => count(bytes, |[b]: [u8; 1]| {
            let x = b & 0x7f;
            (x == 0x7f, false, x != 0)
        }),
        Dtype::F8E8M0 => count(bytes, |[b]: [u8; 1]| (b == 0xff, false, b != 0)),
        Dtype::I8 | Dtype::U8 => {
            let (n, i, nz, v) = count(bytes, |[b]: [u8; 1]| (false, false, b & 0x77 != 0));
            (n, i, nz, 2 * v)
        }
        Dtype::Bool => count(bytes, |[b]: [u8; 1]| (false, false, b != 0)),
        Dtype::I16 | Dtype::U16 => count(bytes, |b: [u8; 2]| (false, false, b != [0; 2])),
        Dtype::I32 | Dtype::U32 => count(bytes, |b: [u8; 4]| (false, false, b != [0; 4])),
        Dtype::I64 | Dtype::U64 => count(bytes, |b: [u8; 8]| (false, false, b != [0; 8])),
    };
    scan.nan += nan;
    scan.inf += inf;
    scan.nonzero |= nonzero;
    scan.values += values;
    if scan.first_non_finite.is_none() && nan + inf > 0 {
        scan.first_non_finite = first_non_finite(dtype, bytes).map(|i| first + i as u64);
    }
}

/// `(NaN, infinite, any non-zero, elements)` over the `N`-byte elements of `bytes`, `judge`
/// saying of one element whether it is NaN, infinite, non-zero. Branch-free sums, so the
/// compiler can vectorise the loop.
fn count<const N: usize>(
    bytes: &[u8],
    judge: impl Fn([u8; N]) -> (bool, bool, bool),
) -> (u64, u64, bool, u64) {
    let (mut nan, mut inf, mut nonzero) = (0u64, 0u64, false);
    let elements = bytes.chunks_exact(N);
    let n = elements.len() as u64;
    for e in elements {
        let (is_nan, is_inf, is_nonzero) = judge(e.try_into().expect("N bytes"));
        nan += u64::from(is_nan);
        inf += u64::from(is_inf);
        nonzero |= is_nonzero;
    }
    (nan, inf, nonzero, n)
}

/// The index of the first NaN or infinite element of `bytes` (only looked for once a piece is
/// known to hold one: the element-by-element search is slower than [`count`]).
fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    bytes.chunks_exact(dtype.size()).position(|e| {
        // Marked as found already, so this scan of one element does not search again.
        let mut one = Scan {
            first_non_finite: Some(0),
            ..Scan::default()
        };
        scan(dtype, e, 0, &mut one);
        one.nan + one.inf > 0
    })
}

/// One tensor [`verify`] reports: NaN or infinite values, or every value zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub tensor: String,
    /// The shard file holding it.
    pub file: PathBuf,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub nan: u64,
    pub inf: u64,
    pub all_zero: bool,
    /// Where the first NaN or infinite value is (one index per dimension).
    pub first_non_finite: Option<Vec<usize>>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in {} ({} {:?})",
            self.tensor,
            self.file.display(),
            self.dtype,
            self.shape
        )?;
        if self.all_zero {
            return write!(f, ": every value is zero");
        }
        write!(f, ": {} NaN, {} infinite", self.nan, self.inf)?;
        if let Some(at) = &self.first_non_finite {
            write!(f, ", first at {at:?}")?;
        }
        Ok(())
    }
}

/// What [`verify`] read and found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Tensors read, in every shard.
    pub tensors: usize,
    /// Payload bytes read.
    pub bytes: u64,
    /// Tensors with NaN or infinite values, or all zero, in shard order and then file order.
    pub findings: Vec<Finding>,
    /// Additive biases whose every value is zero (valid, not a finding; module docs).
    pub zero_biases: Vec<String>,
}

impl VerifyReport {
    pub fn clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Reads every tensor of `ckpt` in pieces of [`CHUNK_BYTES`] and reports NaN, infinite and
/// all-zero tensors (module docs); `progress(done, total)` after each piece, in payload bytes.
pub fn verify(
    ckpt: &Checkpoint,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, CheckpointError> {
    verify_in_chunks(ckpt, CHUNK_BYTES, progress)
}

/// [`verify`] reading pieces of at most `chunk` bytes (rounded down to a multiple of 8, at
/// least 8): memory holds one such piece.
pub fn verify_in_chunks(
    ckpt: &Checkpoint,
    chunk: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, CheckpointError> {
    let chunk = (chunk / 8).max(1) * 8;
    let total = ckpt.payload_bytes();
    let biases: std::collections::HashSet<String> = logical_inventory(ckpt.config())
        .into_iter()
        .filter(|t| {
            matches!(
                t.role,
                TensorRole::Ape | TensorRole::AttnSink | TensorRole::GateBias | TensorRole::Bias
            )
        })
        .map(|t| t.name)
        .collect();
    let mut report = VerifyReport::default();
    let mut buf = vec![
        0u8;
        chunk
            .min(usize::try_from(total).unwrap_or(usize::MAX))
            .max(8)
    ];
    progress(0, total);
    for (shard, path) in ckpt.shard_paths().iter().enumerate() {
        let mut tensors: Vec<_> = ckpt
            .names()
            .filter_map(|n| ckpt.info(n))
            .filter(|t| t.shard == shard)
            .collect();
        tensors.sort_by_key(|t| t.data_offsets.start);
        let mut file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        let mut at = None;
        for t in tensors {
            let (start, end) = (t.data_offsets.start as u64, t.data_offsets.end as u64);
            if at != Some(start) {
                file.seek(SeekFrom::Start(start))
                    .map_err(|e| CheckpointError::io(path, e))?;
            }
            let mut s = Scan::default();
            let mut pos = start;
            while pos < end {
                let n = (end - pos).min(chunk as u64) as usize;
                file.read_exact(&mut buf[..n]).map_err(|e| {
                    CheckpointError::io(
                        path,
                        std::io::Error::new(
                            e.kind(),
                            format!(
                                "tensor {}: reading bytes {pos}..{} of the file: {e}",
                                t.name,
                                pos + n as u64
                            ),
                        ),
                    )
                })?;
                let element = (pos - start) / t.dtype.size() as u64;
                scan(t.dtype, &buf[..n], element, &mut s);
                pos += n as u64;
                report.bytes += n as u64;
                progress(report.bytes, total);
            }
            at = Some(end);
            report.tensors += 1;
            if s.nan + s.inf == 0 && s.all_zero() && biases.contains(&t.name) {
                report.zero_biases.push(t.name.clone());
            } else if s.nan + s.inf > 0 || s.all_zero() {
                report.findings.push(Finding {
                    tensor: t.name.clone(),
                    file: t.file.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    nan: s.nan,
                    inf: s.inf,
                    all_zero: s.all_zero(),
                    first_non_finite: s.first_non_finite.map(|i| unravel(i, &t.shape)),
                });
            }
        }
    }
    Ok(report)
}

/// The row-major index of element `flat` in `shape`.
fn unravel(mut flat: u64, shape: &[usize]) -> Vec<usize> {
    debug_assert!(flat < numel(shape).max(1) as u64);
    let mut at = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        let d = d.max(1) as u64;
        at[i] = (flat % d) as usize;
        flat /= d;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(dtype: Dtype, bytes: &[u8]) -> Scan {
        let mut s = Scan::default();
        scan(dtype, bytes, 0, &mut s);
        s
    }

    fn le<const N: usize>(words: &[[u8; N]]) -> Vec<u8> {
        words.iter().flatten().copied().collect()
    }

    #[test]
    fn bf16_nan_inf_and_signed_zero() {
        let v = le(&[
            0x7fc0u16.to_le_bytes(), // NaN
            0xffc1u16.to_le_bytes(), // -NaN
            0x7f80u16.to_le_bytes(), // +inf
            0xff80u16.to_le_bytes(), // -inf
            0x8000u16.to_le_bytes(), // -0
            0x3f80u16.to_le_bytes(), // 1
        ]);
        let s = scanned(Dtype::BF16, &v);
        assert_eq!((s.nan, s.inf, s.values), (2, 2, 6));
        assert_eq!(s.first_non_finite, Some(0));
        let zeros = le(&[0u16.to_le_bytes(), 0x8000u16.to_le_bytes()]);
        assert!(scanned(Dtype::BF16, &zeros).all_zero());
        // The largest finite bf16 is neither.
        let s = scanned(Dtype::BF16, &0x7f7fu16.to_le_bytes());
        assert_eq!((s.nan, s.inf, s.nonzero), (0, 0, true));
    }

    #[test]
    fn f32_f16_f64_follow_ieee() {
        let f32s: Vec<u8> = [f32::NAN, f32::INFINITY, -f32::INFINITY, f32::MAX, -0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s = scanned(Dtype::F32, &f32s);
        assert_eq!((s.nan, s.inf, s.values), (1, 2, 5));
        let f16s: Vec<u8> = [half::f16::NAN, half::f16::INFINITY, half::f16::MAX]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s = scanned(Dtype::F16, &f16s);
        assert_eq!((s.nan, s.inf), (1, 1));
        let f64s: Vec<u8> = [1.0f64, f64::NEG_INFINITY, f64::NAN, f64::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s = scanned(Dtype::F64, &f64s);
        assert_eq!((s.nan, s.inf, s.first_non_finite), (2, 1, Some(1)));
        assert!(scanned(Dtype::F64, &(-0.0f64).to_le_bytes()).all_zero());
    }

    #[test]
    fn e4m3fn_has_two_nan_codes_and_no_infinity() {
        let s = scanned(Dtype::F8E4M3, &[0x7f, 0xff, 0x7e, 0xfe, 0x78, 0x00]);
        assert_eq!((s.nan, s.inf, s.first_non_finite), (2, 0, Some(0)));
        assert!(scanned(Dtype::F8E4M3, &[0x00, 0x80, 0x00]).all_zero());
        assert!(!scanned(Dtype::F8E4M3, &[0x00, 0x01]).all_zero());
    }

    #[test]
    fn e5m2_has_infinities_and_nans() {
        let s = scanned(Dtype::F8E5M2, &[0x7c, 0xfc, 0x7d, 0xff, 0x7b, 0x80]);
        assert_eq!((s.nan, s.inf, s.first_non_finite), (2, 2, Some(0)));
    }

    #[test]
    fn e8m0_nan_is_0xff_and_zero_filled_scales_are_all_zero() {
        let s = scanned(Dtype::F8E8M0, &[0x7f, 0x80, 0xff, 0x00]);
        assert_eq!((s.nan, s.inf, s.first_non_finite), (1, 0, Some(2)));
        assert!(scanned(Dtype::F8E8M0, &[0, 0, 0]).all_zero());
        assert!(!scanned(Dtype::F8E8M0, &[0, 0x7f]).all_zero());
    }

    #[test]
    fn packed_fp4_counts_two_values_per_byte_and_signed_zero_nibbles() {
        for dtype in [Dtype::I8, Dtype::U8] {
            // 0x0 and 0x8 are +0 and -0 in e2m1: a byte of both is two zeros.
            let s = scanned(dtype, &[0x00, 0x80, 0x08, 0x88]);
            assert_eq!((s.nan, s.inf, s.values), (0, 0, 8));
            assert!(s.all_zero(), "{dtype}");
            // Every other code is a finite non-zero value; none is NaN.
            let every: Vec<u8> = (0..=255).collect();
            let s = scanned(dtype, &every);
            assert_eq!((s.nan, s.inf, s.nonzero), (0, 0, true));
        }
    }

    #[test]
    fn integers_are_zero_or_not() {
        assert!(scanned(Dtype::I64, &[0; 16]).all_zero());
        let mut v = [0u8; 16];
        v[9] = 1;
        let s = scanned(Dtype::I64, &v);
        assert!(!s.all_zero() && s.nan == 0 && s.values == 2);
        assert!(scanned(Dtype::I32, &[0; 8]).all_zero());
        assert!(!scanned(Dtype::U16, &[0, 0, 0, 1]).all_zero());
        assert!(scanned(Dtype::Bool, &[0, 0]).all_zero());
    }

    #[test]
    fn pieces_add_up_and_keep_the_first_index() {
        let bytes: Vec<u8> = [1.0f32, 2.0, f32::NAN, 3.0, f32::INFINITY, 0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let whole = scanned(Dtype::F32, &bytes);
        let mut pieces = Scan::default();
        for (i, piece) in bytes.chunks(8).enumerate() {
            scan(Dtype::F32, piece, 2 * i as u64, &mut pieces);
        }
        assert_eq!(whole, pieces);
        assert_eq!(pieces.first_non_finite, Some(2));
        assert!(
            !scanned(Dtype::F32, &[]).all_zero(),
            "no values: not all-zero"
        );
    }

    #[test]
    fn flat_indices_unravel_row_major() {
        assert_eq!(unravel(0, &[3, 4]), [0, 0]);
        assert_eq!(unravel(7, &[3, 4]), [1, 3]);
        assert_eq!(unravel(23, &[2, 3, 4]), [1, 2, 3]);
        assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    }
}
