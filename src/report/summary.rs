//! Summaries of finished cells: per (target length, index profile, kv, top-k) group the recall
//! rate, the median and worst `min_needle_rank`, and the CSA layers lost. Rendered as a plain
//! aligned terminal table ([`render_table`]) and as summary.json ([`SummaryJson`]).
//!
//! Definitions (all from [`CellRecord`] fields, nothing recomputed from layers):
//! - a cell is recalled when `answer_correct` is true, or, when it is empty, when the needle was
//!   selected on every non-trivial CSA layer at the answer position (indexer recall);
//! - the recall rate counts evidence cells only ([`CellRecord::is_evidence`]): a cell judged by
//!   the indexer whose every CSA layer is trivial is left out (it cannot lose the needle), and a
//!   group with no evidence cell has no rate (null, shown as `trivial`);
//! - median / worst rank: median / maximum of the cells' `min_needle_rank` (cells without one
//!   are left out); the median of an even count is the mean of the two middle values;
//! - layers lost per cell = `csa_layers_nontrivial - csa_layers_selected`; the group reports
//!   the worst cell (and its non-trivial count) and the sum over cells;
//! - a trivial cell has no non-trivial CSA layer: shown, never evidence;
//! - layers lost to rounding: of those lost layers, the ones the `exact` profile selects on
//!   the same hidden states ([`crate::record::verdict`]): each cell's `exact_keeps`, which the
//!   store derives from its layers.csv rows ([`ExactKeepsByCell`]); a group has the figure only
//!   when `exact` was scored in every cell.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;

use crate::record::verdict::{ExactKeepsByCell, LayerWord};
use crate::record::{CellRecord, IndexProfile, KvMode, RunInfo};
use crate::units::format_tokens;

/// One group of cells: a target length under one (index, kv, top-k).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupSummary {
    pub target_tokens: usize,
    pub index: IndexProfile,
    pub kv: KvMode,
    pub topk: usize,
    /// Finished cells (depths x samples).
    pub cells: usize,
    /// Cells that count towards the recall rate ([`CellRecord::is_evidence`]).
    pub evidence_cells: usize,
    /// Evidence cells recalled.
    pub recalled: usize,
    /// `recalled / evidence_cells`; None without evidence cells.
    pub recall_rate: Option<f64>,
    /// "answer", "indexer" or "mixed": how the cells were judged.
    pub judged_by: &'static str,
    pub median_rank: Option<f64>,
    pub worst_rank: Option<usize>,
    /// Cells whose every CSA layer was trivial (n_t <= k).
    pub trivial_cells: usize,
    /// Most CSA layers lost in one cell, and that cell's non-trivial CSA layer count.
    pub layers_lost_worst: usize,
    pub layers_nontrivial_of_worst: usize,
    /// CSA layers lost, summed over the cells.
    pub layers_lost_total: usize,
    /// Of those, the layers `exact` selects on the same hidden states (lost to the profile's
    /// rounding; the rest are lost by the exact math too); None unless `exact` was scored in
    /// every cell of the group. The cells' `exact_keeps` summed; summary.json keeps its
    /// published key `layers_lost_to_rounding`.
    #[serde(rename = "layers_lost_to_rounding")]
    pub exact_keeps: Option<usize>,
}

fn profile_order(p: IndexProfile) -> usize {
    IndexProfile::EVERY
        .iter()
        .position(|q| *q == p)
        .unwrap_or(usize::MAX)
}

/// Median of ascending `v` (mean of the two middle values for an even count).
pub fn median(sorted: &[usize]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2] as f64),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) as f64 / 2.0),
    }
}

/// Groups `cells` by (target_tokens, index, kv, topk), ordered by length, then profile in
/// the order of docs/architecture.md section 5, then kv, then top-k; `rounding` gives the cells' rounding losses.
pub fn summarize(cells: &[CellRecord], exact_keeps_by: &ExactKeepsByCell) -> Vec<GroupSummary> {
    let mut groups: BTreeMap<(usize, usize, &str, usize), Vec<&CellRecord>> = BTreeMap::new();
    for c in cells {
        groups
            .entry((c.target_tokens, profile_order(c.index), c.kv.name(), c.topk))
            .or_default()
            .push(c);
    }
    groups
        .into_values()
        .map(|cs| {
            let first = cs[0];
            let evidence: Vec<&&CellRecord> = cs.iter().filter(|c| c.is_evidence()).collect();
            let recalled = evidence.iter().filter(|c| c.recalled()).count();
            let answers = cs.iter().filter(|c| c.answer_correct.is_some()).count();
            let mut ranks: Vec<usize> = cs.iter().filter_map(|c| c.min_needle_rank).collect();
            ranks.sort_unstable();
            let worst_cell = cs
                .iter()
                .max_by_key(|c| (c.layers_lost(), c.csa_layers_nontrivial))
                .expect("groups are never empty");
            GroupSummary {
                target_tokens: first.target_tokens,
                index: first.index,
                kv: first.kv,
                topk: first.topk,
                cells: cs.len(),
                evidence_cells: evidence.len(),
                recalled,
                recall_rate: (!evidence.is_empty())
                    .then(|| recalled as f64 / evidence.len() as f64),
                judged_by: match answers {
                    0 => "indexer",
                    n if n == cs.len() => "answer",
                    _ => "mixed",
                },
                median_rank: median(&ranks),
                worst_rank: ranks.last().copied(),
                trivial_cells: cs.iter().filter(|c| c.all_trivial()).count(),
                layers_lost_worst: worst_cell.layers_lost(),
                layers_nontrivial_of_worst: worst_cell.csa_layers_nontrivial,
                layers_lost_total: cs.iter().map(|c| c.layers_lost()).sum(),
                exact_keeps: cs
                    .iter()
                    .map(|c| exact_keeps_by.get(&c.cell_id))
                    .sum::<Option<usize>>(),
            }
        })
        .collect()
}

/// summary.json: the run's identity and the group summaries.
#[derive(Clone, Debug, Serialize)]
pub struct SummaryJson {
    pub model: String,
    pub scenario: String,
    pub synthetic: bool,
    pub cells_finished: usize,
    /// The cells of a sweep's grid (null for a probe's directory): fewer finished means the
    /// run stopped early.
    pub cells_planned: Option<usize>,
    pub groups: Vec<GroupSummary>,
}

impl SummaryJson {
    pub fn new(info: &RunInfo, cells: &[CellRecord], exact_keeps_by: &ExactKeepsByCell) -> Self {
        SummaryJson {
            model: info.model_name().to_string(),
            scenario: info.scenario.clone(),
            synthetic: info.synthetic,
            cells_finished: cells.len(),
            cells_planned: info.cells_planned(),
            groups: summarize(cells, exact_keeps_by),
        }
    }
}

/// Whether stdout should get colour: a terminal, and `NO_COLOR` unset.
pub fn stdout_wants_colour() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

const GREEN: &str = "\x1b[32m";
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// The summary table's column heads, as the terminal table and `report.html` write them, with
/// `word` naming the ranked layers (`CSA` on DeepSeek-V4, `index` on DeepSeek-V4.1).
pub fn summary_head(word: LayerWord) -> [String; 11] {
    [
        "length".into(),
        "index".into(),
        "kv".into(),
        "top-k".into(),
        "cells".into(),
        "recall".into(),
        "median rank".into(),
        "worst rank".into(),
        format!("{word} lost (worst cell)"),
        format!("{word} lost (sum)"),
        "exact keeps".into(),
    ]
}

/// The column of [`summary_head`] that [`RecallTone`] colours.
pub const RECALL_COLUMN: usize = 5;

/// What the summary table says under itself (terminal table and `report.html`), with `word`
/// naming the ranked layers.
pub fn summary_legend(word: LayerWord) -> String {
    let layer = word.noun();
    format!(
        "recall: answer correct; \"idx\": no answer verdict, judged by \
         indexer recall (needle selected on every non-trivial {layer} at the answer position), \
         over the cells that count (an indexer-judged cell with only trivial {layer}s does not).\n\
         rank: min_needle_rank (the needle rank on the worst {layer} of a cell), median and worst over cells.\n\
         {word} lost: non-trivial {layer}s (n_t > k) that did not select the needle, as \
         lost/non-trivial in the worst cell and summed over cells;\n\
         exact keeps: of the {layer}s lost (sum), those the exact profile selects on the same \
         hidden states: lost to the index profile's rounding (the exact math loses the rest \
         too: the top-k is too small there); -: exact not scored in every cell of the group \
         (probes and sweeps score it by themselves whenever a rounding profile drives; cells of \
         directories written before sweeps did, or grids driven by exact alone, lack it).\n\
         trivial: n_t <= k on every {layer} of every cell (no evidence).\n"
    )
}

/// How a group's recall reads at a glance: all, some or none of its evidence cells recalled,
/// or no evidence at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecallTone {
    All,
    Some,
    None,
    NoEvidence,
}

impl RecallTone {
    fn ansi(self) -> &'static str {
        match self {
            RecallTone::All => GREEN,
            RecallTone::Some => YELLOW,
            RecallTone::None => RED,
            RecallTone::NoEvidence => DIM,
        }
    }

    /// The CSS class `report.html` gives the recall cell.
    pub fn css_class(self) -> &'static str {
        match self {
            RecallTone::All => "recall-all",
            RecallTone::Some => "recall-some",
            RecallTone::None => "recall-none",
            RecallTone::NoEvidence => "recall-trivial",
        }
    }
}

/// The rows of the summary table, one per group, as text in [`summary_head`]'s order, with the
/// tone of the recall cell.
pub fn table_rows(groups: &[GroupSummary]) -> Vec<(Vec<String>, RecallTone)> {
    let mut rows = Vec::new();
    for g in groups {
        let recall = match g.recall_rate {
            Some(rate) => format!(
                "{}/{} {:>3}%{}",
                g.recalled,
                g.evidence_cells,
                whole_percent(rate),
                match g.judged_by {
                    "answer" => "",
                    "indexer" => " idx",
                    _ => " mix",
                }
            ),
            None => "trivial".to_string(),
        };
        let tone = if g.evidence_cells == 0 {
            RecallTone::NoEvidence
        } else if g.recalled == g.evidence_cells {
            RecallTone::All
        } else if g.recalled == 0 {
            RecallTone::None
        } else {
            RecallTone::Some
        };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let mut lost = format!("{}/{}", g.layers_lost_worst, g.layers_nontrivial_of_worst);
        if g.trivial_cells == g.cells {
            lost = "trivial".into();
        }
        rows.push((
            vec![
                format_tokens(g.target_tokens),
                g.index.to_string(),
                g.kv.to_string(),
                g.topk.to_string(),
                g.cells.to_string(),
                recall,
                opt(g.median_rank.map(|m| {
                    if m.fract() == 0.0 {
                        format!("{m:.0}")
                    } else {
                        format!("{m:.1}")
                    }
                })),
                opt(g.worst_rank.map(|w| w.to_string())),
                lost,
                g.layers_lost_total.to_string(),
                opt(g.exact_keeps.map(|n| n.to_string())),
            ],
            tone,
        ));
    }
    rows
}

/// The terminal table of `groups` ([`table_rows`]): columns padded by their plain-text width
/// (colour codes, when asked for, wrap the padded recall cell so alignment holds), followed by
/// [`summary_legend`]; `word` names the ranked layers.
pub fn render_table(groups: &[GroupSummary], colour: bool, word: LayerWord) -> String {
    let head = summary_head(word);
    let rows = table_rows(groups);
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for (r, _) in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Text columns left-aligned, numbers right-aligned.
    let left = |i: usize| i == 1 || i == 2;
    let pad = |i: usize, s: &str| {
        if left(i) {
            format!("{s:<w$}", w = width[i])
        } else {
            format!("{s:>w$}", w = width[i])
        }
    };
    let mut out = String::new();
    let head: Vec<String> = head.iter().enumerate().map(|(i, h)| pad(i, h)).collect();
    out.push_str(head.join("  ").trim_end());
    out.push('\n');
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for (r, tone) in &rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let p = pad(i, c);
                if colour && i == RECALL_COLUMN {
                    format!("{}{p}{RESET}", tone.ansi())
                } else {
                    p
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&summary_legend(word));
    out
}

/// A rate as a whole percentage that says 100 only when all and 0 only when none: 199 of 200
/// is 99%, not a rounded 100% beside a fraction that says otherwise.
fn whole_percent(rate: f64) -> u32 {
    let pct = (rate * 100.0).round() as u32;
    if rate > 0.0 && rate < 1.0 {
        pct.clamp(1, 99)
    } else {
        pct
    }
}
