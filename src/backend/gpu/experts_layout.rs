//! Row layout of the batched routed experts (`GpuBackend::with_moe_batched`, used by
//! `experts::moe_experts`): each used expert's rows padded to a size of the series 1, 2, 3, 4,
//! 6, 8, 12, ... ([`padded_group_rows`]), the groups ordered by size ([`BatchedLayout`]) so
//! that each size class ([`SizeClass`]) is one batched GEMM per weight. Padding stays below
//! half the real rows whatever the routing's imbalance.

use super::executor::{Gemm, GemmType};

/// Rows of an expert's padded group in the batched products: the smallest of 1, 2, 3, 4, 6,
/// 8, 12, 16, 24, ... (`2^i` and `3·2^(i-1)`) that holds `n` rows. Padding stays below half the
/// real rows, and experts of similar load share a size and so one GEMM call.
pub fn padded_group_rows(n: usize) -> usize {
    if n <= 2 {
        return n;
    }
    let pow = n.next_power_of_two();
    if pow / 4 * 3 >= n {
        pow / 4 * 3
    } else {
        pow
    }
}

/// The used experts of one padded size: positions in the call's used list, `per` rows each,
/// the groups one after another from row `first`.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeClass {
    pub per: usize,
    pub first: usize,
    pub members: Vec<usize>,
}

impl SizeClass {
    /// The members' entries of a per-used-expert list.
    pub(super) fn pick<T: Copy>(&self, all: &[T]) -> Vec<T> {
        self.members.iter().map(|&p| all[p]).collect()
    }

    /// One product per member over its padded group of `per` rows: `[per, k]` inputs of type
    /// `ty` to `[per, n]` f32 outputs, the groups contiguous from row `first` of both.
    pub(super) fn gemm(&self, k: usize, n: usize, ty: GemmType) -> Gemm {
        Gemm {
            batch: self.members.len(),
            x_offset: self.first * k * ty.bytes(),
            stride_x: self.per * k,
            y_offset: self.first * n * 4,
            stride_y: self.per * n,
            ..Gemm::dense(self.per, n, k, ty)
        }
    }
}

/// Row layout of the batched products: every used expert's rows padded to
/// [`padded_group_rows`], the groups ordered by size (then by expert), so each size is one
/// contiguous run of equal groups. `counts[p]` are the rows of used expert p.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchedLayout {
    pub classes: Vec<SizeClass>,
    /// First row of each used expert's group.
    pub starts: Vec<usize>,
    pub rows: usize,
}

impl BatchedLayout {
    pub fn new(counts: &[usize]) -> Self {
        let mut sizes: Vec<(usize, usize)> = counts
            .iter()
            .enumerate()
            .map(|(p, &n)| (padded_group_rows(n), p))
            .collect();
        sizes.sort_unstable();
        let (mut classes, mut starts, mut rows) =
            (Vec::<SizeClass>::new(), vec![0; counts.len()], 0);
        for (per, p) in sizes {
            match classes.last_mut() {
                Some(c) if c.per == per => c.members.push(p),
                _ => classes.push(SizeClass {
                    per,
                    first: rows,
                    members: vec![p],
                }),
            }
            starts[p] = rows;
            rows += per;
        }
        BatchedLayout {
            classes,
            starts,
            rows,
        }
    }
}
