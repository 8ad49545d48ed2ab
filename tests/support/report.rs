//! Hand-made records for the report tests: a small sweep (lengths x depths x profiles x top-k)
//! whose needle ranks grow with length and are worse under fp8 than under bf16, with
//! layers.csv rows for three scored profiles on 21 CSA layers. Deterministic (a tiny LCG).

use needlescope::numerics::modes::{IndexProfile, KvMode};
use needlescope::record::{AttentionRecord, CellRecord, LayerRecord, RunInfo};

pub use needlescope::numerics::rng::Rng;

pub fn run_info(synthetic: bool) -> RunInfo {
    let mut info = RunInfo::new(
        if synthetic {
            "/tmp/models/planted"
        } else {
            "/models/DeepSeek-V4-Flash"
        },
        "sha256:0123abcd",
        "passkey",
        synthetic,
        serde_json::json!({
            "lengths": [2048, 4096],
            "depths": [0.0, 50.0, 100.0],
            "index": ["fp8", "bf16"],
            "topk": [512, 1024],
            "kv": "fp8",
            "samples": 1,
        }),
    );
    info.command_line = vec![
        "needlescope".into(),
        "sweep".into(),
        "--model".into(),
        "X".into(),
    ];
    info
}

pub fn cell(id: &str, target: usize, depth: f64, index: IndexProfile, topk: usize) -> CellRecord {
    CellRecord {
        cell_id: id.to_string(),
        target_tokens: target,
        prompt_tokens: target,
        depth_pct: depth,
        needle_start: 100,
        needle_end: 130,
        answer_start: 120,
        answer_end: 125,
        index,
        kv: KvMode::Fp8,
        topk,
        answer_text: "The pass key is 71432.".into(),
        answer_correct: Some(true),
        min_needle_rank: Some(3),
        csa_layers_selected: 21,
        csa_layers_nontrivial: 21,
        wall_seconds: 1.25,
        recalled: Some(true),
        exact_keeps: None,
        sample: CellRecord::sample_of_id(id),
    }
}

pub fn layer(
    cell_id: &str,
    layer: usize,
    profile: &str,
    driving: bool,
    rank: usize,
) -> LayerRecord {
    LayerRecord {
        cell_id: cell_id.to_string(),
        layer,
        query_pos: 4095,
        phase: "prompt".into(),
        profile: profile.into(),
        driving,
        needle: 0,
        visible_rows: 1024,
        needle_rows: 9,
        needle_rank: Some(rank),
        rank_ties: 0,
        needle_ties: 0,
        needle_score: Some(1.5),
        kth_score: Some(0.75),
        margin: Some(0.75),
        selected: rank <= 512,
        trivial: false,
        ..Default::default()
    }
}

pub fn attention(cell_id: &str, layer: usize) -> AttentionRecord {
    AttentionRecord {
        cell_id: cell_id.to_string(),
        layer,
        layer_type: "csa".into(),
        query_pos: 4095,
        phase: "prompt".into(),
        needle_mass_mean: 0.125,
        needle_mass_max_head: 0.5,
        needle_in_window: false,
        sink_mass_mean: 0.25,
    }
}

/// CSA layers of the sample model.
pub fn csa_layers() -> Vec<usize> {
    (0..21).map(|i| 2 + 2 * i).collect()
}

/// A whole sample sweep: every (length, depth, driving profile, top-k) cell with its layer rows
/// (profiles exact, fp8, bf16 at the last prompt token) and attention rows; `samples` prompts
/// per cell (ids get `-s<n>` when there are several).
pub fn sample_sweep(
    lengths: &[usize],
    depths: &[f64],
    judge_by_answer: bool,
    samples: usize,
) -> Vec<(CellRecord, Vec<LayerRecord>, Vec<AttentionRecord>)> {
    let mut rng = Rng::new(7);
    let mut out = Vec::new();
    for &len in lengths {
        for &d in depths {
            for index in [IndexProfile::SglangFp8, IndexProfile::SglangBf16Keys] {
                for (topk, sample) in [512usize, 1024]
                    .into_iter()
                    .flat_map(|k| (0..samples).map(move |s| (k, s)))
                {
                    let mut id = format!("{}-d{d}-{}-k{topk}", len / 1024, index.name());
                    if samples > 1 {
                        id.push_str(&format!("-s{sample}"));
                    }
                    let pos = len - 1;
                    let visible = len / 4;
                    let mut layers = Vec::new();
                    let mut attn = Vec::new();
                    for (li, &l) in csa_layers().iter().enumerate() {
                        for profile in ["exact", "fp8", "bf16"] {
                            let noise = match profile {
                                "fp8" => 2.2,
                                "bf16" => 1.15,
                                _ => 1.0,
                            };
                            let depth_factor = 1.0 + (d - 50.0).abs() / 40.0;
                            let layer_factor = 1.0 + 3.0 * ((li as f64) / 6.0).sin().abs();
                            let base = (len as f64 / 2048.0).powf(1.6) * 4.0;
                            let r =
                                base * noise * depth_factor * layer_factor * (0.5 + rng.uniform());
                            let rank = (r.round() as usize).clamp(1, visible);
                            let mut rec = layer(&id, l, profile, profile == index.name(), rank);
                            rec.query_pos = pos;
                            rec.visible_rows = visible;
                            rec.selected = rank <= topk;
                            rec.trivial = visible <= topk;
                            layers.push(rec);
                        }
                        let mut a = attention(&id, l);
                        a.query_pos = pos;
                        attn.push(a);
                    }
                    let driving: Vec<&LayerRecord> = layers.iter().filter(|r| r.driving).collect();
                    let nontrivial = driving.iter().filter(|r| !r.trivial).count();
                    let selected = driving.iter().filter(|r| !r.trivial && r.selected).count();
                    let mut c = cell(&id, len, d, index, topk);
                    c.prompt_tokens = len;
                    c.min_needle_rank = driving.iter().filter_map(|r| r.needle_rank).max();
                    c.csa_layers_nontrivial = nontrivial;
                    c.csa_layers_selected = selected;
                    c.answer_correct = judge_by_answer.then(|| selected + 2 >= nontrivial);
                    c.answer_text = if c.answer_correct == Some(false) {
                        "I could not find a pass key, \"sorry\".\nSecond line".into()
                    } else {
                        "71432".into()
                    };
                    c.wall_seconds = 0.5 + rng.uniform();
                    out.push((c, layers, attn));
                }
            }
        }
    }
    out
}

/// `cell` and its `layers` made to agree as the probe writes them (`report` refuses records
/// that do not): prompt rows at [`layer`]'s position 4095 move to the cell's answer position,
/// every row's `selected` and `trivial` follow from its rank and the cell's top-k, and the
/// cell's worst rank and layer counts are its driving rows' at the answer position.
#[allow(dead_code)]
pub fn agreeing(
    mut cell: CellRecord,
    mut layers: Vec<LayerRecord>,
) -> (CellRecord, Vec<LayerRecord>) {
    let (answer, k) = (cell.answer_position(), cell.topk);
    for r in &mut layers {
        if r.phase == "prompt" && r.query_pos == 4095 {
            r.query_pos = answer;
        }
        r.selected = r.needle_rank.is_some_and(|rank| rank <= k)
            && r.needle_score.is_some_and(|s| !s.is_nan());
        r.trivial = r.visible_rows <= k;
    }
    let driving: Vec<&LayerRecord> = layers
        .iter()
        .filter(|r| r.driving && r.query_pos == answer)
        .collect();
    cell.min_needle_rank = driving.iter().filter_map(|r| r.needle_rank).max();
    cell.csa_layers_nontrivial = driving.iter().filter(|r| !r.trivial).count();
    cell.csa_layers_selected = driving.iter().filter(|r| !r.trivial && r.selected).count();
    (cell, layers)
}
