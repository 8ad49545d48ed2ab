//! `synth --preset v41-tiny`: a deterministic DeepSeek-V4.1 at toy size in the release's tensor
//! names, dtypes and `config.json` layout (docs/spec/v41.md sections 2 to 4), so that what reads
//! V4.1 checkpoints is exercised on every layer role without the 510 GB release.
//!
//! The config ([`tiny_config_json`]) is the release's composite `config.json` (`model_type`
//! `deepseek_v41`, `text_config`, `vision_config`, `quantization_config` for `official`) with
//! every field of the released `text_config`, at small sizes, and is read back through
//! [`V41Config::from_json_str`] like any V4.1 config. Its 12 main layers and one draft block keep
//! every role of the release (docs/spec/v41.md 3):
//!
//! | layer | kind | ratio | KV src | idx src | role | candidate | Engram |
//! |---|---|---|---|---|---|---|---|
//! | 0 | swa | 0 | — | — | window only | — | — |
//! | 1 | swa | 0 | — | — | window only | — | table 0 |
//! | 2 | csa2 | 2 | 2 | 2 | KV + index source ("full") | — | — |
//! | 3, 4 | csa2 | 2 | 2 | 2 | reuse | — | — |
//! | 5 | csa2 | 2 | 5 | 5 | KV + index source ("full") | — | table 1 |
//! | 6 | csa1 | 1 | 6 | 6 | KV + index source, ratio 1 | source | — |
//! | 7 | csa1 | 1 | 6 | 6 | reuse | — | — |
//! | 8 | csa1 | 1 | 6 | 8 | reindex (index source, not KV source) | consumer | — |
//! | 9 | csa1 | 1 | 6 | 8 | reuse | — | — |
//! | 10 | csa1 | 1 | 6 | 10 | reindex | consumer | — |
//! | 11 | csa1 | 1 | 6 | 10 | reuse, DSpark target | — | — |
//! | mtp.0 | draft, window only | 0 | — | — | own 4-expert MoE, `main_proj`, Markov and confidence heads | — | — |
//!
//! Sizes: the real vocabulary (129,280, so the bundled tokenizer's prompts fit), hidden 128,
//! 4 heads of 64 (RoPE on the last 16), q LoRA 64, 2 output groups of LoRA 64, 4 index heads of
//! 32 with top-64, 8 routed experts top-2 of width 64 (+1 shared), 4 draft experts top-2,
//! window 64. The candidate stage keeps 128 blocks of 8 rows: 1,024 ratio-1 rows, so a prompt
//! longer than 1,024 tokens has blocks dropped at the consumers (the release: 2,048 x 8 = 16,384).
//! Engram on layers 1 and 5: n-grams of 2 and 3, 2 heads of width 64, tables of 4,062 and
//! 4,152 rows from the release's prime walk ([`engram_table_rows`]) started at
//! `engram_vocab_size` 1,000. A two-block vision tower of width 32 keeps the image tensors
//! (`image_start`/`end`/`newline`, `ffn.gate.bias_vl`, `vision.*`, `aligner.*`).
//!
//! Formats: `bf16` (no `quantization_config`: every linear and the Engram tables BF16),
//! `official` (the release's `quantization_config`: FP8 e4m3 `[32, 32]` blocks with E8M0 scales,
//! FP4 routed experts as I8 + E8M0 per 32, Engram tables F8_E4M3 rows with one E8M0 scale per 32
//! columns) and `nvfp4` (NVIDIA's re-quantisation, docs/spec/v41.md 4.3: `moe_quant_algo`
//! `NVFP4`, the backbone's routed experts U8 + F8_E4M3 `weight_scale` per 16 + F32
//! `weight_scale_2` / `input_scale`, the draft block's experts as `official`, the rest as
//! `official`). The tensors are exactly
//! [`expected_inventory_v41`](crate::checkpoint::inventory_v41::expected_inventory_v41) of the
//! config, values and files as for DeepSeek-V4 (`super` module doc).

use super::tensors::GenParams;
use super::{groups, write_groups, Preset, SynthOptions, SynthSummary};
use crate::checkpoint::inventory::{InventoryOptions, StorageRules};
use crate::checkpoint::inventory_v41::logical_inventory_v41;
use crate::checkpoint::{CheckpointError, WeightFormat};
use crate::config::V41Config;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// The main layers of the tiny V4.1.
pub const TINY_LAYERS: usize = 12;
/// `engram_layer_ids` of the tiny V4.1.
pub const TINY_ENGRAM_LAYERS: [usize; 2] = [1, 5];
const ENGRAM_MAX_NGRAM: usize = 3;
const ENGRAM_HEADS: usize = 2;
const ENGRAM_VOCAB: u64 = 1000;

/// The error of the DeepSeek-V4 entry points ([`super::synth`], [`super::synth_config`]) asked
/// for `v41-tiny`.
pub(crate) fn not_a_v4_preset() -> CheckpointError {
    CheckpointError::SynthOption {
        field: "preset",
        expected: "a DeepSeek-V4 preset (tiny, planted, flash) here; v41-tiny is DeepSeek-V4.1, \
                   written by synth::v41::synth_v41"
            .into(),
        found: "v41-tiny".into(),
    }
}

/// Rows of each Engram table: the sum of each layer's primes of the release's walk
/// ([`crate::config::engram::engram_primes`]).
pub fn engram_table_rows(layers: usize, max_ngram: usize, heads: usize, vocab: u64) -> Vec<u64> {
    crate::config::engram::engram_primes(layers, max_ngram, heads, vocab)
        .iter()
        .map(|layer| layer.iter().flatten().sum())
        .collect()
}

/// A JSON object that keeps its keys in the order given (the release's order), nested.
enum Ordered {
    Value(Value),
    Object(Vec<(&'static str, Ordered)>),
}

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Ordered::Value(v) => v.serialize(s),
            Ordered::Object(entries) => {
                let mut m = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

fn obj(entries: Vec<(&'static str, Value)>) -> Ordered {
    Ordered::Object(
        entries
            .into_iter()
            .map(|(k, v)| (k, Ordered::Value(v)))
            .collect(),
    )
}

/// The tiny V4.1's `config.json` text in `format` (module doc): the release's composite layout
/// and key order, `quantization_config` for `official` and `nvfp4` (which adds NVIDIA's
/// `moe_quant_algo`).
pub fn tiny_config_json(format: WeightFormat) -> Result<String, CheckpointError> {
    let engram_rows = engram_table_rows(
        TINY_ENGRAM_LAYERS.len(),
        ENGRAM_MAX_NGRAM,
        ENGRAM_HEADS,
        ENGRAM_VOCAB,
    );
    // 12 main layers (module doc table), then the draft block's 0.
    let ratios = [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0];
    let text = obj(vec![
        ("model_type", json!("deepseek_v41_text")),
        ("vocab_size", json!(129280)),
        ("hidden_size", json!(128)),
        ("moe_intermediate_size", json!(64)),
        ("num_hidden_layers", json!(TINY_LAYERS)),
        ("num_attention_heads", json!(4)),
        ("num_key_value_heads", json!(1)),
        ("head_dim", json!(64)),
        ("qk_rope_head_dim", json!(16)),
        ("q_lora_rank", json!(64)),
        ("o_lora_rank", json!(64)),
        ("o_groups", json!(2)),
        ("hidden_act", json!("silu")),
        ("swiglu_limit", json!(10.0)),
        ("rms_norm_eps", json!(1e-20)),
        ("attention_bias", json!(false)),
        ("attention_dropout", json!(0.0)),
        ("initializer_range", json!(0.02)),
        ("use_cache", json!(true)),
        ("tie_word_embeddings", json!(false)),
        ("max_position_embeddings", json!(65536)),
        ("rope_theta", json!(10000)),
        // Its place in the order; the object (keys in the release's order) is set below.
        ("rope_scaling", Value::Null),
        ("compress_rope_theta", json!(160000)),
        ("n_routed_experts", json!(8)),
        ("n_shared_experts", json!(1)),
        ("num_experts_per_tok", json!(2)),
        ("scoring_func", json!("sqrtsoftplus")),
        ("topk_method", json!("noaux_tc")),
        ("norm_topk_prob", json!(true)),
        ("routed_scaling_factor", json!(1.5)),
        ("sliding_window", json!(64)),
        ("compress_ratios", json!(ratios)),
        ("kv_source_layer_ids", json!([2, 5, 6])),
        ("index_source_layer_ids", json!([2, 5, 6, 8, 10])),
        ("index_n_heads", json!(4)),
        ("index_head_dim", json!(32)),
        ("index_topk", json!(64)),
        ("candidate_source_layer_id", json!(6)),
        ("candidate_topk_blocks", json!(128)),
        ("candidate_block_size", json!(8)),
        ("hc_mult", json!(4)),
        ("hc_sinkhorn_iters", json!(20)),
        ("hc_eps", json!(1e-6)),
        ("engram_layer_ids", json!(TINY_ENGRAM_LAYERS)),
        ("engram_num_embeddings", json!(engram_rows)),
        ("engram_max_ngram_size", json!(ENGRAM_MAX_NGRAM)),
        ("engram_vocab_size", json!(ENGRAM_VOCAB)),
        ("engram_n_heads", json!(ENGRAM_HEADS)),
        ("engram_head_dim", json!(64)),
        ("engram_pad_token_id", json!(2)),
        ("engram_compressed_vocab_size", json!(99092)),
        ("num_nextn_predict_layers", json!(1)),
        ("dspark_block_size", json!(5)),
        ("dspark_noise_token_id", json!(128799)),
        ("dspark_target_layer_ids", json!([TINY_LAYERS - 1])),
        ("dspark_markov_rank", json!(16)),
        ("dspark_n_routed_experts", json!(4)),
        ("dspark_num_experts_per_tok", json!(2)),
    ]);
    let rope_scaling = obj(vec![
        ("rope_type", json!("yarn")),
        ("factor", json!(16)),
        ("beta_fast", json!(32)),
        ("beta_slow", json!(1)),
        // x factor 16 = max_position_embeddings 65536.
        ("original_max_position_embeddings", json!(4096)),
    ]);
    let Ordered::Object(mut text) = text else {
        unreachable!("obj builds an object")
    };
    let at = text
        .iter()
        .position(|(k, _)| *k == "rope_scaling")
        .expect("rope_scaling listed");
    text[at].1 = rope_scaling;
    let text = Ordered::Object(text);
    let vision = obj(vec![
        ("model_type", json!("deepseek_v41_vision")),
        ("num_hidden_layers", json!(2)),
        ("hidden_size", json!(32)),
        ("num_attention_heads", json!(2)),
        ("intermediate_size", json!(64)),
        ("patch_size", json!(14)),
        ("downsample_ratio", json!(3)),
        ("rope_theta", json!(10000)),
        ("max_image_tokens", json!(1024)),
        ("min_pixels", json!(295936)),
        ("max_wh_ratio", Value::Null),
    ]);
    let mut top: Vec<(&'static str, Ordered)> = vec![
        (
            "architectures",
            Ordered::Value(json!(["DeepseekV41ForCausalLM"])),
        ),
        ("model_type", Ordered::Value(json!("deepseek_v41"))),
        ("dtype", Ordered::Value(json!("bfloat16"))),
        ("bos_token_id", Ordered::Value(json!(0))),
        ("eos_token_id", Ordered::Value(json!(1))),
        ("pad_token_id", Ordered::Value(json!(2))),
        ("image_token_id", Ordered::Value(json!(129264))),
    ];
    if format != WeightFormat::Bf16 {
        let mut quant = vec![
            ("quant_method", json!("fp8")),
            ("activation_scheme", json!("dynamic")),
            ("weight_block_size", json!([32, 32])),
            ("scale_fmt", json!("ue8m0")),
            ("expert_dtype", json!("fp4")),
        ];
        if format == WeightFormat::Nvfp4 {
            quant.push(("moe_quant_algo", json!("NVFP4")));
        }
        top.push(("quantization_config", obj(quant)));
    }
    top.push(("text_config", text));
    top.push(("vision_config", vision));
    let mut out = serde_json::to_string_pretty(&Ordered::Object(top)).expect("json");
    out.push('\n');
    Ok(out)
}

/// The tiny V4.1's config in `format`, read from [`tiny_config_json`] as any V4.1 config is.
pub fn tiny_config(format: WeightFormat) -> Result<V41Config, CheckpointError> {
    let text = tiny_config_json(format)?;
    Ok(V41Config::from_json_str(
        &text,
        Path::new("<synth v41-tiny config>"),
    )?)
}

/// Writes the tiny DeepSeek-V4.1 checkpoint `opts` describes (`opts.preset` must be
/// [`Preset::V41Tiny`]; `tokenizer_json`, if given, is copied beside it), calling
/// `written(bytes, total)` as the payload is written. Refused before anything is written:
/// `--layers`, `--experts` and `--fp8-compressors` (the preset exists to keep
/// every layer role and the release's storage), and whatever synth refuses for DeepSeek-V4
/// (`--shards` out of range, an `--out` synth did not write).
pub fn synth_v41(
    opts: &SynthOptions,
    tokenizer_json: Option<&[u8]>,
    written: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary<V41Config>, CheckpointError> {
    let refuse = |field, found: String| CheckpointError::SynthOption {
        field,
        expected: "none with --preset v41-tiny (it keeps every layer role and the release's \
                   storage)"
            .into(),
        found,
    };
    if opts.preset != Preset::V41Tiny {
        return Err(CheckpointError::SynthOption {
            field: "preset",
            expected: "v41-tiny (the DeepSeek-V4 presets are written by synth::synth)".into(),
            found: opts.preset.name().into(),
        });
    }
    if let Some(n) = opts.layers {
        return Err(refuse("layers", n.to_string()));
    }
    if let Some(e) = opts.experts {
        return Err(refuse("experts", e.to_string()));
    }
    if opts.fp8_compressors {
        return Err(refuse("fp8_compressors", "true".into()));
    }
    let t0 = Instant::now();
    let text = tiny_config_json(opts.format)?;
    let cfg = V41Config::from_json_str(&text, Path::new("<synth v41-tiny config>"))?;
    let groups = groups(
        logical_inventory_v41(&cfg),
        StorageRules::from(&cfg),
        InventoryOptions::from(opts.format),
    );
    let w = write_groups(
        &groups,
        GenParams::from(&cfg),
        opts,
        tokenizer_json,
        &text,
        written,
    )?;
    Ok(SynthSummary {
        dir: opts.out.clone(),
        config: cfg,
        format: opts.format,
        tensors: w.tensors,
        payload_bytes: w.payload_bytes,
        files: w.files,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CandidateStage, LayerKind};

    #[test]
    fn the_prime_walk_gives_the_released_engram_tables() {
        assert_eq!(
            engram_table_rows(2, 4, 8, 16_000_000),
            vec![384_006_168, 384_016_682]
        );
        // The tiny tables: 1009 + 1013 + 1019 + 1021 and 1031 + 1033 + 1039 + 1049.
        assert_eq!(engram_table_rows(2, 3, 2, 1000), vec![4062, 4152]);
    }

    #[test]
    fn the_tiny_config_reads_back_in_every_format() {
        let bf16 = tiny_config(WeightFormat::Bf16).unwrap();
        assert_eq!(bf16.weights.dtype, "bf16");
        assert_eq!(bf16.weights.block, None);
        let official = tiny_config(WeightFormat::Official).unwrap();
        assert_eq!(official.weights.dtype, "fp8");
        assert_eq!(official.weights.block, Some((32, 32)));
        assert_eq!(official.weights.expert_dtype.as_deref(), Some("fp4"));
        assert_eq!(bf16.text, official.text);
        assert_eq!(bf16.vision, official.vision);
        assert_eq!(bf16.draft_blocks(), 1);
        let nvfp4 = tiny_config(WeightFormat::Nvfp4).unwrap();
        assert!(nvfp4.weights.experts_nvfp4 && !official.weights.experts_nvfp4);
        assert_eq!(nvfp4.weights.block, Some((32, 32)));
        assert_eq!(nvfp4.text, official.text);
    }

    #[test]
    fn the_tiny_config_keeps_every_layer_role() {
        let cfg = tiny_config(WeightFormat::Official).unwrap();
        let roles = cfg.layer_roles();
        let kinds: Vec<LayerKind> = roles.iter().map(|r| r.kind).collect();
        use LayerKind::{Csa1, Csa2, Swa};
        assert_eq!(
            kinds,
            [Swa, Swa, Csa2, Csa2, Csa2, Csa2, Csa1, Csa1, Csa1, Csa1, Csa1, Csa1]
        );
        let kv: Vec<Option<usize>> = roles.iter().map(|r| r.kv_source).collect();
        let n = None;
        let s = Some;
        assert_eq!(
            kv,
            [
                n,
                n,
                s(2),
                s(2),
                s(2),
                s(5),
                s(6),
                s(6),
                s(6),
                s(6),
                s(6),
                s(6)
            ]
        );
        let idx: Vec<Option<usize>> = roles.iter().map(|r| r.index_source).collect();
        assert_eq!(
            idx,
            [
                n,
                n,
                s(2),
                s(2),
                s(2),
                s(5),
                s(6),
                s(6),
                s(8),
                s(8),
                s(10),
                s(10)
            ]
        );
        let stages: Vec<CandidateStage> = roles.iter().map(|r| r.candidate_stage).collect();
        let c = CandidateStage::Consumer { source: 6 };
        let o = CandidateStage::None;
        assert_eq!(
            stages,
            [o, o, o, o, o, o, CandidateStage::Source, o, c, o, c, o]
        );
    }

    #[test]
    fn the_v4_entry_points_refuse_v41_tiny() {
        let o = SynthOptions::new(Preset::V41Tiny, WeightFormat::Official, "x");
        let msg = super::super::synth_config(&o).unwrap_err().to_string();
        assert!(
            msg.contains("v41-tiny") && msg.contains("synth_v41"),
            "{msg}"
        );
        assert!(super::super::synth(&o, None).is_err());
        assert_eq!("v41-tiny".parse::<Preset>().unwrap(), Preset::V41Tiny);
    }
}
