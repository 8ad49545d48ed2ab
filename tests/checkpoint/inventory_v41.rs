//! The DeepSeek-V4.1 inventory computed from the released config alone reproduces the
//! official index at revision dba1be0a to the byte (docs/spec/v41.md 4.2): tensor and byte
//! totals, the per-class split of the public census, the dtype histogram, and the shapes of
//! each family of tensors.

use needlescope::checkpoint::inventory_v41::expected_inventory_v41;
use needlescope::checkpoint::{Dtype, ExpectedTensor, WeightFormat};
use needlescope::config::V41Config;
use needlescope::devices::plan::{classify, Component};
use std::collections::BTreeMap;
use std::path::Path;

fn released(file: &str) -> V41Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    V41Config::from_json_str(&text, &path).unwrap()
}

fn composite() -> V41Config {
    released("deepseek_v41_flash_config.json")
}

fn tally<'a>(inv: impl IntoIterator<Item = &'a ExpectedTensor>) -> (usize, u64) {
    inv.into_iter()
        .fold((0, 0), |(n, b), t| (n + 1, b + t.bytes()))
}

fn find<'a>(inv: &'a [ExpectedTensor], name: &str) -> &'a ExpectedTensor {
    inv.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} missing from the V4.1 inventory"))
}

fn has(inv: &[ExpectedTensor], name: &str, dtype: Dtype, shape: &[usize]) {
    let t = find(inv, name);
    assert_eq!(
        (t.dtype, t.shape.as_slice()),
        (dtype, shape),
        "{name}: dtype and shape"
    );
}

#[test]
fn released_config_gives_the_official_index_to_the_byte() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Official);
    assert_eq!(tally(&inv), (96_085, 510_286_023_000));
    let mut names: Vec<&str> = inv.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), inv.len(), "every name once");
    let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &inv {
        *hist.entry(t.dtype.as_str()).or_default() += 1;
    }
    let want: BTreeMap<&str, usize> = [
        ("BF16", 520),
        ("F32", 387),
        ("F8_E4M3", 357),
        ("F8_E8M0", 47_589),
        ("I8", 47_232),
    ]
    .into();
    assert_eq!(hist, want);
}

/// The census classes (docs/spec/v41.md 4.2) from the footprint's components.
#[test]
fn census_classes_match_the_component_split() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Official);
    let of = |cs: &[Component]| tally(inv.iter().filter(|t| cs.contains(&classify(&t.name))));
    use Component::*;
    assert_eq!(
        of(&[AttentionCore, Compressors, Indexers]),
        (563, 5_151_556_608),
        "attention"
    );
    assert_eq!(
        of(&[Norms, Mhc, ImageDelimiters]),
        (324, 158_155_200),
        "backbone_or_other"
    );
    assert_eq!(
        of(&[RouterGates, RouterBiases]),
        (120, 157_409_280),
        "router"
    );
    assert_eq!(of(&[SharedExperts]), (240, 1_416_960_000), "shared_expert");
    assert_eq!(
        of(&[RoutedExperts]),
        (92_160, 288_777_830_400),
        "routed_expert"
    );
    assert_eq!(of(&[Engram]), (12, 203_073_076_240), "engram");
    assert_eq!(of(&[Embed, Head]), (2, 2_647_654_400), "embedding_or_head");
    assert_eq!(of(&[Mtp]), (2_401, 7_932_874_632), "draft_mtp");
    assert_eq!(of(&[Vision]), (263, 970_506_240), "vision");
    assert_eq!(
        of(&[Other, HcHead, RouterHashTables]),
        (0, 0),
        "nothing else"
    );
}

#[test]
fn per_layer_and_per_block_figures() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Official);
    let layer = |l: usize| {
        let p = format!("layers.{l}.");
        tally(inv.iter().filter(|t| t.name.starts_with(&p)))
    };
    // A window-only layer without Engram: the common 2,334 tensors.
    assert_eq!(layer(0), (2_334, 7_389_500_888));
    for l in [3, 21, 25, 39] {
        assert_eq!(layer(l), layer(0), "reuse layer {l} owns no extra tensor");
    }
    let block = |i: usize| {
        let p = format!("mtp.{i}.");
        tally(inv.iter().filter(|t| t.name.starts_with(&p)))
    };
    assert_eq!(block(1), (798, 2_573_913_560));
    let (n0, b0) = block(0);
    let (n2, _) = block(2);
    assert_eq!(
        (n0, n2),
        (801, 802),
        "main_proj + main_norm; norm + two heads"
    );
    assert_eq!(b0, 2_573_913_560 + 10_240 + 5120 * 15_360 + 160 * 480);
}

#[test]
fn shapes_of_each_family_follow_the_spec() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Official);
    // 32x32 FP8 blocks.
    has(
        &inv,
        "layers.0.attn.wq_b.weight",
        Dtype::F8E4M3,
        &[32_768, 1280],
    );
    has(&inv, "layers.0.attn.wq_b.scale", Dtype::F8E8M0, &[1024, 40]);
    has(&inv, "layers.7.attn.wo_a.scale", Dtype::F8E8M0, &[256, 128]);
    has(
        &inv,
        "layers.7.ffn.shared_experts.w2.scale",
        Dtype::F8E8M0,
        &[160, 72],
    );
    // FP4 experts as in V4.
    has(
        &inv,
        "layers.5.ffn.experts.383.w1.weight",
        Dtype::I8,
        &[2304, 2560],
    );
    has(
        &inv,
        "layers.5.ffn.experts.383.w2.scale",
        Dtype::F8E8M0,
        &[5120, 72],
    );
    // Routers: no hash table, an image bias.
    has(&inv, "layers.9.ffn.gate.weight", Dtype::BF16, &[384, 5120]);
    has(&inv, "layers.9.ffn.gate.bias_vl", Dtype::F32, &[384]);
    assert!(inv.iter().all(|t| !t.name.ends_with("tid2eid")));
    assert!(inv.iter().all(|t| !t.name.contains("hc_head")));
    // Compressors on KV sources, wgate on ratio 2 only, no ape.
    has(
        &inv,
        "layers.2.attn.compressor.wgate.weight",
        Dtype::BF16,
        &[512, 5120],
    );
    has(
        &inv,
        "layers.20.attn.compressor.wkv.weight",
        Dtype::BF16,
        &[512, 5120],
    );
    for absent in [
        "layers.20.attn.compressor.wgate.weight",
        "layers.3.attn.compressor.wkv.weight",
        "layers.24.attn.compressor.wkv.weight",
        "layers.2.attn.compressor.ape",
        "layers.24.attn.indexer.wk.weight",
        "layers.21.attn.indexer.wq_b.weight",
        "layers.2.attn.indexer.compressor.wkv.weight",
    ] {
        assert!(
            inv.iter().all(|t| t.name != absent),
            "{absent} expected absent"
        );
    }
    // Indexers: on 8 layers, keys on the 4 KV sources.
    has(
        &inv,
        "layers.24.attn.indexer.wq_b.weight",
        Dtype::F8E4M3,
        &[4096, 1280],
    );
    has(
        &inv,
        "layers.24.attn.indexer.wq_b.scale",
        Dtype::F8E8M0,
        &[128, 40],
    );
    has(
        &inv,
        "layers.36.attn.indexer.weights_proj.weight",
        Dtype::BF16,
        &[32, 5120],
    );
    has(
        &inv,
        "layers.8.attn.indexer.wk.weight",
        Dtype::BF16,
        &[128, 512],
    );
    has(
        &inv,
        "layers.8.attn.indexer.k_norm.weight",
        Dtype::BF16,
        &[128],
    );
    let indexers = inv
        .iter()
        .filter(|t| t.name.ends_with("indexer.wq_b.weight"))
        .count();
    assert_eq!(indexers, 8);
    // Engram on layers 1 and 14.
    has(
        &inv,
        "layers.1.engram.embed.weight",
        Dtype::F8E4M3,
        &[384_006_168, 256],
    );
    has(
        &inv,
        "layers.14.engram.embed.scale",
        Dtype::F8E8M0,
        &[384_016_682, 8],
    );
    has(
        &inv,
        "layers.14.engram.wkv.weight",
        Dtype::F8E4M3,
        &[25_600, 6144],
    );
    has(
        &inv,
        "layers.14.engram.wkv.scale",
        Dtype::F8E8M0,
        &[800, 192],
    );
    has(&inv, "layers.1.engram.q_weight", Dtype::BF16, &[4, 5120]);
    has(&inv, "layers.1.engram.k_weight", Dtype::BF16, &[4, 5120]);
    // Draft blocks.
    has(
        &inv,
        "mtp.0.main_proj.weight",
        Dtype::F8E4M3,
        &[5120, 15_360],
    );
    has(&inv, "mtp.0.main_proj.scale", Dtype::F8E8M0, &[160, 480]);
    has(&inv, "mtp.1.ffn.gate.weight", Dtype::BF16, &[128, 5120]);
    has(
        &inv,
        "mtp.2.ffn.experts.127.w3.weight",
        Dtype::I8,
        &[2304, 2560],
    );
    has(
        &inv,
        "mtp.2.markov_head.head.weight",
        Dtype::BF16,
        &[129_280, 256],
    );
    has(
        &inv,
        "mtp.2.confidence_head.proj.weight",
        Dtype::BF16,
        &[1, 5376],
    );
    // Vision and the image delimiters.
    has(&inv, "image_newline", Dtype::BF16, &[5120]);
    has(
        &inv,
        "vision.patch_embed.proj.weight",
        Dtype::BF16,
        &[1024, 588],
    );
    has(
        &inv,
        "vision.blocks.31.mlp.w1.weight",
        Dtype::BF16,
        &[5632, 1024],
    );
    has(&inv, "aligner.w1.weight", Dtype::BF16, &[5120, 9216]);
    has(&inv, "aligner.w2.bias", Dtype::BF16, &[5120]);
}

#[test]
fn both_dialects_give_one_inventory() {
    let flat = released("deepseek_v41_flash_inference_config.json");
    for format in [WeightFormat::Official, WeightFormat::Bf16] {
        assert_eq!(
            expected_inventory_v41(&flat, format),
            expected_inventory_v41(&composite(), format),
            "{format}"
        );
    }
}

#[test]
fn bf16_format_has_no_scales_and_bf16_tables() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Bf16);
    assert!(inv.iter().all(|t| !t.name.ends_with(".scale")));
    has(
        &inv,
        "layers.1.engram.embed.weight",
        Dtype::BF16,
        &[384_006_168, 256],
    );
    has(
        &inv,
        "layers.5.ffn.experts.0.w2.weight",
        Dtype::BF16,
        &[5120, 2304],
    );
    // The official tensors less their scales.
    let official = expected_inventory_v41(&composite(), WeightFormat::Official);
    let scales = official
        .iter()
        .filter(|t| t.name.ends_with(".scale"))
        .count();
    assert_eq!(inv.len(), official.len() - scales);
}

#[test]
fn a_text_only_config_has_no_vision_tensors() {
    let mut cfg = composite();
    cfg.vision = None;
    let inv = expected_inventory_v41(&cfg, WeightFormat::Official);
    let with = expected_inventory_v41(&composite(), WeightFormat::Official);
    // 263 vision tensors, 3 delimiters, one image bias per router (40 layers + 3 draft blocks).
    assert_eq!(inv.len(), with.len() - 263 - 3 - 43);
    assert!(inv.iter().all(|t| !t.name.ends_with("bias_vl")));
}

/// NVIDIA's NVFP4 re-quantisation (docs/spec/v41.md 4.3): the 46,080 backbone expert
/// projections gain a second scale and two scalars, the draft blocks' experts stay MXFP4; the
/// payload its 48 shard headers sum to (527,273,322,840 bytes; its index still says the
/// official 510,286,023,000).
#[test]
fn nvfp4_requantisation_of_the_backbone_experts() {
    let inv = expected_inventory_v41(&composite(), WeightFormat::Nvfp4);
    assert_eq!(tally(&inv), (188_245, 527_273_322_840));
    has(
        &inv,
        "layers.3.ffn.experts.7.w1.weight",
        Dtype::U8,
        &[2304, 2560],
    );
    has(
        &inv,
        "layers.3.ffn.experts.7.w1.weight_scale",
        Dtype::F8E4M3,
        &[2304, 320],
    );
    has(
        &inv,
        "layers.3.ffn.experts.7.w2.weight_scale",
        Dtype::F8E4M3,
        &[5120, 144],
    );
    has(
        &inv,
        "layers.3.ffn.experts.7.w3.weight_scale_2",
        Dtype::F32,
        &[],
    );
    has(
        &inv,
        "layers.3.ffn.experts.7.w3.input_scale",
        Dtype::F32,
        &[],
    );
    has(
        &inv,
        "mtp.1.ffn.experts.7.w1.weight",
        Dtype::I8,
        &[2304, 2560],
    );
    has(
        &inv,
        "mtp.1.ffn.experts.7.w1.scale",
        Dtype::F8E8M0,
        &[2304, 160],
    );
    has(
        &inv,
        "layers.1.engram.embed.scale",
        Dtype::F8E8M0,
        &[384_006_168, 8],
    );
    has(&inv, "layers.3.attn.wq_a.scale", Dtype::F8E8M0, &[40, 160]);
}

/// What only a checkpoint settles is honoured as for V4: a compressor or indexer linear kind
/// stored as FP8 blocks is expected so on every layer that has it.
#[test]
fn fp8_compressor_linears_are_expected_where_a_checkpoint_stores_them() {
    use needlescope::checkpoint::inventory::{CompressorKinds, CompressorLinear, InventoryOptions};
    let mut kinds = CompressorKinds::NONE;
    kinds.insert(CompressorLinear::Wkv);
    let opts = InventoryOptions {
        fp8_compressor_linears: kinds,
        ..InventoryOptions::from(WeightFormat::Official)
    };
    let inv = expected_inventory_v41(&composite(), opts);
    let official = expected_inventory_v41(&composite(), WeightFormat::Official);
    // One more tensor (the scale) on each of the 4 KV sources.
    assert_eq!(inv.len(), official.len() + 4);
    for l in [2, 8, 14, 20] {
        has(
            &inv,
            &format!("layers.{l}.attn.compressor.wkv.weight"),
            Dtype::F8E4M3,
            &[512, 5120],
        );
        has(
            &inv,
            &format!("layers.{l}.attn.compressor.wkv.scale"),
            Dtype::F8E8M0,
            &[16, 160],
        );
    }
    has(
        &inv,
        "layers.2.attn.compressor.wgate.weight",
        Dtype::BF16,
        &[512, 5120],
    );
}
