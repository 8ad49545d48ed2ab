//! The expected inventory computed from a config alone reproduces the measured facts of the
//! official DeepSeek-V4-Flash release (docs/spec/model.md sections 0 and 3) to the byte.

use needlescope::checkpoint::inventory::{expected_inventory, logical_inventory, TensorRole};
use needlescope::checkpoint::{Dtype, ExpectedTensor, WeightFormat};
use needlescope::config::ModelConfig;
use std::collections::BTreeMap;

fn histogram(inv: &[ExpectedTensor]) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for t in inv {
        *h.entry(t.dtype.as_str()).or_insert(0) += 1;
    }
    h
}

fn bytes(inv: &[ExpectedTensor]) -> u64 {
    inv.iter().map(|t| t.bytes()).sum()
}

fn find<'a>(inv: &'a [ExpectedTensor], name: &str) -> &'a ExpectedTensor {
    inv.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} missing from the inventory"))
}

#[test]
fn flash_official_inventory_matches_the_release_to_the_byte() {
    let inv = expected_inventory(&ModelConfig::flash(), WeightFormat::Official);
    assert_eq!(inv.len(), 69_187);
    assert_eq!(bytes(&inv), 159_609_485_896);
    let want: BTreeMap<&str, usize> = [
        ("BF16", 433),
        ("F32", 417),
        ("F8_E4M3", 375),
        ("F8_E8M0", 34_167),
        ("I64", 3),
        ("I8", 33_792),
    ]
    .into();
    assert_eq!(histogram(&inv), want);
    let mtp: Vec<_> = inv
        .iter()
        .filter(|t| t.name.starts_with("mtp."))
        .cloned()
        .collect();
    assert_eq!(mtp.len(), 1_575);
    assert_eq!(bytes(&mtp), 3_593_787_756);
}

#[test]
fn flash_tensor_names_are_unique() {
    let inv = expected_inventory(&ModelConfig::flash(), WeightFormat::Official);
    let mut names: Vec<&str> = inv.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before);
}

#[test]
fn flash_tensors_per_layer_are_1565_swa_1576_csa_1569_hca() {
    let inv = expected_inventory(&ModelConfig::flash(), WeightFormat::Official);
    let count = |l: usize| {
        let p = format!("layers.{l}.");
        inv.iter().filter(|t| t.name.starts_with(&p)).count()
    };
    assert_eq!(count(0), 1565);
    assert_eq!(count(1), 1565);
    assert_eq!(count(2), 1576);
    assert_eq!(count(3), 1569);
    assert_eq!(count(42), 1576);
}

#[test]
fn flash_shapes_follow_spec_table_3_2() {
    let inv = expected_inventory(&ModelConfig::flash(), WeightFormat::Official);
    let check = |name: &str, dtype: Dtype, shape: &[usize]| {
        let t = find(&inv, name);
        assert_eq!((t.dtype, t.shape.as_slice()), (dtype, shape), "{name}");
    };
    check("layers.5.attn.wq_b.weight", Dtype::F8E4M3, &[32768, 1024]);
    check("layers.5.attn.wq_b.scale", Dtype::F8E8M0, &[256, 8]);
    check("layers.5.attn.wo_a.weight", Dtype::F8E4M3, &[8192, 4096]);
    check("layers.5.attn.wo_b.scale", Dtype::F8E8M0, &[32, 64]);
    check(
        "layers.5.ffn.experts.255.w2.weight",
        Dtype::I8,
        &[4096, 1024],
    );
    check(
        "layers.5.ffn.experts.255.w2.scale",
        Dtype::F8E8M0,
        &[4096, 64],
    );
    check("layers.2.ffn.gate.tid2eid", Dtype::I64, &[129280, 6]);
    check("layers.3.ffn.gate.bias", Dtype::F32, &[256]);
    check("layers.4.attn.compressor.ape", Dtype::F32, &[4, 1024]);
    check("layers.3.attn.compressor.ape", Dtype::F32, &[128, 512]);
    check(
        "layers.3.attn.compressor.wkv.weight",
        Dtype::BF16,
        &[512, 4096],
    );
    check("layers.4.attn.indexer.wq_b.scale", Dtype::F8E8M0, &[64, 8]);
    check(
        "layers.4.attn.indexer.compressor.ape",
        Dtype::F32,
        &[4, 256],
    );
    check(
        "layers.4.attn.indexer.compressor.norm.weight",
        Dtype::BF16,
        &[128],
    );
    check("layers.0.hc_attn_fn", Dtype::F32, &[24, 16384]);
    check("hc_head_fn", Dtype::F32, &[4, 16384]);
    check("mtp.0.e_proj.scale", Dtype::F8E8M0, &[32, 32]);
    check("mtp.0.hc_head_scale", Dtype::F32, &[1]);
    assert!(!inv.iter().any(|t| t.name == "layers.3.ffn.gate.tid2eid"));
    assert!(!inv.iter().any(|t| t.name == "mtp.0.ffn.gate.tid2eid"));
    assert!(!inv
        .iter()
        .any(|t| t.name.starts_with("layers.3.attn.indexer")));
}

#[test]
fn nvfp4_replaces_main_experts_only() {
    let cfg = ModelConfig::flash();
    let off = expected_inventory(&cfg, WeightFormat::Official);
    let nv = expected_inventory(&cfg, WeightFormat::Nvfp4);
    // 43 layers x 256 experts x 3 linears gain weight_scale_2 and input_scale.
    assert_eq!(nv.len(), off.len() + 43 * 256 * 3 * 2);
    let w = find(&nv, "layers.7.ffn.experts.3.w1.weight");
    assert_eq!((w.dtype, w.shape.clone()), (Dtype::U8, vec![2048, 2048]));
    let s = find(&nv, "layers.7.ffn.experts.3.w1.weight_scale");
    assert_eq!((s.dtype, s.shape.clone()), (Dtype::F8E4M3, vec![2048, 256]));
    let s2 = find(&nv, "layers.7.ffn.experts.3.w1.weight_scale_2");
    assert_eq!((s2.dtype, s2.shape.clone()), (Dtype::F32, vec![]));
    assert_eq!(find(&nv, "mtp.0.ffn.experts.3.w1.weight").dtype, Dtype::I8);
    assert_eq!(find(&nv, "layers.7.attn.wq_a.weight").dtype, Dtype::F8E4M3);
}

#[test]
fn bf16_format_has_no_scale_tensors_and_unpacked_experts() {
    let cfg = ModelConfig::flash();
    let inv = expected_inventory(&cfg, WeightFormat::Bf16);
    assert!(inv
        .iter()
        .all(|t| !t.name.contains("scale") || t.name.contains("hc_")));
    assert_eq!(
        find(&inv, "layers.7.ffn.experts.3.w2.weight").shape,
        vec![4096, 2048]
    );
    assert!(inv
        .iter()
        .all(|t| matches!(t.dtype, Dtype::BF16 | Dtype::F32 | Dtype::I64)));
    let linears = logical_inventory(&cfg)
        .iter()
        .filter(|t| t.role.is_linear())
        .count();
    let official = expected_inventory(&cfg, WeightFormat::Official).len();
    let quantised = logical_inventory(&cfg)
        .iter()
        .filter(|t| {
            matches!(
                t.role,
                TensorRole::QuantLinear | TensorRole::RoutedExpert { .. }
            )
        })
        .count();
    assert_eq!(official, inv.len() + quantised, "{linears} linears");
}
