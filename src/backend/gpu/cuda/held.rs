//! The bytes of device memory a [`super::CudaExecutor`]'s own allocations hold
//! ([`HeldBytes`]): added at each successful `cuMemAlloc`, taken off at each `cuMemFree`, with
//! the peak of that figure (the buffer pool's kept buffers included) and the peak of the bytes
//! in use (held less what the pool keeps, taken at each allocation, pooled or not). `bench`
//! prints both against the memory plan (`Backend::device_memory`). The CUDA context, cuBLAS's
//! workspace and kernels' local memory are not ours to count: the plan's fixed 1 GiB covers
//! them.

use crate::backend::MemoryUse;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Held bytes now and the two peaks (see the module docs).
#[derive(Debug, Default)]
pub struct HeldBytes {
    held: AtomicUsize,
    peak_held: AtomicUsize,
    peak_in_use: AtomicUsize,
}

impl HeldBytes {
    /// `bytes` more are held (a `cuMemAlloc` succeeded).
    pub fn allocated(&self, bytes: usize) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_held.fetch_max(now, Ordering::Relaxed);
    }

    /// `bytes` are no longer held (a `cuMemFree`).
    pub fn freed(&self, bytes: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                debug_assert!(h >= bytes, "freed {bytes} of {h} bytes held: counted twice");
                Some(h.saturating_sub(bytes))
            });
    }

    /// A buffer was handed out while the pool keeps `pooled` bytes: records the bytes in use.
    pub fn handed_out(&self, pooled: usize) {
        let in_use = self.held.load(Ordering::Relaxed).saturating_sub(pooled);
        self.peak_in_use.fetch_max(in_use, Ordering::Relaxed);
    }

    /// Restarts both peaks from what is held and in use now, with the pool keeping `pooled`.
    pub fn reset_peaks(&self, pooled: usize) {
        let held = self.held.load(Ordering::Relaxed);
        self.peak_held.store(held, Ordering::Relaxed);
        self.peak_in_use
            .store(held.saturating_sub(pooled), Ordering::Relaxed);
    }

    /// Now and the peaks, with the pool keeping `pooled` bytes now.
    pub fn snapshot(&self, pooled: usize) -> MemoryUse {
        let held = self.held.load(Ordering::Relaxed);
        MemoryUse {
            held,
            in_use: held.saturating_sub(pooled),
            peak_held: self.peak_held.load(Ordering::Relaxed),
            peak_in_use: self.peak_in_use.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pooled buffer stays held; the in-use peak is taken when buffers are handed out.
    #[test]
    fn held_and_in_use_peaks_follow_allocations_frees_and_the_pool() {
        let h = HeldBytes::default();
        h.allocated(100);
        h.handed_out(0);
        h.allocated(50);
        h.handed_out(0);
        // The 100-byte buffer goes to the pool, then is handed out again.
        h.handed_out(0);
        assert_eq!(
            h.snapshot(100),
            MemoryUse {
                held: 150,
                in_use: 50,
                peak_held: 150,
                peak_in_use: 150
            }
        );
        // The pool is drained (really freed) and a smaller buffer allocated.
        h.freed(100);
        h.allocated(30);
        h.handed_out(0);
        assert_eq!(
            h.snapshot(0),
            MemoryUse {
                held: 80,
                in_use: 80,
                peak_held: 150,
                peak_in_use: 150
            }
        );
        // Restarted peaks begin at what is held and in use now.
        h.reset_peaks(30);
        assert_eq!(
            h.snapshot(30),
            MemoryUse {
                held: 80,
                in_use: 50,
                peak_held: 80,
                peak_in_use: 50
            }
        );
        h.allocated(10);
        h.handed_out(30);
        assert_eq!(
            (h.snapshot(30).peak_held, h.snapshot(30).peak_in_use),
            (90, 60)
        );
    }
}
