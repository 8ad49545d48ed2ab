//! Dense linear algebra of the CPU backend: the resident weight type, `x · Wᵀ` through the
//! `gemm` crate, the grouped `wo_a` product, row gathers and a dot product.
//!
//! Numerics: f32 inputs, f32 accumulation. `gemm` keeps the summation order along K the same
//! for every row, so a token's result does not depend on how many tokens share the chunk (up to
//! the m = 1 / n = 1 vector paths, which differ in the last bits; the chunk-invariance tests
//! allow 1e-5 relative). Products large enough to amortise threads run with
//! `Parallelism::Rayon`, tiny ones single-threaded.

use gemm::Parallelism;

/// A decoded weight `[rows, cols]`, row-major f32 (one row per output feature).
pub struct CpuMatrix {
    pub(crate) data: Vec<f32>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl CpuMatrix {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        CpuMatrix { data, rows, cols }
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
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

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` with explicit row strides for `x` (`x_rs`) and `y` (`y_rs`),
/// so sub-blocks of wider buffers can be used without copying.
#[allow(clippy::too_many_arguments)]
pub fn matmul_strided(
    x: &[f32],
    x_rs: usize,
    w: &[f32],
    n: usize,
    k: usize,
    y: &mut [f32],
    y_rs: usize,
    m: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(x.len() >= (m - 1) * x_rs + k, "matmul: x too short");
    assert!(y.len() >= (m - 1) * y_rs + n, "matmul: y too short");
    assert_eq!(w.len(), n * k, "matmul: weight shape");
    if k == 0 {
        for r in 0..m {
            y[r * y_rs..r * y_rs + n].fill(0.0);
        }
        return;
    }
    // SAFETY: the asserts above bound every element gemm touches: rows r < m of x span
    // [r·x_rs, r·x_rs + k), of y [r·y_rs, r·y_rs + n); w is exactly n·k. `read_dst` is false so
    // y's previous contents are never read; x, w and y do not alias (y is &mut).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
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
            parallelism(m, n, k),
        );
    }
}

/// `y[T, out] = x[T, in] · Wᵀ`.
pub fn matmul(x: &[f32], w: &CpuMatrix, y: &mut [f32]) {
    let k = w.cols;
    assert_eq!(x.len() % k.max(1), 0, "matmul: x is not [T, {k}]");
    let m = x.len().checked_div(k).unwrap_or(0);
    assert_eq!(y.len(), m * w.rows, "matmul: y is not [T, {}]", w.rows);
    matmul_strided(x, k, &w.data, w.rows, k, y, w.rows, m);
}

/// Grouped product: `x [T, G·in]`, `w [G·out, in]`, `y [T, G·out]`.
pub fn matmul_grouped(x: &[f32], groups: usize, w: &CpuMatrix, y: &mut [f32]) {
    assert_eq!(
        w.rows % groups,
        0,
        "grouped matmul: rows not divisible by groups"
    );
    let (k, out) = (w.cols, w.rows / groups);
    let x_rs = groups * k;
    let m = x.len() / x_rs;
    assert_eq!(x.len(), m * x_rs, "grouped matmul: x is not [T, G·in]");
    assert_eq!(
        y.len(),
        m * groups * out,
        "grouped matmul: y is not [T, G·out]"
    );
    for g in 0..groups {
        let wg = &w.data[g * out * k..(g + 1) * out * k];
        matmul_strided(
            &x[g * k..],
            x_rs,
            wg,
            out,
            k,
            &mut y[g * out..],
            groups * out,
            m,
        );
    }
}

/// `out[i] = table.row(rows[i])`.
pub fn gather_rows(table: &CpuMatrix, rows: &[usize], out: &mut [f32]) {
    let d = table.cols;
    assert_eq!(out.len(), rows.len() * d, "gather: out is not [rows, D]");
    for (dst, &r) in out.chunks_exact_mut(d).zip(rows) {
        dst.copy_from_slice(table.row(r));
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
        for &(m, n, k) in &[(1, 3, 5), (7, 33, 17), (64, 256, 128)] {
            let x = ramp(m * k, 0.37);
            let w = CpuMatrix::new(ramp(n * k, 0.11), n, k);
            let mut y = vec![0.0; m * n];
            matmul(&x, &w, &mut y);
            let want = naive(&x, &w.data, n, k);
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
        let mut y = vec![0.0; m * g * out];
        matmul_grouped(&x, g, &w, &mut y);
        for r in 0..m {
            for gi in 0..g {
                let xs = &x[r * g * k + gi * k..r * g * k + gi * k + k];
                for o in 0..out {
                    let want = dot(xs, w.row(gi * out + o));
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
}
