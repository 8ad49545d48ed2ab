//! The diff of a checkpoint against the inventory its config implies (what `inspect` shows).
//!
//! [`audit`] compares against the checkpoint's own format ([`Checkpoint::inventory_options`] also settles the one
//! NVFP4 unknown, whether the MTP experts were re-quantised too, and which compressor / indexer
//! linears are stored as FP8). Shapes `[]` and `[1]` count as
//! equal (NVFP4 scalars are written either way); everything else must match exactly.

use super::dtype::{numel, Dtype};
use super::inventory::{expected_inventory_with, ExpectedTensor};
use super::reader::{Checkpoint, CheckpointConfig};

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
/// ckpt.inventory_options())`, or [`audit`], to compare against the checkpoint's own format).
pub fn compare<C: CheckpointConfig>(
    ckpt: &Checkpoint<C>,
    expected: &[ExpectedTensor],
) -> InventoryDiff {
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
pub fn audit<C: CheckpointConfig>(ckpt: &Checkpoint<C>) -> InventoryDiff {
    compare(
        ckpt,
        &ckpt.config().expected_inventory(ckpt.inventory_options()),
    )
}

/// `name` with every all-digit dotted part replaced by `#` (`layers.#.ffn.experts.#.w1.weight`):
/// the kind of tensor, whatever layer or expert it belongs to.
fn name_kind(name: &str) -> String {
    name.split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                "#"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Why `name` (a tensor of a kind the model knows, not expected by `cfg`) has no place in it:
/// the config field most likely wrong.
fn misfit_hint(cfg: &crate::config::ModelConfig, name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    let number = |i: usize| parts.get(i).and_then(|p| p.parse::<usize>().ok());
    let Some(layer) = (parts.first() == Some(&"layers"))
        .then(|| number(1))
        .flatten()
    else {
        return "a tensor of a kind the model uses, not expected at this place".into();
    };
    if layer >= cfg.num_hidden_layers {
        return format!(
            "num_hidden_layers is {}, so layers end at {}",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers.saturating_sub(1)
        );
    }
    let role = *cfg.layer_roles().get(layer);
    let (ratio, kind) = (role.ratio, role.kind.name().to_uppercase());
    if name.contains(".attn.indexer.") || name.contains(".attn.compressor.") {
        return format!(
            "compress_ratios[{layer}] is {ratio} (a {kind} layer), whose attention has no such \
             tensor"
        );
    }
    if let Some(expert) = (parts.get(3) == Some(&"experts"))
        .then(|| number(4))
        .flatten()
    {
        if expert >= cfg.n_routed_experts {
            return format!(
                "n_routed_experts is {}, so experts end at {}",
                cfg.n_routed_experts,
                cfg.n_routed_experts.saturating_sub(1)
            );
        }
    }
    if name.ends_with(".ffn.gate.tid2eid") || name.ends_with(".ffn.gate.bias") {
        return format!(
            "num_hash_layers is {}: layer {layer} is {} routed",
            cfg.num_hash_layers,
            if layer < cfg.num_hash_layers {
                "hash"
            } else {
                "score"
            }
        );
    }
    format!("layer {layer} ({kind}) expects no such tensor")
}

/// Checks, from the headers alone, that the config describes every tensor the model could use:
/// a stored tensor of a kind the model knows (any decoder-layer or top-level tensor of a
/// release, in the checkpoint's format) that the config has no place for means config.json and
/// the weights disagree (a layer, an indexer or an expert the run would silently skip), and is
/// refused, naming the tensor, its file and the config field. Tensors of unknown kinds and the
/// MTP namespace (never run) are ignored; their names are returned for a note.
pub fn check_config_describes(ckpt: &Checkpoint) -> Result<Vec<String>, super::CheckpointError> {
    let diff = audit(ckpt);
    if diff.extra.is_empty() {
        return Ok(Vec::new());
    }
    let opts = ckpt.inventory_options();
    let known: std::collections::HashSet<String> =
        expected_inventory_with(&crate::config::ModelConfig::flash(), opts)
            .iter()
            .chain(&expected_inventory_with(ckpt.config(), opts))
            .map(|t| name_kind(&t.name))
            .collect();
    let (misfits, ignored): (Vec<_>, Vec<_>) = diff
        .extra
        .iter()
        .partition(|t| !t.name.starts_with("mtp.") && known.contains(&name_kind(&t.name)));
    let Some(first) = misfits.first() else {
        return Ok(ignored.into_iter().map(|t| t.name.clone()).collect());
    };
    let file = ckpt
        .info(&first.name)
        .map(|t| t.file.clone())
        .unwrap_or_default();
    Err(super::CheckpointError::UndescribedTensors(Box::new(
        super::Undescribed {
            config: ckpt.dir().join("config.json"),
            file,
            tensor: first.name.clone(),
            dtype: first.dtype,
            shape: first.shape.clone(),
            hint: misfit_hint(ckpt.config(), &first.name),
            others: misfits.len() - 1,
            dir: ckpt.dir().to_path_buf(),
        },
    )))
}
