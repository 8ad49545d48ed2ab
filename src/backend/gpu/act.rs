//! Device-resident activations of the GPU backend ([`GpuAct`]) and the helpers every op uses to
//! place its operands: an input on the device the op runs on ([`GpuBackend::on`]), an in-place
//! operand moved there for good ([`GpuBackend::migrate`]), an output buffer there
//! ([`GpuBackend::output`]), and NaN outputs after a failure (`GpuBackend::settle_acts`).
//!
//! An activation is `len` f32 values at the start of one buffer on one device of the backend;
//! the buffer may hold more (its *capacity*, [`GpuBackend::capacity`]): the per-sequence caches
//! grow in place by a chunk at a time ([`GpuBackend::append`], doubling when full, at least
//! [`MIN_CAPACITY`] values) and forget their oldest rows ([`GpuBackend::drop_front`]), all with
//! device-to-device copies (`el_copy`). Everything else reads and writes the first `len` values
//! only. Activations are created on the current site's device; an op runs on the device of its
//! weight (or, without a weight, on the current site's device), and an operand that lives
//! elsewhere is moved there through the host (download, upload: rare, once per device boundary
//! of the placement). A buffer whose allocation failed is `None` (the failure was recorded): ops
//! fail on it, reads give NaN.

use super::executor::{bytemuck_lite, download, grid_for, upload, Arg, Executor, GpuError};
use super::matrix::GpuMatrix;
use super::GpuBackend;
use std::ops::Deref;

/// `len` f32 values in one buffer on device `device` (an index into the backend's devices).
pub struct GpuAct<B> {
    /// None when its allocation (or a move) failed; the failure was recorded.
    pub(crate) buf: Option<B>,
    pub(crate) len: usize,
    pub(crate) device: usize,
}

impl<B> GpuAct<B> {
    /// Number of f32 values.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the device holding the values.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device buffer (None after a failed allocation).
    pub fn buf(&self) -> Option<&B> {
        self.buf.as_ref()
    }
}

/// An input's buffer on the device an op runs on: the activation's own where it lives there,
/// else a copy moved through the host (dropped after the op).
pub enum Placed<'a, B> {
    Here(&'a B),
    Moved(B),
}

impl<B> Deref for Placed<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        match self {
            Placed::Here(b) => b,
            Placed::Moved(b) => b,
        }
    }
}

/// Smallest capacity (values) a growing activation gets.
pub const MIN_CAPACITY: usize = 1024;

/// Copies `n` f32 values on device `e` from element `from` of `src` to element `to` of `dst`
/// (one launch of `el_copy`). The two ranges must not overlap (threads run in any order).
pub fn copy_values<E: Executor>(
    e: &E,
    (src, from): (&E::Buf, usize),
    (dst, to): (&E::Buf, usize),
    n: usize,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let args = [
        Arg::Buf(src, from * 4),
        Arg::Buf(dst, to * 4),
        Arg::I64(n as i64),
    ];
    e.launch("el_copy", grid_for(n), &args)
}

fn lost() -> GpuError {
    GpuError::Other("activation lost to an earlier device failure (see the first error)".into())
}

impl<E: Executor> GpuBackend<E> {
    /// The executor of device `d`.
    pub fn dev_at(&self, d: usize) -> &E {
        &self.devices[d]
    }

    /// Uploads f32 values to the current device.
    pub fn up(&self, x: &[f32]) -> Result<E::Buf, GpuError> {
        upload(self.dev(), x)
    }

    /// Uploads i32 values to the current device.
    pub fn up_i32(&self, x: &[i32]) -> Result<E::Buf, GpuError> {
        upload(self.dev(), x)
    }

    /// Downloads f32 values from the current device.
    pub fn down(&self, b: &E::Buf, out: &mut [f32]) -> Result<(), GpuError> {
        download(self.dev(), b, out)
    }

    /// An f32 buffer of `n` zeros on the current device.
    pub fn zeros(&self, n: usize) -> Result<E::Buf, GpuError> {
        self.dev().alloc(n * 4)
    }

    /// The device (executor) holding `m`.
    pub fn dev_of(&self, m: &GpuMatrix<E::Buf>) -> &E {
        &self.devices[m.device]
    }

    /// An activation of host values on the current site's device (buffer None on failure, the
    /// failure recorded).
    pub fn act_upload(&self, data: &[f32]) -> GpuAct<E::Buf> {
        let device = self.current_index();
        let buf = upload(self.dev(), data)
            .map_err(|e| self.fail("activation upload", e))
            .ok();
        GpuAct {
            buf,
            len: data.len(),
            device,
        }
    }

    /// An activation of `len` zeros on the current site's device.
    pub fn act_alloc(&self, len: usize) -> GpuAct<E::Buf> {
        self.act_alloc_filled(len, true)
    }

    /// [`Self::act_alloc`] without the zero fill (`Backend::act_uninit`).
    pub fn act_alloc_uninit(&self, len: usize) -> GpuAct<E::Buf> {
        self.act_alloc_filled(len, false)
    }

    /// An activation of `len` values on the current site's device, zeroed when `zeroed`; a
    /// failed allocation is recorded and leaves no buffer (reads give NaN).
    fn act_alloc_filled(&self, len: usize, zeroed: bool) -> GpuAct<E::Buf> {
        let device = self.current_index();
        let dev = self.dev();
        let buf = if zeroed {
            dev.alloc(len * 4)
        } else {
            dev.alloc_uninit(len * 4)
        };
        let buf = buf.map_err(|e| self.fail("activation allocation", e)).ok();
        GpuAct { buf, len, device }
    }

    /// Copies `out.len()` values from element `start` of `a` (NaN and a recorded failure when
    /// the read fails or the buffer was lost). Panics when the range is outside `a`.
    pub fn act_download(&self, a: &GpuAct<E::Buf>, start: usize, out: &mut [f32]) {
        assert!(
            start.checked_add(out.len()).is_some_and(|end| end <= a.len),
            "act_read: {} values at {start} past an activation of {}",
            out.len(),
            a.len
        );
        if out.is_empty() {
            return;
        }
        let r = a.buf.as_ref().ok_or_else(lost).and_then(|b| {
            self.devices[a.device].read(b, start * 4, bytemuck_lite::bytes_of_mut(out))
        });
        if let Err(e) = r {
            self.fail("activation read", e);
            out.fill(f32::NAN);
        }
    }

    /// `len` f32 values of `b` (on device `from`) as a new buffer on device `to`, through the
    /// host.
    fn move_buf(&self, b: &E::Buf, len: usize, from: usize, to: usize) -> Result<E::Buf, GpuError> {
        let mut host = vec![0f32; len];
        if len > 0 {
            self.devices[from].read(b, 0, bytemuck_lite::bytes_of_mut(&mut host))?;
        }
        upload(&self.devices[to], &host)
    }

    /// The buffer of input `a` on device `d` (moved there for this op if it lives elsewhere).
    pub fn on<'a>(&self, a: &'a GpuAct<E::Buf>, d: usize) -> Result<Placed<'a, E::Buf>, GpuError> {
        let b = a.buf.as_ref().ok_or_else(lost)?;
        if a.device == d {
            Ok(Placed::Here(b))
        } else {
            self.move_buf(b, a.len, a.device, d).map(Placed::Moved)
        }
    }

    /// The buffer of in-place operand `a`, moved to device `d` first if it lives elsewhere (the
    /// activation then stays there).
    pub fn migrate<'a>(
        &self,
        a: &'a mut GpuAct<E::Buf>,
        d: usize,
    ) -> Result<&'a mut E::Buf, GpuError> {
        if a.device != d {
            let moved = self.move_buf(a.buf.as_ref().ok_or_else(lost)?, a.len, a.device, d)?;
            a.buf = Some(moved);
            a.device = d;
        }
        a.buf.as_mut().ok_or_else(lost)
    }

    /// A buffer on device `d` for output `a` (`a.len` values, contents undefined: the op writes
    /// all of them): its own where it lives there, else a new allocation that replaces it.
    pub fn output<'a>(
        &self,
        a: &'a mut GpuAct<E::Buf>,
        d: usize,
    ) -> Result<&'a mut E::Buf, GpuError> {
        if a.device != d || a.buf.is_none() {
            a.buf = None;
            a.buf = Some(self.devices[d].alloc(a.len * 4)?);
            a.device = d;
        }
        a.buf.as_mut().ok_or_else(lost)
    }

    /// Makes `b` (on device `d`, at least `a.len` values) the buffer of `a`.
    pub fn replace(&self, a: &mut GpuAct<E::Buf>, d: usize, b: E::Buf) {
        a.buf = Some(b);
        a.device = d;
    }

    /// Values the buffer of `a` has room for (at least its length; 0 without a buffer).
    pub fn capacity(&self, a: &GpuAct<E::Buf>) -> usize {
        a.buf
            .as_ref()
            .map_or(0, |b| self.devices[a.device].len(b) / 4)
    }

    /// Appends the values of `tail` to `a` on `a`'s device (see
    /// [`crate::backend::Backend::act_append`]): in place when the capacity allows, else into a
    /// new buffer of twice the capacity (at least the new length and [`MIN_CAPACITY`]) after a
    /// device copy of the old values. `a.len` is the new length even on failure (the caller
    /// then fills it with NaN).
    pub fn append(&self, a: &mut GpuAct<E::Buf>, tail: &GpuAct<E::Buf>) -> Result<(), GpuError> {
        let (old, need) = (a.len, a.len + tail.len);
        a.len = need;
        if tail.len == 0 {
            return Ok(());
        }
        let d = a.device;
        let e = &self.devices[d];
        let t = self.on(tail, d)?;
        let cap = self.capacity(a);
        if cap < need {
            let grown = e.alloc(need.max(2 * cap).max(MIN_CAPACITY) * 4)?;
            if old > 0 {
                let b = a.buf.as_ref().ok_or_else(lost)?;
                copy_values(e, (b, 0), (&grown, 0), old)?;
            }
            a.buf = Some(grown);
        }
        let b = a.buf.as_ref().ok_or_else(lost)?;
        copy_values(e, (&t, 0), (b, old), tail.len)
    }

    /// Drops the first `n` values of `a` (see [`crate::backend::Backend::act_drop_front`]): the
    /// rest moves to the front in place when the two ranges are disjoint (`n >= len - n`), else
    /// into a new buffer of the same capacity (an overlapping copy would race). A rest that
    /// fills at most a quarter of a buffer larger than [`MIN_CAPACITY`] moves into a new buffer
    /// of twice its length (at least [`MIN_CAPACITY`]) instead, so a cache that held a chunk for
    /// a moment (a compressor's buffered tokens, the window rows) does not keep the chunk's
    /// memory between chunks. Panics when `n > len`.
    pub fn drop_front(&self, a: &mut GpuAct<E::Buf>, n: usize) -> Result<(), GpuError> {
        assert!(
            n <= a.len,
            "act_drop_front: {n} values of an activation of {}",
            a.len
        );
        let rest = a.len - n;
        a.len = rest;
        if n == 0 {
            return Ok(());
        }
        let e = &self.devices[a.device];
        let cap = self.capacity(a);
        let shrink = cap > MIN_CAPACITY && 4 * rest <= cap;
        if rest == 0 && !shrink {
            return Ok(());
        }
        let b = a.buf.as_ref().ok_or_else(lost)?;
        if n >= rest && !shrink {
            return copy_values(e, (b, n), (b, 0), rest);
        }
        let new_cap = if shrink {
            (2 * rest).max(MIN_CAPACITY)
        } else {
            cap
        };
        let moved = e.alloc(new_cap * 4)?;
        if rest > 0 {
            copy_values(e, (b, n), (&moved, 0), rest)?;
        }
        a.buf = Some(moved);
        Ok(())
    }

    /// Fills an activation with NaN, best effort: in place when it has a buffer, else a new
    /// upload; when that fails too the buffer is dropped (later reads give NaN anyway).
    fn poison(&self, a: &mut GpuAct<E::Buf>) {
        if a.len == 0 {
            return;
        }
        let nan = vec![f32::NAN; a.len];
        let e = &self.devices[a.device];
        let written = match a.buf.as_mut() {
            Some(b) => e.write(b, 0, bytemuck_lite::bytes_of(&nan)).is_ok(),
            None => false,
        };
        if !written {
            a.buf = upload(e, &nan).ok();
        }
    }

    /// Settles an op on activations: on failure records it and fills `outputs` with NaN.
    pub(crate) fn settle_acts(
        &self,
        what: &str,
        r: Result<(), GpuError>,
        outputs: &mut [&mut GpuAct<E::Buf>],
    ) {
        if let Err(e) = r {
            self.fail(what, e);
            for o in outputs.iter_mut() {
                self.poison(o);
            }
        }
    }
}
