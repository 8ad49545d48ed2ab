//! The emulator's stand-in for device memory: [`EmuBuf`], a 256-byte aligned host allocation
//! followed by [`GUARD_BYTES`] of guard words that `emu.rs` checks after every launch, handed
//! back to the executor's pool (or really freed) when dropped.

use super::super::pool::BufferPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const ALIGN: usize = 256;

/// Bytes after every buffer's end holding the guard word (a NaN pattern), checked after every launch: a
/// kernel that writes past the end of an argument is an error naming the kernel and the
/// argument (on a GPU it would corrupt a neighbouring allocation or fault later).
pub const GUARD_BYTES: usize = 1024;

/// The guard pattern: a NaN as f32 (a kernel reading past the end sees NaN), a huge index as
/// i32 (not the -1 padding some kernels write), and a bf16 NaN in its high half.
const GUARD_WORD: u32 = 0x7FC0_0A51;

/// A host allocation standing in for device memory (256-byte aligned, zero-filled): `len`
/// bytes, `cap` really allocated (its pool size class when the executor pools), followed by
/// [`GUARD_BYTES`] of guard words from `len` on.
pub struct EmuBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) cap: usize,
    pub(super) used: Arc<AtomicUsize>,
    pub(super) pool: Option<Arc<BufferPool>>,
}

// SAFETY: the buffer is plain memory owned by this value; kernels write disjoint elements.
unsafe impl Send for EmuBuf {}
unsafe impl Sync for EmuBuf {}

impl EmuBuf {
    /// The host layout of an allocation of `cap` bytes (its guard included).
    pub(super) fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap + GUARD_BYTES, ALIGN).expect("allocation size")
    }

    /// Writes the guard words after `len` bytes.
    pub(super) fn arm_guard(&mut self) {
        let guard = GUARD_WORD.to_le_bytes();
        // SAFETY: the allocation holds cap + GUARD_BYTES >= len + GUARD_BYTES bytes.
        let tail = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(self.len), GUARD_BYTES) };
        for (i, b) in tail.iter_mut().enumerate() {
            *b = guard[(self.len + i) % 4];
        }
    }

    /// Whether the guard after `len` bytes is as [`Self::arm_guard`] left it.
    pub(super) fn guard_intact(&self) -> bool {
        let guard = GUARD_WORD.to_le_bytes();
        // SAFETY: as in arm_guard.
        let tail = unsafe { std::slice::from_raw_parts(self.ptr.add(self.len), GUARD_BYTES) };
        tail.iter()
            .enumerate()
            .all(|(i, &b)| b == guard[(self.len + i) % 4])
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for EmuBuf {
    fn drop(&mut self) {
        // A pooled buffer stays allocated (and counted as used), as on a device.
        if self
            .pool
            .as_ref()
            .is_some_and(|p| p.give(self.cap, self.ptr as u64))
        {
            return;
        }
        free_host(&self.used, self.cap, self.ptr);
    }
}

/// Really frees an emulated allocation of `cap` bytes.
pub(super) fn free_host(used: &AtomicUsize, cap: usize, ptr: *mut u8) {
    // SAFETY: allocated in `alloc_now` with the layout of `cap`.
    unsafe { std::alloc::dealloc(ptr, EmuBuf::layout(cap)) }
    used.fetch_sub(cap, Ordering::Relaxed);
}
