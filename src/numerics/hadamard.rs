//! The indexer's Hadamard rotation (`rotate_activation`, attention spec §3.7).
//!
//! `y = H_n · x / sqrt(n)` with `H_n[i][j] = (-1)^popcount(i & j)` (Sylvester, natural order),
//! n a power of two: the index head dim (128 in the real model, smaller in synthetic ones).
//! Computed in f32 as the iterative butterfly (stride h = 1, 2, 4, .., n/2, pairs (u, v) ->
//! (u + v, u - v)) followed by one multiply by `fp32(1/sqrt(n))` (0.08838834764831845 for
//! n = 128), the order of `fast_hadamard_transform`. `H/sqrt(n)` is symmetric and orthonormal,
//! so applying it twice is the identity and it preserves dot products up to rounding.
//! Callers decide about bf16 rounding before and after; this module does none.

use super::FormatError;

/// `fp32(1/sqrt(n))` for a power of two n (correctly rounded from f64).
pub fn hadamard_scale(n: usize) -> f32 {
    if n == 128 {
        return 0.088_388_347_648_318_45_f64 as f32;
    }
    (1.0 / (n as f64).sqrt()) as f32
}

/// Rotates `x` in place; its length must be a power of two.
pub fn hadamard_inplace(x: &mut [f32]) -> Result<(), FormatError> {
    let n = x.len();
    if !n.is_power_of_two() {
        return Err(FormatError::NotPowerOfTwo { n });
    }
    let mut h = 1;
    while h < n {
        for base in (0..n).step_by(2 * h) {
            for j in base..base + h {
                let (u, v) = (x[j], x[j + h]);
                x[j] = u + v;
                x[j + h] = u - v;
            }
        }
        h *= 2;
    }
    let s = hadamard_scale(n);
    for v in x.iter_mut() {
        *v *= s;
    }
    Ok(())
}

/// Rotates every `dim`-long row of a row-major `[rows, dim]` buffer.
pub fn hadamard_rows(x: &mut [f32], dim: usize) -> Result<(), FormatError> {
    if !dim.is_power_of_two() {
        return Err(FormatError::NotPowerOfTwo { n: dim });
    }
    if !x.len().is_multiple_of(dim) {
        return Err(FormatError::Length {
            what: "hadamard rows",
            expected: x.len().div_ceil(dim) * dim,
            found: x.len(),
        });
    }
    for row in x.chunks_exact_mut(dim) {
        hadamard_inplace(row)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sylvester(i: usize, j: usize) -> f32 {
        if (i & j).count_ones().is_multiple_of(2) {
            1.0
        } else {
            -1.0
        }
    }

    #[test]
    fn scale_for_128_is_the_pinned_constant() {
        assert_eq!(hadamard_scale(128), 0.08838834764831845f64 as f32);
        assert_eq!(hadamard_scale(128), (1.0 / 128f64.sqrt()) as f32);
        assert_eq!(hadamard_scale(4), 0.5);
        assert_eq!(hadamard_scale(1), 1.0);
    }

    #[test]
    fn basis_vector_maps_to_scaled_sylvester_column() {
        for n in [2usize, 8, 32, 128] {
            for k in [0, 1, n / 2, n - 1] {
                let mut x = vec![0.0f32; n];
                x[k] = 1.0;
                hadamard_inplace(&mut x).unwrap();
                for (i, &v) in x.iter().enumerate() {
                    assert_eq!(v, sylvester(i, k) * hadamard_scale(n), "n={n} e_{k}[{i}]");
                }
            }
        }
    }

    #[test]
    fn hadamard_twice_is_identity() {
        let orig: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut x = orig.clone();
        hadamard_inplace(&mut x).unwrap();
        assert_ne!(x, orig);
        hadamard_inplace(&mut x).unwrap();
        for (i, (a, b)) in x.iter().zip(&orig).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "element {i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn matches_dense_matrix_product() {
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut y = x.clone();
        hadamard_inplace(&mut y).unwrap();
        for (i, &yi) in y.iter().enumerate() {
            let want: f64 = (0..16)
                .map(|j| sylvester(i, j) as f64 * x[j] as f64)
                .sum::<f64>()
                * 0.25;
            assert!((yi as f64 - want).abs() < 1e-6, "row {i}: {yi} vs {want}");
        }
    }

    #[test]
    fn rejects_non_power_of_two_lengths() {
        assert_eq!(
            hadamard_inplace(&mut [0.0; 3]),
            Err(FormatError::NotPowerOfTwo { n: 3 })
        );
        assert_eq!(
            hadamard_inplace(&mut []),
            Err(FormatError::NotPowerOfTwo { n: 0 })
        );
        assert!(hadamard_rows(&mut [0.0; 12], 6).is_err());
        assert!(hadamard_rows(&mut [0.0; 12], 8).is_err());
        let mut two_rows = [1.0f32, 0.0, 0.0, 1.0];
        hadamard_rows(&mut two_rows, 2).unwrap();
        let s = hadamard_scale(2);
        assert_eq!(two_rows, [s, s, s, -s]);
    }
}
