//! Prefill throughput of the CPU reference on the tiny model (the figure `bench_prefill` gives
//! the CLI). Ignored by default; run in release mode:
//! `cargo test --release --test model -- --ignored --nocapture bench::`.

use needlescope_testkit::engine as engine_support;

use engine_support::*;
use needlescope::backend::WeightResidency;
use needlescope::model::{bench_prefill, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};

#[test]
#[ignore]
fn tiny_prefill_2k_tokens() {
    let model = tiny();
    let toks = tokens(2048, 4096, 21);
    for (index, kv) in [
        (IndexProfile::Exact, KvMode::Exact),
        (IndexProfile::SglangFp8, KvMode::Fp8),
    ] {
        for chunk in [256, 2048] {
            let opts = ModelOptions {
                index,
                kv,
                topk: None,
                chunk,
            };
            let f = bench_prefill(&model.ckpt, opts, WeightResidency::Auto, &toks).unwrap();
            eprintln!(
                "tiny prefill {} tokens, index {index}, kv {kv}, chunk {chunk}: {:.3} s, {:.0} tokens/s (load {:.3} s)",
                f.tokens, f.seconds, f.tokens_per_s, f.load_seconds
            );
            assert!(f.tokens_per_s > 0.0);
        }
    }
}
