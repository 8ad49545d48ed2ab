//! The diff of a checkpoint against the inventory its config implies (what `inspect` shows).
//!
//! [`audit`] compares against the checkpoint's own format ([`options_for`] also settles the one
//! NVFP4 unknown: whether the MTP experts were re-quantised too). Shapes `[]` and `[1]` count as
//! equal (NVFP4 scalars are written either way); everything else must match exactly.

use super::dtype::{numel, Dtype, WeightFormat};
use super::inventory::{expected_inventory_with, ExpectedTensor, InventoryOptions};
use super::reader::Checkpoint;

/// The inventory options that match what `ckpt` holds (its format, and for NVFP4 whether the
/// MTP experts were re-quantised too).
pub fn options_for(ckpt: &Checkpoint) -> InventoryOptions {
    let format = ckpt.format();
    let mtp_experts_nvfp4 = format == WeightFormat::Nvfp4
        && ckpt.names().any(|n| {
            n.starts_with("mtp.") && n.contains(".experts.") && n.ends_with(".weight_scale_2")
        });
    InventoryOptions {
        format,
        mtp_experts_nvfp4,
    }
}

/// A stored tensor whose dtype or shape differs from the expected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub expected: ExpectedTensor,
    pub found_dtype: Dtype,
    pub found_shape: Vec<usize>,
}

/// The difference between a checkpoint and an expected inventory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InventoryDiff {
    /// Expected, not in the checkpoint.
    pub missing: Vec<ExpectedTensor>,
    /// In the checkpoint, not expected (with the dtype and shape found).
    pub extra: Vec<ExpectedTensor>,
    pub mismatched: Vec<Mismatch>,
}

impl InventoryDiff {
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.mismatched.is_empty()
    }

    /// A human summary listing at most `limit` entries per category.
    pub fn summary(&self, limit: usize) -> String {
        if self.is_clean() {
            return "inventory matches the config".into();
        }
        let mut s = format!(
            "{} missing, {} extra, {} mismatched",
            self.missing.len(),
            self.extra.len(),
            self.mismatched.len()
        );
        for t in self.missing.iter().take(limit) {
            s += &format!("\n  missing {} ({} {:?})", t.name, t.dtype, t.shape);
        }
        for t in self.extra.iter().take(limit) {
            s += &format!("\n  extra {} ({} {:?})", t.name, t.dtype, t.shape);
        }
        for m in self.mismatched.iter().take(limit) {
            s += &format!(
                "\n  {}: expected {} {:?}, found {} {:?}",
                m.expected.name, m.expected.dtype, m.expected.shape, m.found_dtype, m.found_shape
            );
        }
        s
    }
}

/// `[]` and `[1]` both hold one value (NVFP4 scalars are written either way).
fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a == b || (a.len() <= 1 && b.len() <= 1 && numel(a) == 1 && numel(b) == 1)
}

/// Compares what `ckpt` holds with `expected` (use `expected_inventory_with(cfg,
/// options_for(ckpt))`, or [`audit`], to compare against the checkpoint's own format).
pub fn compare(ckpt: &Checkpoint, expected: &[ExpectedTensor]) -> InventoryDiff {
    let mut diff = InventoryDiff::default();
    let mut seen = std::collections::HashSet::with_capacity(expected.len());
    for e in expected {
        seen.insert(e.name.as_str());
        match ckpt.info(&e.name) {
            None => diff.missing.push(e.clone()),
            Some(t) if t.dtype != e.dtype || !same_shape(&t.shape, &e.shape) => {
                diff.mismatched.push(Mismatch {
                    expected: e.clone(),
                    found_dtype: t.dtype,
                    found_shape: t.shape.clone(),
                })
            }
            Some(_) => {}
        }
    }
    for name in ckpt.names().filter(|n| !seen.contains(n)) {
        let t = ckpt.info(name).expect("listed name");
        diff.extra.push(ExpectedTensor::new(
            name.to_string(),
            t.dtype,
            t.shape.clone(),
        ));
    }
    diff
}

/// Compares `ckpt` with the inventory its own config and format imply.
pub fn audit(ckpt: &Checkpoint) -> InventoryDiff {
    compare(
        ckpt,
        &expected_inventory_with(ckpt.config(), options_for(ckpt)),
    )
}
