//! The CPU's bf16 product (`--cpu-gemm bf16`): `y[m, n] = x[m, k] · w[n, k]ᵀ` with both
//! operands rounded to bf16 (ties to even, `half::bf16::from_f32`) and f32 accumulation, what
//! serving engines compute and what `--gpu-gemm bf16` does on a GPU. A bf16 x bf16 product is
//! exact in f32, so the only differences from the f32 reference are the operands' rounding and
//! the summation order.
//!
//! Two paths, the same operands:
//! - **AMX** (Intel Sapphire Rapids and later, where the CPU has AMX-BF16 and the kernel grants
//!   the tile state, `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): x is packed once
//!   per product as bf16 rows padded to 32 rows and 32 columns; w as 16 x 16 tiles of bf16
//!   pairs (the TDPBF16PS "VNNI" layout: tile row `p` holds `w[j][2p], w[j][2p + 1]` for the
//!   16 output columns `j`). Each task computes a 32 x 32 block of y in four accumulator tiles
//!   over the whole of k (TDPBF16PS, 16 x 16 x 32 per instruction), then stores it; tasks run
//!   on rayon's threads, each loading its tile configuration. Inline assembly: Rust has no
//!   stable AMX intrinsics.
//! - **AVX512-BF16** (AMD Zen 4 and later, Intel Cooper Lake; CPUs with the AVX512_BF16
//!   extension and no AMX): VDPBF16PS, per 32-bit lane one output column `j` and one pair of k:
//!   `acc += x[2p + 1]·w[j][2p + 1]`, then `acc += x[2p]·w[j][2p]`, each an exact product
//!   added with one f32 rounding (to nearest even; bf16 subnormal inputs and f32 subnormal
//!   results flushed to zero, as on AMX). x is packed once per product as bf16 pairs in tiles
//!   of 12 rows (`[pairs][12]`, one pair broadcast per row and step), each band of weight rows
//!   as panels of 32 rows (`[pairs][32]`, two vectors per step); a task keeps a 12 x 32 block of
//!   y in 24 registers over the whole of k, so every element's order is the same chain over
//!   the pairs whatever m, the band or the threads.
//! - **portable** (every other CPU): the rounded operands through the f32 `gemm` crate, exact
//!   products summed in f32 (no speed-up; the same numerics).
//!
//! Entry points: [`matmul_as`] / [`matmul_grouped_as`] (the backend's products, either operand
//! type: f32 goes to `linalg`, bf16 packs `x` once and runs each band of weight rows through
//! [`matmul_rows`]). Shapes: `x` and `y` strided as [`super::linalg::Strided`] rows, `w`
//! `[n, k]` row-major f32 (a decoded band). The summation order along k depends only on k
//! (whole tiles of 32, then pairs inside the instruction), never on m or the threads.

use super::linalg::{for_each_band, matmul_strided, CpuMatrix, Grouping, Strided};
use crate::backend::gpu::GemmType;
use rayon::prelude::*;

/// Output rows and columns of one AMX task (2 x 2 accumulator tiles of 16 x 16).
const BLOCK: usize = 32;
/// The k of one TDPBF16PS (32 bf16 values per tile row).
const TILE_K: usize = 32;

/// The bf16 bits of `x`, rounded to nearest, ties to even; a NaN stays a (quiet) NaN. The
/// same bits as `half::bf16::from_f32` (tested), written branch-light so packing loops
/// vectorise.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x0040) as u16;
    }
    // The largest non-NaN pattern (0xFF80_0000, -inf) plus 0x8000 stays below 2^32.
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Which path this CPU takes: `amx-bf16`, `avx512-bf16` or `portable` (the name `bench`
/// prints).
pub fn bf16_kernels() -> &'static str {
    if amx_ready() {
        "amx-bf16"
    } else if avx512_bf16_ready() {
        "avx512-bf16"
    } else {
        "portable"
    }
}

/// Whether the AVX512-BF16 path may run (AVX512F and AVX512_BF16 reported).
pub fn avx512_bf16_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the AMX path may run: the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7) and the
/// kernel granted this process the tile data state (asked once).
pub fn amx_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // CPUID leaf 7 is read only where the CPU reports it (max leaf >= 7).
            let max = std::arch::x86_64::__cpuid(0).eax;
            let leaf7 = (max >= 7).then(|| std::arch::x86_64::__cpuid_count(7, 0));
            let Some(l) = leaf7 else { return false };
            let (amx_bf16, amx_tile) = (l.edx & (1 << 22) != 0, l.edx & (1 << 24) != 0);
            if !(amx_bf16 && amx_tile) {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a plain syscall with integer arguments; it only changes which state
            // components this process may use.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            rc == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// `y[T, out] = x[T, in] · Wᵀ` with operands of `gemm`: f32 ([`super::linalg::matmul`], the
/// reference) or bf16, `x` packed once for all the bands of `w` ([`Bf16Rows`]).
pub fn matmul_as(gemm: GemmType, x: &[f32], w: &CpuMatrix, y: &mut [f32]) {
    matmul_grouped_as(gemm, x, 1, w, y)
}

/// The grouped product (`x [T, G·in]`, `w [G·out, in]`, `y [T, G·out]`) with operands of
/// `gemm` ([`super::linalg::matmul_grouped`] for f32).
pub fn matmul_grouped_as(gemm: GemmType, x: &[f32], groups: usize, w: &CpuMatrix, y: &mut [f32]) {
    if gemm == GemmType::F32 {
        return super::linalg::matmul_grouped(x, groups, w, y);
    }
    let shape = Grouping::of(x.len(), groups, w);
    let (m, k) = (shape.m, shape.k);
    for_each_band(
        shape,
        x,
        w,
        y,
        |rows| Bf16Rows::pack(rows, m, k),
        |rows, wb, n, y| matmul_rows(rows, wb, n, k, y),
    );
}

/// `x`'s rows with bf16 operands, packed once for every band of a product: AMX rows (bf16,
/// padded), or the rounded f32 rows of the portable path.
pub enum Bf16Rows {
    #[cfg(target_arch = "x86_64")]
    Amx {
        data: Vec<u32>,
        m: usize,
        kp: usize,
    },
    #[cfg(target_arch = "x86_64")]
    Avx512 {
        data: Vec<u32>,
        m: usize,
        pairs: usize,
    },
    Portable {
        data: Vec<f32>,
        m: usize,
    },
}

impl Bf16Rows {
    /// Packs `m` rows of `k` values (this CPU's path).
    pub fn pack(x: Strided<&[f32]>, m: usize, k: usize) -> Self {
        assert!(
            m == 0 || x.data.len() >= (m - 1) * x.row_stride + k,
            "matmul: x too short"
        );
        #[cfg(target_arch = "x86_64")]
        if amx_ready() && k > 0 {
            let kp = k.div_ceil(TILE_K) * TILE_K;
            let data = amx::pack_pair_tiles(
                x.data,
                (m, x.row_stride, k),
                (m.div_ceil(BLOCK) * BLOCK, kp),
            );
            return Bf16Rows::Amx { data, m, kp };
        }
        #[cfg(target_arch = "x86_64")]
        if avx512_bf16_ready() && k > 0 {
            return Self::pack_avx512(x, m, k);
        }
        Self::pack_portable(x, m, k)
    }

    /// The AVX512-BF16 path's rows (x86-64; the kernel needs [`avx512_bf16_ready`]).
    #[cfg(target_arch = "x86_64")]
    fn pack_avx512(x: Strided<&[f32]>, m: usize, k: usize) -> Self {
        let pairs = k.div_ceil(2);
        let data = avx512::pack_pairs(x.data, (m, x.row_stride, k), avx512::ROWS);
        Bf16Rows::Avx512 { data, m, pairs }
    }

    /// The portable path's rows, whatever the CPU.
    pub fn pack_portable(x: Strided<&[f32]>, m: usize, k: usize) -> Self {
        let mut data = Vec::with_capacity(m * k);
        for r in 0..m {
            let row = &x.data[r * x.row_stride..r * x.row_stride + k];
            data.extend(row.iter().map(|&v| crate::numerics::codecs::bf16_round(v)));
        }
        Bf16Rows::Portable { data, m }
    }

    fn rows(&self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Rows::Amx { m, .. } => *m,
            #[cfg(target_arch = "x86_64")]
            Bf16Rows::Avx512 { m, .. } => *m,
            Bf16Rows::Portable { m, .. } => *m,
        }
    }
}

/// `y = x · bf16(w)ᵀ` for packed rows `x` (f32 accumulation), `w` `[n, k]`.
pub fn matmul_rows(x: &Bf16Rows, w: &[f32], n: usize, k: usize, y: Strided<&mut [f32]>) {
    let m = x.rows();
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        y.data.len() >= (m - 1) * y.row_stride + n,
        "matmul: y too short"
    );
    assert_eq!(w.len(), n * k, "matmul: weight shape");
    match x {
        #[cfg(target_arch = "x86_64")]
        Bf16Rows::Amx { data, kp, .. } => amx::matmul(data, m, *kp, w, n, k, y),
        #[cfg(target_arch = "x86_64")]
        Bf16Rows::Avx512 { data, pairs, .. } => avx512::matmul(data, m, *pairs, w, n, k, y),
        Bf16Rows::Portable { data, .. } => {
            let wr: Vec<f32> = w
                .par_iter()
                .map(|&v| crate::numerics::codecs::bf16_round(v))
                .collect();
            matmul_strided(
                Strided {
                    data,
                    row_stride: k,
                },
                &wr,
                n,
                k,
                y,
                m,
            );
        }
    }
}

/// `y`'s first element, shared by rayon's tasks of the AMX and AVX512-BF16 products (each task
/// writes its own elements of y: see their `matmul`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the tasks that share it write disjoint elements.
#[cfg(target_arch = "x86_64")]
unsafe impl Send for SendPtr {}
#[cfg(target_arch = "x86_64")]
unsafe impl Sync for SendPtr {}
#[cfg(target_arch = "x86_64")]
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use super::*;
    use std::arch::asm;

    /// LDTILECFG's 64-byte operand, palette 1.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// tmm0-3 accumulators (16 x 16 f32), tmm4-5 x rows (16 x 32 bf16), tmm6-7 w tiles
    /// (16 pairs x 16 columns): every tile 16 rows of 64 bytes.
    const CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    };

    /// Rows `[rows, k]` (row stride `stride`) as tiles of 16 rows x 32 bf16 values, zero-padded
    /// to `rows_padded` rows and `kp` columns: tile (row block rb, kb) at `(rb · kp/32 + kb) ·
    /// 512` u16, its row `r` at `r · 32`: one tile load reads 1 KiB in one piece. The A operand:
    /// a band of weight rows.
    fn pack_row_tiles(
        src: &[f32],
        (rows, stride, k): (usize, usize, usize),
        (rows_padded, kp): (usize, usize),
    ) -> Vec<u16> {
        let k_tiles = kp / TILE_K;
        let mut out = vec![0u16; rows_padded * kp];
        out.par_chunks_mut(512 * k_tiles)
            .enumerate()
            .for_each(|(rb, tiles)| {
                for r in 0..16 {
                    let row = rb * 16 + r;
                    if row >= rows {
                        break;
                    }
                    let from = &src[row * stride..row * stride + k];
                    for (kb, part) in from.chunks(TILE_K).enumerate() {
                        let dst =
                            &mut tiles[kb * 512 + r * TILE_K..kb * 512 + r * TILE_K + part.len()];
                        for (d, &v) in dst.iter_mut().zip(part) {
                            *d = bf16_bits(v);
                        }
                    }
                }
            });
        out
    }

    /// Rows `[rows, k]` (row stride `stride`) as the B operand: tiles of bf16 pairs, zero-padded
    /// to `rows_padded` rows and `kp` columns: tile (column block cb, kb) at `(cb · kp/32 + kb)
    /// · 256` u32, its row `p` holding row `j`'s pair `[cb·16 + j][kb·32 + 2p ..= + 1]` at
    /// `p · 16 + j` (TDPBF16PS's layout). Packed once per product: x.
    pub(super) fn pack_pair_tiles(
        src: &[f32],
        (rows, stride, k): (usize, usize, usize),
        (rows_padded, kp): (usize, usize),
    ) -> Vec<u32> {
        let k_tiles = kp / TILE_K;
        let mut out = vec![0u32; rows_padded * kp / 2];
        out.par_chunks_mut(256 * k_tiles)
            .enumerate()
            .for_each(|(cb, tiles)| {
                for j in 0..16 {
                    let row = cb * 16 + j;
                    if row >= rows {
                        break;
                    }
                    let from = &src[row * stride..row * stride + k];
                    for (pair, v) in from.chunks(2).enumerate() {
                        let lo = bf16_bits(v[0]) as u32;
                        let hi = v.get(1).map_or(0, |&h| bf16_bits(h) as u32);
                        let (kb, p) = (pair / 16, pair % 16);
                        tiles[kb * 256 + p * 16 + j] = lo | (hi << 16);
                    }
                }
            });
        out
    }

    /// `y[m, n] = x · wᵀ` for `x` packed by [`pack_pair_tiles`] (`m` rows, `kp` columns) and a
    /// band `w [n, k]`: the weight rows are the tiles' rows (A), x's rows their columns (B), so
    /// each accumulator holds a block of yᵀ, transposed on the way out.
    pub(super) fn matmul(
        xs: &[u32],
        m: usize,
        kp: usize,
        w: &[f32],
        n: usize,
        k: usize,
        y: Strided<&mut [f32]>,
    ) {
        let (mp, np) = (m.div_ceil(BLOCK) * BLOCK, n.div_ceil(BLOCK) * BLOCK);
        let ws = pack_row_tiles(w, (n, k, k), (np, kp));
        let k_tiles = kp / TILE_K;
        let (m_blocks, n_blocks) = (mp / BLOCK, np / BLOCK);
        let y_rs = y.row_stride;
        let y_ptr = SendPtr(y.data.as_mut_ptr());
        (0..m_blocks * n_blocks).into_par_iter().for_each(|b| {
            let (nb, mb) = (b / m_blocks, b % m_blocks);
            let mut acc = [0f32; BLOCK * BLOCK];
            // SAFETY: `amx_ready` granted the tile state; the tile loads read inside `ws` (the
            // tiles of weight row blocks 2nb, 2nb + 1) and `xs` (the pair tiles of x's row
            // blocks 2mb, 2mb + 1), k_tiles tiles of 1 KiB each; the stores write inside `acc`.
            unsafe { block(&ws, xs, (nb, mb), k_tiles, &mut acc) };
            let rows = (m - mb * BLOCK).min(BLOCK);
            let cols = (n - nb * BLOCK).min(BLOCK);
            for r in 0..rows {
                let at = (mb * BLOCK + r) * y_rs + nb * BLOCK;
                // SAFETY: each (nb, mb) block writes its own rows x columns of y, inside the
                // bounds asserted by the caller; no two tasks write one element.
                let dst = unsafe { std::slice::from_raw_parts_mut(y_ptr.get().add(at), cols) };
                for (c, d) in dst.iter_mut().enumerate() {
                    *d = acc[c * BLOCK + r];
                }
            }
        });
    }

    /// One 32 x 32 block of yᵀ (weight rows x x rows) over the whole of k into `acc` (row
    /// stride 32).
    ///
    /// # Safety
    /// The AMX tile state is granted; `ws` and `xs` are packed by [`pack_row_tiles`] and
    /// [`pack_pair_tiles`] with `k_tiles` tiles along k and hold block (nb, mb).
    unsafe fn block(
        ws: &[u16],
        xs: &[u32],
        (nb, mb): (usize, usize),
        k_tiles: usize,
        acc: &mut [f32; BLOCK * BLOCK],
    ) {
        let a0 = ws.as_ptr().add(2 * nb * k_tiles * 512);
        let a1 = a0.add(k_tiles * 512);
        let b0 = xs.as_ptr().add(2 * mb * k_tiles * 256);
        let b1 = b0.add(k_tiles * 256);
        let tile_stride = 64usize;
        asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack)
        );
        for kb in 0..k_tiles {
            asm!(
                "tileloadd tmm4, [{a0} + {ts}*1]",
                "tileloadd tmm5, [{a1} + {ts}*1]",
                "tileloadd tmm6, [{b0} + {ts}*1]",
                "tileloadd tmm7, [{b1} + {ts}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0.add(kb * 512),
                a1 = in(reg) a1.add(kb * 512),
                b0 = in(reg) b0.add(kb * 256),
                b1 = in(reg) b1.add(kb * 256),
                ts = in(reg) tile_stride,
                options(nostack),
            );
        }
        let a = acc.as_mut_ptr();
        let row_bytes = BLOCK * 4;
        asm!(
            "tilestored [{c00} + {rs}*1], tmm0",
            "tilestored [{c01} + {rs}*1], tmm1",
            "tilestored [{c10} + {rs}*1], tmm2",
            "tilestored [{c11} + {rs}*1], tmm3",
            "tilerelease",
            c00 = in(reg) a,
            c01 = in(reg) a.add(16),
            c10 = in(reg) a.add(16 * BLOCK),
            c11 = in(reg) a.add(16 * BLOCK + 16),
            rs = in(reg) row_bytes,
            options(nostack),
        );
    }
}

/// The AVX512-BF16 path (module doc).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// x rows per tile (a task's block of y is `ROWS x COLS`, 24 accumulator registers).
    pub(super) const ROWS: usize = 12;
    /// Weight rows per panel: two 16-lane vectors.
    pub(super) const COLS: usize = 32;

    /// The pair of bf16 values `v[2p], v[2p + 1]` of a row (the second 0 past its end) as the
    /// 32-bit lane VDPBF16PS reads: the even element in the low half.
    #[inline(always)]
    fn pair(row: &[f32], p: usize) -> u32 {
        let lo = bf16_bits(row[2 * p]) as u32;
        let hi = row.get(2 * p + 1).map_or(0, |&h| bf16_bits(h) as u32);
        lo | (hi << 16)
    }

    /// Rows `[rows, k]` (row stride `stride`) interleaved in groups of `width` rows as bf16
    /// pairs, each group `[pairs][width]` (rows past `rows` zero): group `g`'s pair `p` of row
    /// `r` at `(g · pairs + p) · width + r`. x in tiles of [`ROWS`] (one broadcast per row and
    /// step), a band of weights in panels of [`COLS`] (two vectors per step).
    pub(super) fn pack_pairs(
        src: &[f32],
        (rows, stride, k): (usize, usize, usize),
        width: usize,
    ) -> Vec<u32> {
        let pairs = k.div_ceil(2);
        let mut out = vec![0u32; rows.div_ceil(width) * pairs * width];
        out.par_chunks_mut(pairs * width)
            .enumerate()
            .for_each(|(g, group)| {
                for r in 0..width.min(rows - g * width) {
                    let row = &src[(g * width + r) * stride..(g * width + r) * stride + k];
                    for p in 0..pairs {
                        group[p * width + r] = pair(row, p);
                    }
                }
            });
        out
    }

    /// `y[m, n] = x · wᵀ` for `x` packed by [`pack_pairs`] in tiles of [`ROWS`] and a band `w [n, k]`: the band's
    /// panels packed once, then the row tiles spread over the threads, each passing over every
    /// panel.
    pub(super) fn matmul(
        xs: &[u32],
        m: usize,
        pairs: usize,
        w: &[f32],
        n: usize,
        k: usize,
        y: Strided<&mut [f32]>,
    ) {
        debug_assert!(avx512_bf16_ready());
        let ws = pack_pairs(w, (n, k, k), COLS);
        let y_rs = y.row_stride;
        let y_ptr = SendPtr(y.data.as_mut_ptr());
        let tiles = m.div_ceil(ROWS);
        // Enough tiles per task that a panel is reused from cache, enough tasks to share out.
        let per_task = tiles.div_ceil(4 * rayon::current_num_threads()).clamp(1, 8);
        (0..tiles.div_ceil(per_task))
            .into_par_iter()
            .for_each(|task| {
                let first = task * per_task;
                for panel in 0..n.div_ceil(COLS) {
                    let cols = COLS.min(n - panel * COLS);
                    for t in first..(first + per_task).min(tiles) {
                        let rows = ROWS.min(m - t * ROWS);
                        let block = Block {
                            x: xs[t * pairs * ROWS..].as_ptr(),
                            w: ws[panel * pairs * COLS..].as_ptr(),
                            pairs,
                            // SAFETY: row t·ROWS, column panel·COLS is inside y (the caller
                            // asserted y holds m rows of n at stride y_rs).
                            y: unsafe { y_ptr.get().add(t * ROWS * y_rs + panel * COLS) },
                            y_rs,
                            cols,
                        };
                        // SAFETY: AVX512F + AVX512_BF16 (the path is only taken where ready); the
                        // tile holds pairs x ROWS values, the panel pairs x COLS, and each task
                        // writes only its own tiles' rows of y.
                        unsafe { block_dispatch(rows, &block) };
                    }
                }
            });
    }

    /// One block's operands.
    struct Block {
        /// The x tile, `[pairs][ROWS]`.
        x: *const u32,
        /// The weight panel, `[pairs][COLS]`.
        w: *const u32,
        pairs: usize,
        y: *mut f32,
        y_rs: usize,
        /// Valid columns (1..=COLS).
        cols: usize,
    }

    /// [`block`] for `rows` (1..=ROWS) valid rows.
    ///
    /// # Safety
    /// As [`block`].
    unsafe fn block_dispatch(rows: usize, b: &Block) {
        // SAFETY: forwarded.
        unsafe {
            match rows {
                12 => block::<12>(b),
                11 => block::<11>(b),
                10 => block::<10>(b),
                9 => block::<9>(b),
                8 => block::<8>(b),
                7 => block::<7>(b),
                6 => block::<6>(b),
                5 => block::<5>(b),
                4 => block::<4>(b),
                3 => block::<3>(b),
                2 => block::<2>(b),
                1 => block::<1>(b),
                _ => unreachable!("bf16 gemm: {rows} rows in a tile"),
            }
        }
    }

    /// `R` rows of the x tile times one panel over all pairs of k, the sums in registers, then
    /// stored to y (masked past `cols`).
    ///
    /// # Safety
    /// AVX512F + AVX512_BF16; `b.x` valid for `pairs · ROWS` values, `b.w` for `pairs · COLS`,
    /// `b.y` rows `r < R` at stride `y_rs`, `cols` values each, valid for writes.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn block<const R: usize>(b: &Block) {
        let lo: __mmask16 = if b.cols >= 16 {
            0xffff
        } else {
            ((1u32 << b.cols) - 1) as u16
        };
        let hi: __mmask16 = if b.cols >= COLS {
            0xffff
        } else if b.cols > 16 {
            ((1u32 << (b.cols - 16)) - 1) as u16
        } else {
            0
        };
        // SAFETY: every pointer stays inside the regions of the function's contract; the
        // transmutes reinterpret 512 bits of bf16 pairs as the intrinsics' bf16 vector type.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for p in 0..b.pairs {
                let w0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b.w.add(p * COLS) as *const __m512i));
                let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                    b.w.add(p * COLS + 16) as *const __m512i
                ));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*b.x.add(p * ROWS + r) as i32));
                    a[0] = _mm512_dpbf16_ps(a[0], w0, xv);
                    a[1] = _mm512_dpbf16_ps(a[1], w1, xv);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let y = b.y.add(r * b.y_rs);
                _mm512_mask_storeu_ps(y, lo, a[0]);
                _mm512_mask_storeu_ps(y.add(16), hi, a[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::codecs::bf16_round;

    /// A strided product (`x`, `w`, n, k, `y`, m).
    type Product = fn(Strided<&[f32]>, &[f32], usize, usize, Strided<&mut [f32]>, usize);

    /// `y = bf16(x) · bf16(w)ᵀ` on this CPU's path.
    fn matmul_bf16(
        x: Strided<&[f32]>,
        w: &[f32],
        n: usize,
        k: usize,
        y: Strided<&mut [f32]>,
        m: usize,
    ) {
        matmul_rows(&Bf16Rows::pack(x, m, k), w, n, k, y)
    }

    /// The same on the portable path, whatever the CPU.
    fn matmul_portable(
        x: Strided<&[f32]>,
        w: &[f32],
        n: usize,
        k: usize,
        y: Strided<&mut [f32]>,
        m: usize,
    ) {
        matmul_rows(&Bf16Rows::pack_portable(x, m, k), w, n, k, y)
    }

    fn ramp(len: usize, seed: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32 * 0.7311 + seed).sin() * 1.37) + 1e-3 * i as f32)
            .collect()
    }

    /// The bf16-rounded operands' product summed in f64, and the f32 summation's error bound
    /// for it (`k · eps · Σ|products|`): what either path must meet.
    fn reference(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
        let mut y = vec![(0f64, 0f64); m * n];
        for r in 0..m {
            for c in 0..n {
                let products = (0..k)
                    .map(|i| bf16_round(x[r * k + i]) as f64 * bf16_round(w[c * k + i]) as f64);
                let (sum, abs) = products.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()));
                y[r * n + c] = (sum, k as f64 * f32::EPSILON as f64 * abs);
            }
        }
        y
    }

    fn run(f: Product, (m, n, k): (usize, usize, usize)) -> (Vec<f32>, Vec<(f64, f64)>) {
        let (x, w) = (ramp(m * k, 0.3), ramp(n * k, 1.1));
        // y wider than n (row stride n + 3) and pre-filled: only [.., ..n] is written.
        let mut y = vec![7.0f32; m * (n + 3)];
        f(
            Strided {
                data: &x,
                row_stride: k,
            },
            &w,
            n,
            k,
            Strided {
                data: &mut y,
                row_stride: n + 3,
            },
            m,
        );
        let want = reference(&x, &w, m, n, k);
        let got: Vec<f32> = (0..m)
            .flat_map(|r| y[r * (n + 3)..r * (n + 3) + n].to_vec())
            .collect();
        for r in 0..m {
            assert_eq!(&y[r * (n + 3) + n..(r + 1) * (n + 3)], &[7.0; 3]);
        }
        (got, want)
    }

    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (3, 17, 31),
        (33, 40, 33),
        (16, 16, 64),
        (70, 65, 300),
        (5, 300, 1024),
    ];

    #[test]
    fn both_paths_compute_the_rounded_operands_product_for_any_shape() {
        let paths: [(&str, Product); 2] =
            [("dispatch", matmul_bf16), ("portable", matmul_portable)];
        for (name, f) in paths {
            for shape in SHAPES {
                let (got, want) = run(f, shape);
                for (i, (g, (w, tol))) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= *tol,
                        "{name} {shape:?} [{i}]: {g} vs {w} (tol {tol}, kernels {})",
                        bf16_kernels()
                    );
                }
            }
        }
    }

    /// The AVX512-BF16 path (where the CPU has it, AMX or not) gives every element exactly the
    /// chain of its module doc, emulated here in f32 (each bf16 product is exact in f32, so one
    /// rounded add per product), whatever the shape's edges, and a row's values do not depend
    /// on how many rows share the product (first 5 rows alone = the same rows among 70).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_bf16_is_the_pair_chain_bit_for_bit() {
        if !avx512_bf16_ready() {
            eprintln!("no AVX512_BF16 here: skipped");
            return;
        }
        let chain = |x: &[f32], w: &[f32]| -> f32 {
            let (x, w): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| bf16_round(v)).collect(),
                w.iter().map(|&v| bf16_round(v)).collect(),
            );
            let mut acc = 0.0f32;
            for p in 0..x.len().div_ceil(2) {
                if 2 * p + 1 < x.len() {
                    acc += x[2 * p + 1] * w[2 * p + 1];
                }
                acc += x[2 * p] * w[2 * p];
            }
            acc
        };
        for (m, n, k) in [
            (1, 1, 1),
            (13, 33, 7),
            (70, 65, 300),
            (5, 300, 1024),
            (25, 40, 4096),
        ] {
            let (x, w) = (ramp(m * k, 0.3), ramp(n * k, 1.1));
            let product = |rows: usize| {
                let mut y = vec![f32::NAN; rows * (n + 1)];
                let packed = Bf16Rows::pack_avx512(
                    Strided {
                        data: &x,
                        row_stride: k,
                    },
                    rows,
                    k,
                );
                matmul_rows(
                    &packed,
                    &w,
                    n,
                    k,
                    Strided {
                        data: &mut y,
                        row_stride: n + 1,
                    },
                );
                y
            };
            let (all, few) = (product(m), product(m.min(5)));
            for r in 0..m {
                for j in 0..n {
                    let want = chain(&x[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
                    let got = all[r * (n + 1) + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "({m}, {n}, {k}) [{r}, {j}]");
                    if r < 5 {
                        assert_eq!(few[r * (n + 1) + j].to_bits(), got.to_bits());
                    }
                }
                assert!(all[r * (n + 1) + n].is_nan(), "column n written");
            }
        }
    }

    #[test]
    fn bf16_bits_are_half_s_rounding() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
        ];
        let randoms = (0..100_000).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f32::from_bits(state as u32)
        });
        for x in specials.into_iter().chain(randoms) {
            assert_eq!(
                bf16_bits(x),
                half::bf16::from_f32(x).to_bits(),
                "{x:e} ({:#010x})",
                x.to_bits()
            );
        }
    }

    #[test]
    fn rounding_is_to_bf16_not_truncation() {
        // 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7 in bf16 (truncation would give 1): x·1 shows it.
        let x = [1.0f32 + 1.0 / 256.0 + 1.0 / 512.0];
        let w = [1.0f32];
        let mut y = [0.0f32];
        matmul_bf16(
            Strided {
                data: &x,
                row_stride: 1,
            },
            &w,
            1,
            1,
            Strided {
                data: &mut y,
                row_stride: 1,
            },
            1,
        );
        assert_eq!(y[0], 1.0 + 1.0 / 128.0, "kernels {}", bf16_kernels());
    }
}
