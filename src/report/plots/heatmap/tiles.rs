//! What a heatmap shows, before any pixel: the grid (the lengths and depths of its cells and of
//! the sweep's plan in run.json), each tile's verdict, text and sample count, how the run was
//! judged (title and legend entries), and which legend entries the tiles use.
//!
//! A sweep's plan names every (length, depth) and the samples per tile, so a stopped sweep's
//! missing tiles are drawn as "not run" and a tile with fewer samples than planned says so
//! (`[2/3]`); a probe's directory has no plan and shows what it has. A position of the grid
//! that neither has a cell nor is planned (probes at different lengths and depths sharing a
//! directory) is drawn as "no cell" rather than left blank.

use std::collections::{BTreeSet, HashMap};

use plotters::style::RGBColor;
use serde::Deserialize;

use crate::record::verdict::LayerWord;
use crate::record::{CellRecord, Judge, RunInfo};

pub(super) const GREEN: RGBColor = RGBColor(122, 198, 126);
pub(super) const RED: RGBColor = RGBColor(236, 112, 99);
pub(super) const AMBER: RGBColor = RGBColor(247, 190, 85);
/// Trivial tiles (no evidence).
pub(super) const GREY: RGBColor = RGBColor(205, 205, 205);
/// Not-run tiles: this background under [`HATCH`] lines.
pub(super) const NOT_RUN: RGBColor = RGBColor(244, 244, 244);
pub(super) const HATCH: RGBColor = RGBColor(150, 150, 150);
/// No-cell tiles: this background under dots of [`HATCH`].
pub(super) const NO_CELL: RGBColor = RGBColor(252, 252, 252);

/// The grid part of a sweep's `sweep_args` (the rest is checked by `validate`).
#[derive(Debug, Deserialize)]
struct Plan {
    lengths: Vec<usize>,
    depths: Vec<f64>,
    #[serde(default = "one")]
    samples: usize,
}

fn one() -> usize {
    1
}

/// How a tile is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fill {
    Colour(RGBColor),
    /// Planned, no sample finished.
    NotRun,
    /// Neither planned nor run: a position of the grid (a length and a depth of other cells)
    /// without a cell.
    NoCell,
}

/// The verdict of one grid tile.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Tile {
    pub fill: Fill,
    /// Worst rank, "(recalled/evidence)" when split, "[finished/planned]" when partial.
    pub text: String,
    /// The worst `min_needle_rank` over the samples.
    pub worst: Option<usize>,
    /// (recalled, evidence samples) when the samples disagree (the "(2/3)" of the text).
    pub split: Option<(usize, usize)>,
    /// Some samples finished, fewer than planned.
    pub partial: bool,
}

impl Tile {
    /// A tile without samples.
    fn empty(fill: Fill) -> Tile {
        Tile {
            fill,
            text: String::new(),
            worst: None,
            split: None,
            partial: false,
        }
    }
}

/// The tiles of one heatmap: column i = `lengths[i]`, row j = `depths[j]` (0 % first).
pub(super) struct Grid {
    pub lengths: Vec<usize>,
    pub depths: Vec<f64>,
    /// (column, row) -> tile, for every pair.
    pub tiles: HashMap<(usize, usize), Tile>,
    /// Cells (samples) of this heatmap, and the plan's count for it when the run has a plan.
    pub finished: usize,
    pub planned: Option<usize>,
    pub judging: Judging,
    /// What the legend calls the ranked layers (CSA layers on DeepSeek-V4, index layers on
    /// DeepSeek-V4.1).
    pub word: LayerWord,
}

impl Grid {
    /// The grid of `cells` (one heatmap's) in a run recorded by `info`, whose ranked layers
    /// are called `word`.
    pub fn new(info: &RunInfo, cells: &[&CellRecord], word: LayerWord) -> Grid {
        let plan: Option<Plan> = info
            .cells_planned()
            .and_then(|_| serde_json::from_value(info.sweep_args.clone()).ok());
        let mut lengths: BTreeSet<usize> = cells.iter().map(|c| c.target_tokens).collect();
        let mut depths: Vec<f64> = cells.iter().map(|c| c.depth_pct).collect();
        if let Some(p) = &plan {
            lengths.extend(&p.lengths);
            depths.extend(&p.depths);
        }
        depths.sort_by(|a, b| a.total_cmp(b));
        depths.dedup();
        let lengths: Vec<usize> = lengths.into_iter().collect();
        let column = |l: usize| lengths.binary_search(&l).ok();
        let row = |d: f64| {
            depths
                .binary_search_by(|x| x.partial_cmp(&d).unwrap_or(std::cmp::Ordering::Less))
                .ok()
        };
        let mut samples: HashMap<(usize, usize), Vec<&CellRecord>> = HashMap::new();
        for c in cells {
            if let (Some(i), Some(j)) = (column(c.target_tokens), row(c.depth_pct)) {
                samples.entry((i, j)).or_default().push(c);
            }
        }
        let per_tile = plan.as_ref().map(|p| p.samples);
        let mut tiles: HashMap<(usize, usize), Tile> = samples
            .iter()
            .map(|(&at, s)| (at, tile(s, per_tile)))
            .collect();
        if let Some(p) = &plan {
            for &l in &p.lengths {
                for &d in &p.depths {
                    if let (Some(i), Some(j)) = (column(l), row(d)) {
                        tiles
                            .entry((i, j))
                            .or_insert_with(|| Tile::empty(Fill::NotRun));
                    }
                }
            }
        }
        for i in 0..lengths.len() {
            for j in 0..depths.len() {
                tiles
                    .entry((i, j))
                    .or_insert_with(|| Tile::empty(Fill::NoCell));
            }
        }
        Grid {
            planned: plan
                .as_ref()
                .map(|p| p.lengths.len() * p.depths.len() * p.samples),
            lengths,
            depths,
            tiles,
            finished: cells.len(),
            judging: Judging::of(cells),
            word,
        }
    }

    /// "19 of 20 cells" when the plan has more cells than finished.
    pub fn completeness(&self) -> Option<String> {
        self.planned
            .filter(|&p| self.finished < p)
            .map(|p| format!("{} of {p} cells", self.finished))
    }

    /// The legend's swatches: the verdict colours of the judging, grey when trivial tiles
    /// are drawn (always listed for indexer-only runs), "not run" and "no cell" whenever a tile
    /// is.
    pub fn legend(&self) -> Vec<(Fill, &'static str)> {
        let used = |f: Fill| self.tiles.values().any(|t| t.fill == f);
        let mut out: Vec<(Fill, &'static str)> = match self.judging {
            Judging::Answer => vec![
                (Fill::Colour(GREEN), "answer correct"),
                (Fill::Colour(RED), "answer wrong"),
                (Fill::Colour(AMBER), "some samples wrong"),
            ],
            Judging::Indexer => vec![
                (
                    Fill::Colour(GREEN),
                    match self.word {
                        LayerWord::Csa => "selected on every non-trivial CSA layer",
                        LayerWord::Index => "selected on every non-trivial index layer",
                    },
                ),
                (
                    Fill::Colour(RED),
                    match self.word {
                        LayerWord::Csa => "lost on a CSA layer",
                        LayerWord::Index => "lost on an index layer",
                    },
                ),
                (Fill::Colour(AMBER), "some samples lost"),
            ],
            Judging::Mixed => vec![
                (Fill::Colour(GREEN), "recalled"),
                (Fill::Colour(RED), "lost"),
                (Fill::Colour(AMBER), "some samples lost"),
            ],
        };
        if self.judging == Judging::Indexer || used(Fill::Colour(GREY)) {
            out.push((Fill::Colour(GREY), "trivial: n_t <= k everywhere"));
        }
        if used(Fill::NotRun) {
            out.push((Fill::NotRun, "not run"));
        }
        if used(Fill::NoCell) {
            out.push((Fill::NoCell, "no cell at this length and depth"));
        }
        out
    }

    /// The first tile (by length, then depth) whose samples disagree, for the legend's example.
    pub fn first_split(&self) -> Option<&Tile> {
        (0..self.lengths.len())
            .flat_map(|i| (0..self.depths.len()).map(move |j| (i, j)))
            .filter_map(|at| self.tiles.get(&at))
            .find(|t| t.split.is_some())
    }

    /// Whether a tile has fewer samples than planned.
    pub fn any_partial(&self) -> bool {
        self.tiles.values().any(|t| t.partial)
    }
}

/// How the cells of a heatmap were judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Judging {
    /// Every cell has an answer verdict.
    Answer,
    /// No cell has one: indexer recall.
    Indexer,
    /// Some have: each cell by its answer where present, else by the indexer.
    Mixed,
}

impl Judging {
    pub fn of(cells: &[&CellRecord]) -> Judging {
        let judges: BTreeSet<bool> = cells.iter().map(|c| c.judge() == Judge::Answer).collect();
        match (judges.contains(&true), judges.contains(&false)) {
            (true, true) => Judging::Mixed,
            (true, false) => Judging::Answer,
            _ => Judging::Indexer,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Judging::Answer => "Needle recall (generated answer) by context length and depth",
            Judging::Indexer => "Needle recall (lightning indexer) by context length and depth",
            Judging::Mixed => {
                "Needle recall (answer where present, else indexer) by context length and depth"
            }
        }
    }
}

/// The tile of `samples` (at least one), of `planned` samples when the run has a plan.
pub(super) fn tile(samples: &[&CellRecord], planned: Option<usize>) -> Tile {
    // Trivial indexer-judged samples are no evidence: counted neither way.
    let n = samples.iter().filter(|c| c.is_evidence()).count();
    let recalled = samples
        .iter()
        .filter(|c| c.is_evidence() && c.recalled())
        .count();
    let fill = if n == 0 {
        GREY
    } else if recalled == n {
        GREEN
    } else if recalled == 0 {
        RED
    } else {
        AMBER
    };
    let worst = samples.iter().filter_map(|c| c.min_needle_rank).max();
    let mut text = worst.map_or_else(|| "-".to_string(), |w| w.to_string());
    let split = (n > 1 && recalled != 0 && recalled != n).then_some((recalled, n));
    if let Some((recalled, n)) = split {
        text.push_str(&format!(" ({recalled}/{n})"));
    }
    let partial = planned.is_some_and(|p| samples.len() < p);
    if let Some(p) = planned.filter(|_| partial) {
        text.push_str(&format!(" [{}/{p}]", samples.len()));
    }
    Tile {
        fill: Fill::Colour(fill),
        text,
        worst,
        split,
        partial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{IndexProfile, KvMode};

    fn sample(depth: f64, rank: Option<usize>, correct: Option<bool>) -> CellRecord {
        CellRecord {
            cell_id: format!("L4096-d{depth}-fp8-k512-s0"),
            target_tokens: 4096,
            prompt_tokens: 4096,
            depth_pct: depth,
            needle_start: 100,
            needle_end: 130,
            answer_start: 120,
            answer_end: 125,
            index: IndexProfile::SglangFp8,
            kv: KvMode::Fp8,
            topk: 512,
            answer_text: String::new(),
            answer_correct: correct,
            min_needle_rank: rank,
            csa_layers_selected: 2,
            csa_layers_nontrivial: 2,
            wall_seconds: 1.0,
            recalled: None,
            exact_keeps: None,
            sample: Some(0),
        }
    }

    fn trivial(depth: f64) -> CellRecord {
        let mut c = sample(depth, Some(7), None);
        (c.csa_layers_selected, c.csa_layers_nontrivial) = (0, 0);
        c
    }

    /// A sweep's run.json over `depths` at 4096 tokens, `samples` per tile.
    fn sweep(depths: &[f64], samples: usize) -> RunInfo {
        let args = serde_json::json!({
            "lengths": [4096], "depths": depths, "indexes": ["fp8"], "topks": [512],
            "kv": "fp8", "samples": samples,
        });
        RunInfo::new("/m", "sha256:0", "passkey", false, args)
    }

    /// A tile names the worst rank over its samples, and the recalled fraction when the samples
    /// disagree.
    #[test]
    fn a_tile_shows_the_worst_rank_over_its_samples() {
        let (a, b, c) = (
            sample(50.0, Some(5), Some(true)),
            sample(50.0, Some(900), Some(true)),
            sample(50.0, None, Some(true)),
        );
        let t = tile(&[&a, &b, &c], None);
        assert_eq!((t.text.as_str(), t.fill), ("900", Fill::Colour(GREEN)));
        let lost = sample(50.0, Some(40), Some(false));
        let t = tile(&[&a, &lost], None);
        assert_eq!((t.text.as_str(), t.fill), ("40 (1/2)", Fill::Colour(AMBER)));
        assert_eq!(tile(&[&c], None).text, "-");
    }

    /// Answer-judged and indexer-judged cells in one heatmap: the title says both, and the
    /// legend lists the grey of the trivial indexer-judged tile next to the verdict colours.
    #[test]
    fn mixed_judging_is_named_and_its_trivial_grey_has_a_legend_entry() {
        let cells = [sample(0.0, Some(3), Some(true)), trivial(50.0)];
        let refs: Vec<&CellRecord> = cells.iter().collect();
        let grid = Grid::new(&sweep(&[0.0, 50.0], 1), &refs, LayerWord::Csa);
        assert_eq!(grid.judging, Judging::Mixed);
        assert!(grid
            .judging
            .title()
            .contains("answer where present, else indexer"));
        let fills: Vec<Fill> = grid.legend().iter().map(|e| e.0).collect();
        for want in [GREEN, RED, AMBER, GREY] {
            assert!(
                fills.contains(&Fill::Colour(want)),
                "{want:?} not in {fills:?}"
            );
        }
        let answer_only = [sample(0.0, Some(3), Some(true))];
        let refs: Vec<&CellRecord> = answer_only.iter().collect();
        let grid = Grid::new(&sweep(&[0.0], 1), &refs, LayerWord::Csa);
        assert_eq!(grid.judging, Judging::Answer);
        assert!(!grid.legend().iter().any(|e| e.0 == Fill::Colour(GREY)));
    }

    /// A stopped sweep: the planned tile without samples is "not run" (with a legend entry),
    /// the tile with 2 of its 3 samples says so, and the grid counts 2 of 9 cells.
    #[test]
    fn a_stopped_sweep_shows_not_run_and_partial_tiles() {
        let cells = [
            sample(0.0, Some(3), Some(true)),
            sample(0.0, Some(4), Some(true)),
        ];
        let refs: Vec<&CellRecord> = cells.iter().collect();
        let grid = Grid::new(&sweep(&[0.0, 50.0, 100.0], 3), &refs, LayerWord::Csa);
        assert_eq!(grid.depths, vec![0.0, 50.0, 100.0]);
        assert_eq!(grid.tiles[&(0, 0)].text, "4 [2/3]");
        assert!(grid.tiles[&(0, 0)].partial);
        assert_eq!(grid.tiles[&(0, 1)].fill, Fill::NotRun);
        assert_eq!(grid.tiles[&(0, 2)].fill, Fill::NotRun);
        assert!(grid.legend().iter().any(|e| e.0 == Fill::NotRun));
        assert_eq!(grid.completeness().as_deref(), Some("2 of 9 cells"));
        // A directory without a plan (a probe's) shows what it has.
        let mut probe = sweep(&[0.0], 1);
        probe.sweep_args = serde_json::json!({"command": "probe"});
        let grid = Grid::new(&probe, &refs, LayerWord::Csa);
        assert_eq!((grid.tiles.len(), grid.completeness()), (1, None));
        assert!(!grid.tiles[&(0, 0)].partial);
    }

    /// Probes at (4096, 0 %) and (8192, 50 %) sharing a directory: the two other positions of
    /// the grid are "no cell" tiles with a legend entry, not blank (before, they had no tile).
    #[test]
    fn grid_positions_without_a_cell_are_drawn_and_named() {
        let mut far = sample(50.0, Some(9), Some(true));
        far.target_tokens = 8192;
        let cells = [sample(0.0, Some(3), Some(true)), far];
        let refs: Vec<&CellRecord> = cells.iter().collect();
        let mut probe = sweep(&[0.0], 1);
        probe.sweep_args = serde_json::json!({"command": "probe"});
        let grid = Grid::new(&probe, &refs, LayerWord::Csa);
        assert_eq!(grid.tiles.len(), 4);
        assert_eq!(grid.tiles[&(0, 1)].fill, Fill::NoCell);
        assert_eq!(grid.tiles[&(1, 0)].fill, Fill::NoCell);
        assert!(grid
            .legend()
            .contains(&(Fill::NoCell, "no cell at this length and depth")));
        // A full grid has none, and no legend entry for it.
        let full = Grid::new(&probe, &refs[..1], LayerWord::Csa);
        assert!(!full.legend().iter().any(|e| e.0 == Fill::NoCell));
    }
}
