//! Tests of `config::v41`: the two dialects of DeepSeek-V4.1-Flash give one description, its
//! 40 layer roles are docs/spec/v41.md section 3, each structural refusal names its field, and
//! V4 configs load as before while `ModelConfig::load` refuses a V4.1 config by name.

use super::v41::{Dialect, V41Config};
use super::*;
use serde_json::{json, Value};

/// The release's composite `config.json` (values of docs/spec/v41.md 2.2-2.4).
const COMPOSITE: &str = include_str!("../../tests/fixtures/deepseek_v41_flash_config.json");
/// The reference dialect (`inference/config.json`) of the same model.
const REFERENCE: &str =
    include_str!("../../tests/fixtures/deepseek_v41_flash_inference_config.json");

fn composite() -> Value {
    serde_json::from_str(COMPOSITE).unwrap()
}
fn reference() -> Value {
    serde_json::from_str(REFERENCE).unwrap()
}
fn load(v: &Value) -> Result<V41Config, ConfigError> {
    V41Config::from_json_str(&v.to_string(), Path::new("v41/config.json"))
}
/// The refusal of an edited config; it must name the config's path.
fn refusal(v: &Value) -> String {
    let msg = load(v).unwrap_err().to_string();
    assert!(msg.contains("v41/config.json"), "{msg}");
    msg
}

#[test]
fn composite_and_reference_dialects_give_the_same_description() {
    let c = load(&composite()).unwrap();
    let r = load(&reference()).unwrap();
    assert_eq!(c.dialect, Dialect::Composite);
    assert_eq!(r.dialect, Dialect::Reference);
    assert_eq!(
        V41Config {
            dialect: Dialect::Composite,
            ..r.clone()
        },
        c
    );
    // Every field of the chapter, read.
    let t = &c.text;
    assert_eq!(
        (t.vocab_size, t.hidden_size, t.num_hidden_layers),
        (129280, 5120, 40)
    );
    assert_eq!(
        (t.num_attention_heads, t.head_dim, t.qk_rope_head_dim),
        (64, 512, 64)
    );
    assert_eq!((t.q_lora_rank, t.o_lora_rank, t.o_groups), (1280, 1024, 8));
    assert_eq!(t.moe_intermediate_size, 2304);
    assert_eq!(
        (
            t.n_routed_experts,
            t.n_shared_experts,
            t.num_experts_per_tok
        ),
        (384, 1, 6)
    );
    assert_eq!(t.rms_norm_eps, 1e-20);
    assert_eq!((t.rope_theta, t.compress_rope_theta), (10000.0, 160000.0));
    let rs = t.rope_scaling.as_ref().unwrap();
    assert_eq!(
        (rs.factor, rs.original_max_position_embeddings),
        (16.0, 65536)
    );
    assert_eq!(t.compress_ratios.len(), 43);
    assert_eq!(t.kv_source_layer_ids, vec![2, 8, 14, 20]);
    assert_eq!(t.index_source_layer_ids, vec![2, 8, 14, 20, 24, 28, 32, 36]);
    assert_eq!(
        (t.index_n_heads, t.index_head_dim, t.index_topk),
        (32, 128, 512)
    );
    assert_eq!(c.candidate_source(), Some(20));
    assert_eq!((t.candidate_topk_blocks, t.candidate_block_size), (2048, 8));
    assert_eq!(t.engram_layer_ids, vec![1, 14]);
    assert_eq!(t.engram_num_embeddings, vec![384006168, 384016682]);
    assert_eq!(
        (t.engram_max_ngram_size, t.engram_vocab_size),
        (4, 16000000)
    );
    assert_eq!((t.engram_n_heads, t.engram_head_dim), (8, 256));
    assert_eq!(
        (t.engram_pad_token_id, t.engram_compressed_vocab_size),
        (2, 99092)
    );
    assert_eq!((t.num_nextn_predict_layers, t.dspark_block_size), (3, 5));
    assert_eq!(t.dspark_noise_token_id, Some(128799));
    assert_eq!(t.dspark_target_layer_ids, vec![37, 38, 39]);
    assert_eq!(
        (t.dspark_markov_rank, t.dspark_n_routed_experts),
        (256, 128)
    );
    assert_eq!(t.dspark_num_experts_per_tok, 3);
    assert_eq!(c.draft_blocks(), 3);
    assert_eq!(c.image_token_id, Some(129264));
    assert_eq!(c.weights.dtype, "fp8");
    assert_eq!(c.weights.block, Some((32, 32)));
    assert_eq!(c.weights.expert_dtype.as_deref(), Some("fp4"));
    let v = c.vision.as_ref().unwrap();
    assert_eq!(
        (v.num_hidden_layers, v.hidden_size, v.num_attention_heads),
        (32, 1024, 16)
    );
    assert_eq!(
        (v.intermediate_size, v.patch_size, v.downsample_ratio),
        (2816, 14, 3)
    );
    assert_eq!(
        (v.max_image_tokens, v.min_pixels, v.max_wh_ratio),
        (1024, 295936, None)
    );
}

#[test]
fn the_family_comes_from_model_type_or_the_key_set_never_a_layer_count() {
    assert_eq!(Family::of_json_str(COMPOSITE), Family::V41);
    assert_eq!(Family::of_json_str(REFERENCE), Family::V41);
    // In text_config only.
    let mut v = composite();
    v.as_object_mut().unwrap().remove("model_type");
    assert_eq!(Family::of_json_str(&v.to_string()), Family::V41);
    // Folded (text fields at the top level): loads too.
    let mut folded = composite();
    let text = folded["text_config"].clone();
    let top = folded.as_object_mut().unwrap();
    top.remove("text_config");
    for (k, val) in text.as_object().unwrap() {
        top.entry(k.clone()).or_insert(val.clone());
    }
    let f = load(&folded).unwrap();
    assert_eq!(f.dialect, Dialect::Folded);
    assert_eq!(f.layer_roles(), load(&composite()).unwrap().layer_roles());
    // V4 with a V4.1-like layer count stays V4; V4's model_type wins over the key set.
    let mut v4 = flash_config_json();
    v4["num_hidden_layers"] = json!(40);
    assert_eq!(Family::of_json_str(&v4.to_string()), Family::V4);
    let mut v4 = flash_config_json();
    v4["engram_layer_ids"] = json!([1]);
    assert_eq!(Family::of_json_str(&v4.to_string()), Family::V4);
    v4.as_object_mut().unwrap().remove("model_type");
    assert_eq!(Family::of_json_str(&v4.to_string()), Family::V41);
}

#[test]
fn load_any_dispatches_and_model_config_load_refuses_v41_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let v41 = tmp.path().join("v41");
    std::fs::create_dir(&v41).unwrap();
    std::fs::write(v41.join("config.json"), COMPOSITE).unwrap();
    let d = load_any(&v41).unwrap();
    assert_eq!(d.family(), Family::V41);
    assert_eq!(d.layer_roles().len(), 40);
    let msg = ModelConfig::load(&v41).unwrap_err().to_string();
    assert!(
        msg.contains("DeepSeek-V4.1 (model_type deepseek_v41) is not supported by this command"),
        "{msg}"
    );
    assert!(
        msg.contains(&v41.join("config.json").display().to_string()),
        "{msg}"
    );
    // The reference dialect too.
    let flat = tmp.path().join("inference.json");
    std::fs::write(&flat, REFERENCE).unwrap();
    assert!(ModelConfig::load(&flat)
        .unwrap_err()
        .to_string()
        .contains("DeepSeek-V4.1"));
    assert_eq!(load_any(&flat).unwrap().family(), Family::V41);
    // V4 through load_any: the same ModelConfig as ModelConfig::load.
    let v4 = tmp.path().join("v4.json");
    std::fs::write(&v4, ModelConfig::flash().to_json_string()).unwrap();
    assert_eq!(
        load_any(&v4).unwrap(),
        ModelDescription::V4(ModelConfig::load(&v4).unwrap())
    );
    // The V4.1 loader reads both dialects into one description (one hash) and names a V4
    // config the other way round.
    let a = V41Config::load(&v41).unwrap();
    let b = V41Config::load(&flat).unwrap();
    assert_eq!(a.hash_hex(), b.hash_hex());
    let mut c = a.clone();
    c.text.index_topk = 1024;
    assert_ne!(c.hash_hex(), a.hash_hex());
    let msg = V41Config::load(&v4).unwrap_err().to_string();
    assert!(
        msg.contains("DeepSeek-V4 (model_type deepseek_v4) found where a DeepSeek-V4.1 config"),
        "{msg}"
    );
}

/// The serialised V4 config and its hash (what synth writes and what report directories
/// carry) are what they were before V4.1 was read.
#[test]
fn v4_flash_loads_to_the_same_config_and_hash() {
    let c = ModelConfig::flash();
    let back = ModelConfig::from_json_str(&c.to_json_string(), Path::new("x")).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.hash_hex(), c.hash_hex());
    assert_eq!(c.hash_hex(), FLASH_HASH);
    let keys: Vec<String> = flash_config_json()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(!keys
        .iter()
        .any(|k| k.contains("source") || k.contains("family")));
}

/// `ModelConfig::flash().hash_hex()` as computed before this family was added.
const FLASH_HASH: &str = "f0168d24b5c8a4c427814ef8bfc927e6a80b42b16794227a1a47572cee15503b";

#[test]
fn the_40_layer_roles_are_the_chapters_table() {
    let c = load(&composite()).unwrap();
    let roles = c.layer_roles();
    assert_eq!(roles.len(), 40);
    let latest = |sources: &[usize], l: usize| sources.iter().rev().find(|&&s| s <= l).copied();
    for (l, role) in roles.iter().enumerate() {
        assert_eq!(role.layer, l);
        let (kind, ratio) = match l {
            0 | 1 => (LayerKind::Swa, 0),
            2..=19 => (LayerKind::Csa2, 2),
            _ => (LayerKind::Csa1, 1),
        };
        assert_eq!((role.kind, role.ratio), (kind, ratio), "layer {l}");
        assert_eq!(c.layer_kind(l), kind, "layer {l}");
        // docs/spec/v41.md 3, row by row.
        let (kv, index, stage) = match l {
            0 | 1 => (None, None, CandidateStage::None),
            2..=7 => (Some(2), Some(2), CandidateStage::None),
            8..=13 => (Some(8), Some(8), CandidateStage::None),
            14..=19 => (Some(14), Some(14), CandidateStage::None),
            20 => (Some(20), Some(20), CandidateStage::Source),
            21..=23 => (Some(20), Some(20), CandidateStage::None),
            24 | 28 | 32 | 36 => (Some(20), Some(l), CandidateStage::Consumer { source: 20 }),
            25..=27 => (Some(20), Some(24), CandidateStage::None),
            29..=31 => (Some(20), Some(28), CandidateStage::None),
            33..=35 => (Some(20), Some(32), CandidateStage::None),
            _ => (Some(20), Some(36), CandidateStage::None), // 37-39, DSpark targets
        };
        assert_eq!(role.kv_source, kv, "layer {l} kv source");
        assert_eq!(role.index_source, index, "layer {l} index source");
        assert_eq!(role.candidate_stage, stage, "layer {l} candidate stage");
        // The same by the rule of 2.5.
        if ratio > 0 {
            assert_eq!(role.kv_source, latest(&[2, 8, 14, 20], l), "layer {l}");
        }
        let rows = match ratio {
            0 => None,
            r => Some(RowMapping {
                ratio: r,
                overlap: false,
            }),
        };
        assert_eq!(roles.rows(l), rows, "layer {l} rows");
        assert_eq!(roles.owns_kv(l), [2, 8, 14, 20].contains(&l), "layer {l}");
    }
    assert_eq!(roles.indexed_layers(), vec![2, 8, 14, 20, 24, 28, 32, 36]);
    assert_eq!(roles.layers_of_kind(LayerKind::Swa), vec![0, 1]);
    assert_eq!(roles.layers_of_kind(LayerKind::Csa2).len(), 18);
    assert_eq!(roles.layers_of_kind(LayerKind::Csa1).len(), 20);
    assert_eq!(
        c.schedule_summary(),
        "40 layers: 2 SWA, 18 CSA2, 20 CSA1; KV sources 2, 8, 14, 20, index sources 2, 8, 14, \
         20, 24, 28, 32, 36, candidate source 20; Engram on 1, 14; 3 draft blocks"
    );
    assert_eq!(CandidateStage::Source.name(), Some("source"));
    assert_eq!(
        CandidateStage::Consumer { source: 20 }.name(),
        Some("consumer")
    );
    assert_eq!(
        (LayerKind::Csa2.name(), LayerKind::Csa1.name()),
        ("csa2", "csa1")
    );
    // No V4 ratio reads as a V4.1 kind, and no V4.1 ratio as a V4 kind.
    assert_eq!(LayerKind::from_ratio(2), None);
    assert_eq!(LayerKind::from_ratio(1), None);
    assert_eq!(LayerKind::from_v41_ratio(4), None);
    // Without a candidate stage, no layer has one.
    let mut v = composite();
    v["text_config"]["candidate_source_layer_id"] = json!(-1);
    let none = load(&v).unwrap();
    assert!(none
        .layer_roles()
        .iter()
        .all(|r| r.candidate_stage == CandidateStage::None));
}

/// Edits `text_config.<field>` of the composite config, or `<field>` of the reference one.
fn edit(dialect: Dialect, field: &str, value: Value) -> Value {
    match dialect {
        Dialect::Reference => {
            let mut v = reference();
            v[field] = value;
            v
        }
        _ => {
            let mut v = composite();
            v["text_config"][field] = value;
            v
        }
    }
}

#[test]
fn sources_not_ascending_or_out_of_range_are_refused_naming_the_field() {
    let msg = refusal(&edit(
        Dialect::Composite,
        "kv_source_layer_ids",
        json!([2, 14, 8, 20]),
    ));
    assert!(msg.contains("`text_config.kv_source_layer_ids`"), "{msg}");
    assert!(msg.contains("strictly ascending"), "{msg}");
    let msg = refusal(&edit(
        Dialect::Composite,
        "index_source_layer_ids",
        json!([2, 8, 14, 20, 24, 28, 32, 36, 40]),
    ));
    assert!(
        msg.contains("`text_config.index_source_layer_ids`"),
        "{msg}"
    );
    assert!(msg.contains("below num_hidden_layers = 40"), "{msg}");
    // The reference dialect names its own spelling.
    let msg = refusal(&edit(
        Dialect::Reference,
        "kv_source_layers",
        json!([2, 8, 8, 20]),
    ));
    assert!(msg.contains("`kv_source_layers`"), "{msg}");
    let msg = refusal(&edit(
        Dialect::Reference,
        "index_source_layers",
        json!([2, 8, 14, 20, 24, 99]),
    ));
    assert!(
        msg.contains("`index_source_layers`") && msg.contains("99"),
        "{msg}"
    );
    // A source on a window-only layer.
    let msg = refusal(&edit(
        Dialect::Composite,
        "kv_source_layer_ids",
        json!([1, 2, 8, 14, 20]),
    ));
    assert!(
        msg.contains("`text_config.kv_source_layer_ids`") && msg.contains("ratio 0"),
        "{msg}"
    );
}

#[test]
fn an_index_source_without_a_kv_source_at_or_below_it_is_refused() {
    let mut v = composite();
    v["text_config"]["kv_source_layer_ids"] = json!([8, 14, 20]);
    let msg = refusal(&v);
    assert!(
        msg.contains("`text_config.index_source_layer_ids`"),
        "{msg}"
    );
    assert!(
        msg.contains("layer 2 has no KV source at or below it"),
        "{msg}"
    );
}

#[test]
fn a_candidate_source_that_is_not_an_index_source_is_refused() {
    for (dialect, field, spelled) in [
        (
            Dialect::Composite,
            "candidate_source_layer_id",
            "`text_config.candidate_source_layer_id`",
        ),
        (
            Dialect::Reference,
            "candidate_source_layer",
            "`candidate_source_layer`",
        ),
    ] {
        let msg = refusal(&edit(dialect, field, json!(21)));
        assert!(msg.contains(spelled), "{msg}");
        assert!(
            msg.contains("21") && msg.contains("one of the index sources"),
            "{msg}"
        );
    }
}

#[test]
fn candidate_blocks_too_small_for_index_topk_are_refused() {
    let msg = refusal(&edit(
        Dialect::Composite,
        "candidate_topk_blocks",
        json!(63),
    ));
    assert!(msg.contains("`text_config.candidate_topk_blocks`"), "{msg}");
    assert!(msg.contains("63 blocks x 8 rows"), "{msg}");
    assert!(
        msg.contains("= 504") && msg.contains("index_topk = 512"),
        "{msg}"
    );
    // 64 x 8 = 512 is enough.
    load(&edit(
        Dialect::Composite,
        "candidate_topk_blocks",
        json!(64),
    ))
    .unwrap();
    let msg = refusal(&edit(Dialect::Composite, "candidate_block_size", json!(0)));
    assert!(
        msg.contains("candidate_topk_blocks") && msg.contains("candidate_block_size"),
        "{msg}"
    );
}

#[test]
fn per_layer_lists_of_the_wrong_length_are_refused() {
    let mut v = composite();
    v["text_config"]["compress_ratios"]
        .as_array_mut()
        .unwrap()
        .pop();
    let msg = refusal(&v);
    assert!(msg.contains("`text_config.compress_ratios`"), "{msg}");
    assert!(
        msg.contains("42 entries") && msg.contains("40") && msg.contains("43"),
        "{msg}"
    );
    // 40 (no draft entries) is accepted.
    let mut v = composite();
    v["text_config"]["compress_ratios"]
        .as_array_mut()
        .unwrap()
        .truncate(40);
    assert_eq!(load(&v).unwrap().draft_blocks(), 0);
    // Engram tables against their layers.
    let msg = refusal(&edit(
        Dialect::Composite,
        "engram_num_embeddings",
        json!([384006168]),
    ));
    assert!(msg.contains("`text_config.engram_num_embeddings`"), "{msg}");
    assert!(
        msg.contains("1 entries") && msg.contains("2 entries"),
        "{msg}"
    );
    let msg = refusal(&edit(
        Dialect::Reference,
        "engram_layer_ids",
        json!([1, 14, 20]),
    ));
    assert!(msg.contains("`engram_num_embeddings`"), "{msg}");
}

#[test]
fn a_compress_ratio_other_than_0_1_2_is_refused() {
    let mut v = composite();
    v["text_config"]["compress_ratios"][5] = json!(4);
    let msg = refusal(&v);
    assert!(
        msg.contains("`text_config.compress_ratios[5]` is 4"),
        "{msg}"
    );
    assert!(msg.contains("0, 1, 2"), "{msg}");
    let mut v = reference();
    v["compress_ratios"][30] = json!(128);
    let msg = refusal(&v);
    assert!(msg.contains("`compress_ratios[30]` is 128"), "{msg}");
    // A draft block's entry must be 0.
    let mut v = composite();
    v["text_config"]["compress_ratios"][41] = json!(2);
    assert!(refusal(&v).contains("`text_config.compress_ratios[41]`"));
    // A layer whose ratio differs from its KV source's.
    let mut v = composite();
    v["text_config"]["compress_ratios"][19] = json!(1);
    let msg = refusal(&v);
    assert!(
        msg.contains("`text_config.compress_ratios[19]`") && msg.contains("layer 14"),
        "{msg}"
    );
}

#[test]
fn a_missing_or_mistyped_field_is_named_as_the_dialect_spells_it() {
    let mut v = composite();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("candidate_block_size");
    let msg = refusal(&v);
    assert!(msg.contains("text_config.candidate_block_size"), "{msg}");
    let mut v = reference();
    v.as_object_mut().unwrap().remove("dim");
    let msg = refusal(&v);
    assert!(msg.contains("hidden_size") || msg.contains("dim"), "{msg}");
    let msg = refusal(&edit(Dialect::Reference, "engram_pad_id", json!("two")));
    assert!(msg.contains("`engram_pad_id`"), "{msg}");
    let mut v = composite();
    v["quantization_config"]["quant_method"] = json!("gptq");
    assert!(refusal(&v).contains("`quantization_config.quant_method`"));
    let mut v = composite();
    v["quantization_config"]["moe_quant_algo"] = json!("AWQ");
    assert!(refusal(&v).contains("`quantization_config.moe_quant_algo`"));
    v["quantization_config"]["moe_quant_algo"] = json!("NVFP4");
    let cfg = V41Config::from_value(v, Path::new("config.json")).unwrap();
    assert!(cfg.weights.experts_nvfp4);
    assert!(
        !V41Config::from_json_str(COMPOSITE, Path::new("c"))
            .unwrap()
            .weights
            .experts_nvfp4
    );
}

/// The sizes only V4.1 has are bounded like V4's, so no figure built from them wraps; each
/// refusal names the field as the file spells it.
#[test]
fn v41_only_sizes_are_bounded_by_name() {
    let mut v = composite();
    v["text_config"]["engram_num_embeddings"] = json!([1u64 << 62, 384016682]);
    let msg = refusal(&v);
    assert!(
        msg.contains("`text_config.engram_num_embeddings[0]`") && msg.contains("at most"),
        "{msg}"
    );
    let mut v = composite();
    v["vision_config"]["hidden_size"] = json!(1u64 << 40);
    assert!(refusal(&v).contains("`vision_config.hidden_size`"));
    let mut v = composite();
    v["text_config"]["dspark_n_routed_experts"] = json!(1_000_000_000u64);
    assert!(refusal(&v).contains("`text_config.dspark_n_routed_experts`"));
    let mut v = reference();
    v["vision_dim"] = json!(1u64 << 40);
    assert!(refusal(&v).contains("`vision_dim`"));
    let mut v = reference();
    v["engram_head_dim"] = json!(1 << 20);
    assert!(refusal(&v).contains("`engram_head_dim`"));
    // The released values pass with room: each bound is at least 16x.
    let c = load(&composite()).unwrap();
    for (name, max) in super::v41::V41_SIZE_LIMITS {
        let released = match name {
            "engram_num_embeddings" => 384_016_682,
            "engram_vocab_size" => c.text.engram_vocab_size,
            other => serde_json::to_value(&c.text).unwrap()[other]
                .as_u64()
                .unwrap(),
        };
        assert!(max >= 16 * released, "{name}: {max} < 16 x {released}");
    }
}

/// `V41Config::load` names what it found: a parse error as such, another model by its
/// `model_type`, a V4 config as V4.
#[test]
fn the_v41_loader_names_what_it_found() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("config.json");
    std::fs::write(&path, "{ not json").unwrap();
    let msg = V41Config::load(&path).unwrap_err().to_string();
    assert!(!msg.contains("DeepSeek-V4 (model_type"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    std::fs::write(&path, r#"{"model_type": "llama"}"#).unwrap();
    let msg = V41Config::load(&path).unwrap_err().to_string();
    assert!(
        msg.contains("`model_type`") && msg.contains("\"llama\""),
        "{msg}"
    );
    std::fs::write(&path, ModelConfig::flash().to_json_string()).unwrap();
    let msg = V41Config::load(&path).unwrap_err().to_string();
    assert!(
        msg.contains("DeepSeek-V4 (model_type deepseek_v4) found"),
        "{msg}"
    );
}
