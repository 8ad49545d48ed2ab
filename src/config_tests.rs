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
