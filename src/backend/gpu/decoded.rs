//! Decoded copies of stored weights kept on the device, so that a weight used by every chunk of a
//! prefill (and by every prompt of a sweep) is dequantised once instead of once per product.
//!
//! A product with a [`GpuMatrix`] reads, in this order of preference:
//! 1. the stored bytes themselves when they already are the GEMM's element type (bf16 weights
//!    with [`GemmType::Bf16`], f32 ones with [`GemmType::F32`]): no copy, no decode;
//! 2. the weight's decoded copy `[rows, cols]` in the GEMM type, made on its first product when
//!    the device's [`DecodeBudget`] has room (the dequantisation is the banded path's, so the
//!    copy holds the same values bit for bit);
//! 3. otherwise the banded path of [`super::matrix::gemm_weight`] (decode a band into a
//!    workspace, one GEMM per band), as before.
//!
//! The budget of a device is what the memory plan leaves free there once weights, sequence state
//! for the run's context and workspace are counted, less a margin ([`headroom_budget`]), so the
//! plan's promise (no out-of-memory midway) holds with copies as without. A copy that does not
//! fit the budget, or whose allocation fails anyway, is simply not made: the weight keeps the
//! banded path. Copies are made first come, first served, and freed with their weight. A copy is
//! charged what its allocation takes on the device ([`Executor::footprint`]: its buffer pool's size
//! class), not its values' bytes, so the budget bounds the device memory the copies really hold.

use super::executor::{Executor, GemmType, GpuError};
use super::matrix::{dequant_rows, GpuMatrix};
use crate::checkpoint::linear::LinearForm;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Environment variable capping the decoded copies per device, in MiB (0 turns them off).
pub const DECODE_CACHE_ENV: &str = "NEEDLESCOPE_DECODE_CACHE_MIB";

/// Bytes of one device's memory that decoded copies may take.
#[derive(Debug)]
pub struct DecodeBudget {
    limit: usize,
    used: AtomicUsize,
    copies: AtomicUsize,
}

impl DecodeBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(DecodeBudget {
            limit,
            used: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
        })
    }

    /// Takes `bytes` from the budget; false (and nothing taken) when they do not fit.
    fn reserve(&self, bytes: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.limit)
            })
            .is_ok();
        if taken {
            self.copies.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.copies.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held by decoded copies now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Decoded copies held now.
    pub fn copies(&self) -> usize {
        self.copies.load(Ordering::Relaxed)
    }
}

/// The budget for decoded copies on a device the memory plan leaves `plan_free` bytes free on
/// (capacity `capacity`): that less a margin of max(2 GiB, 5% of the capacity) for what the plan
/// does not itemise (CUDA context, cuBLAS and NVRTC modules, allocation granularity), capped by
/// `env_mib` ([`DECODE_CACHE_ENV`]) when given. An `env_mib` that is not a number is an error
/// naming the variable.
pub fn headroom_budget(
    plan_free: i64,
    capacity: u64,
    env_mib: Option<&str>,
) -> Result<usize, String> {
    let margin = (2u64 << 30).max(capacity / 20);
    let headroom = (plan_free.max(0) as u64).saturating_sub(margin) as usize;
    match env_mib {
        None => Ok(headroom),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(|mib| headroom.min(mib.saturating_mul(1 << 20)))
            .map_err(|_| {
                format!("{DECODE_CACHE_ENV}: expected a whole number of MiB, found {v:?}")
            }),
    }
}

/// A decoded copy of a whole weight in one GEMM type.
struct DecodedCopy<B> {
    ty: GemmType,
    buf: B,
    bytes: usize,
}

/// A weight's decoded copy, made on first use when its device's budget allows.
pub struct DecodeSlot<B> {
    budget: Option<Arc<DecodeBudget>>,
    /// Set on the first product: `None` when no copy could be made (the banded path is used).
    copy: OnceLock<Option<DecodedCopy<B>>>,
}

impl<B> Default for DecodeSlot<B> {
    fn default() -> Self {
        DecodeSlot {
            budget: None,
            copy: OnceLock::new(),
        }
    }
}

impl<B> DecodeSlot<B> {
    /// A slot that may make a copy within `budget` (none: never).
    pub fn new(budget: Option<Arc<DecodeBudget>>) -> Self {
        DecodeSlot {
            budget,
            copy: OnceLock::new(),
        }
    }

    /// Whether the weight's decoded copy exists.
    pub fn is_resident(&self) -> bool {
        matches!(self.copy.get(), Some(Some(_)))
    }
}

impl<B> Drop for DecodeSlot<B> {
    fn drop(&mut self) {
        if let (Some(budget), Some(Some(copy))) = (&self.budget, self.copy.get()) {
            budget.release(copy.bytes);
        }
    }
}

/// The operand a GEMM of type `ty` can read all of `w` from without decoding it again: its
/// stored bytes when they are of type `ty`, else its decoded copy (made now if this is the first
/// product and the budget allows). `None`: decode band by band.
pub fn resident_operand<'a, E: Executor>(
    e: &E,
    w: &'a GpuMatrix<E::Buf>,
    ty: GemmType,
) -> Result<Option<&'a E::Buf>, GpuError> {
    let stored_as_gemm_type = matches!(
        (w.form, ty),
        (LinearForm::Bf16, GemmType::Bf16) | (LinearForm::F32, GemmType::F32)
    );
    if stored_as_gemm_type {
        return w.data.as_ref().map(Some).ok_or_else(|| {
            GpuError::Other("weight was not uploaded (see the first error)".into())
        });
    }
    let Some(budget) = &w.decode.budget else {
        return Ok(None);
    };
    let copy = w.decode.copy.get_or_init(|| {
        let values_bytes = w.rows * w.cols * ty.bytes();
        // Charged at what the allocation takes on the device (its pool size class).
        let bytes = e.footprint(values_bytes);
        if values_bytes == 0 || !budget.reserve(bytes) {
            return None;
        }
        let made = e.alloc_uninit(values_bytes).and_then(|buf| {
            dequant_rows(e, w, None, 0, w.rows, &buf, ty)?;
            Ok(buf)
        });
        match made {
            Ok(buf) => Some(DecodedCopy { ty, buf, bytes }),
            Err(_) => {
                budget.release(bytes);
                None
            }
        }
    });
    Ok(copy.as_ref().filter(|c| c.ty == ty).map(|c| &c.buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_takes_what_fits_and_gives_back() {
        let b = DecodeBudget::new(100);
        assert!(b.reserve(60));
        assert!(!b.reserve(50), "over the limit: nothing taken");
        assert_eq!((b.used(), b.copies()), (60, 1));
        assert!(b.reserve(40));
        b.release(60);
        assert_eq!((b.used(), b.copies()), (40, 1));
    }

    #[test]
    fn headroom_keeps_a_margin_and_obeys_the_cap() {
        let gib = 1i64 << 30;
        // 80 GiB device, 30 GiB left by the plan: margin 4 GiB (5%).
        let cap = 80u64 << 30;
        assert_eq!(headroom_budget(30 * gib, cap, None).unwrap(), 26 << 30);
        // Small device: the 2 GiB floor.
        assert_eq!(headroom_budget(3 * gib, 8 << 30, None).unwrap(), 1 << 30);
        assert_eq!(headroom_budget(gib, 8 << 30, None).unwrap(), 0);
        assert_eq!(headroom_budget(-gib, 8 << 30, None).unwrap(), 0);
        assert_eq!(
            headroom_budget(30 * gib, cap, Some("1024")).unwrap(),
            1 << 30
        );
        assert_eq!(headroom_budget(30 * gib, cap, Some(" 0 ")).unwrap(), 0);
        assert_eq!(
            headroom_budget(30 * gib, cap, Some("999999")).unwrap(),
            26 << 30,
            "the cap never exceeds the plan's headroom"
        );
        let err = headroom_budget(30 * gib, cap, Some("lots")).unwrap_err();
        assert!(
            err.contains(DECODE_CACHE_ENV) && err.contains("lots"),
            "{err}"
        );
    }
}
