//! Tests of `config.rs`: schedules, JSON round trips and refusals naming the field.

use super::*;

#[test]
fn flash_schedule_has_2_swa_21_csa_20_hca() {
    let c = ModelConfig::flash();
    c.validate(Path::new("flash")).unwrap();
    assert_eq!(c.layers_of_kind(LayerKind::Swa), vec![0, 1]);
    assert_eq!(c.layers_of_kind(LayerKind::Csa).len(), 21);
    assert_eq!(c.layers_of_kind(LayerKind::Hca).len(), 20);
    assert_eq!(c.layer_kind(2), LayerKind::Csa);
    assert_eq!(c.layer_kind(3), LayerKind::Hca);
    assert_eq!(c.layer_kind(42), LayerKind::Csa);
    assert_eq!(c.mtp_layer_kind(0), LayerKind::Swa);
    assert_eq!(c.router_kind(2), RouterKind::Hash);
    assert_eq!(c.router_kind(3), RouterKind::Score);
    assert_eq!(c.compress_ratios.len(), 44);
}

#[test]
fn tiny_has_every_layer_and_router_kind() {
    let c = ModelConfig::tiny();
    c.validate(Path::new("tiny")).unwrap();
    let kinds: Vec<_> = (0..4).map(|l| c.layer_kind(l)).collect();
    assert_eq!(
        kinds,
        vec![
            LayerKind::Swa,
            LayerKind::Csa,
            LayerKind::Hca,
            LayerKind::Csa
        ]
    );
    assert_eq!(c.router_kind(1), RouterKind::Hash);
    assert_eq!(c.router_kind(2), RouterKind::Score);
    assert!(c.index_n_heads >= 16);
}

#[test]
fn config_round_trips_through_json() {
    let c = ModelConfig::flash();
    let back = ModelConfig::from_json_str(&c.to_json_string(), Path::new("x")).unwrap();
    assert_eq!(c, back);
}

#[test]
fn bad_ratio_names_field_value_and_expectation() {
    let mut v = flash_config_json();
    v["compress_ratios"][5] = serde_json::json!(16);
    let err = ModelConfig::from_json_str(&v.to_string(), Path::new("cfg.json")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("compress_ratios[5]"), "{msg}");
    assert!(msg.contains("16"), "{msg}");
    assert!(msg.contains("0, 4, 128"), "{msg}");
    assert!(msg.contains("cfg.json"), "{msg}");
}

/// Flash-0731 lists 46 ratios (`..., 4, 0, 0, 0`): extra trailing entries are accepted and
/// the 43 main layers keep their schedule.
#[test]
fn extra_trailing_ratios_are_accepted() {
    let mut v = flash_config_json();
    let ratios = v["compress_ratios"].as_array_mut().unwrap();
    ratios.extend([serde_json::json!(0), serde_json::json!(0)]);
    assert_eq!(ratios.len(), 46);
    let cfg = ModelConfig::from_json_str(&v.to_string(), Path::new("c")).unwrap();
    assert_eq!(cfg.csa_layers().len(), 21);
    assert_eq!(cfg.layer_kind(42), LayerKind::Csa);
}

#[test]
fn wrong_ratio_count_is_rejected() {
    let mut v = flash_config_json();
    v["compress_ratios"].as_array_mut().unwrap().pop();
    v["compress_ratios"].as_array_mut().unwrap().pop();
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("c"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("compress_ratios") && msg.contains("42"),
        "{msg}"
    );
}

#[test]
fn missing_field_is_a_parse_error_naming_it() {
    let mut v = flash_config_json();
    v.as_object_mut().unwrap().remove("index_topk");
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("c"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("index_topk"), "{msg}");
}

#[test]
fn rope_dim_larger_than_head_is_rejected() {
    let mut v = flash_config_json();
    v["qk_rope_head_dim"] = serde_json::json!(1024);
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("c"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("qk_rope_head_dim") && msg.contains("1024"),
        "{msg}"
    );
}

#[test]
fn pro_like_config_validates() {
    let mut c = ModelConfig::flash();
    c.hidden_size = 7168;
    c.num_hidden_layers = 61;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.o_groups = 16;
    c.n_routed_experts = 384;
    c.moe_intermediate_size = 3072;
    c.routed_scaling_factor = 2.5;
    c.index_topk = 1024;
    let mut r = vec![128, 128];
    for l in 2..61 {
        r.push(if l % 2 == 0 { 4 } else { 128 });
    }
    r.push(0);
    c.compress_ratios = r;
    c.validate(Path::new("pro")).unwrap();
    assert_eq!(c.layers_of_kind(LayerKind::Csa).len(), 30);
}

#[test]
fn rope_scaling_may_carry_type_and_rope_type_if_they_agree() {
    let mut v = flash_config_json();
    v["rope_scaling"]["rope_type"] = serde_json::json!("yarn");
    let c = ModelConfig::from_json_str(&v.to_string(), Path::new("cfg.json")).unwrap();
    assert_eq!(c.rope_scaling.unwrap().kind, "yarn");
    v["rope_scaling"]["rope_type"] = serde_json::json!("linear");
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("cfg.json"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("cfg.json") && msg.contains("rope_type"),
        "{msg}"
    );
    assert!(msg.contains("\"linear\""), "{msg}");
    // Only `rope_type`: read as the kind.
    let mut only = flash_config_json();
    let kind = only["rope_scaling"]
        .as_object_mut()
        .unwrap()
        .remove("type")
        .unwrap();
    only["rope_scaling"]["rope_type"] = kind;
    let c = ModelConfig::from_json_str(&only.to_string(), Path::new("cfg.json")).unwrap();
    assert_eq!(c.rope_scaling.unwrap().kind, "yarn");
}

#[test]
fn a_config_resaved_by_transformers_is_refused_naming_what_is_missing() {
    // What transformers 5.x writes: rope_parameters (main / compress) instead of rope_scaling.
    let mut v = flash_config_json();
    let yarn = v.as_object_mut().unwrap().remove("rope_scaling").unwrap();
    v["rope_parameters"] = serde_json::json!({
        "main": {"rope_type": "default", "rope_theta": 10000.0},
        "compress": yarn,
    });
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("cfg.json"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cfg.json"), "{msg}");
    assert!(msg.contains("`rope_scaling`"), "{msg}");
    assert!(
        msg.contains("rope_parameters") && msg.contains("re-saved by transformers"),
        "{msg}"
    );
    // And with layer_types instead of compress_ratios, both are named.
    let ratios = v
        .as_object_mut()
        .unwrap()
        .remove("compress_ratios")
        .unwrap();
    v["layer_types"] = ratios;
    let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("cfg.json"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`compress_ratios, rope_scaling`"), "{msg}");
}

fn refusal(v: &serde_json::Value) -> String {
    ModelConfig::from_json_str(&v.to_string(), Path::new("c/config.json"))
        .unwrap_err()
        .to_string()
}

/// `vocab_size` 2^63 used to pass and overflow every memory figure into `0 B`.
#[test]
fn a_size_field_past_its_sanity_bound_is_refused_naming_field_and_bound() {
    let mut v = flash_config_json();
    v["vocab_size"] = serde_json::json!(1u64 << 63);
    let msg = refusal(&v);
    assert!(msg.contains("c/config.json"), "{msg}");
    assert!(
        msg.contains("`vocab_size`") && msg.contains("9223372036854775808"),
        "{msg}"
    );
    assert!(msg.contains("at most 2097152"), "{msg}");
    // Every bounded field: one past its bound is refused by name, the bound itself is not
    // refused for being too large.
    for l in &limits::SIZE_LIMITS {
        let mut v = flash_config_json();
        v[l.field] = serde_json::json!(l.max + 1);
        let msg = refusal(&v);
        assert!(
            msg.contains(&format!("`{}` is {}", l.field, l.max + 1)),
            "{}: {msg}",
            l.field
        );
        v[l.field] = serde_json::json!(l.max);
        if let Err(e) = ModelConfig::from_json_str(&v.to_string(), Path::new("c")) {
            assert!(!e.to_string().contains("sanity bound"), "{}: {e}", l.field);
        }
    }
}

#[test]
fn size_bounds_are_at_least_16x_the_released_models() {
    let flash = ModelConfig::flash();
    for l in &limits::SIZE_LIMITS {
        assert!(
            l.max >= 16 * l.largest_released,
            "{}: bound {} under 16 x {}",
            l.field,
            l.max,
            l.largest_released
        );
        let v = serde_json::to_value(&flash).unwrap()[l.field]
            .as_u64()
            .unwrap();
        assert!(
            v as usize <= l.largest_released,
            "{}: Flash has {v}",
            l.field
        );
    }
    // The released values of V4-Pro (docs/spec/model.md 1.2) stay accepted.
    let mut v = flash_config_json();
    for (field, value) in [
        ("hidden_size", 7168),
        ("num_attention_heads", 128),
        ("q_lora_rank", 1536),
        ("o_groups", 16),
        ("n_routed_experts", 384),
        ("moe_intermediate_size", 3072),
        ("index_topk", 1024),
    ] {
        v[field] = serde_json::json!(value);
    }
    ModelConfig::from_json_str(&v.to_string(), Path::new("pro")).unwrap();
}

#[test]
fn oversized_block_ratio_list_and_rope_original_are_refused() {
    let mut v = flash_config_json();
    v["quantization_config"]["weight_block_size"] = serde_json::json!([128, 1u64 << 40]);
    assert!(
        refusal(&v).contains("quantization_config.weight_block_size"),
        "{}",
        refusal(&v)
    );
    let mut v = flash_config_json();
    v["compress_ratios"] = serde_json::json!(vec![0; 100_000]);
    assert!(refusal(&v).contains("`compress_ratios`"), "{}", refusal(&v));
    let mut v = flash_config_json();
    v["rope_scaling"]["original_max_position_embeddings"] = serde_json::json!(0);
    let msg = refusal(&v);
    assert!(
        msg.contains("rope_scaling.original_max_position_embeddings") && msg.contains("is 0"),
        "{msg}"
    );
}

#[test]
fn zero_max_position_embeddings_is_refused_but_small_ones_load() {
    let mut v = flash_config_json();
    v["max_position_embeddings"] = serde_json::json!(0);
    let msg = refusal(&v);
    assert!(
        msg.contains("c/config.json") && msg.contains("`max_position_embeddings` is 0"),
        "{msg}"
    );
    assert!(msg.contains("positive"), "{msg}");
    v["max_position_embeddings"] = serde_json::json!(64);
    let c = ModelConfig::from_json_str(&v.to_string(), Path::new("c")).unwrap();
    assert_eq!(c.max_position_embeddings, 64);
}

#[test]
fn unknown_quant_method_is_refused_naming_the_accepted_ones() {
    let mut v = flash_config_json();
    v["quantization_config"]["quant_method"] = serde_json::json!("gptq");
    let msg = refusal(&v);
    assert!(msg.contains("c/config.json"), "{msg}");
    assert!(
        msg.contains("`quantization_config.quant_method` is \"gptq\""),
        "{msg}"
    );
    assert!(
        msg.contains("\"fp8\"") && msg.contains("\"modelopt\"") && msg.contains("absent"),
        "{msg}"
    );
    for method in [Some("fp8"), Some("modelopt"), None] {
        let mut v = flash_config_json();
        match method {
            Some(m) => v["quantization_config"]["quant_method"] = serde_json::json!(m),
            None => {
                v["quantization_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("quant_method");
            }
        }
        ModelConfig::from_json_str(&v.to_string(), Path::new("c")).unwrap();
    }
    // No quantization_config at all (bf16): accepted.
    let mut v = flash_config_json();
    v.as_object_mut().unwrap().remove("quantization_config");
    ModelConfig::from_json_str(&v.to_string(), Path::new("c")).unwrap();
}

#[test]
fn another_model_type_is_refused_and_an_absent_one_is_deepseek_v4() {
    let mut v = flash_config_json();
    v["model_type"] = serde_json::json!("llama");
    let msg = refusal(&v);
    assert!(
        msg.contains("c/config.json") && msg.contains("`model_type` is \"llama\""),
        "{msg}"
    );
    assert!(msg.contains("\"deepseek_v4\""), "{msg}");
    v.as_object_mut().unwrap().remove("model_type");
    let c = ModelConfig::from_json_str(&v.to_string(), Path::new("c")).unwrap();
    assert_eq!(c.model_type, "deepseek_v4");
}

#[test]
fn the_presets_still_validate() {
    for c in [ModelConfig::flash(), ModelConfig::tiny()] {
        let back = ModelConfig::from_json_str(&c.to_json_string(), Path::new("p")).unwrap();
        assert_eq!(back, c);
    }
}

#[test]
fn a_directory_named_config_json_is_reported_as_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("config.json");
    std::fs::create_dir(&dir).unwrap();
    for given in [dir.clone(), tmp.path().to_path_buf()] {
        let msg = ModelConfig::load(&given).unwrap_err().to_string();
        assert!(
            msg.contains(&format!(
                "{} is a directory, expected a file",
                dir.display()
            )),
            "{msg}"
        );
        assert!(!msg.contains("config.json/config.json"), "{msg}");
    }
    // A model directory without config.json still names the file it lacks.
    let empty = tempfile::tempdir().unwrap();
    let msg = ModelConfig::load(empty.path()).unwrap_err().to_string();
    assert!(
        msg.contains("config.json") && !msg.contains("is a directory"),
        "{msg}"
    );
}

/// Something that exists but is not a directory (`/dev/null`) is read as the config itself:
/// the error names the path given, not a `config.json` below it.
#[cfg(unix)]
#[test]
fn a_device_file_is_read_as_the_config_not_as_a_directory() {
    let msg = ModelConfig::load(Path::new("/dev/null"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("/dev/null"), "{msg}");
    assert!(!msg.contains("/dev/null/config.json"), "{msg}");
}

#[test]
fn moe_quant_algo_is_read_but_not_hashed() {
    let mut json = flash_config_json();
    let plain = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    json["quantization_config"]["moe_quant_algo"] = serde_json::json!("NVFP4");
    let nvidia = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    assert!(nvidia
        .quantization_config
        .as_ref()
        .unwrap()
        .states_nvfp4_experts());
    assert!(!plain
        .quantization_config
        .as_ref()
        .unwrap()
        .states_nvfp4_experts());
    assert_eq!(nvidia.hash_hex(), plain.hash_hex());
    // The hash the released Flash config has had since before the key was read.
    assert_eq!(
        plain.hash_hex(),
        "f0168d24b5c8a4c427814ef8bfc927e6a80b42b16794227a1a47572cee15503b"
    );
}

#[test]
fn expert_dtype_inside_quantization_config_is_read_when_the_top_level_has_none() {
    let mut json = flash_config_json();
    let top = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    let ed = json
        .as_object_mut()
        .unwrap()
        .remove("expert_dtype")
        .unwrap();
    let none = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    assert_eq!(none.expert_dtype, None);
    json["quantization_config"]["expert_dtype"] = ed;
    let nested = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    assert_eq!(nested.expert_dtype.as_deref(), Some("fp4"));
    assert!(nested.experts_fp4());
    assert_eq!(nested.hash_hex(), top.hash_hex());
    // Both given and different: refused, naming the nested field and both values.
    json["expert_dtype"] = serde_json::json!("fp8");
    let err = ModelConfig::from_json_str(&json.to_string(), Path::new("cfg.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("quantization_config.expert_dtype")
            && err.contains("\"fp4\"")
            && err.contains("\"fp8\""),
        "{err}"
    );
    // Both given and equal: accepted.
    json["expert_dtype"] = serde_json::json!("fp4");
    let both = ModelConfig::from_json_str(&json.to_string(), Path::new("x")).unwrap();
    assert_eq!(both.hash_hex(), top.hash_hex());
}

#[test]
fn a_value_of_the_wrong_type_names_its_field() {
    for (edit, field) in [
        (
            ("index_topk", serde_json::json!("512")),
            "field `index_topk`: invalid type: string",
        ),
        (
            ("hidden_size", serde_json::json!(4096.0)),
            "field `hidden_size`: invalid type",
        ),
        (
            ("rope_theta", serde_json::Value::Null),
            "field `rope_theta`: invalid type: null",
        ),
    ] {
        let mut v = flash_config_json();
        v[edit.0] = edit.1;
        let msg = ModelConfig::from_json_str(&v.to_string(), Path::new("c.json"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("config c.json") && msg.contains(field),
            "{msg}"
        );
    }
    let nested = {
        let mut v = flash_config_json();
        v["quantization_config"]["weight_block_size"] = serde_json::json!("128");
        v
    };
    let msg = ModelConfig::from_json_str(&nested.to_string(), Path::new("c.json"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("field `quantization_config.weight_block_size`"),
        "{msg}"
    );
    // A syntax error outside any field has no field to name.
    let msg = ModelConfig::from_json_str("not json", Path::new("c.json"))
        .unwrap_err()
        .to_string();
    assert!(!msg.contains("field `"), "{msg}");
}

#[test]
fn text_after_the_config_object_is_refused() {
    let text = flash_config_json().to_string() + " {\"oops\": 1}";
    let msg = ModelConfig::from_json_str(&text, Path::new("c.json"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("trailing characters"), "{msg}");
}

// RoPE tables of the config's layers (docs/spec/attention.md 3.3).
use crate::numerics::rope::yarn_correction_range;

fn close_rel(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn flash_compress_table_matches_attention_md_examples() {
    let cfg = ModelConfig::flash();
    let t = cfg.rope_table(LayerKind::Csa);
    let f = t.frequencies();
    assert_eq!(f.len(), 32);
    for (i, want) in [
        (0, 1.0),
        (15, 3.6355e-3),
        (16, 2.2656e-3),
        (20, 2.9698e-4),
        (31, 5.6805e-7),
    ] {
        assert!(
            close_rel(f[i] as f64, want, 1e-4),
            "freq'_{i} = {} want {want}",
            f[i]
        );
    }
    let (low, high) =
        yarn_correction_range(64, 160000.0, &cfg.rope_scaling.as_ref().unwrap().yarn());
    assert_eq!((low, high), (15.0, 25.0));
}

#[test]
fn hca_layers_share_the_compress_table_and_swa_is_plain() {
    let cfg = ModelConfig::flash();
    assert_eq!(
        cfg.rope_table(LayerKind::Hca),
        cfg.rope_table(LayerKind::Csa)
    );
    let swa = cfg.rope_table(LayerKind::Swa);
    // f32 steps: within an ulp or two of the exact value.
    assert!(close_rel(
        swa.frequencies()[31] as f64,
        10000f64.powf(-62.0 / 64.0),
        2.5e-7
    ));
}

/// The angle is REF's f32 product `fp32(pos) · freq'_i` (torch.outer on an f32 table), not
/// the exact one: at position 100,003 they are 3.4e-3 rad apart on pair 1 of the Flash
/// compress table, which moves cos by 3.3e-3, nearly a bf16 step at 1.
#[test]
fn angles_are_f32_products_of_position_and_frequency() {
    let t = ModelConfig::flash().rope_table(LayerKind::Csa);
    let (mut c, mut s) = (vec![0.0; 32], vec![0.0; 32]);
    let pos = 100_003usize;
    t.cos_sin(pos, &mut c, &mut s);
    let f1 = t.frequencies()[1];
    let f32_angle = (pos as f32 * f1) as f64;
    let exact_angle = pos as f64 * f1 as f64;
    assert!(
        (f32_angle - exact_angle).abs() > 2e-3,
        "{f32_angle} vs {exact_angle}"
    );
    assert_eq!(
        (c[1], s[1]),
        (f32_angle.cos() as f32, f32_angle.sin() as f32)
    );
    assert!((c[1] as f64 - exact_angle.cos()).abs() > 1e-3);
    // Pair 0 has freq 1: the angle is the position itself.
    assert_eq!(t.frequencies()[0], 1.0);
    assert_eq!(c[0], (pos as f64).cos() as f32);
}

#[test]
fn tiny_yarn_ramp_is_inside_the_rope_dims() {
    let cfg = ModelConfig::tiny();
    let (low, high) =
        yarn_correction_range(16, 160000.0, &cfg.rope_scaling.as_ref().unwrap().yarn());
    assert_eq!((low, high), (3.0, 7.0));
    let t = cfg.rope_table(LayerKind::Csa);
    assert_eq!(t.frequencies().len(), 8);
    assert_eq!(t.frequencies()[0], 1.0);
}
