//! Memory accounting of the host emulator ([`EmuExecutor::with_memory_tracking`], off by default): the executor
//! always counts the bytes it holds (`used`: live allocations at their pool size class plus
//! what the pool keeps, as a device would); with tracking on it also records the peak of that
//! figure and the peak of the bytes *in use* (held less what the pool keeps: what a device must
//! have, since a full device empties the pool before it fails, see `pool.rs`), updated on every
//! allocation ([`EmuExecutor::memory_stats`], [`EmuExecutor::reset_peaks`]). It does not tell
//! weights from activations by itself: a caller snapshots [`MemoryStats::in_use`] after loading
//! the weights and reads decoded copies from `GpuBackend::decode_cache_use`
//! (`tests/backend/emu_memory.rs` checks the memory plan against it this way).

use super::EmuExecutor;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Peaks recorded by an executor with memory tracking on.
#[derive(Debug, Default)]
pub(super) struct Peaks {
    /// Most bytes held (live allocations at their class plus the pool's kept bytes).
    pub(super) held: AtomicUsize,
    /// Most bytes in use (held less the pool's kept bytes).
    pub(super) in_use: AtomicUsize,
}

/// Device memory of an emulated device (see the module docs), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Held now: live allocations (their pool size class when pooling) plus the pool's kept
    /// buffers.
    pub held: usize,
    /// Kept by the pool now (freed by their users, not yet returned to the device).
    pub pooled: usize,
    /// In use now: `held - pooled`.
    pub in_use: usize,
    /// Most held since the executor was made or [`EmuExecutor::reset_peaks`] (0 without
    /// tracking).
    pub peak_held: usize,
    /// Most in use since then (0 without tracking).
    pub peak_in_use: usize,
}

impl EmuExecutor {
    /// The same executor recording the peaks of its held and in-use bytes (`on`; see the
    /// module docs and [`Self::memory_stats`]). Off by default: one more atomic maximum per
    /// allocation when on, nothing when off.
    pub fn with_memory_tracking(mut self, on: bool) -> Self {
        self.peaks = on.then(|| {
            let p = Peaks::default();
            let now = self.memory_stats();
            p.held.store(now.held, Ordering::Relaxed);
            p.in_use.store(now.in_use, Ordering::Relaxed);
            p
        });
        self
    }

    /// Held, pooled and in-use bytes now, and the peaks when tracking.
    pub fn memory_stats(&self) -> MemoryStats {
        let held = self.used.load(Ordering::Relaxed);
        let pooled = self.pool.as_ref().map_or(0, |p| p.kept_bytes());
        let (peak_held, peak_in_use) = self.peaks.as_ref().map_or((0, 0), |p| {
            (
                p.held.load(Ordering::Relaxed),
                p.in_use.load(Ordering::Relaxed),
            )
        });
        MemoryStats {
            held,
            pooled,
            in_use: held.saturating_sub(pooled),
            peak_held,
            peak_in_use,
        }
    }

    /// Restarts the peaks from the bytes held and in use now (no-op without tracking).
    pub fn reset_peaks(&self) {
        if let Some(p) = &self.peaks {
            let now = self.memory_stats();
            p.held.store(now.held, Ordering::Relaxed);
            p.in_use.store(now.in_use, Ordering::Relaxed);
        }
    }

    /// Raises the peaks to what is held and in use now (after an allocation).
    pub(super) fn note_peak(&self) {
        if let Some(p) = &self.peaks {
            let now = self.memory_stats();
            p.held.fetch_max(now.held, Ordering::Relaxed);
            p.in_use.fetch_max(now.in_use, Ordering::Relaxed);
        }
    }
}
