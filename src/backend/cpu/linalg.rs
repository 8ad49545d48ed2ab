//! Dense linear algebra of the CPU backend: the resident weight type, `x · Wᵀ` through the
//! `gemm` crate, the grouped `wo_a` product, row gathers and a dot product.
//!
//! Numerics: f32 inputs, f32 accumulation. `gemm` keeps the summation order along K the same
//! for every row, so a token's result does not depend on how many tokens share the chunk (up to
//! the m = 1 / n = 1 vector paths, which differ in the last bits; the chunk-invariance tests
//! allow 1e-5 relative). Products large enough to amortise threads use every worker: with at
//! least two bands per thread the bands themselves are spread over the threads (one
//! single-threaded `gemm` each, decoding its own rows when streamed), narrower products split
//! each band's `gemm` over the threads (`Parallelism::Rayon`), tiny ones run on the calling
//! thread. `gemm` splits rows and columns over threads, never the sum over k, so all three give
//! the same bits (a unit test checks the first two against each other).
//!
//! Weights ([`CpuMatrix`]) are decoded f32 (`Decoded` residency) or the stored bytes
//! (`Streamed`), which decode the rows a product needs into a scratch buffer right before it,
//! with the same per-element decode as a decoded matrix got at load. Every product runs in bands
//! of [`BAND_ROWS`] weight rows (one `gemm` per band, the band split depending only on the
//! shape), so a streamed matrix holds one band of f32 per busy thread and decoded and streamed weights
//! give bit-identical results: the same `gemm` calls on the same values.

use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use gemm::Parallelism;
use std::borrow::Cow;
use std::ops::Range;

/// Weight rows per product band: a multiple of the 128-row FP8 scale block (so a streamed FP8
/// band decodes no extra rows), large enough that re-packing `x` per band is noise.
pub const BAND_ROWS: usize = 256;

/// A weight `[rows, cols]` (one row per output feature), decoded or in its stored format.
pub struct CpuMatrix {
    rows: usize,
    cols: usize,
    store: Store,
}

enum Store {
    /// Row-major f32.
    Decoded(Vec<f32>),
    /// The checkpoint's bytes (shared memory map), decoded band by band on use.
    Streamed(SharedLinear),
}

impl CpuMatrix {
    /// A decoded matrix.
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        CpuMatrix {
            rows,
            cols,
            store: Store::Decoded(data),
        }
    }

    /// A matrix kept in its stored format. Decodes the first scale block of rows now, so that
    /// format errors surface at load and decoding on use cannot fail (lengths were checked
    /// against the shapes when the checkpoint was opened).
    pub fn streamed(w: SharedLinear) -> Result<Self, CheckpointError> {
        let probe = w.rows().min(w.row_alignment());
        w.decode_rows(0..probe)?;
        Ok(CpuMatrix {
            rows: w.rows(),
            cols: w.cols(),
            store: Store::Streamed(w),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Whether the matrix is kept in its stored format.
    pub fn is_streamed(&self) -> bool {
        matches!(self.store, Store::Streamed(_))
    }

    /// Calls `f` with rows `band` as f32 `[band.len(), cols]`: a slice of the decoded data, or a
    /// scratch buffer decoded from the stored format (rounded out to whole scale blocks).
    pub fn with_rows<R>(&self, band: Range<usize>, f: impl FnOnce(&[f32]) -> R) -> R {
        assert!(
            band.start <= band.end && band.end <= self.rows,
            "rows {band:?} outside a [{}, {}] matrix",
            self.rows,
            self.cols
        );
        let c = self.cols;
        match &self.store {
            Store::Decoded(data) => f(&data[band.start * c..band.end * c]),
            Store::Streamed(w) => {
                let align = w.row_alignment();
                let first = band.start - band.start % align;
                let end = (band.end.div_ceil(align) * align).min(self.rows);
                let scratch = w
                    .decode_rows(first..end)
                    .expect("stored weight validated at load");
                let skip = band.start - first;
                f(&scratch[skip * c..(skip + band.len()) * c])
            }
        }
    }

    /// The whole matrix as f32 (borrowed when decoded, decoded now when streamed).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        match &self.store {
            Store::Decoded(data) => Cow::Borrowed(data),
            Store::Streamed(w) => {
                Cow::Owned(w.decode_f32().expect("stored weight validated at load"))
            }
        }
    }
}

/// The product bands of `rows` weight rows starting at row `first`.
fn bands(first: usize, rows: usize) -> impl Iterator<Item = Range<usize>> {
    (0..rows)
        .step_by(BAND_ROWS)
        .map(move |b| first + b..first + (b + BAND_ROWS).min(rows))
}

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_WORK: usize = 1 << 20;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m * n * k >= PARALLEL_WORK {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// Rows of a row-major matrix inside a wider buffer: row r starts at `data[r · row_stride]` (a
/// block of columns, e.g. one group's slice of a grouped activation).
pub struct Strided<T> {
    /// The buffer, from the first row's first element.
    pub data: T,
    /// Elements from one row's start to the next's.
    pub row_stride: usize,
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` with explicit row strides for `x` and `y`, so sub-blocks of
/// wider buffers can be used without copying.
pub fn matmul_strided(
    x: Strided<&[f32]>,
    w: &[f32],
    n: usize,
    k: usize,
    y: Strided<&mut [f32]>,
    m: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let y_rs = y.row_stride;
    assert!(y.data.len() >= (m - 1) * y_rs + n, "matmul: y too short");
    // SAFETY: y is an exclusive borrow covering rows r < m, columns < n at stride y_rs
    // (asserted just above).
    unsafe {
        gemm_into(
            x,
            w,
            (m, n, k),
            (y.data.as_mut_ptr(), y_rs),
            parallelism(m, n, k),
        )
    }
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` through the `gemm` crate into rows `r < m` of `y` at
/// `y.0 + r · y.1`, columns `< n`; `y`'s previous contents are never read.
///
/// # Safety
/// Those elements of `y` are valid for writes and nothing else reads or writes them during the
/// call.
unsafe fn gemm_into(
    x: Strided<&[f32]>,
    w: &[f32],
    (m, n, k): (usize, usize, usize),
    (y, y_rs): (*mut f32, usize),
    parallelism: Parallelism,
) {
    let (x, x_rs) = (x.data, x.row_stride);
    if m == 0 || n == 0 {
        return;
    }
    assert!(x.len() >= (m - 1) * x_rs + k, "matmul: x too short");
    assert_eq!(w.len(), n * k, "matmul: weight shape");
    if k == 0 {
        for r in 0..m {
            // SAFETY: the caller's contract covers row r's first n elements.
            unsafe { std::slice::from_raw_parts_mut(y.add(r * y_rs), n) }.fill(0.0);
        }
        return;
    }
    // SAFETY: the assert above bounds every element of x gemm reads (rows r < m span
    // [r·x_rs, r·x_rs + k)); w is exactly n·k; y's elements are the caller's to write.
    // `read_dst` is false so y's previous contents are never read; x and w are shared borrows
    // y cannot alias (the caller owns y's elements).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y,
            1,
            y_rs as isize,
            false,
            x.as_ptr(),
            1,
            x_rs as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The shape of a banded product: `m` rows of `x [m, groups·k]` through `w [groups·out, k]`
/// (group `g`'s rows `g·out..` see `x`'s columns `g·k..`) into `y [m, groups·out]`.
#[derive(Clone, Copy, Debug)]
pub struct Grouping {
    pub m: usize,
    pub groups: usize,
    pub k: usize,
    pub out: usize,
}

impl Grouping {
    /// The shape of `x` (`x_len` values) in `groups` groups through `w`, checked.
    pub fn of(x_len: usize, groups: usize, w: &CpuMatrix) -> Self {
        assert!(
            groups > 0 && w.rows.is_multiple_of(groups),
            "matmul: {} weight rows in {groups} groups",
            w.rows
        );
        let (k, out) = (w.cols, w.rows / groups);
        let x_rs = groups * k;
        assert_eq!(x_len % x_rs.max(1), 0, "matmul: x is not [T, {groups}·{k}]");
        let m = x_len.checked_div(x_rs).unwrap_or(0);
        Grouping { m, groups, k, out }
    }
}

/// The band loop of every product with `w`: per group, `prepare` its rows of `x` once, then
/// `band(rows, w_band, band_rows, y_band)` for each band of [`BAND_ROWS`] weight rows (decoded
/// on the spot when streamed). `y` must be `[m, groups·out]`.
pub fn for_each_band<'x, P>(
    shape: Grouping,
    x: &'x [f32],
    w: &CpuMatrix,
    y: &mut [f32],
    prepare: impl Fn(Strided<&'x [f32]>) -> P,
    band: impl Fn(&P, &[f32], usize, Strided<&mut [f32]>),
) {
    let Grouping { m, groups, k, out } = shape;
    assert_eq!(
        y.len(),
        m * groups * out,
        "matmul: y is not [T, {}]",
        groups * out
    );
    if m == 0 {
        return;
    }
    let (x_rs, y_rs) = (groups * k, groups * out);
    for g in 0..groups {
        let rows = prepare(Strided {
            data: &x[g * k..],
            row_stride: x_rs,
        });
        for b in bands(g * out, out) {
            w.with_rows(b.clone(), |wb| {
                let y = Strided {
                    data: &mut y[b.start..],
                    row_stride: y_rs,
                };
                band(&rows, wb, b.len(), y)
            });
        }
    }
}

/// `y[T, out] = x[T, in] · Wᵀ`, in bands of weight rows.
pub fn matmul(x: &[f32], w: &CpuMatrix, y: &mut [f32]) {
    matmul_grouped(x, 1, w, y)
}

/// Grouped product: `x [T, G·in]`, `w [G·out, in]`, `y [T, G·out]`.
pub fn matmul_grouped(x: &[f32], groups: usize, w: &CpuMatrix, y: &mut [f32]) {
    let shape = Grouping::of(x.len(), groups, w);
    let (m, k) = (shape.m, shape.k);
    let bands = groups * shape.out.div_ceil(BAND_ROWS);
    let threaded = matches!(parallelism(m, groups * shape.out, k), Parallelism::Rayon(_));
    if threaded && bands >= 2 * rayon::current_num_threads() {
        return bands_in_parallel(shape, x, w, y);
    }
    band_by_band(shape, x, w, y)
}

/// [`matmul_grouped`] one band after another, each band's `gemm` split over the threads when
/// large enough.
fn band_by_band(shape: Grouping, x: &[f32], w: &CpuMatrix, y: &mut [f32]) {
    let (m, k) = (shape.m, shape.k);
    for_each_band(
        shape,
        x,
        w,
        y,
        |rows| rows,
        |rows, wb, n, y| {
            let x = Strided {
                data: rows.data,
                row_stride: rows.row_stride,
            };
            matmul_strided(x, wb, n, k, y, m)
        },
    );
}

/// [`matmul_grouped`] with its bands spread over the worker threads, each band one
/// single-threaded `gemm` (decoding its own rows when streamed): the same calls on the same
/// values as the band loop, so the same bits (`gemm` splits a product's rows and columns over
/// threads, never its sum over k), without a synchronisation per band or a decode that leaves
/// the other threads idle.
fn bands_in_parallel(shape: Grouping, x: &[f32], w: &CpuMatrix, y: &mut [f32]) {
    use rayon::prelude::*;
    let Grouping { m, groups, k, out } = shape;
    let (x_rs, y_rs) = (groups * k, groups * out);
    assert_eq!(y.len(), m * y_rs, "matmul: y is not [T, {y_rs}]");
    if m == 0 {
        return;
    }
    /// `y`'s first element, shared by the bands (each writes only its own columns).
    struct Out(*mut f32);
    // SAFETY: the bands write disjoint columns of y (below); y outlives the parallel loop.
    unsafe impl Sync for Out {}
    let y = Out(y.as_mut_ptr());
    let jobs: Vec<(usize, Range<usize>)> = (0..groups)
        .flat_map(|g| bands(g * out, out).map(move |b| (g, b)))
        .collect();
    jobs.into_par_iter().for_each(|(g, b)| {
        let y = &y;
        let x = Strided {
            data: &x[g * k..],
            row_stride: x_rs,
        };
        w.with_rows(b.clone(), |wb| {
            // SAFETY: band b writes rows r < m, columns b.start..b.end of y [m, y_rs] (b.end
            // <= groups·out = y_rs); the bands of all groups partition those columns, so no
            // two jobs touch the same element, and y is exclusively borrowed for the call.
            unsafe {
                gemm_into(
                    x,
                    wb,
                    (m, b.len(), k),
                    (y.0.add(b.start), y_rs),
                    Parallelism::None,
                )
            }
        });
    });
}

/// `out[i] = table.row(rows[i])` (a streamed table decodes only the rows asked for).
pub fn gather_rows(table: &CpuMatrix, rows: &[usize], out: &mut [f32]) {
    let d = table.cols;
    assert_eq!(out.len(), rows.len() * d, "gather: out is not [rows, D]");
    for (dst, &r) in out.chunks_exact_mut(d).zip(rows) {
        table.with_rows(r..r + 1, |row| dst.copy_from_slice(row));
    }
}

/// f32 dot product with 8 independent partial sums (vectorises; summation order fixed).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += a · x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let m = x.len() / k;
        let mut y = vec![0.0; m * n];
        for r in 0..m {
            for o in 0..n {
                y[r * n + o] = (0..k).map(|i| x[r * k + i] * w[o * k + i]).sum();
            }
        }
        y
    }

    fn ramp(len: usize, seed: f32) -> Vec<f32> {
        (0..len).map(|i| (i as f32 * seed).sin() * 1.7).collect()
    }

    #[test]
    fn matmul_matches_naive_for_small_and_threaded_shapes() {
        // 600 rows: three bands, the last one partial.
        for &(m, n, k) in &[(1, 3, 5), (7, 33, 17), (64, 256, 128), (5, 600, 40)] {
            let x = ramp(m * k, 0.37);
            let w = CpuMatrix::new(ramp(n * k, 0.11), n, k);
            let mut y = vec![0.0; m * n];
            matmul(&x, &w, &mut y);
            let want = naive(&x, &w.to_f32(), n, k);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{a} vs {b} at {m}x{n}x{k}"
                );
            }
        }
    }

    #[test]
    fn grouped_matmul_uses_each_groups_own_block() {
        let (m, g, k, out) = (3, 2, 4, 3);
        let x = ramp(m * g * k, 0.5);
        let w = CpuMatrix::new(ramp(g * out * k, 0.23), g * out, k);
        let wf = w.to_f32();
        let mut y = vec![0.0; m * g * out];
        matmul_grouped(&x, g, &w, &mut y);
        for r in 0..m {
            for gi in 0..g {
                let xs = &x[r * g * k + gi * k..r * g * k + gi * k + k];
                for o in 0..out {
                    let want = dot(xs, &wf[(gi * out + o) * k..(gi * out + o + 1) * k]);
                    let got = y[r * g * out + gi * out + o];
                    assert!((got - want).abs() < 1e-5, "row {r} group {gi} out {o}");
                }
            }
        }
    }

    #[test]
    fn dot_handles_tails() {
        let a = ramp(13, 0.3);
        let b = ramp(13, 0.7);
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-5);
    }

    /// Bands spread over the threads give the bits of the band loop (each band one `gemm`
    /// split over the threads), grouped or not, for shapes with a partial last band.
    #[test]
    fn bands_in_parallel_equal_the_band_loop_bit_for_bit() {
        for &(m, groups, out, k) in &[
            (37, 1, 9 * BAND_ROWS + 17, 70),
            (64, 2, 5 * BAND_ROWS + 3, 96),
        ] {
            let x = ramp(m * groups * k, 0.173);
            let w = CpuMatrix::new(ramp(groups * out * k, 0.311), groups * out, k);
            let shape = Grouping::of(x.len(), groups, &w);
            let mut serial = vec![f32::NAN; m * groups * out];
            band_by_band(shape, &x, &w, &mut serial);
            let mut parallel = vec![f32::NAN; m * groups * out];
            bands_in_parallel(shape, &x, &w, &mut parallel);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&parallel),
                bits(&serial),
                "{m} x {groups} x {out} x {k}"
            );
            // And matmul_grouped takes one of the two.
            let mut y = vec![f32::NAN; m * groups * out];
            matmul_grouped(&x, groups, &w, &mut y);
            assert_eq!(bits(&y), bits(&serial));
        }
    }
}
