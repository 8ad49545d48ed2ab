//! Manual measurement (ignored by default): synth throughput at real Flash dimensions.
//! Run: `cargo test --release --test checkpoint -- --ignored --nocapture synth_speed::`
//! (set `NEEDLESCOPE_SYNTH_EXPERTS` to change the expert count, default 16).

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::synth::{synth, Preset, SynthOptions};

#[test]
#[ignore = "writes several GB; run by hand to measure synth speed"]
fn synth_flash_four_layers_official_throughput() {
    let experts = std::env::var("NEEDLESCOPE_SYNTH_EXPERTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let dir = tempfile::tempdir().unwrap();
    let mut o = SynthOptions::new(Preset::Flash, WeightFormat::Official, dir.path());
    o.layers = Some(4);
    o.experts = Some(experts);
    o.shards = 6;
    let s = synth(&o, None).unwrap();
    eprintln!(
        "flash --layers 4 --experts {experts} official: {} tensors, {:.2} GB in {:.1} s = {:.0} MB/s",
        s.tensors,
        s.payload_bytes as f64 / 1e9,
        s.seconds,
        s.mb_per_s()
    );
    let t = std::time::Instant::now();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let diff = needlescope::checkpoint::audit(&ckpt);
    assert!(diff.is_clean(), "{}", diff.summary(10));
    let w = ckpt
        .linear_f32("layers.3.ffn.experts.0.w1", 2048, 4096)
        .unwrap();
    assert_eq!(w.len(), 2048 * 4096);
    eprintln!(
        "open + audit + one expert decode: {:.2} s",
        t.elapsed().as_secs_f64()
    );
}
