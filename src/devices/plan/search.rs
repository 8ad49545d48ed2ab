//! Exact layout search (a part of the memory plan): the contiguous layout over an
//! order-preserving subset of the devices that leaves the tightest device the most room, or
//! none when no such layout fits.
//!
//! A layout gives each device it uses a non-empty range of consecutive layers, in device order;
//! the first used device is also charged the embedding, the last one the head and the logits
//! (its workspace is the last device's, [`workspace_bytes`]); the devices left out are idle and
//! charged nothing. A device's share is its load over its free memory; a layout fits when no
//! share is above 1. Two dynamic programs over (last used device, layers placed), each
//! O(devices x layers^2):
//! 1. the smallest largest share over all layouts, compared exactly (integer cross products):
//!    above 1 means that no layout fits, so the placement never refuses one that does;
//! 2. among the layouts with every share within that bound, the smallest sum of load^2 / free
//!    (its continuous optimum gives every device the same share), so the devices off the
//!    bottleneck are evened out too (exact ties keep the earlier device).

use std::cmp::Ordering;

use super::{fixed_bytes, layer_loads, AsPlanModel};
use crate::devices::plan::Footprint;

/// A layout found by [`search`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The devices that run layers, in order (indices into the capacities searched).
    pub used: Vec<usize>,
    /// Decoder layer -> position in `used` (ascending: contiguous ranges).
    pub assign: Vec<usize>,
}

/// The layout of `footprint` over devices with free memory `caps` for `context` tokens in
/// prefill chunks of `chunk` (see the module docs); `None` when none fits or there is no layer.
pub fn search(
    cfg: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    caps: &[u64],
    context: usize,
    chunk: usize,
) -> Option<Layout> {
    let m = cfg.plan_model();
    let m = m.as_ref();
    let items = layer_loads(m, footprint, context, chunk);
    let fixed = |first, last| fixed_bytes(m, footprint, context, chunk, first, last);
    let fixed = [
        [fixed(false, false), fixed(false, true)],
        [fixed(true, false), fixed(true, true)],
    ];
    best_layout(&items, fixed, caps)
}

/// [`search`] over plain figures: `items[l]` is layer `l`'s load and `fixed[first][last]` what a
/// device is charged besides its layers when it is the first and / or last used one.
pub(super) fn best_layout(items: &[u64], fixed: [[u64; 2]; 2], caps: &[u64]) -> Option<Layout> {
    let (n, layers) = (caps.len(), items.len());
    if n == 0 || layers == 0 {
        return None;
    }
    let mut prefix = vec![0u128; layers + 1];
    for (l, &it) in items.iter().enumerate() {
        prefix[l + 1] = prefix[l] + u128::from(it);
    }
    // Device d holding layers a..b (b exclusive), as the first used one when a == 0 and the
    // last when b == layers.
    let share = |d: usize, a: usize, b: usize| {
        let held = u64::try_from(prefix[b] - prefix[a]).unwrap_or(u64::MAX);
        let load = held.saturating_add(fixed[usize::from(a == 0)][usize::from(b == layers)]);
        Share::new(load, caps[d])
    };

    // 1. before[a]: the smallest largest share of layers ..a on the devices before d.
    let mut before: Vec<Option<Share>> = vec![None; layers + 1];
    for d in 0..n {
        let ending: Vec<Option<Share>> = (0..=layers)
            .map(|b| {
                (0..b)
                    .filter_map(|a| {
                        let prev = if a == 0 { Some(Share::ZERO) } else { before[a] };
                        prev.map(|p| p.max(share(d, a, b)))
                    })
                    .min()
            })
            .collect();
        for (slot, s) in before.iter_mut().zip(ending) {
            *slot = match (*slot, s) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
    }
    let bound = before[layers]?;
    if bound > Share::ONE {
        return None;
    }

    // 2. ends[d][b]: the smallest sum of load^2 / free of layers ..b with device d the last
    // used one and no share above `bound`, with where device d's range starts and the device
    // before it; best[a]: the smallest such sum over the devices so far, and its device.
    let mut ends: Vec<Vec<Option<Step>>> = vec![vec![None; layers + 1]; n];
    let mut best: Vec<Option<(f64, usize)>> = vec![None; layers + 1];
    for (d, row) in ends.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            for (a, &up_to_a) in best.iter().enumerate().take(b) {
                let s = share(d, a, b);
                let (base, prev) = match (a, up_to_a) {
                    _ if s > bound => continue,
                    (0, _) => (0.0, None),
                    (_, Some((c, p))) => (c, Some(p)),
                    (_, None) => continue,
                };
                let cost = base + s.weight();
                if cell.is_none_or(|(c, ..)| cost < c) {
                    *cell = Some((cost, a, prev));
                }
            }
        }
        for (slot, cell) in best.iter_mut().zip(row.iter()) {
            if let Some((c, ..)) = *cell {
                if slot.is_none_or(|(x, _)| c < x) {
                    *slot = Some((c, d));
                }
            }
        }
    }

    let (_, mut d) = best[layers]?;
    let (mut b, mut ranges) = (layers, Vec::new());
    loop {
        let (_, a, prev) = ends[d][b].expect("a recorded step leads to a recorded cell");
        ranges.push((d, a, b));
        match prev {
            Some(p) => (d, b) = (p, a),
            None => break,
        }
    }
    ranges.reverse();
    let mut assign = vec![0; layers];
    for (k, &(_, a, b)) in ranges.iter().enumerate() {
        assign[a..b].fill(k);
    }
    Some(Layout {
        used: ranges.iter().map(|&(d, ..)| d).collect(),
        assign,
    })
}

/// A cell of the second program: the sum of load^2 / free so far, where the range of its
/// device starts, and the used device before it.
type Step = (f64, usize, Option<usize>);

/// `load / cap`, compared exactly; a load on a device of no memory is an infinite share.
#[derive(Clone, Copy, Debug)]
struct Share {
    load: u64,
    cap: u64,
}

impl Share {
    const ZERO: Share = Share { load: 0, cap: 1 };
    const ONE: Share = Share { load: 1, cap: 1 };

    fn new(load: u64, cap: u64) -> Self {
        match (load, cap) {
            (0, _) => Share::ZERO,
            (_, 0) => Share { load: 1, cap: 0 },
            _ => Share { load, cap },
        }
    }

    /// `load^2 / cap`, the term of the evening-out sum (finite: only shares within 1 get here).
    fn weight(self) -> f64 {
        (self.load as f64) * (self.load as f64) / (self.cap as f64)
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.cap, other.cap) {
            (0, 0) => Ordering::Equal,
            (0, _) => Ordering::Greater,
            (_, 0) => Ordering::Less,
            _ => (u128::from(self.load) * u128::from(other.cap))
                .cmp(&(u128::from(other.load) * u128::from(self.cap))),
        }
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Share {}
