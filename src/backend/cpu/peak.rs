//! The f32 fused multiply-add peak of the cores the CPU backend runs on, measured: every worker
//! thread runs a loop of independent vector FMAs (12 accumulators, more than the FMA latency
//! times the FMA ports, so the loop is throughput-bound) on the widest vectors the CPU has
//! (AVX-512, else AVX2 + FMA), all threads at once. `bench` divides its reference GEMM rate by
//! it: the fraction of these cores' arithmetic the products reach. No result on CPUs without FMA
//! vectors (the figure would be meaningless there).

use rayon::prelude::*;
use std::time::Instant;

/// FMAs per accumulator per measured pass.
const ITERATIONS: usize = 40_000_000;

/// The measured f32 FMA peak of all the pool's threads together, in TFLOP/s (2 flops per FMA
/// lane), and the vectors it ran on; best of three passes.
pub fn fma_peak_tflops() -> Option<(f64, &'static str)> {
    let (lanes, name) = vector_lanes()?;
    let threads = rayon::current_num_threads();
    let best = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            let sink: f32 = (0..threads)
                .into_par_iter()
                .with_max_len(1)
                .map(|_| fma_loop(ITERATIONS))
                .sum();
            std::hint::black_box(sink);
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-12);
    let flops = 2.0 * (threads * ITERATIONS * ACCUMULATORS * lanes) as f64;
    Some((flops / best / 1e12, name))
}

/// Independent accumulators of the loop.
const ACCUMULATORS: usize = 12;

/// f32 lanes of the widest FMA vectors here, and their name.
fn vector_lanes() -> Option<(usize, &'static str)> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Some((16, "avx512f"));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Some((8, "avx2+fma"));
        }
    }
    None
}

/// `iterations` rounds of [`ACCUMULATORS`] independent FMAs on the widest vectors; returns a
/// value that depends on all of them (so nothing is optimised away).
fn fma_loop(iterations: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F checked just above.
            return unsafe { fma_loop_avx512(iterations) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA checked just above.
            return unsafe { fma_loop_avx2(iterations) };
        }
    }
    let _ = iterations;
    0.0
}

/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let b = _mm512_set1_ps(0.999_999);
    let c = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_setzero_ps(); ACCUMULATORS];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm512_set1_ps(i as f32);
    }
    for _ in 0..iterations {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, b, c);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let b = _mm256_set1_ps(0.999_999);
    let c = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_setzero_ps(); ACCUMULATORS];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm256_set1_ps(i as f32);
    }
    for _ in 0..iterations {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, b, c);
        }
    }
    let mut lanes = [0.0f32; 8];
    acc.iter().fold(0.0, |s, &a| {
        _mm256_storeu_ps(lanes.as_mut_ptr(), a);
        s + lanes.iter().sum::<f32>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_computes_what_it_claims() {
        // Short loops give the scalar recurrence a_{n+1} = a_n·b + c per lane: check the sum
        // against it (so a kernel that skipped work would be caught), then that the peak is
        // positive where the CPU has FMA vectors.
        if let Some((lanes, _)) = vector_lanes() {
            let got = fma_loop(3);
            let (b, c) = (0.999_999f32, 1e-7f32);
            let want: f32 = (0..ACCUMULATORS)
                .map(|i| {
                    let mut a = i as f32;
                    for _ in 0..3 {
                        a = a.mul_add(b, c);
                    }
                    a * lanes as f32
                })
                .sum();
            assert!((got - want).abs() <= 1e-4 * want.abs(), "{got} vs {want}");
            let (tflops, _) = fma_peak_tflops().unwrap();
            assert!(tflops > 0.0 && tflops.is_finite());
        } else {
            assert!(fma_peak_tflops().is_none());
        }
    }
}
