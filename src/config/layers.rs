//! The layer-role table ([`LayerRoles`]): what each main layer of a config does, computed once
//! from its `compress_ratios`, and the token-to-row mapping of compressed KV ([`RowMapping`]).
//! Everything that asks "does this layer have an indexer", "does it have compressed rows",
//! "which rows does a needle cover" asks this table instead of comparing ratios
//! (docs/architecture.md section 4, "Layer roles").
//!
//! One [`LayerRole`] per main layer, in layer order:
//! - `kind` and `ratio`: the attention type and its compress ratio (0 SWA, 4 CSA, 128 HCA);
//! - `kv_source`: the layer whose compressed KV it attends to (`None`: window only);
//! - `index_source`: the layer whose indexer selection picks its compressed rows (`None`: every
//!   visible row, or none);
//! - `candidate_stage`: its part in a candidate stage ([`CandidateStage::None`] on V4).
//!
//! On DeepSeek-V4 every layer with a ratio above 0 is its own `kv_source` (it owns a
//! compressor) and every ratio-4 layer is its own `index_source` (it owns a lightning indexer);
//! SWA and HCA layers have no `index_source`. The sources are layer indices rather than flags
//! so that a family whose layers reuse another layer's KV or selection, or take part in a
//! candidate stage (DeepSeek-V4.1), fills the same fields without changing their readers.
//!
//! Row mapping (docs/architecture.md section 4, docs/spec/attention.md 5.4 / 6.5 / 10): a
//! compressor of ratio r emits row w when token `rw + r - 1` arrives; query t sees row w iff
//! `w < floor((t+1)/r)`. Non-overlapping, row w pools `[rw, rw + r - 1]`; overlapping (CSA),
//! it also pools the previous window, `[rw - r, rw + r - 1]` clipped at 0, so the rows touching
//! a span `[a, b)` are `w in [floor(a/r), floor((b-1)/r) + 1]` instead of
//! `[floor(a/r), floor((b-1)/r)]`. Spans are half-open token ranges `(a, b)`; rows come back as
//! half-open `Range<usize>`, empty for an empty span.
//!
//! The table is not stored in `ModelConfig` (whose JSON `synth` writes and the config hash
//! covers): [`super::ModelConfig::layer_roles`] builds it from the validated ratios, one entry
//! per layer.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The attention type of one layer, from its compress ratio. `Swa`, `Csa` and `Hca` are
/// DeepSeek-V4's ([`LayerKind::from_ratio`]); `Csa2` and `Csa1` are DeepSeek-V4.1's shared
/// compressed attention ([`LayerKind::from_v41_ratio`], docs/spec/v41.md 3), whose layers read
/// the compressed cache of their KV source rather than owning one each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LayerKind {
    /// ratio 0: sliding window only.
    Swa,
    /// ratio 4: overlapping compressor + lightning indexer.
    Csa,
    /// ratio 128: non-overlapping compressor, every row visible.
    Hca,
    /// DeepSeek-V4.1, ratio 2: reads a non-overlapping ratio-2 compressed cache (rows of 2
    /// tokens, gated pooling) owned by its KV source, rows picked by its index source's top-k.
    Csa2,
    /// DeepSeek-V4.1, ratio 1: reads a per-token compressed cache (one row per token, an
    /// ungated projection) owned by its KV source, rows picked by its index source's top-k.
    Csa1,
}

impl LayerKind {
    pub fn from_ratio(ratio: usize) -> Option<Self> {
        match ratio {
            0 => Some(LayerKind::Swa),
            4 => Some(LayerKind::Csa),
            128 => Some(LayerKind::Hca),
            _ => None,
        }
    }
    /// A DeepSeek-V4.1 layer's kind from its ratio: 0 SWA, 2 `Csa2`, 1 `Csa1`; `None` for
    /// anything else.
    pub fn from_v41_ratio(ratio: usize) -> Option<Self> {
        match ratio {
            0 => Some(LayerKind::Swa),
            2 => Some(LayerKind::Csa2),
            1 => Some(LayerKind::Csa1),
            _ => None,
        }
    }
    pub fn ratio(self) -> usize {
        match self {
            LayerKind::Swa => 0,
            LayerKind::Csa => 4,
            LayerKind::Hca => 128,
            LayerKind::Csa2 => 2,
            LayerKind::Csa1 => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Swa => "swa",
            LayerKind::Csa => "csa",
            LayerKind::Hca => "hca",
            LayerKind::Csa2 => "csa2",
            LayerKind::Csa1 => "csa1",
        }
    }
    /// The row mapping of this kind's compressed KV: CSA overlapping at ratio 4, HCA
    /// non-overlapping at ratio 128, V4.1's `Csa2` / `Csa1` non-overlapping at ratio 2 / 1;
    /// `None` for SWA (no compressed rows).
    pub fn rows(self) -> Option<RowMapping> {
        match self {
            LayerKind::Swa => None,
            LayerKind::Csa => Some(RowMapping::CSA),
            LayerKind::Hca => Some(RowMapping::HCA),
            LayerKind::Csa2 => Some(RowMapping::CSA2),
            LayerKind::Csa1 => Some(RowMapping::CSA1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row mapping: which compressed rows pool which tokens, and which rows a query sees.

/// The token-to-row mapping of a compressor of ratio `ratio` (> 0), overlapping or not (module
/// doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowMapping {
    /// Tokens per row step (the compress ratio), at least 1.
    pub ratio: usize,
    /// Whether row w also pools the previous window (`[rw - r, rw + r - 1]`).
    pub overlap: bool,
}

impl RowMapping {
    /// CSA: ratio 4, overlapping (`[4w-4, 4w+3]`).
    pub const CSA: RowMapping = RowMapping {
        ratio: 4,
        overlap: true,
    };
    /// HCA: ratio 128, non-overlapping (`[128w, 128w+127]`).
    pub const HCA: RowMapping = RowMapping {
        ratio: 128,
        overlap: false,
    };
    /// DeepSeek-V4.1 ratio 2, non-overlapping (`[2w, 2w+1]`).
    pub const CSA2: RowMapping = RowMapping {
        ratio: 2,
        overlap: false,
    };
    /// DeepSeek-V4.1 ratio 1, non-overlapping (row w is token w).
    pub const CSA1: RowMapping = RowMapping {
        ratio: 1,
        overlap: false,
    };

    /// Tokens pooled by row `w`, inclusive `(first, last)`.
    pub fn row_tokens(self, w: usize) -> (usize, usize) {
        let r = self.ratio;
        let first = if self.overlap {
            (r * w).saturating_sub(r)
        } else {
            r * w
        };
        (first, r * w + r - 1)
    }

    /// Number of rows visible to query `t`: `floor((t+1)/ratio)` (rows `0..n_t`).
    pub fn visible_rows(self, t: usize) -> usize {
        (t + 1) / self.ratio
    }

    /// The first query position that sees row `w` (the token that completes it).
    pub fn first_visible(self, w: usize) -> usize {
        self.ratio * w + self.ratio - 1
    }

    /// Whether row `w` pools at least one token of `span`.
    pub fn row_touches(self, w: usize, span: (usize, usize)) -> bool {
        let (first, last) = self.row_tokens(w);
        span.0 < span.1 && first < span.1 && last >= span.0
    }

    /// All rows (visible or not) that pool a token of `span`.
    pub fn span_rows(self, span: (usize, usize)) -> Range<usize> {
        let (a, b) = span;
        if b <= a {
            return 0..0;
        }
        let last = (b - 1) / self.ratio + usize::from(self.overlap);
        a / self.ratio..last + 1
    }

    /// Rows pooling a token of `span` that query `t` can see (the needle rows of section 4).
    pub fn rows_covering(self, span: (usize, usize), t: usize) -> Range<usize> {
        let all = self.span_rows(span);
        let n_t = self.visible_rows(t);
        all.start.min(n_t)..all.end.min(n_t)
    }
}

// ---------------------------------------------------------------------------------------------
// The table.

/// A layer's part in a candidate stage (DeepSeek-V4.1's two-level selection,
/// docs/spec/v41.md 3). Every DeepSeek-V4 layer has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CandidateStage {
    /// Takes no part in a candidate stage.
    #[default]
    None,
    /// The candidate source (`candidate_source_layer_id`): its own top-k is unrestricted and
    /// it keeps the top `candidate_topk_blocks` blocks of `candidate_block_size` rows per query.
    Source,
    /// An index source after the candidate source: it picks its top-k only inside the blocks
    /// layer `source` kept.
    Consumer { source: usize },
}

impl CandidateStage {
    /// The name `inspect` prints; `None` (JSON `null`) for no stage.
    pub fn name(self) -> Option<&'static str> {
        match self {
            CandidateStage::None => Option::None,
            CandidateStage::Source => Some("source"),
            CandidateStage::Consumer { .. } => Some("consumer"),
        }
    }
}

/// What one main layer does (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerRole {
    /// The layer's index (0-based, main layers).
    pub layer: usize,
    pub kind: LayerKind,
    /// Its `compress_ratios` entry.
    pub ratio: usize,
    /// The layer whose compressed KV it attends to; `None`: window only.
    pub kv_source: Option<usize>,
    /// The layer whose indexer selection picks its compressed rows; `None`: no selection.
    pub index_source: Option<usize>,
    pub candidate_stage: CandidateStage,
}

impl LayerRole {
    /// The DeepSeek-V4 role of layer `layer` of `kind`: ratio > 0 owns its compressed KV,
    /// ratio 4 also its indexer. Also what an MTP layer of `kind` does.
    pub fn v4(layer: usize, kind: LayerKind) -> Self {
        LayerRole {
            layer,
            kind,
            ratio: kind.ratio(),
            kv_source: (kind != LayerKind::Swa).then_some(layer),
            index_source: (kind == LayerKind::Csa).then_some(layer),
            candidate_stage: CandidateStage::None,
        }
    }

    /// Whether it runs a compressor of its own (holds `attn.compressor.*`).
    pub fn owns_kv(&self) -> bool {
        self.kv_source == Some(self.layer)
    }

    /// Whether it runs a lightning indexer of its own (holds `attn.indexer.*`, and its
    /// selection is what the probe ranks).
    pub fn has_indexer(&self) -> bool {
        self.index_source == Some(self.layer)
    }

    /// Whether its compressed rows are picked by an indexer selection (its own or another's)
    /// rather than all taken.
    pub fn uses_selection(&self) -> bool {
        self.index_source.is_some()
    }

    /// The row mapping of the compressed KV it attends to; `None` without compressed KV.
    pub fn rows(&self) -> Option<RowMapping> {
        self.kv_source.and(self.kind.rows())
    }
}

/// Every main layer's [`LayerRole`], in layer order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRoles {
    roles: Vec<LayerRole>,
}

impl LayerRoles {
    /// The DeepSeek-V4 table of a layer schedule ([`LayerRole::v4`] per layer).
    pub fn v4(kinds: impl IntoIterator<Item = LayerKind>) -> Self {
        LayerRoles {
            roles: kinds
                .into_iter()
                .enumerate()
                .map(|(l, kind)| LayerRole::v4(l, kind))
                .collect(),
        }
    }

    /// The DeepSeek-V4.1 table (docs/spec/v41.md 2.5 and 3) of validated `ratios` (one per main
    /// layer: 0, 2 or 1), KV sources, index sources (both ascending) and candidate source: a
    /// layer with ratio > 0 reads the compressed KV of the latest KV source at or below it and
    /// the selection of the latest index source at or below it (`None` before the first); a
    /// ratio-0 layer neither. The candidate source is `Source`; every index source after it is
    /// `Consumer { source }` (the release's 24, 28, 32, 36 behind 20).
    pub fn v41(
        ratios: &[usize],
        kv_sources: &[usize],
        index_sources: &[usize],
        candidate_source: Option<usize>,
    ) -> Self {
        let latest = |sources: &[usize], l: usize| sources.iter().rev().find(|&&s| s <= l).copied();
        let roles = ratios
            .iter()
            .enumerate()
            .map(|(l, &ratio)| {
                let kind = LayerKind::from_v41_ratio(ratio).expect("validated V4.1 ratio");
                let compressed = ratio > 0;
                let candidate_stage = match candidate_source {
                    Some(c) if c == l => CandidateStage::Source,
                    Some(c) if l > c && index_sources.contains(&l) => {
                        CandidateStage::Consumer { source: c }
                    }
                    _ => CandidateStage::None,
                };
                LayerRole {
                    layer: l,
                    kind,
                    ratio,
                    kv_source: compressed.then(|| latest(kv_sources, l)).flatten(),
                    index_source: compressed.then(|| latest(index_sources, l)).flatten(),
                    candidate_stage,
                }
            })
            .collect();
        LayerRoles { roles }
    }

    /// Number of main layers.
    pub fn len(&self) -> usize {
        self.roles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, LayerRole> {
        self.roles.iter()
    }

    /// Layer `layer`'s role (panics past the last layer).
    pub fn get(&self, layer: usize) -> &LayerRole {
        &self.roles[layer]
    }

    pub fn kind(&self, layer: usize) -> LayerKind {
        self.roles[layer].kind
    }

    /// Whether layer `layer` runs its own lightning indexer.
    pub fn has_indexer(&self, layer: usize) -> bool {
        self.roles[layer].has_indexer()
    }

    /// Whether layer `layer` runs its own compressor.
    pub fn owns_kv(&self, layer: usize) -> bool {
        self.roles[layer].owns_kv()
    }

    /// The row mapping of layer `layer`'s compressed KV, `None` without.
    pub fn rows(&self, layer: usize) -> Option<RowMapping> {
        self.roles[layer].rows()
    }

    /// The layers that run their own indexer, ascending (on V4 the CSA layers): the ones whose
    /// selection the probe ranks and a serving engine reports.
    pub fn indexed_layers(&self) -> Vec<usize> {
        self.layers_where(LayerRole::has_indexer)
    }

    /// The layers of `kind`, ascending.
    pub fn layers_of_kind(&self, kind: LayerKind) -> Vec<usize> {
        self.layers_where(|r| r.kind == kind)
    }

    fn layers_where(&self, keep: impl Fn(&LayerRole) -> bool) -> Vec<usize> {
        self.roles
            .iter()
            .filter(|r| keep(r))
            .map(|r| r.layer)
            .collect()
    }
}

impl std::ops::Index<usize> for LayerRoles {
    type Output = LayerRole;
    fn index(&self, layer: usize) -> &LayerRole {
        &self.roles[layer]
    }
}

impl<'a> IntoIterator for &'a LayerRoles {
    type Item = &'a LayerRole;
    type IntoIter = std::slice::Iter<'a, LayerRole>;
    fn into_iter(self) -> Self::IntoIter {
        self.roles.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    const fn map(ratio: usize, overlap: bool) -> RowMapping {
        RowMapping { ratio, overlap }
    }

    #[test]
    fn csa_mapping_is_ratio_4_overlapping_and_hca_ratio_128_not() {
        assert_eq!(LayerKind::Csa.rows(), Some(map(4, true)));
        assert_eq!(LayerKind::Hca.rows(), Some(map(128, false)));
        assert_eq!(LayerKind::Swa.rows(), None);
    }

    #[test]
    fn row_tokens_follow_ratio_and_overlap() {
        // Ratio 4 overlapping: [4w-4, 4w+3], clipped at 0.
        let csa = map(4, true);
        assert_eq!(csa.row_tokens(0), (0, 3));
        assert_eq!(csa.row_tokens(1), (0, 7));
        assert_eq!(csa.row_tokens(250), (996, 1003));
        // Ratio 128 non-overlapping: [128w, 128w+127].
        let hca = map(128, false);
        assert_eq!(hca.row_tokens(0), (0, 127));
        assert_eq!(hca.row_tokens(7), (896, 1023));
        // Ratios 1 and 2 non-overlapping: [rw, rw+r-1].
        assert_eq!(map(1, false).row_tokens(5), (5, 5));
        assert_eq!(map(2, false).row_tokens(5), (10, 11));
        assert_eq!(map(2, false).row_tokens(0), (0, 1));
    }

    #[test]
    fn a_row_is_visible_from_the_token_that_completes_it() {
        for m in [map(1, false), map(2, false), map(4, true), map(128, false)] {
            for t in 0..600 {
                assert_eq!(m.visible_rows(t), (t + 1) / m.ratio, "{m:?} t = {t}");
            }
            for w in 0..20 {
                let from = m.first_visible(w);
                assert_eq!(from, m.row_tokens(w).1, "{m:?} row {w}: its last token");
                assert!(m.visible_rows(from) > w, "{m:?} row {w} at {from}");
                assert!(from == 0 || m.visible_rows(from - 1) <= w, "{m:?} row {w}");
            }
        }
        assert_eq!(map(1, false).visible_rows(0), 1);
        assert_eq!(map(2, false).visible_rows(0), 0);
        assert_eq!(map(2, false).visible_rows(1), 1);
        assert_eq!(map(4, true).visible_rows(1002), 250);
        assert_eq!(map(128, false).visible_rows(1022), 7);
        assert_eq!(map(128, false).visible_rows(1023), 8);
    }

    #[test]
    fn rows_covering_a_span_follow_the_formulas() {
        // Overlapping ratio r: [floor(a/r), floor((b-1)/r) + 1]; non-overlapping:
        // [floor(a/r), floor((b-1)/r)]; clipped to the visible rows.
        let late = 1 << 20;
        assert_eq!(map(4, true).rows_covering((1000, 1012), late), 250..254);
        assert_eq!(map(128, false).rows_covering((1000, 1012), late), 7..8);
        assert_eq!(map(1, false).rows_covering((10, 13), late), 10..13);
        assert_eq!(map(2, false).rows_covering((10, 13), late), 5..7);
        assert_eq!(map(2, false).rows_covering((11, 12), late), 5..6);
        // Clipped: at t = 1003 only row 250 of the CSA rows is complete.
        assert_eq!(map(4, true).rows_covering((1000, 1012), 1003), 250..251);
        assert_eq!(map(2, false).rows_covering((10, 13), 11), 5..6);
        assert_eq!(map(1, false).rows_covering((10, 13), 10), 10..11);
        for m in [map(1, false), map(2, false), map(4, true), map(128, false)] {
            assert_eq!(m.rows_covering((10, 10), late), 0..0, "{m:?} empty span");
        }
    }

    #[test]
    fn span_rows_are_exactly_the_rows_that_touch_the_span_at_every_ratio() {
        for m in [
            map(1, false),
            map(2, false),
            map(4, true),
            map(128, false),
            map(1, true),
            map(2, true),
        ] {
            for a in 0..300 {
                for b in [a, a + 1, a + 2, a + 5, a + 130] {
                    let r = m.span_rows((a, b));
                    for w in 0..12 {
                        assert_eq!(
                            r.contains(&w),
                            m.row_touches(w, (a, b)),
                            "{m:?} span [{a},{b}) row {w}"
                        );
                    }
                }
            }
        }
    }

    /// Every CSA layer is its own KV and index source, every HCA layer its own KV source
    /// only, every SWA layer neither; no layer is in a candidate stage.
    fn assert_v4_roles(cfg: &ModelConfig) {
        let roles = cfg.layer_roles();
        assert_eq!(roles.len(), cfg.num_hidden_layers);
        for (l, role) in roles.iter().enumerate() {
            assert_eq!(role.layer, l);
            assert_eq!(role.ratio, cfg.compress_ratios[l], "layer {l}");
            assert_eq!(role.kind, cfg.layer_kind(l), "layer {l}");
            assert_eq!(role.candidate_stage, CandidateStage::None, "layer {l}");
            let (kv, index) = match role.kind {
                LayerKind::Csa => (Some(l), Some(l)),
                LayerKind::Hca => (Some(l), None),
                LayerKind::Swa => (None, None),
                LayerKind::Csa2 | LayerKind::Csa1 => unreachable!("a V4 config"),
            };
            assert_eq!(
                (role.kv_source, role.index_source),
                (kv, index),
                "layer {l}"
            );
            assert_eq!(
                roles.has_indexer(l),
                role.kind == LayerKind::Csa,
                "layer {l}"
            );
            assert_eq!(roles.owns_kv(l), role.ratio > 0, "layer {l}");
            assert_eq!(roles.rows(l), role.kind.rows(), "layer {l}");
        }
        assert_eq!(roles.indexed_layers(), roles.layers_of_kind(LayerKind::Csa));
    }

    #[test]
    fn flash_roles_csa_own_kv_and_index_hca_own_kv_swa_none() {
        let cfg = ModelConfig::flash();
        assert_v4_roles(&cfg);
        let roles = cfg.layer_roles();
        assert_eq!(roles.len(), 43);
        assert_eq!(roles.layers_of_kind(LayerKind::Swa), vec![0, 1]);
        let csa: Vec<usize> = (2..=42).step_by(2).collect();
        assert_eq!(roles.indexed_layers(), csa);
        assert_eq!(
            roles[3],
            LayerRole {
                layer: 3,
                kind: LayerKind::Hca,
                ratio: 128,
                kv_source: Some(3),
                index_source: None,
                candidate_stage: CandidateStage::None,
            }
        );
        assert_eq!(roles.rows(2), Some(RowMapping::CSA));
        assert_eq!(roles.rows(3), Some(RowMapping::HCA));
        assert_eq!(roles.rows(0), None);
    }

    #[test]
    fn tiny_roles_csa_own_kv_and_index_hca_own_kv_swa_none() {
        let cfg = ModelConfig::tiny();
        assert_v4_roles(&cfg);
        let roles = cfg.layer_roles();
        let got: Vec<(Option<usize>, Option<usize>)> = roles
            .iter()
            .map(|r| (r.kv_source, r.index_source))
            .collect();
        assert_eq!(
            got,
            vec![
                (None, None),
                (Some(1), Some(1)),
                (Some(2), None),
                (Some(3), Some(3))
            ]
        );
        assert_eq!(roles.indexed_layers(), vec![1, 3]);
        // The MTP layer (ratio 0 in tiny's fifth entry) is not a main layer.
        assert_eq!(cfg.mtp_layer_role(0), LayerRole::v4(4, LayerKind::Swa));
    }
}
