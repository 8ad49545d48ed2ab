//! Tests of the memory plan of DeepSeek-V4.1 (docs/spec/v41.md, "Memory plan"): the released
//! config's per-layer state by role, the Engram tables on the host, the draft blocks and the
//! vision tower left out, plans that fit and one that is refused. Every expected figure is
//! derived by hand in the comments, not by calling the plan's own functions.

use super::*;
use crate::config::V41Config;

const GIB: u64 = 1 << 30;
const K128: usize = 131_072;
const M1: usize = 1 << 20;

fn released() -> V41Config {
    V41Config::from_json_str(
        include_str!("../../../tests/fixtures/deepseek_v41_flash_config.json"),
        std::path::Path::new("deepseek_v41_flash_config.json"),
    )
    .unwrap()
}

/// Engram table rows of the release (`engram_num_embeddings`).
const ENGRAM_ROWS: [(usize, u64); 2] = [(1, 384_006_168), (14, 384_016_682)];
/// Per-component bytes of the release (docs/spec/v41.md 4.1 and 4.2).
const LAYER_BYTES: u64 = 7_389_500_888; // every backbone layer's common tensors
const EMBED_BYTES: u64 = 1_323_827_200; // embed.weight, head.weight: [129280, 5120] bf16
const D_BF16: u64 = 10_240; // norm.weight, each image delimiter: [5120] bf16
const MTP_BYTES: u64 = 7_932_874_632;
const VISION_BYTES: u64 = 970_506_240; // vision.* + aligner.*
const ALIGNER_BYTES: u64 = 146_821_120;
const CENSUS_TOTAL: u64 = 510_286_023_000;

/// The released checkpoint's tensors as a hand-made list (one lump per family of tensors where
/// the plan only needs its bytes), names as docs/spec/v41.md 4.1 spells them.
fn released_tensors() -> Vec<(String, &'static str, u64)> {
    let mut t: Vec<(String, &'static str, u64)> = vec![
        ("embed.weight".into(), "BF16", EMBED_BYTES),
        ("head.weight".into(), "BF16", EMBED_BYTES),
        ("norm.weight".into(), "BF16", D_BF16),
        ("image_start".into(), "BF16", D_BF16),
        ("image_end".into(), "BF16", D_BF16),
        ("image_newline".into(), "BF16", D_BF16),
        ("mtp.0.ffn.experts.0.w1.weight".into(), "I8", MTP_BYTES),
        (
            "vision.blocks.0.attn.wqkv.weight".into(),
            "BF16",
            VISION_BYTES - ALIGNER_BYTES,
        ),
        ("aligner.w1.weight".into(), "BF16", ALIGNER_BYTES),
    ];
    for l in 0..40 {
        t.push((
            format!("layers.{l}.ffn.experts.0.w1.weight"),
            "I8",
            LAYER_BYTES,
        ));
    }
    // Compressors: wkv [512, 5120] bf16 and norm [512] on every KV source, wgate on ratio 2.
    for l in [2, 8, 14, 20] {
        t.push((
            format!("layers.{l}.attn.compressor.wkv.weight"),
            "BF16",
            5_242_880,
        ));
        t.push((
            format!("layers.{l}.attn.compressor.norm.weight"),
            "BF16",
            1_024,
        ));
        if l != 20 {
            t.push((
                format!("layers.{l}.attn.compressor.wgate.weight"),
                "BF16",
                5_242_880,
            ));
        }
    }
    // Indexers: wq_b [4096, 1280] fp8 + scale [128, 40], weights_proj [32, 5120] bf16; wk
    // [128, 512] and k_norm [128] bf16 on the KV sources only.
    for l in [2, 8, 14, 20, 24, 28, 32, 36] {
        let p = format!("layers.{l}.attn.indexer.");
        t.push((format!("{p}wq_b.weight"), "F8_E4M3", 5_242_880));
        t.push((format!("{p}wq_b.scale"), "F8_E8M0", 5_120));
        t.push((format!("{p}weights_proj.weight"), "BF16", 327_680));
        if l <= 20 {
            t.push((format!("{p}wk.weight"), "BF16", 131_072));
            t.push((format!("{p}k_norm.weight"), "BF16", 256));
        }
    }
    // Engram: table [rows, 256] e4m3 + scales [rows, 8] e8m0; wkv [25600, 6144] fp8 + scale
    // [800, 192]; q_weight, k_weight [4, 5120] bf16.
    for (l, rows) in ENGRAM_ROWS {
        let p = format!("layers.{l}.engram.");
        t.push((format!("{p}embed.weight"), "F8_E4M3", rows * 256));
        t.push((format!("{p}embed.scale"), "F8_E8M0", rows * 8));
        t.push((format!("{p}wkv.weight"), "F8_E4M3", 157_286_400));
        t.push((format!("{p}wkv.scale"), "F8_E8M0", 153_600));
        t.push((format!("{p}q_weight"), "BF16", 40_960));
        t.push((format!("{p}k_weight"), "BF16", 40_960));
    }
    t
}

fn released_footprint() -> Footprint {
    let tensors = released_tensors();
    Footprint::from_tensors(
        40,
        tensors.iter().map(|(name, dtype, bytes)| TensorSpec {
            name,
            dtype,
            numel: *bytes,
            bytes: *bytes,
        }),
    )
}

// Hand-derived figures of the release (docs/spec/v41.md 4.2):
// - Engram tables on the host: 768,022,850 rows x (256 + 8) B = 196,613,849,600 +
//   6,144,182,800 = 202,758,032,400 B (188.83 GiB).
const HOST_BYTES: u64 = 202_758_032_400;
// - left out: the draft blocks 7,932,874,632 B; the vision tower and aligner 970,506,240 B + the
//   three image delimiters 3 x 10,240 = 970,536,960 B.
const EXCLUDED_VISION: u64 = 970_536_960;
// - on the GPUs: embed + head 2 x 1,323,827,200 + norm 10,240, 40 layers x 7,389,500,888,
//   compressors 36,704,256, indexers 45,130,752, Engram projections 2 x (157,286,400 +
//   153,600 + 2 x 40,960) = 314,880,000: 298,624,579,008 B (278.12 GiB).
const GPU_WEIGHTS: u64 = 298_624_579_008;

/// Window of a layer, chunk 2,048: 2 (growth slack) x (128 + 2,048) rows x 512 x 4 B.
const WINDOW_2048: u64 = 8_912_896;

#[test]
fn the_hand_made_release_reproduces_the_census() {
    let f = released_footprint();
    assert_eq!(f.total.bytes, CENSUS_TOTAL);
    assert_eq!(f.host_bytes, HOST_BYTES);
    assert_eq!(f.mtp.bytes, MTP_BYTES);
    assert_eq!(f.vision.bytes, EXCLUDED_VISION);
    let placed: u64 = f.layer_bytes.iter().sum::<u64>() + f.first_bytes + f.last_bytes;
    assert_eq!(placed, GPU_WEIGHTS);
    // main = everything planned: on the GPUs or on the host.
    assert_eq!(f.main.bytes, GPU_WEIGHTS + HOST_BYTES);
    assert_eq!(f.main.bytes + f.mtp.bytes + f.vision.bytes, f.total.bytes);
    // Layer 1 carries its Engram projections (not its table): 7,389,500,888 + 157,286,400 +
    // 153,600 + 81,920; layer 14 also its compressor (10,486,784) and indexer (5,575,680 +
    // 131,328 = 5,707,008).
    assert_eq!(f.layer_bytes[1], LAYER_BYTES + 157_521_920);
    assert_eq!(
        f.layer_bytes[14],
        LAYER_BYTES + 157_521_920 + 10_486_784 + 5_707_008
    );
    assert_eq!(f.layer_bytes[0], LAYER_BYTES);
}

/// The expected inventory of the released config (`checkpoint::inventory_v41`) slots into
/// the same figures as the hand-made list: the plan of `inspect --config` is the one tested
/// here.
#[test]
fn the_released_inventory_has_the_hand_made_figures() {
    let f = Footprint::of_inventory(&released(), crate::checkpoint::WeightFormat::Official);
    let hand = released_footprint();
    assert_eq!(f.total.bytes, CENSUS_TOTAL);
    assert_eq!(f.host_bytes, HOST_BYTES);
    assert_eq!(f.mtp.bytes, MTP_BYTES);
    assert_eq!(f.vision.bytes, EXCLUDED_VISION);
    assert_eq!(f.layer_bytes, hand.layer_bytes);
    assert_eq!(
        (f.first_bytes, f.last_bytes),
        (hand.first_bytes, hand.last_bytes)
    );
    let p = crate::devices::placement::plan_over(
        &released(),
        &f,
        &"8x80G".parse().unwrap(),
        K128,
        2048,
    );
    assert!(p.fits && p.weights == GPU_WEIGHTS && p.host_bytes == HOST_BYTES);
}

#[test]
fn v41_names_map_to_slots() {
    assert_eq!(slot("layers.1.engram.embed.weight", 40), Slot::Host);
    assert_eq!(slot("layers.14.engram.embed.scale", 40), Slot::Host);
    assert_eq!(slot("layers.14.engram.wkv.weight", 40), Slot::Layer(14));
    assert_eq!(slot("layers.14.engram.wkv.scale", 40), Slot::Layer(14));
    assert_eq!(slot("layers.1.engram.q_weight", 40), Slot::Layer(1));
    assert_eq!(slot("layers.1.engram.k_weight", 40), Slot::Layer(1));
    assert_eq!(slot("mtp.2.markov_head.embed.weight", 40), Slot::Excluded);
    assert_eq!(slot("vision.patch_embed.proj.weight", 40), Slot::Vision);
    assert_eq!(slot("aligner.w2.bias", 40), Slot::Vision);
    for d in ["image_start", "image_end", "image_newline"] {
        assert_eq!(slot(d, 40), Slot::Vision, "{d}");
    }
    assert_eq!(slot("norm.weight", 40), Slot::Last);
    assert_eq!(
        slot("layers.20.attn.compressor.wkv.weight", 40),
        Slot::Layer(20)
    );
}

/// Every layer holds its window; only the KV sources 2, 8, 14 (ratio 2) and 20 (ratio 1) hold
/// compressed KV and index keys; reuse and reindex layers hold nothing else.
#[test]
fn v41_layer_state_follows_the_role() {
    let cfg = released();
    // (context, ratio-2 source, ratio-1 source) as (compressed KV, index keys, carry):
    // rows = C / ratio; compressed 2 x rows x 512 x 4; index keys 2 x rows x (2 x 128 + 1) x 4;
    // carry at ratio 2: the pair's kv and gate projections, 2 x 2 x 512 x 4 = 8,192; at ratio 1
    // nothing.
    // 128k: ratio 2 -> 65,536 rows: 268,435,456 + 134,742,016 + 8,192;
    //       ratio 1 -> 131,072 rows: 536,870,912 + 269,484,032 + 0.
    // 1M:   ratio 2 -> 524,288 rows: 2,147,483,648 + 1,077,936,128 + 8,192;
    //       ratio 1 -> 1,048,576 rows: 4,294,967,296 + 2,155,872,256 + 0.
    let cases = [
        (
            K128,
            (268_435_456, 134_742_016, 8_192),
            (536_870_912, 269_484_032, 0),
        ),
        (
            M1,
            (2_147_483_648, 1_077_936_128, 8_192),
            (4_294_967_296, 2_155_872_256, 0),
        ),
    ];
    for (c, two, one) in cases {
        for l in 0..40 {
            let s = layer_state(&cfg, l, c, 2048);
            assert_eq!(s.window, WINDOW_2048, "layer {l} at {c}");
            let rest = (s.compressed_kv, s.index_keys, s.compressor_carry);
            let want = match l {
                2 | 8 | 14 => two,
                20 => one,
                // window only: layers 0, 1 (SWA), reuse 3-7, ..., reindex 24, 28, 32, 36.
                _ => (0, 0, 0),
            };
            assert_eq!(rest, want, "layer {l} at {c}");
        }
    }
    // Every layer's state at 128k: 40 windows + 3 ratio-2 sources + the ratio-1 source.
    let total: u64 = (0..40)
        .map(|l| layer_state(&cfg, l, K128, 2048).total())
        .sum();
    assert_eq!(
        total,
        40 * WINDOW_2048 + 3 * (268_435_456 + 134_742_016 + 8_192) + 536_870_912 + 269_484_032
    );
    assert_eq!(total, 2_372_427_776);
    // The largest single cache: layer 20's compressed rows.
    assert_eq!(largest_cache_bytes(&cfg, M1, 2048), 4_294_967_296);
}

/// The activation phases with V4.1's dimensions (D 5120, 64 x 512 heads, 384 experts top-6,
/// moe 2304, index 32 x 128, hc_mult 4, window 128, top-k 512), the candidate stage (2,048
/// blocks of 8) and the Engram injection (24 rows x 256, wkv to 5 x 5120), by hand.
#[test]
fn v41_workspace_by_hand() {
    let m = PlanModel::v41(&released());
    let t = 2048u64;
    // Kept-block table at the candidate source, per token: min(2048, C/8) ids; 2,048 at 128k
    // and 1M. Base L = n D + D + n + n^2 + kept = 20,480 + 5,120 + 4 + 16 + 2,048 = 27,668.
    let base = 27_668u64;
    // Engram phase: 4 t (L + 2 x 24 x 256 + 5 x 5,120 + 4) + t x 24 x (264 + 8).
    let engram = 4 * t * (base + 12_288 + 25_600 + 4) + t * 24 * 272;
    // MoE phase: 4 t (L + 2 D + 3 k) + 6 t k (2 D + 3 I).
    let moe = 4 * t * (base + 10_240 + 18) + 6 * t * 6 * (10_240 + 6_912);
    // Scratch: capped at 256 MiB (the head's band, 129,280 x 5,120 x 4 B, is larger).
    let scratch = 256u64 << 20;
    let p = m.activation_phases(K128, 2048);
    assert_eq!(p.engram, engram);
    assert_eq!(p.moe, moe);
    assert_eq!(p.scratch, scratch);
    // At 128k the routed experts are the largest phase.
    let live = moe + scratch;
    assert_eq!(m.activation_peak_bytes(K128, 2048), live + live.div_ceil(8));

    // At 1M the indexer is: attention's A = L + q_lora 1,280 + H d 32,768 + d 512 + 8 d
    // 4,096 = 66,324 values a token; + index queries and weights 2 (32 x 128 + 32); per block
    // of 256 tokens the scores [256, C] and block queries [256, 32 x 128], the keys' copy
    // [C, 128], top-k candidates 12 x 256 x 512, 5 MiB of top-k tables; the candidate source's
    // block scores of the chunk t x C/8 and its top-2048 candidates 12 x 256 x 2048.
    let c = M1 as u64;
    let a = base + 1_280 + 32_768 + 512 + 4_096;
    let indexer = 4 * t * (a + 8_192 + 64)
        + 4 * 256 * c
        + 4 * c * 128
        + 4 * 256 * 32 * 128
        + 12 * 256 * 512
        + (5 << 20)
        + 4 * t * (c / 8)
        + 12 * 256 * 2048;
    let p = m.activation_phases(M1, 2048);
    assert_eq!(p.indexer, indexer);
    assert!(p.attend < indexer && p.moe < indexer, "{p:?}");
    let live = indexer + scratch;
    assert_eq!(m.activation_peak_bytes(M1, 2048), live + live.div_ceil(8));
    // The workspace: 1 GiB + the peak + the largest cache (+ logits on the last device:
    // 1,024 x 129,280 x 4).
    assert_eq!(
        workspace_bytes(&m, M1, 2048, true),
        GIB + live + live.div_ceil(8) + 4_294_967_296 + 1_024 * 129_280 * 4
    );
}

/// The released V4.1 on 8 x 80 GiB at 128k and 1M: the backbone on the GPUs, the Engram tables
/// on the host and on no GPU, the draft blocks and the vision tower left out, the state as
/// derived above; notes say what is where.
#[test]
fn v41_release_fits_8x80g_with_the_engram_tables_on_the_host() {
    let cfg = released();
    let f = released_footprint();
    let devices: DeviceSet = "8x80G".parse().unwrap();
    for (c, state) in [
        (K128, 2_372_427_776u64),
        // 40 windows + 3 x (2,147,483,648 + 1,077,936,128 + 8,192) + 4,294,967,296 +
        // 2,155,872,256.
        (M1, 16_483_639_296),
    ] {
        let p = crate::devices::placement::plan_over(&cfg, &f, &devices, c, 2048);
        assert!(p.fits, "{c}: {p:#?}");
        assert_eq!(p.devices.len(), 8);
        assert_eq!(p.weights, GPU_WEIGHTS, "no Engram table on a GPU");
        assert_eq!(p.state, state);
        assert_eq!(p.host_bytes, HOST_BYTES);
        // A token reads 24 rows x 264 B from each of 2 tables.
        assert_eq!(p.host_read_bytes_per_token, 12_672);
        assert_eq!(p.excluded_mtp_bytes, MTP_BYTES);
        assert_eq!(p.excluded_vision_bytes, EXCLUDED_VISION);
        // Contiguous, every layer placed, every device within its 80 GiB.
        let mut next = 0;
        for d in &p.devices {
            let [a, b] = d.layers.unwrap();
            assert_eq!(a, next);
            next = b + 1;
            assert!(d.total <= d.capacity && d.capacity == 80 * GIB, "{d:?}");
            assert_eq!(d.total, d.weights + d.state + d.workspace);
        }
        assert_eq!(next, 40);
        let notes = p.placement_notes.join("\n");
        for said in [
            "Engram: the tables stay on the host, memory-mapped and read by row, on no device",
            "layer 1 384,006,168 rows, layer 14 384,016,682 rows",
            "264 B a row",
            "12,672 B in all",
            "layer 1 on device 0",
            "compressed KV and index keys on the KV sources only: layer 2 (device 0)",
            "the other 36 layers hold their window only",
            "reindex layers 24, 28, 32, 36",
            "candidate stage: layer 20",
        ] {
            assert!(notes.contains(said), "{said}: {notes}");
        }
        let words = p.assumptions.join("\n");
        for said in [
            "window on every layer: 128 + 2048 (one chunk) rows x 512",
            "compressed KV on the KV sources only (2, 8, 14, 20): context/2 or context/1 rows",
            "Engram tables (embed.weight, embed.scale) on the host",
            "24 gathered rows x 256",
            "the block scores of the whole chunk",
        ] {
            assert!(words.contains(said), "{said}: {words}");
        }
        // The JSON carries the new figures.
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["host_bytes"], HOST_BYTES);
        assert_eq!(json["excluded_vision_bytes"], EXCLUDED_VISION);
        assert!(json["placement_notes"].as_array().unwrap().len() >= 3);
    }
    if std::env::var("NEEDLESCOPE_PRINT_PLAN").is_ok() {
        for c in [K128, M1] {
            let p = crate::devices::placement::plan_over(&cfg, &f, &devices, c, 2048);
            println!("{}", serde_json::to_string_pretty(&p).unwrap());
        }
    }
}

/// Too few devices: refused, with the shortfall of every device over its capacity; more than
/// the devices hold in total (278 GiB of weights on 3 x 80 GiB).
#[test]
fn v41_release_is_refused_on_3x80g() {
    let cfg = released();
    let f = released_footprint();
    let devices: DeviceSet = "3x80G".parse().unwrap();
    let p = crate::devices::placement::plan_over(&cfg, &f, &devices, K128, 2048);
    assert!(!p.fits);
    assert_eq!(p.strategy, "refused");
    assert!(p.shortfall >= GPU_WEIGHTS - 240 * GIB, "{}", p.shortfall);
    assert_eq!(
        p.shortfall,
        p.devices.iter().map(|d| d.shortfall).sum::<u64>()
    );
    assert_eq!(
        p.host_bytes, HOST_BYTES,
        "the host tables are reported either way"
    );
    // The Engram tables are not charged to a GPU: the devices' weights are the GPU weights.
    assert_eq!(p.weights, GPU_WEIGHTS);
    assert!(p.total < GPU_WEIGHTS + 3 * 8 * GIB);
}

/// A V4 plan has none of the V4.1 figures (its JSON keeps its fields), and the V4 rules are
/// unchanged: Flash at 128k on 8 x 96 GiB, figures recorded before V4.1 was planned.
#[test]
fn v4_plans_are_unchanged() {
    let cfg = ModelConfig::flash();
    let f = Footprint::of_inventory(&cfg, crate::checkpoint::WeightFormat::Official);
    assert_eq!((f.host_bytes, f.vision), (0, Tally::default()));
    let p = plan(&cfg, &f, &"8x96G".parse().unwrap(), K128, DEFAULT_CHUNK);
    assert!(p.placement_notes.is_empty());
    assert_eq!((p.host_bytes, p.excluded_vision_bytes), (0, 0));
    let json = serde_json::to_value(&p).unwrap();
    for absent in [
        "host_bytes",
        "host_read_bytes_per_token",
        "excluded_vision_bytes",
        "placement_notes",
    ] {
        assert!(json.get(absent).is_none(), "{absent}");
    }
    let fj = serde_json::to_value(&f).unwrap();
    assert!(fj.get("host_bytes").is_none() && fj.get("vision").is_none());
    // Recorded with the V4-only code (commit f076e86): state, workspace and totals; since then
    // only the last device's logit rows grew, from 256 to PROBED_LOGIT_ROWS (1,024) of 129,280
    // f32 values.
    let logits_grew = (PROBED_LOGIT_ROWS - 256) * 129_280 * 4;
    // The placement balances the devices' totals: with the last device that much heavier,
    // devices 5 and 6 trade their loads (the same two totals, the other way round).
    let mut recorded = V4_FLASH_8X96G_128K_TOTALS;
    recorded[7] += logits_grew;
    recorded.swap(5, 6);
    let totals: Vec<u64> = p.devices.iter().map(|d| d.total).collect();
    assert_eq!(totals, recorded, "{p:#?}");
    assert_eq!(p.state, V4_FLASH_8X96G_128K_STATE);
    assert_eq!(p.workspace, V4_FLASH_8X96G_128K_WORKSPACE + logits_grew);
}

/// `inspect --config flash.json --devices 8x96G --context 128k --chunk 2048` before V4.1 was
/// planned (commit f076e86).
const V4_FLASH_8X96G_128K_TOTALS: [u64; 8] = [
    22_525_033_656,
    25_274_534_160,
    21_474_099_384,
    25_274_534_160,
    21_692_306_360,
    21_474_099_384,
    25_274_534_160,
    22_884_021_196,
];
const V4_FLASH_8X96G_128K_STATE: u64 = 4_712_710_144;
const V4_FLASH_8X96G_128K_WORKSPACE: u64 = 25_144_754_176;
