mod engine_support;
use engine_support::*;
use needlescope::model::{Engine, EngineOptions, LogitsRequest};
use needlescope::numerics::profiles::{IndexProfile, KvMode};

#[test]
fn diag() {
    let model = tiny();
    let toks = tokens(300, 4096, 7);
    for (index, kv) in [(IndexProfile::OfficialFp4, KvMode::Fp8), (IndexProfile::OfficialFp4, KvMode::Exact), (IndexProfile::Exact, KvMode::Fp8), (IndexProfile::SglangFp8, KvMode::Exact)] {
    let run = |chunk| {
        let e = Engine::load(&model.ckpt, EngineOptions { index, kv, topk: None, chunk }).unwrap();
        let mut rec = Recorder::all(&["layers."]);
        let mut st = e.new_sequence();
        let out = e.forward(&mut st, &toks, &mut rec, LogitsRequest::All).unwrap();
        (out, rec)
    };
    let a = run(300);
    let b = run(1);
    let mut maxrel = std::collections::BTreeMap::new();
    for name in a.1.rows.keys() {
        for (p, ra) in &a.1.rows[name] {
            let rb = &b.1.rows[name][p];
            let ra = trim_neg_inf(ra); let rb = trim_neg_inf(rb);
            if ra.len() != rb.len() { continue; }
            let scale = ra.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
            let d = ra.iter().zip(rb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale;
            let e = maxrel.entry(name.clone()).or_insert((0f32, 0usize));
            if d > e.0 { *e = (d, *p); }
        }
    }
    eprintln!("== {index} {kv}");
    for (k, v) in &maxrel { eprintln!("{k}: max rel {:.2e} at {}", v.0, v.1); }
    let mut first_sel = None;
    for (key, r) in &a.1.indexer { if b.1.indexer[key].selected != r.selected { first_sel = Some(*key); break; } }
    eprintln!("first selection diff: {first_sel:?}");
    }
}
