//! A per-device cache of freed allocations, reused by later allocations of the same size class,
//! so that the many short-lived op outputs and scratch buffers of a forward cost neither a
//! `cuMemAlloc` nor a `cuMemFree` (which waits for all queued device work) each time.
//!
//! Reuse is safe because an executor queues everything on one in-order stream (the legacy
//! default stream): a buffer handed back while kernels that read it are still queued is only
//! handed out again to work queued after them. Sizes are rounded up to classes (multiples of
//! 256 bytes up to 4 KiB, then 8 classes per power of two up to 64 MiB: at most 12.5% slack,
//! then multiples of 2 MiB: at most 3%) so that buffers whose size varies a little from chunk
//! to chunk (tokens per expert) still meet. The pool keeps
//! at most `limit` bytes; what would exceed it is really freed. An allocation that fails for
//! lack of memory empties the pool and tries again ([`BufferPool::drain`]), so the memory plan's
//! guarantee holds as without a pool.

use std::collections::HashMap;
use std::sync::Mutex;

/// Freed allocations by size class: device addresses (or host pointers on the emulator).
#[derive(Debug)]
pub struct BufferPool {
    limit: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    free: HashMap<usize, Vec<u64>>,
    kept: usize,
    closed: bool,
    reused: u64,
}

/// Above this size classes are multiples of [`LARGE_STEP`] (at most 3% slack; the driver's own
/// granularity), not eighths of a power of two: the big buffers are mostly long-lived (weights,
/// decoded copies, caches), and the memory plan counts their exact bytes with no room for
/// 12.5% more (a 1.06 GB embedding would take 1.125 GB).
pub const LARGE_BYTES: usize = 64 << 20;
/// Class step above [`LARGE_BYTES`].
pub const LARGE_STEP: usize = 2 << 20;

impl BufferPool {
    /// A pool keeping at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        BufferPool {
            limit,
            state: Mutex::new(PoolState::default()),
        }
    }

    /// A pool keeping at most `limit` bytes, or none for 0 (a real device's pool:
    /// [`GpuSwitches::pool_bytes`](super::GpuSwitches::pool_bytes)).
    pub fn limited(limit: usize) -> Option<Self> {
        (limit > 0).then(|| Self::new(limit))
    }

    /// The size class of an allocation of `bytes`: what is really allocated for it.
    pub fn class(bytes: usize) -> usize {
        let bytes = bytes.max(1);
        if bytes <= 4096 {
            return bytes.div_ceil(256) * 256;
        }
        if bytes > LARGE_BYTES {
            return bytes.div_ceil(LARGE_STEP) * LARGE_STEP;
        }
        let step = 1usize << (usize::BITS - 1 - bytes.leading_zeros() - 3);
        bytes.div_ceil(step) * step
    }

    /// The bytes an allocation of `bytes` takes on a device: its size class when the device
    /// pools (`pooled`), else `bytes` itself.
    pub fn footprint(pooled: bool, bytes: usize) -> usize {
        if pooled {
            Self::class(bytes)
        } else {
            bytes
        }
    }

    /// A kept allocation of class `class`, if there is one.
    pub fn take(&self, class: usize) -> Option<u64> {
        let mut s = self.state.lock().unwrap();
        let addr = s.free.get_mut(&class)?.pop()?;
        s.kept -= class;
        s.reused += 1;
        Some(addr)
    }

    /// Offers a freed allocation of class `class`; false when the caller must free it (the
    /// pool is full or closed).
    pub fn give(&self, class: usize, addr: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        if s.closed || s.kept + class > self.limit {
            return false;
        }
        s.kept += class;
        s.free.entry(class).or_default().push(addr);
        true
    }

    /// Takes every kept allocation out, `(class, address)`, for the caller to free.
    pub fn drain(&self) -> Vec<(usize, u64)> {
        let mut s = self.state.lock().unwrap();
        s.kept = 0;
        s.free
            .drain()
            .flat_map(|(class, addrs)| addrs.into_iter().map(move |a| (class, a)))
            .collect()
    }

    /// [`drain`](Self::drain), and refuse everything given later (the executor is going away).
    pub fn close(&self) -> Vec<(usize, u64)> {
        self.state.lock().unwrap().closed = true;
        self.drain()
    }

    /// Bytes kept now.
    pub fn kept_bytes(&self) -> usize {
        self.state.lock().unwrap().kept
    }

    /// Allocations served from the pool so far.
    pub fn reused(&self) -> u64 {
        self.state.lock().unwrap().reused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        assert_eq!(BufferPool::class(0), 256);
        assert_eq!(BufferPool::class(1), 256);
        assert_eq!(BufferPool::class(257), 512);
        assert_eq!(BufferPool::class(4096), 4096);
        assert_eq!(BufferPool::class(4097), 4608);
        for bytes in [
            5000usize,
            65_537,
            1 << 20,
            (1 << 20) + 1,
            60 << 20,
            123_456_789,
        ] {
            let c = BufferPool::class(bytes);
            assert!(c >= bytes && (c - bytes) * 8 <= bytes, "{bytes} -> {c}");
            assert_eq!(BufferPool::class(c), c, "a class is its own class");
        }
        // Large buffers (a Flash embedding: 129,280 x 4,096 bf16) round to 2 MiB only.
        for bytes in [(64 << 20) + 1, 129_280 * 4096 * 2, 3 << 30] {
            let c = BufferPool::class(bytes);
            assert!(c >= bytes && c - bytes < LARGE_STEP, "{bytes} -> {c}");
            assert!(
                (c - bytes) * 32 <= bytes,
                "{bytes} -> {c}: at most 3% slack"
            );
            assert_eq!(BufferPool::class(c), c, "a class is its own class");
        }
    }

    #[test]
    fn a_zero_limit_is_no_pool() {
        let limit = |v| BufferPool::limited(v).map(|p| p.limit);
        assert_eq!(limit(64 << 20), Some(64 << 20));
        assert_eq!(limit(0), None);
    }

    #[test]
    fn keeps_up_to_its_limit_and_hands_back_by_class() {
        let p = BufferPool::new(1024);
        assert!(p.give(512, 1));
        assert!(p.give(512, 2));
        assert!(!p.give(256, 3), "over the limit: the caller frees it");
        assert_eq!(p.kept_bytes(), 1024);
        assert_eq!(p.take(256), None);
        assert_eq!(p.take(512), Some(2));
        assert_eq!(p.kept_bytes(), 512);
        assert_eq!(p.reused(), 1);
        let mut drained = p.close();
        drained.sort_unstable();
        assert_eq!(drained, vec![(512, 1)]);
        assert_eq!(p.kept_bytes(), 0);
        assert!(!p.give(512, 4), "closed");
    }
}
