//! Tests of the footprint and the memory plan.

use super::*;

#[test]
fn names_map_to_components_and_slots() {
    assert_eq!(
        classify("layers.4.attn.indexer.wq_b.scale"),
        Component::Indexers
    );
    assert_eq!(
        classify("layers.4.attn.compressor.ape"),
        Component::Compressors
    );
    assert_eq!(
        classify("layers.4.attn.wq_a.weight"),
        Component::AttentionCore
    );
    assert_eq!(
        classify("layers.4.attn.attn_sink"),
        Component::AttentionCore
    );
    assert_eq!(
        classify("layers.0.ffn.experts.7.w2.scale"),
        Component::RoutedExperts
    );
    assert_eq!(
        classify("layers.0.ffn.gate.tid2eid"),
        Component::RouterHashTables
    );
    assert_eq!(classify("layers.9.hc_ffn_base"), Component::Mhc);
    assert_eq!(classify("layers.9.ffn_norm.weight"), Component::Norms);
    assert_eq!(classify("hc_head_fn"), Component::HcHead);
    assert_eq!(classify("mtp.0.e_proj.weight"), Component::Mtp);
    assert_eq!(classify("model.layers.0.x"), Component::Other);
    assert_eq!(slot("head.weight", 43), Slot::Last);
    assert_eq!(slot("embed.weight", 43), Slot::First);
    assert_eq!(slot("layers.42.attn_norm.weight", 43), Slot::Layer(42));
    assert_eq!(slot("layers.43.attn_norm.weight", 43), Slot::First);
    assert_eq!(slot("mtp.0.norm.weight", 43), Slot::Excluded);
}

#[test]
fn scales_tables_and_biases_are_not_parameters() {
    assert_eq!(
        logical_params("layers.3.ffn.experts.0.w1.weight", "I8", 10),
        20
    );
    assert_eq!(
        logical_params("layers.3.ffn.experts.0.w1.scale", "F8_E8M0", 10),
        0
    );
    assert_eq!(
        logical_params("layers.3.ffn.experts.0.w1.weight_scale_2", "F32", 1),
        0
    );
    assert_eq!(logical_params("layers.3.ffn.gate.bias", "F32", 256), 0);
    assert_eq!(logical_params("layers.0.ffn.gate.tid2eid", "I64", 60), 0);
    assert_eq!(logical_params("hc_head_scale", "F32", 1), 1);
    assert_eq!(logical_params("layers.3.hc_attn_scale", "F32", 3), 3);
}

#[test]
fn device_specs_parse_counts_and_units() {
    let d: DeviceSet = "8x96G".parse().unwrap();
    assert_eq!(d.capacities, vec![96 << 30; 8]);
    let d: DeviceSet = "2x80GiB,1x40GB".parse().unwrap();
    assert_eq!(d.capacities, vec![80 << 30, 80 << 30, 40_000_000_000]);
    let d: DeviceSet = "141G".parse().unwrap();
    assert_eq!(d.capacities.len(), 1);
    // Units in any case.
    let d: DeviceSet = "1x96gib,1x96gb,1x1t".parse().unwrap();
    assert_eq!(d.capacities, vec![96 << 30, 96_000_000_000, 1 << 40]);
    for bad in ["8x", "x96G", "0x96G", "8x96", "8x96Q", "eightx96G", ""] {
        let e = bad.parse::<DeviceSet>().unwrap_err();
        assert!(e.contains("8x96G"), "{bad}: {e}");
    }
}

fn fake_footprint(layers: usize, per_layer: u64, first: u64, last: u64) -> Footprint {
    let mut f = Footprint::from_tensors(layers, std::iter::empty());
    f.layer_bytes = vec![per_layer; layers];
    f.first_bytes = first;
    f.last_bytes = last;
    f
}

#[test]
fn balanced_plan_uses_contiguous_ranges_in_order() {
    let cfg = ModelConfig::flash();
    let fp = fake_footprint(43, 3 << 30, 1 << 30, 1 << 30);
    let devs: DeviceSet = "4x80G".parse().unwrap();
    let p = plan(&cfg, &fp, &devs, 4096, 2048);
    assert!(p.fits, "{p:#?}");
    assert_eq!(p.strategy, "balanced");
    let mut next = 0;
    for d in &p.devices {
        let [a, b] = d.layers.unwrap();
        assert_eq!(a, next);
        next = b + 1;
        assert!(d.total <= d.capacity);
    }
    assert_eq!(next, 43);
    let counts: Vec<usize> = p
        .devices
        .iter()
        .map(|d| d.layers.unwrap()[1] + 1 - d.layers.unwrap()[0])
        .collect();
    assert!(counts.iter().all(|&c| (10..=12).contains(&c)), "{counts:?}");
}

#[test]
fn uneven_devices_get_proportional_shares() {
    let cfg = ModelConfig::flash();
    let fp = fake_footprint(10, 10 << 30, 0, 0);
    // 100 GiB of layers over 60 + 60 GiB: balanced gives 5 + 5 layers = 50 GiB each (fits).
    let devs: DeviceSet = "2x60G".parse().unwrap();
    let p = plan(&cfg, &fp, &devs, 4096, 2048);
    assert!(p.fits);
    // 1x200G + 1x15G: proportional targets put ~1 layer on the small device; fits either way.
    let devs: DeviceSet = "1x15G,1x200G".parse().unwrap();
    let p = plan(&cfg, &fp, &devs, 4096, 2048);
    assert!(p.fits, "{p:#?}");
    assert!(p.devices[0].total <= p.devices[0].capacity);
}

#[test]
fn first_fit_packs_in_order_and_overflows_onto_the_last_device() {
    assert_eq!(
        place_first_fit(&[4, 4, 4, 4], &[1, 1], &[10, 10]),
        vec![0, 0, 1, 1]
    );
    assert_eq!(
        place_first_fit(&[8, 8, 8], &[0, 0], &[10, 10]),
        vec![0, 1, 1]
    );
    assert_eq!(
        place_balanced(&[4, 4, 4, 4], &[0, 0], &[10, 30]),
        vec![0, 1, 1, 1]
    );
}

#[test]
fn refusal_reports_the_shortfall() {
    let cfg = ModelConfig::flash();
    let fp = fake_footprint(10, 10 << 30, 0, 0);
    let devs: DeviceSet = "1x50G".parse().unwrap();
    let p = plan(&cfg, &fp, &devs, 4096, 2048);
    assert!(!p.fits);
    assert_eq!(p.strategy, "refused");
    assert_eq!(p.devices[0].shortfall, p.devices[0].total - (50 << 30));
    assert_eq!(p.shortfall, p.devices[0].shortfall);
    assert!(p.devices[0].free < 0);
}

#[test]
fn state_follows_the_layer_kind() {
    let cfg = ModelConfig::flash();
    let swa = layer_state(&cfg, 0, 131072, 2048);
    let csa = layer_state(&cfg, 2, 131072, 2048);
    let hca = layer_state(&cfg, 3, 131072, 2048);
    // f32 rows, twice the rows held (the caches double when full).
    assert_eq!(swa.window, 2 * (128 + 2048) * 512 * 4);
    assert_eq!(swa.compressed_kv + swa.index_keys, 0);
    assert_eq!(csa.window, swa.window);
    assert_eq!(csa.compressed_kv, 2 * 32768 * 2048);
    // Raw and prepared keys, one multiplier per row.
    assert_eq!(csa.index_keys, 2 * 32768 * (2 * 128 + 1) * 4);
    assert_eq!(hca.compressed_kv, 2 * 1024 * 2048);
    assert_eq!(hca.index_keys, 0);
    // A short context counts its chunk at most once.
    assert_eq!(layer_state(&cfg, 0, 100, 2048).window, 2 * 228 * 512 * 4);
    // The plan's printed assumptions say what these figures count (they once said bf16 rows
    // and a 128-token window while the figures were f32, doubled, window plus a chunk).
    let text = assumptions(&cfg, 131072, 2048).join("\n");
    for said in [
        "f32 rows",
        "2x the rows",
        "128 + 2048 (one chunk) rows x 512",
        "twice",
    ] {
        assert!(text.contains(said), "{said}: {text}");
    }
    assert!(!text.contains("bf16"), "{text}");
}

fn flash_footprint() -> Footprint {
    Footprint::of_inventory(
        &ModelConfig::flash(),
        crate::checkpoint::WeightFormat::Official,
    )
}

#[test]
fn flash_official_footprint_matches_the_published_totals() {
    let f = flash_footprint();
    assert_eq!(f.total.bytes, 159_609_485_896);
    assert_eq!(f.total.tensors, 69_187);
    assert_eq!(f.main.bytes, 156_015_698_140);
    assert_eq!(f.main.params, 284_332_230_231);
    assert_eq!(f.mtp.bytes, 3_593_787_756);
    assert_eq!(f.mtp.params, 6_610_048_635);
    // docs/spec/model.md section 8, one row per component: (params, bytes, tensors).
    let rows = [
        (
            Component::RoutedExperts,
            277_025_390_592,
            147_169_738_752,
            66_048,
        ),
        (Component::AttentionCore, 4_599_123_136, 4_599_478_144, 559),
        (Component::SharedExperts, 1_082_130_432, 1_082_196_480, 258),
        (Component::Embed, 529_530_880, 1_059_061_760, 1),
        (Component::Head, 529_530_880, 1_059_061_760, 1),
        (Component::Compressors, 261_464_576, 525_722_624, 164),
        (Component::Indexers, 225_730_176, 275_353_344, 147),
        (Component::RouterGates, 45_088_768, 90_177_536, 43),
        (Component::Mhc, 33_818_898, 135_275_592, 258),
        (Component::RouterHashTables, 0, 18_616_320, 3),
        (Component::Norms, 356_352, 712_704, 87),
        (Component::HcHead, 65_541, 262_164, 3),
        (Component::RouterBiases, 0, 40_960, 40),
    ];
    for (c, params, bytes, tensors) in rows {
        let t = f.component(c);
        assert_eq!(
            (t.params, t.bytes, t.tensors),
            (params, bytes, tensors),
            "{c:?}"
        );
    }
    assert_eq!(f.component(Component::Other), Tally::default());
    let placed: u64 = f.layer_bytes.iter().sum::<u64>() + f.first_bytes + f.last_bytes;
    assert_eq!(placed, f.main.bytes);
}

#[test]
fn flash_fits_8x96g_at_128k_and_not_1x96g() {
    let cfg = ModelConfig::flash();
    let f = flash_footprint();
    let p = plan(&cfg, &f, &"8x96G".parse().unwrap(), 131072, DEFAULT_CHUNK);
    assert!(p.fits, "{p:#?}");
    assert_eq!(p.devices[0].layers.unwrap()[0], 0);
    assert_eq!(p.devices[7].layers.unwrap()[1], 42);
    assert_eq!(p.weights, f.main.bytes);
    let p = plan(&cfg, &f, &"1x96G".parse().unwrap(), 131072, DEFAULT_CHUNK);
    assert!(!p.fits);
    assert!(
        (50_000_000_000..70_000_000_000).contains(&p.shortfall),
        "shortfall {} is not roughly 60 GB",
        p.shortfall
    );
}

#[test]
fn workspace_has_room_for_one_cache_to_grow() {
    let cfg = ModelConfig::flash();
    let (c, t) = (1 << 20, 2048);
    // The biggest cache at 1M tokens: a CSA layer's compressed rows, 2 x 262,144 x 2 KiB.
    assert_eq!(largest_cache_bytes(&cfg, c, t), 2 * (c as u64 / 4) * 2048);
    assert_eq!(
        workspace_bytes(&cfg, c, t, false),
        FIXED_WORKSPACE + activation_peak_bytes(&cfg, c, t) + largest_cache_bytes(&cfg, c, t)
    );
    // At 1M tokens the sparse attention is the largest phase (HCA: 128 window + 8,192
    // compressed entries a query), with the largest capped scratch (256 MiB) and an eighth for
    // the pool's size classes.
    let base = 4 * 4096 + 4096 + 4 + 16;
    let attention = base + 1024 + 64 * 512 + 512 + 8 * 512;
    let emax = 128 + (c as u64) / 128;
    let attend = 4 * t as u64 * (attention + 64 * 512 + 64 * emax + emax + 2 * 64)
        + 4 * 512 * (t as u64 + 128 + c as u64 / 4);
    let live = attend + (256 << 20);
    assert_eq!(activation_peak_bytes(&cfg, c, t), live + live.div_ceil(8));
    // At 128k (chunk 2048) too (1,152 entries a query), ahead of the routed experts (6 slots
    // of 2,048-wide experts, 3/2 for padding).
    let (c, t) = (131_072u64, 2048u64);
    let emax = 128 + c / 128;
    let attend =
        4 * t * (attention + 64 * 512 + 64 * emax + emax + 2 * 64) + 4 * 512 * (t + 128 + c / 4);
    let moe = 4 * t * (base + 2 * 4096 + 3 * 6) + 6 * t * 6 * (2 * 4096 + 3 * 2048);
    assert!(moe < attend, "{moe} {attend}");
    let live = attend + (256 << 20);
    assert_eq!(
        activation_peak_bytes(&cfg, c as usize, t as usize),
        live + live.div_ceil(8)
    );
}

/// A top-k past the rows the context can have selects them all, so it costs no more than one
/// that selects exactly them.
#[test]
fn a_topk_past_the_visible_rows_costs_nothing_more() {
    let mut cfg = ModelConfig::flash();
    let (c, t) = (16384, 2048);
    cfg.index_topk = c / 4;
    let all_rows = workspace_bytes(&cfg, c, t, true);
    cfg.index_topk = 65536;
    assert_eq!(workspace_bytes(&cfg, c, t, true), all_rows);
    cfg.index_topk = 512;
    assert!(workspace_bytes(&cfg, c, t, true) < all_rows);
}

/// Byte figures saturate instead of wrapping: a wrapped sum would be a small, plausible number
/// (the `0 B` embed of a `vocab_size` 2^63 config) and the plan would say it fits.
#[test]
fn footprint_tallies_saturate_instead_of_wrapping() {
    let huge = u64::MAX / 2 + 1;
    let t = |name| TensorSpec {
        name,
        dtype: "I8",
        numel: huge,
        bytes: huge,
    };
    let f = Footprint::from_tensors(1, [t("embed.weight"), t("layers.0.attn.wq_a.weight")]);
    assert_eq!(f.total.bytes, u64::MAX);
    assert_eq!(f.main.bytes, u64::MAX);
    assert_eq!(f.total.params, u64::MAX, "I8 counts two params per byte");
    let f = Footprint::from_tensors(1, [t("embed.weight"), t("embed.weight")]);
    assert_eq!(f.first_bytes, u64::MAX);
    assert_eq!(f.component(Component::Embed).bytes, u64::MAX);
}

#[test]
fn a_plan_too_large_for_u64_saturates_and_does_not_fit() {
    // Field values past the config's bounds, set directly (validate would refuse them).
    let mut cfg = ModelConfig::tiny();
    cfg.vocab_size = 1 << 62;
    cfg.hidden_size = 1 << 40;
    cfg.head_dim = 1 << 40;
    let huge = u64::MAX / 2 + 1;
    let f = Footprint::from_tensors(
        4,
        (0..4).map(|l| TensorSpec {
            name: ["layers.0.x", "layers.1.x", "layers.2.x", "layers.3.x"][l],
            dtype: "BF16",
            numel: huge,
            bytes: huge,
        }),
    );
    let context = usize::MAX / 2;
    assert_eq!(workspace_bytes(&cfg, context, context, true), u64::MAX);
    assert_eq!(layer_state(&cfg, 1, context, context).total(), u64::MAX);
    let devices: DeviceSet = "8x96G".parse().unwrap();
    let p = plan(&cfg, &f, &devices, context, 2048);
    assert!(!p.fits, "a plan of saturated figures never fits");
    assert_eq!(p.total, u64::MAX);
    for d in &p.devices {
        assert!(d.total >= d.workspace && d.total >= d.weights, "{d:?}");
        assert!(d.free < 0 && d.shortfall > 0, "{d:?}");
    }
}

#[test]
fn free_bytes_clamps_to_the_i64_range() {
    assert_eq!(free_bytes(10, 3), 7);
    assert_eq!(free_bytes(3, 10), -7);
    assert_eq!(free_bytes(0, u64::MAX), i64::MIN);
    assert_eq!(free_bytes(u64::MAX, 0), i64::MAX);
}
