//! The planted demo model, end to end: `synth_planted` into a temp dir, the real loader and
//! CPU engine, passkey prompts from the real tokenizer, and the probe's own `NeedleObserver`.
//! Nothing here knows how the model is built: the trends are read off the forward pass.
//!
//! - `planted_needle_rank_grows_with_context_and_fp8_loses_it_first` (default run, small grid
//!   1k / 2k / 4k tokens): the needle's rank grows with length (exact and fp8), fp8 is never
//!   better than exact on average, top-128 keeps the needle where top-64 loses it, and the
//!   exact needle z-score is close to the planted margin.
//! - `planted_demo_grid` (ignored; the full demo grid with timings, run in release):
//!   `cargo test --release --test planted_trends -- --ignored --nocapture planted_demo_grid`

use needlescope::checkpoint::planted::{planted_info, synth_planted, DEFAULT_MARGIN, TITLE_NOTE};
use needlescope::checkpoint::{Checkpoint, Preset, SynthOptions, WeightFormat};
use needlescope::model::observer::{AttentionObservation, IndexerObservation, Observer};
use needlescope::model::{Engine, EngineOptions, LogitsRequest};
use needlescope::numerics::profiles::IndexProfile;
use needlescope::probe::rows::RowKind;
use needlescope::probe::{
    build_prompt, CellTopk, NeedleObserver, NeedleObserverConfig, Scenario, V4Tokenizer,
};
use std::collections::BTreeMap;
use std::time::Instant;

const KS: [usize; 2] = [64, 128];
const PROFILES: [IndexProfile; 5] = [
    IndexProfile::Exact,
    IndexProfile::SglangBf16Keys,
    IndexProfile::SglangFp8,
    IndexProfile::SglangFp4,
    IndexProfile::OfficialFp4,
];

/// The probe's observer plus the exact needle z-score per CSA layer.
struct Probe {
    inner: NeedleObserver,
    needle: (usize, usize),
    /// (layer, z of the best needle row among the haystack rows, exact scores).
    z: Vec<(usize, f64)>,
}

impl Observer for Probe {
    fn wants_position(&self, pos: usize) -> bool {
        self.inner.wants_position(pos)
    }
    fn indexer(&mut self, obs: &IndexerObservation<'_>) {
        if self.inner.wants_position(obs.query_pos) {
            let rows = RowKind::Csa.span_rows(self.needle);
            let rows2 = rows.clone();
            let hay: Vec<f64> = (0..obs.visible_rows)
                .filter(|w| !rows.contains(w))
                .map(|w| obs.scores[w] as f64)
                .collect();
            let n = hay.len() as f64;
            let mean = hay.iter().sum::<f64>() / n;
            let sd = (hay.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
            let best = rows
                .filter(|&w| w < obs.visible_rows)
                .map(|w| obs.scores[w] as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            self.z.push((obs.layer, (best - mean) / sd));
            if std::env::var("PLANTED_KAPPA").is_ok() {
                for prof in [IndexProfile::SglangFp8, IndexProfile::SglangBf16Keys] {
                    let f = needlescope::probe::observe::rescore(prof, obs);
                    let a: f64 = f.iter().map(|&v| v as f64).sum::<f64>()
                        / obs.scores.iter().map(|&v| v as f64).sum::<f64>();
                    let err: Vec<f64> = (0..obs.visible_rows)
                        .map(|w| f[w] as f64 - a * obs.scores[w] as f64)
                        .collect();
                    let m = err.iter().sum::<f64>() / err.len() as f64;
                    let e = (err.iter().map(|x| (x - m).powi(2)).sum::<f64>() / err.len() as f64)
                        .sqrt();
                    let nb: Vec<f64> = rows2
                        .clone()
                        .filter(|&w| w < obs.visible_rows)
                        .map(|w| (err[w] - m) / (a * sd))
                        .collect();
                    eprintln!(
                        "kappa L{} t{} {}: {:.2}  needle err/sd {:?}",
                        obs.layer,
                        obs.query_pos,
                        prof.name(),
                        e / (a * sd),
                        nb.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>()
                    );
                }
            }
        }
        self.inner.indexer(obs);
    }
    fn attention(&mut self, obs: &AttentionObservation<'_>) {
        self.inner.attention(obs);
    }
}

/// One cell's outcome: per (layer, profile) the needle rank, and the exact z per layer.
struct Cell {
    length: usize,
    depth: f64,
    ranks: BTreeMap<(usize, &'static str), usize>,
    z: Vec<(usize, f64)>,
    seconds: f64,
}

struct Setup {
    _dir: tempfile::TempDir,
    engine: Engine,
    tok: V4Tokenizer,
    scenario: Scenario,
}

fn setup(margin: f64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, dir.path());
    opts.seed = 7;
    let t0 = Instant::now();
    let s = synth_planted(&opts, Some(margin)).unwrap();
    eprintln!(
        "synth planted: {} tensors, {} payload bytes in {:.1} s",
        s.tensors,
        s.payload_bytes,
        t0.elapsed().as_secs_f64()
    );
    let info = planted_info(dir.path()).expect("planted.json");
    assert!(info.synthetic && info.title.contains(TITLE_NOTE), "{info:?}");
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let opts = EngineOptions {
        topk: Some(KS[0]),
        ..EngineOptions::default()
    };
    let engine = Engine::load(&ckpt, opts).unwrap();
    let tok = V4Tokenizer::from_file(dir.path()).unwrap();
    Setup {
        _dir: dir,
        engine,
        tok,
        scenario: Scenario::load("passkey").unwrap(),
    }
}

fn run_cell(s: &Setup, length: usize, depth: f64, seed: u64) -> Cell {
    let p = build_prompt(&s.tok, &s.scenario, length, depth, seed, 1 << 20).unwrap();
    let cfg = NeedleObserverConfig {
        needle: p.needle,
        answer: p.answer,
        prompt_len: length,
        prompt_positions: vec![length - 1],
        probe_decode: false,
        driving: IndexProfile::Exact,
        compare: PROFILES[1..].to_vec(),
        cells: KS
            .iter()
            .map(|&k| CellTopk {
                cell_id: format!("k{k}"),
                topk: k,
            })
            .collect(),
    };
    let mut probe = Probe {
        inner: NeedleObserver::new(cfg),
        needle: p.needle,
        z: Vec::new(),
    };
    let t0 = Instant::now();
    let mut state = s.engine.new_sequence();
    s.engine
        .forward(&mut state, &p.tokens, &mut probe, LogitsRequest::Last)
        .unwrap();
    let seconds = t0.elapsed().as_secs_f64();
    assert!(probe.inner.errors.is_empty(), "{:?}", probe.inner.errors);
    let mut ranks = BTreeMap::new();
    for r in probe.inner.layer_records.iter().filter(|r| r.cell_id == "k64") {
        let name = PROFILES.iter().find(|p| p.name() == r.profile).unwrap().name();
        ranks.insert((r.layer, name), r.needle_rank.expect("needle rows visible"));
    }
    Cell {
        length,
        depth,
        ranks,
        z: probe.z,
        seconds,
    }
}

/// Mean needle rank of `profile` over the cells of `length` and every CSA layer.
fn mean_rank(cells: &[Cell], length: usize, profile: &str) -> f64 {
    let v: Vec<f64> = cells
        .iter()
        .filter(|c| c.length == length)
        .flat_map(|c| c.ranks.iter().filter(|((_, p), _)| *p == profile))
        .map(|(_, &r)| r as f64)
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Fraction of (cell, layer) pairs of `length` where `profile` keeps the needle in the top-k.
fn kept(cells: &[Cell], length: usize, profile: &str, k: usize) -> f64 {
    let v: Vec<bool> = cells
        .iter()
        .filter(|c| c.length == length)
        .flat_map(|c| c.ranks.iter().filter(|((_, p), _)| *p == profile))
        .map(|(_, &r)| r <= k)
        .collect();
    v.iter().filter(|&&b| b).count() as f64 / v.len() as f64
}

/// Median needle rank of `profile` over the cells of `length` and every CSA layer.
fn median_rank(cells: &[Cell], length: usize, profile: &str) -> f64 {
    let mut v: Vec<usize> = cells
        .iter()
        .filter(|c| c.length == length)
        .flat_map(|c| c.ranks.iter().filter(|((_, p), _)| *p == profile))
        .map(|(_, &r)| r)
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// Fraction of cells of `length` where `profile` keeps the needle on every CSA layer.
fn kept_every_layer(cells: &[Cell], length: usize, profile: &str, k: usize) -> f64 {
    let of_l: Vec<&Cell> = cells.iter().filter(|c| c.length == length).collect();
    let ok = of_l
        .iter()
        .filter(|c| {
            c.ranks
                .iter()
                .filter(|((_, p), _)| *p == profile)
                .all(|(_, &r)| r <= k)
        })
        .count();
    ok as f64 / of_l.len() as f64
}

fn print_table(cells: &[Cell], lengths: &[usize]) {
    eprintln!("mean needle rank over depths and CSA layers (rows visible = length/4):");
    eprint!("{:>8}", "length");
    for p in PROFILES {
        eprint!(" {:>13}", p.name());
    }
    eprintln!(" {:>8} {:>8}", "z exact", "sec/cell");
    for &l in lengths {
        eprint!("{l:>8}");
        for p in PROFILES {
            eprint!(" {:>13.1}", mean_rank(cells, l, p.name()));
        }
        let of_l: Vec<&Cell> = cells.iter().filter(|c| c.length == l).collect();
        let z: Vec<f64> = of_l.iter().flat_map(|c| c.z.iter().map(|x| x.1)).collect();
        let sec = of_l.iter().map(|c| c.seconds).sum::<f64>() / of_l.len() as f64;
        eprintln!(" {:>8.2} {:>8.2}", z.iter().sum::<f64>() / z.len() as f64, sec);
    }
    eprintln!("median needle rank:");
    for &l in lengths {
        eprint!("{l:>8}");
        for p in PROFILES {
            eprint!(" {:>13.1}", median_rank(cells, l, p.name()));
        }
        let mut per_layer: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for c in cells.iter().filter(|c| c.length == l) {
            for &(layer, z) in &c.z {
                per_layer.entry(layer).or_default().push(z);
            }
        }
        let z: Vec<String> = per_layer
            .iter()
            .map(|(l, v)| format!("L{l} z {:.2}", v.iter().sum::<f64>() / v.len() as f64))
            .collect();
        eprintln!("  {}", z.join(", "));
    }
    for k in KS {
        eprintln!("fraction of cells keeping the needle in the top-{k} on every CSA layer:");
        for &l in lengths {
            eprint!("{l:>8}");
            for p in PROFILES {
                eprint!(" {:>13.2}", kept_every_layer(cells, l, p.name(), k));
            }
            eprintln!();
        }
    }
    for k in KS {
        eprintln!("fraction of (cell, layer) keeping the needle in the top-{k}:");
        for &l in lengths {
            eprint!("{l:>8}");
            for p in PROFILES {
                eprint!(" {:>13.2}", kept(cells, l, p.name(), k));
            }
            eprintln!();
        }
    }
    for c in cells {
        let r: Vec<String> = c
            .ranks
            .iter()
            .map(|((l, p), r)| format!("L{l}:{p}={r}"))
            .collect();
        eprintln!("  {} @ {:>3}%: {}", c.length, c.depth, r.join(" "));
    }
}

#[test]
fn planted_needle_rank_grows_with_context_and_fp8_loses_it_first() {
    let s = setup(DEFAULT_MARGIN);
    let lengths = [1024, 2048, 4096];
    let depths = [25.0, 75.0];
    let mut cells = Vec::new();
    for &l in &lengths {
        for &d in &depths {
            cells.push(run_cell(&s, l, d, 1));
        }
    }
    print_table(&cells, &lengths);
    for w in lengths.windows(2) {
        for p in ["exact", "fp8"] {
            let (a, b) = (mean_rank(&cells, w[0], p), mean_rank(&cells, w[1], p));
            assert!(b > a, "{p}: mean rank {a} at {} vs {b} at {}", w[0], w[1]);
        }
    }
    let all = |p| lengths.iter().map(|&l| mean_rank(&cells, l, p)).sum::<f64>();
    assert!(all("fp8") >= all("exact"), "fp8 {} exact {}", all("fp8"), all("exact"));
    assert!(all("fp8") > all("bf16"), "fp8 {} bf16 {}", all("fp8"), all("bf16"));
    let z: Vec<f64> = cells.iter().flat_map(|c| c.z.iter().map(|x| x.1)).collect();
    let z_mean = z.iter().sum::<f64>() / z.len() as f64;
    assert!(
        (z_mean - DEFAULT_MARGIN).abs() < 0.6,
        "exact z {z_mean}, margin {DEFAULT_MARGIN}"
    );
}

#[test]
#[ignore = "demo grid, minutes in release: see the module docs"]
fn planted_demo_grid() {
    let margin = std::env::var("PLANTED_MARGIN")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(DEFAULT_MARGIN);
    let s = setup(margin);
    let lengths = [1024, 2048, 4096, 8192, 16384];
    let depths = [10.0, 30.0, 50.0, 70.0, 90.0];
    let mut cells = Vec::new();
    let t0 = Instant::now();
    for &l in &lengths {
        for &d in &depths {
            cells.push(run_cell(&s, l, d, 1));
        }
    }
    eprintln!(
        "margin {margin}: {} cells in {:.1} s",
        cells.len(),
        t0.elapsed().as_secs_f64()
    );
    print_table(&cells, &lengths);
}
