//! `synth --preset v41-tiny` (src/synth/v41.rs): the tiny DeepSeek-V4.1 holds exactly the
//! inventory of its config in every format (read back from the shard headers), its config.json
//! reads back to the same config with every layer role of the release, every tensor decodes
//! (from the file bytes, and linears and Engram rows through `Checkpoint::open_v41`) to the
//! generator's values after the format's rounding, the same seed gives the same bytes, and its
//! candidate budget is below the length of a 2k prompt.

use crate::rounding::rounded;
use needlescope::checkpoint::engram::EngramPrecision;
use needlescope::checkpoint::header::parse_header;
use needlescope::checkpoint::inventory::{
    linear_storage, InventoryOptions, LinearStorage, StorageRules, TensorRole, FP4_GROUP,
};
use needlescope::checkpoint::inventory_v41::{expected_inventory_v41, logical_inventory_v41};
use needlescope::checkpoint::{Checkpoint, Dtype, ExpectedTensor, WeightFormat};
use needlescope::config::{CandidateStage, LayerKind, V41Config};
use needlescope::numerics::codecs::{bf16_round, e4m3_to_f32, e8m0_to_f32, f32_to_e4m3};
use needlescope::numerics::formats::{
    bf16_bytes_to_f32, dequant_fp4_group, dequant_fp8_block, dequant_nvfp4, f32_bytes_to_f32,
};
use needlescope::synth::tensors::{generate, Values};
use needlescope::synth::v41::{synth_v41, tiny_config};
use needlescope::synth::{Preset, SynthOptions, SynthSummary};
use std::collections::BTreeMap;
use std::path::Path;

fn write(dir: &Path, format: WeightFormat, shards: usize, seed: u64) -> SynthSummary<V41Config> {
    let mut o = SynthOptions::new(Preset::V41Tiny, format, dir);
    o.shards = shards;
    o.seed = seed;
    synth_v41(&o, None, &mut |_, _| {}).unwrap()
}

/// Every stored tensor of the written shards, in file order: its header entry and its bytes.
struct Stored {
    order: Vec<ExpectedTensor>,
    bytes: BTreeMap<String, Vec<u8>>,
}

impl Stored {
    fn read(files: &[std::path::PathBuf]) -> Self {
        let (mut order, mut bytes) = (Vec::new(), BTreeMap::new());
        for f in files {
            let data = std::fs::read(f).unwrap();
            let header = parse_header(f, &data).unwrap();
            assert_eq!(
                header.metadata.get("format").map(String::as_str),
                Some("pt")
            );
            for e in header.entries {
                order.push(ExpectedTensor {
                    name: e.name.clone(),
                    dtype: e.dtype,
                    shape: e.shape.clone(),
                });
                bytes.insert(e.name, data[e.data_offsets].to_vec());
            }
        }
        Stored { order, bytes }
    }

    fn get(&self, name: &str) -> &[u8] {
        self.bytes
            .get(name)
            .unwrap_or_else(|| panic!("{name} not written"))
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|t| t.name.as_str())
    }
}

fn read_config(dir: &Path) -> V41Config {
    let path = dir.join("config.json");
    V41Config::from_json_str(&std::fs::read_to_string(&path).unwrap(), &path).unwrap()
}

fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: first difference at {i}: read {} expected {}",
            got[i], want[i]
        );
    }
}

#[test]
fn v41_tiny_holds_exactly_its_inventory_in_every_format() {
    for (format, shards) in [
        (WeightFormat::Bf16, 1),
        (WeightFormat::Official, 3),
        (WeightFormat::Nvfp4, 2),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), format, shards, 0);
        let cfg = read_config(dir.path());
        assert_eq!(cfg, s.config, "{format}: config.json reads back");
        assert_eq!(cfg, tiny_config(format).unwrap());
        let stored = Stored::read(&s.files);
        let want = expected_inventory_v41(&cfg, format);
        assert_eq!(stored.order.len(), want.len(), "{format}: tensor count");
        for (got, want) in stored.order.iter().zip(&want) {
            assert_eq!(got, want, "{format}: name, dtype and shape, in order");
        }
        assert_eq!(s.tensors, want.len());
        let bytes: u64 = want.iter().map(|t| t.bytes()).sum();
        assert_eq!(s.payload_bytes, bytes);
        assert_eq!(s.files.len(), shards);
        if shards > 1 {
            let index: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(index["metadata"]["total_size"], bytes);
            assert_eq!(index["weight_map"].as_object().unwrap().len(), want.len());
        }
        let mark = std::fs::read_to_string(dir.path().join("synth.json")).unwrap();
        assert!(mark.contains("\"v41-tiny\""), "{mark}");
        // The storage each format promises.
        let dtypes: std::collections::BTreeSet<Dtype> = want.iter().map(|t| t.dtype).collect();
        let engram = stored
            .order
            .iter()
            .find(|t| t.name == "layers.1.engram.embed.weight")
            .unwrap();
        match format {
            WeightFormat::Bf16 => {
                assert_eq!(dtypes, [Dtype::BF16, Dtype::F32].into());
                assert_eq!(engram.dtype, Dtype::BF16);
            }
            _ => {
                let mut want = std::collections::BTreeSet::from([
                    Dtype::BF16,
                    Dtype::F32,
                    Dtype::F8E4M3,
                    Dtype::F8E8M0,
                    // MXFP4 experts (the draft block's, in NVIDIA's re-quantisation too).
                    Dtype::I8,
                ]);
                if format == WeightFormat::Nvfp4 {
                    want.insert(Dtype::U8);
                }
                assert_eq!(dtypes, want);
                assert_eq!(
                    (engram.dtype, engram.shape.as_slice()),
                    (Dtype::F8E4M3, &[4062, 64][..])
                );
                let scale = stored
                    .order
                    .iter()
                    .find(|t| t.name == "layers.1.engram.embed.scale")
                    .unwrap();
                assert_eq!(
                    (scale.dtype, scale.shape.as_slice()),
                    (Dtype::F8E8M0, &[4062, 2][..])
                );
            }
        }
        // The config file is the release's composite layout.
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
                .unwrap();
        assert_eq!(json["model_type"], "deepseek_v41");
        assert_eq!(json["architectures"][0], "DeepseekV41ForCausalLM");
        assert_eq!(json["text_config"]["model_type"], "deepseek_v41_text");
        assert_eq!(json["vision_config"]["model_type"], "deepseek_v41_vision");
        let quant = &json["quantization_config"];
        match format {
            WeightFormat::Bf16 => assert!(quant.is_null(), "{quant}"),
            WeightFormat::Official => assert_eq!(
                *quant,
                serde_json::json!({"quant_method": "fp8", "activation_scheme": "dynamic",
                    "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"})
            ),
            WeightFormat::Nvfp4 => assert_eq!(
                *quant,
                serde_json::json!({"quant_method": "fp8", "activation_scheme": "dynamic",
                    "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4",
                    "moe_quant_algo": "NVFP4"})
            ),
        }
        // Every key of the released text_config is there.
        let released: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/deepseek_v41_flash_config.json"),
            )
            .unwrap(),
        )
        .unwrap();
        for section in ["text_config", "vision_config"] {
            let keys = |v: &serde_json::Value| -> Vec<String> {
                v[section].as_object().unwrap().keys().cloned().collect()
            };
            assert_eq!(keys(&json), keys(&released), "{section} keys");
        }
    }
}

#[test]
fn v41_tiny_keeps_every_layer_role_of_the_release() {
    let dir = tempfile::tempdir().unwrap();
    let s = write(dir.path(), WeightFormat::Official, 1, 0);
    let cfg = read_config(dir.path());
    let roles = cfg.layer_roles();
    assert_eq!(roles.len(), 12);
    assert_eq!(roles.layers_of_kind(LayerKind::Swa), [0, 1]);
    assert_eq!(roles.layers_of_kind(LayerKind::Csa2), [2, 3, 4, 5]);
    assert_eq!(roles.layers_of_kind(LayerKind::Csa1), [6, 7, 8, 9, 10, 11]);
    let kv_sources: Vec<usize> = roles
        .iter()
        .filter(|r| r.owns_kv())
        .map(|r| r.layer)
        .collect();
    assert_eq!(
        kv_sources,
        [2, 5, 6],
        "KV sources: ratio 2 twice, ratio 1 once"
    );
    let index_sources: Vec<usize> = roles
        .iter()
        .filter(|r| r.has_indexer())
        .map(|r| r.layer)
        .collect();
    assert_eq!(index_sources, [2, 5, 6, 8, 10]);
    let reindex: Vec<usize> = roles
        .iter()
        .filter(|r| r.has_indexer() && !r.owns_kv())
        .map(|r| r.layer)
        .collect();
    assert_eq!(reindex, [8, 10], "index sources reading another layer's KV");
    let reuse: Vec<usize> = roles
        .iter()
        .filter(|r| r.kv_source.is_some() && !r.has_indexer())
        .map(|r| r.layer)
        .collect();
    assert_eq!(reuse, [3, 4, 7, 9, 11]);
    for r in roles.iter() {
        let (kv, idx) = match r.layer {
            0 | 1 => (None, None),
            2..=4 => (Some(2), Some(2)),
            5 => (Some(5), Some(5)),
            6 | 7 => (Some(6), Some(6)),
            8 | 9 => (Some(6), Some(8)),
            _ => (Some(6), Some(10)),
        };
        assert_eq!(
            (r.kv_source, r.index_source),
            (kv, idx),
            "layer {}",
            r.layer
        );
        let stage = match r.layer {
            6 => CandidateStage::Source,
            8 | 10 => CandidateStage::Consumer { source: 6 },
            _ => CandidateStage::None,
        };
        assert_eq!(r.candidate_stage, stage, "layer {}", r.layer);
    }
    assert_eq!(cfg.candidate_source(), Some(6));
    assert_eq!(
        roles.get(6).ratio,
        1,
        "the candidate source reads the ratio-1 cache"
    );
    assert_eq!(cfg.text.engram_layer_ids, [1, 5]);
    assert_eq!(cfg.text.engram_num_embeddings, [4062, 4152]);
    assert_eq!(cfg.draft_blocks(), 1);
    assert!(cfg.vision.is_some());
    assert_eq!(
        cfg.schedule_summary(),
        "12 layers: 2 SWA, 4 CSA2, 6 CSA1; KV sources 2, 5, 6, index sources 2, 5, 6, 8, 10, \
         candidate source 6; Engram on 1, 5; 1 draft block"
    );
    // The tensors each role owns, as written.
    let stored = Stored::read(&s.files);
    let has = |name: &str| stored.names().any(|n| n == name);
    for l in 0..12 {
        let p = format!("layers.{l}.attn.");
        let r = roles.get(l);
        assert_eq!(
            has(&format!("{p}compressor.wkv.weight")),
            r.owns_kv(),
            "{l}"
        );
        assert_eq!(
            has(&format!("{p}compressor.wgate.weight")),
            r.owns_kv() && r.ratio == 2,
            "{l}: a gate on ratio-2 sources only"
        );
        assert_eq!(
            has(&format!("{p}indexer.wq_b.weight")),
            r.has_indexer(),
            "{l}"
        );
        assert_eq!(has(&format!("{p}indexer.wk.weight")), r.owns_kv(), "{l}");
        assert_eq!(
            has(&format!("layers.{l}.engram.embed.weight")),
            l == 1 || l == 5,
            "{l}"
        );
    }
    for name in [
        "mtp.0.attn.wq_a.weight",
        "mtp.0.ffn.experts.3.w2.weight",
        "mtp.0.main_proj.weight",
        "mtp.0.markov_head.head.weight",
        "mtp.0.confidence_head.proj.weight",
        "image_newline",
        "layers.0.ffn.gate.bias_vl",
        "vision.blocks.1.mlp.w2.weight",
        "aligner.w2.bias",
    ] {
        assert!(has(name), "{name}");
    }
    assert!(!has("mtp.0.ffn.experts.4.w1.weight"), "4 draft experts");
    assert!(
        !stored.names().any(|n| n.starts_with("hc_head")),
        "no hc_head"
    );
}

/// Pins the config: the candidate budget (blocks x block size) is below 2,048 ratio-1 rows, so
/// a prompt of a few thousand tokens has blocks dropped at the consumers once part 2 runs it.
#[test]
fn v41_tiny_candidate_budget_is_below_a_2k_prompt() {
    let cfg = tiny_config(WeightFormat::Official).unwrap();
    let t = &cfg.text;
    let source = cfg.candidate_source().unwrap();
    let ratio = t.compress_ratios[source];
    assert_eq!((ratio, t.candidate_block_size), (1, 8));
    let kept_rows = t.candidate_topk_blocks * t.candidate_block_size;
    assert_eq!(kept_rows, 1024);
    assert!(kept_rows < 2048, "a 2k-token prompt must lose blocks");
    assert!(t.index_topk <= kept_rows && t.index_topk == 64);
    // A query at token t sees t + 1 ratio-1 rows, in ceil((t + 1) / 8) blocks.
    let blocks_seen = |tokens: usize| (tokens / ratio).div_ceil(t.candidate_block_size);
    assert_eq!(
        blocks_seen(1024),
        t.candidate_topk_blocks,
        "nothing dropped at 1,024"
    );
    assert!(blocks_seen(1025) > t.candidate_topk_blocks);
    assert_eq!(
        blocks_seen(2048) - t.candidate_topk_blocks,
        128,
        "2,048 drop 128 blocks"
    );
    assert_eq!(blocks_seen(4096) - t.candidate_topk_blocks, 384);
    // Positions the model takes reach well past that.
    assert!(t.max_position_embeddings >= 16384);
}

#[test]
fn v41_tiny_every_tensor_decodes_to_the_generator() {
    for format in [
        WeightFormat::Bf16,
        WeightFormat::Official,
        WeightFormat::Nvfp4,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), format, 1, 42);
        let cfg = s.config;
        let stored = Stored::read(&s.files);
        let ckpt = Checkpoint::open_v41(dir.path()).unwrap();
        let rules = StorageRules::from(&cfg);
        let opts = InventoryOptions::from(format);
        let mut kinds = std::collections::BTreeSet::new();
        for lt in logical_inventory_v41(&cfg) {
            let Values::F32(x) = generate(&cfg, 42, &lt) else {
                panic!("{}: V4.1 has no integer tensor", lt.name)
            };
            let got = |name: &str, dtype: Dtype| {
                let b = stored.get(name);
                match dtype {
                    Dtype::BF16 => bf16_bytes_to_f32(b).unwrap(),
                    Dtype::F32 => f32_bytes_to_f32(b).unwrap(),
                    d => panic!("{name}: {d} where a plain tensor was expected"),
                }
            };
            match linear_storage(rules, opts, lt.role) {
                None => {
                    let t = stored.order.iter().find(|t| t.name == lt.name).unwrap();
                    let want: Vec<f32> = match t.dtype {
                        Dtype::BF16 => x.iter().map(|&v| bf16_round(v)).collect(),
                        _ => x,
                    };
                    assert_same_bits(&got(&lt.name, t.dtype), &want, &lt.name);
                }
                Some(storage) => {
                    let (o, i) = (lt.shape[0], lt.shape[1]);
                    let w = format!("{}.weight", lt.name);
                    let sc = format!("{}.scale", lt.name);
                    let decoded = match storage {
                        LinearStorage::Bf16 => got(&w, Dtype::BF16),
                        LinearStorage::Fp8Block { block: (1, g) } => {
                            let (w, s) = (stored.get(&w), stored.get(&sc));
                            let per_row = i.div_ceil(g);
                            (0..o)
                                .flat_map(|r| {
                                    dequant_fp8_block(
                                        &w[r * i..(r + 1) * i],
                                        &s[r * per_row..(r + 1) * per_row],
                                        1,
                                        i,
                                        g,
                                    )
                                    .unwrap()
                                })
                                .collect()
                        }
                        LinearStorage::Fp8Block { block: (b, _) } => {
                            dequant_fp8_block(stored.get(&w), stored.get(&sc), o, i, b).unwrap()
                        }
                        LinearStorage::Fp4Group => {
                            dequant_fp4_group(stored.get(&w), stored.get(&sc), o, i, FP4_GROUP)
                                .unwrap()
                        }
                        LinearStorage::Nvfp4 => {
                            let s2 = format!("{}.weight_scale_2", lt.name);
                            let s2 = f32_bytes_to_f32(stored.get(&s2)).unwrap()[0];
                            let sc = format!("{}.weight_scale", lt.name);
                            dequant_nvfp4(stored.get(&w), stored.get(&sc), s2, o, i).unwrap()
                        }
                    };
                    kinds.insert(format!("{storage:?}"));
                    assert_same_bits(&decoded, &rounded(storage, &x, o, i), &lt.name);
                    // Linears decode through the reader as for V4, the block from the V4.1
                    // config (the Engram table is read by row, below).
                    if lt.role != TensorRole::EngramTable {
                        let via_reader = ckpt.linear_f32(&lt.name, o, i).unwrap();
                        assert_same_bits(&via_reader, &decoded, &lt.name);
                    }
                }
            }
        }
        let want: &[&str] = match format {
            WeightFormat::Bf16 => &["Bf16"],
            WeightFormat::Nvfp4 => &[
                "Bf16",
                "Fp4Group",
                "Fp8Block { block: (1, 32) }",
                "Fp8Block { block: (32, 32) }",
                "Nvfp4",
            ],
            _ => &[
                "Bf16",
                "Fp4Group",
                "Fp8Block { block: (1, 32) }",
                "Fp8Block { block: (32, 32) }",
            ],
        };
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), want, "{format}");
    }
}

/// The Engram table of the official format, decoded by hand: row r, column c is
/// `e4m3(code[r, c]) · 2^(scale[r, c / 32] − 127)`, each scale the smallest power of two that
/// brings its 32 values within e4m3's ±448.
#[test]
fn v41_tiny_engram_tables_decode_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let s = write(dir.path(), WeightFormat::Official, 1, 7);
    let cfg = s.config;
    let stored = Stored::read(&s.files);
    for (layer, rows) in [(1usize, 4062usize), (5, 4152)] {
        let name = format!("layers.{layer}.engram.embed");
        let lt = logical_inventory_v41(&cfg)
            .into_iter()
            .find(|t| t.name == name)
            .unwrap();
        assert_eq!(lt.shape, [rows, 64]);
        let Values::F32(x) = generate(&cfg, 7, &lt) else {
            panic!()
        };
        let codes = stored.get(&format!("{name}.weight"));
        let scales = stored.get(&format!("{name}.scale"));
        assert_eq!((codes.len(), scales.len()), (rows * 64, rows * 2));
        let (mut sq, mut worst) = (0.0f64, 0.0f32);
        for r in 0..rows {
            for g in 0..2 {
                let cols = r * 64 + g * 32..r * 64 + (g + 1) * 32;
                let amax = x[cols.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                let e = (amax as f64 / 448.0).log2().ceil() as i32;
                assert_eq!(
                    scales[r * 2 + g] as i32,
                    e + 127,
                    "{name} row {r} group {g}"
                );
                let scale = 2f32.powi(e);
                assert_eq!(e8m0_to_f32(scales[r * 2 + g]), scale);
                for c in cols {
                    let got = e4m3_to_f32(codes[c]) * scale;
                    let want = e4m3_to_f32(f32_to_e4m3(x[c] / scale)) * scale;
                    assert_eq!(got.to_bits(), want.to_bits(), "{name}[{r}, {}]", c % 64);
                    // e4m3 keeps 3 mantissa bits: within a sixteenth, plus the subnormal step.
                    let err = (got - x[c]).abs();
                    assert!(
                        err <= x[c].abs() / 16.0 + scale * 2f32.powi(-9),
                        "{got} vs {}",
                        x[c]
                    );
                    worst = worst.max(err);
                }
            }
            sq += x[r * 64..(r + 1) * 64]
                .iter()
                .map(|v| (*v as f64).powi(2))
                .sum::<f64>();
        }
        // Unit-scale rows (an embedding), so the scales sit near 2^-8.
        let std = (sq / (rows * 64) as f64).sqrt();
        assert!((0.9..1.1).contains(&std), "{name}: std {std}");
        assert!(worst < 0.25, "{name}: worst error {worst}");
        // The checkpoint's Engram view reads the same rows, one at a time, from the opened
        // V4.1 checkpoint (rounded to bf16 on request, as the reference does).
        let ckpt = Checkpoint::open_v41(dir.path()).unwrap();
        let table = ckpt.engram_table(layer).unwrap();
        table.expect_shape(rows, 64).unwrap();
        for r in [0, 1, rows / 2, rows - 1] {
            let want: Vec<f32> = (0..64)
                .map(|c| e4m3_to_f32(codes[r * 64 + c]) * e8m0_to_f32(scales[r * 2 + c / 32]))
                .collect();
            let got = table.decode_row(r, EngramPrecision::F32).unwrap();
            assert_same_bits(&got, &want, &format!("{name} row {r}"));
            let got = table.decode_row(r, EngramPrecision::Bf16).unwrap();
            let want: Vec<f32> = want.iter().map(|&v| bf16_round(v)).collect();
            assert_same_bits(&got, &want, &format!("{name} row {r}, bf16"));
        }
        let err = table.decode_row(rows, EngramPrecision::F32).unwrap_err();
        assert!(err.to_string().contains(&format!("{name}.weight")), "{err}");
    }
}

#[test]
fn v41_tiny_same_seed_same_bytes_other_seed_other_bytes() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let t = std::time::Instant::now();
    let sa = write(a.path(), WeightFormat::Official, 1, 5);
    let secs = t.elapsed().as_secs_f64();
    write(b.path(), WeightFormat::Official, 1, 5);
    write(c.path(), WeightFormat::Official, 1, 6);
    let read = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
    for f in ["model.safetensors", "config.json"] {
        assert!(
            read(a.path(), f) == read(b.path(), f),
            "{f} differs for one seed"
        );
    }
    assert!(read(a.path(), "model.safetensors") != read(c.path(), "model.safetensors"));
    assert_eq!(read(a.path(), "config.json"), read(c.path(), "config.json"));
    // Its size: the real vocabulary's embed and head (129,280 x 128 BF16, 33.1 MB each) and the
    // draft block's Markov head (2 x 129,280 x 16 BF16) are most of it.
    eprintln!(
        "v41-tiny official: {} tensors, {} bytes in {secs:.2} s",
        sa.tensors, sa.payload_bytes
    );
    assert_eq!(sa.payload_bytes, OFFICIAL_BYTES);
    let bf16 = tempfile::tempdir().unwrap();
    let sb = write(bf16.path(), WeightFormat::Bf16, 1, 5);
    eprintln!(
        "v41-tiny bf16: {} tensors, {} bytes",
        sb.tensors, sb.payload_bytes
    );
    assert_eq!(sb.payload_bytes, BF16_BYTES);
    assert!(secs < 30.0, "synth took {secs:.1} s");
}

/// Payload bytes of the tiny V4.1, official and bf16.
const OFFICIAL_BYTES: u64 = 79_480_676;
const BF16_BYTES: u64 = 85_154_504;
