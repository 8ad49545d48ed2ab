//! What the memory plan needs to know of a model ([`PlanModel`]), built from either family: the
//! layer-role table, the dimensions its state and workspace are sized by, and what only
//! DeepSeek-V4.1 has (the candidate stage, the Engram tables, index keys without a compressor
//! of their own). Every function of the plan takes a model through [`AsPlanModel`], so a
//! DeepSeek-V4 [`ModelConfig`], a DeepSeek-V4.1 [`V41Config`] or a [`ModelDescription`] of
//! either plans with the same code.

use std::borrow::Cow;

use crate::config::{CandidateStage, Family, LayerRoles, ModelConfig, ModelDescription, V41Config};

use crate::checkpoint::inventory::ENGRAM_GROUP;
use crate::checkpoint::WeightFormat;

/// The plan's description of a model (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanModel {
    pub family: Family,
    /// One role per main layer.
    pub roles: LayerRoles,
    pub hidden_size: usize,
    pub hc_mult: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub vocab_size: usize,
    pub sliding_window: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    /// The largest top-k of the run (the placement sets the run's own).
    pub index_topk: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    /// Whether an indexer pools its keys with a compressor of its own, carrying its unfinished
    /// group (DeepSeek-V4), rather than deriving them from its KV source's compressed latent
    /// (DeepSeek-V4.1).
    pub indexer_compressor: bool,
    /// DeepSeek-V4.1's two-level selection, when the config has a candidate source.
    pub candidate: Option<CandidateBlocks>,
    /// DeepSeek-V4.1's Engram tables, one per Engram layer (none on V4).
    pub engram: Vec<EngramHostTable>,
}

/// The candidate stage (docs/spec/v41.md 5.6): the source keeps `topk_blocks` blocks of
/// `block_size` compressed rows per query, and the consumers pick their top-k inside them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateBlocks {
    pub source: usize,
    pub consumers: Vec<usize>,
    pub topk_blocks: usize,
    pub block_size: usize,
}

/// One Engram table (docs/spec/v41.md 5.2): `rows` rows of `head_dim` values, stored in
/// `row_bytes` each (e4m3 values and one e8m0 scale per [`ENGRAM_GROUP`] columns in the
/// official and NVFP4 formats, bf16 values in the bf16 one), of which each token reads `rows_per_token`
/// (one per n-gram size and head) and projects their concatenation to `out_width` values
/// (`(hc_mult + 1) x hidden`: a key per residual copy and the value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramHostTable {
    pub layer: usize,
    pub rows: u64,
    pub head_dim: usize,
    /// Stored bytes of one row (values and, if any, their scales).
    pub row_bytes: u64,
    pub rows_per_token: usize,
    pub out_width: usize,
}

impl EngramHostTable {
    /// Stored bytes of one row of `head_dim` values in `format`.
    pub fn row_bytes_in(head_dim: usize, format: WeightFormat) -> u64 {
        match format {
            WeightFormat::Bf16 => 2 * head_dim as u64,
            WeightFormat::Official | WeightFormat::Nvfp4 => {
                (head_dim + head_dim.div_ceil(ENGRAM_GROUP)) as u64
            }
        }
    }

    /// Stored bytes of the table, saturating.
    pub fn bytes(&self) -> u64 {
        self.rows.saturating_mul(self.row_bytes)
    }

    /// Bytes one token reads from the table.
    pub fn read_bytes_per_token(&self) -> u64 {
        (self.rows_per_token as u64).saturating_mul(self.row_bytes)
    }
}

impl PlanModel {
    /// A DeepSeek-V4 model.
    pub fn v4(cfg: &ModelConfig) -> Self {
        PlanModel {
            family: Family::V4,
            roles: cfg.layer_roles(),
            hidden_size: cfg.hidden_size,
            hc_mult: cfg.hc_mult,
            num_attention_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim,
            q_lora_rank: cfg.q_lora_rank,
            o_groups: cfg.o_groups,
            o_lora_rank: cfg.o_lora_rank,
            vocab_size: cfg.vocab_size,
            sliding_window: cfg.sliding_window,
            index_n_heads: cfg.index_n_heads,
            index_head_dim: cfg.index_head_dim,
            index_topk: cfg.index_topk,
            num_experts_per_tok: cfg.num_experts_per_tok,
            moe_intermediate_size: cfg.moe_intermediate_size,
            indexer_compressor: true,
            candidate: None,
            engram: Vec::new(),
        }
    }

    /// A DeepSeek-V4.1 model (its main layers; the draft blocks are never planned) in the
    /// weight format its config implies.
    pub fn v41(cfg: &V41Config) -> Self {
        let format = match &cfg.weights {
            w if w.experts_nvfp4 => WeightFormat::Nvfp4,
            w if w.block.is_some() => WeightFormat::Official,
            _ => WeightFormat::Bf16,
        };
        PlanModel::v41_stored(cfg, format)
    }

    /// A DeepSeek-V4.1 model whose tables are stored in `format` (`inspect --config
    /// --format`, or a checkpoint's own).
    pub fn v41_stored(cfg: &V41Config, format: WeightFormat) -> Self {
        let t = &cfg.text;
        let roles = cfg.layer_roles();
        let candidate = cfg.candidate_source().map(|source| CandidateBlocks {
            source,
            consumers: roles
                .iter()
                .filter(|r| matches!(r.candidate_stage, CandidateStage::Consumer { .. }))
                .map(|r| r.layer)
                .collect(),
            topk_blocks: t.candidate_topk_blocks,
            block_size: t.candidate_block_size,
        });
        let engram = t
            .engram_layer_ids
            .iter()
            .zip(&t.engram_num_embeddings)
            .map(|(&layer, &rows)| EngramHostTable {
                layer,
                rows,
                head_dim: t.engram_head_dim,
                row_bytes: EngramHostTable::row_bytes_in(t.engram_head_dim, format),
                // n-grams of 2 ..= max_ngram_size, one row per head each.
                rows_per_token: t.engram_max_ngram_size.saturating_sub(1) * t.engram_n_heads,
                out_width: (t.hc_mult + 1) * t.hidden_size,
            })
            .collect();
        PlanModel {
            family: Family::V41,
            roles,
            hidden_size: t.hidden_size,
            hc_mult: t.hc_mult,
            num_attention_heads: t.num_attention_heads,
            head_dim: t.head_dim,
            q_lora_rank: t.q_lora_rank,
            o_groups: t.o_groups,
            o_lora_rank: t.o_lora_rank,
            vocab_size: t.vocab_size,
            sliding_window: t.sliding_window,
            index_n_heads: t.index_n_heads,
            index_head_dim: t.index_head_dim,
            index_topk: t.index_topk,
            num_experts_per_tok: t.num_experts_per_tok,
            moe_intermediate_size: t.moe_intermediate_size,
            indexer_compressor: false,
            candidate,
            engram,
        }
    }

    /// Number of main layers.
    pub fn layers(&self) -> usize {
        self.roles.len()
    }

    /// Bytes every token reads from the host-resident Engram tables (all Engram layers).
    pub fn engram_read_bytes_per_token(&self) -> u64 {
        super::sat_sum(
            self.engram
                .iter()
                .map(EngramHostTable::read_bytes_per_token),
        )
    }
}

/// Anything the memory plan can plan: a model of either family.
pub trait AsPlanModel {
    fn plan_model(&self) -> Cow<'_, PlanModel>;
}

impl AsPlanModel for PlanModel {
    fn plan_model(&self) -> Cow<'_, PlanModel> {
        Cow::Borrowed(self)
    }
}

impl AsPlanModel for ModelConfig {
    fn plan_model(&self) -> Cow<'_, PlanModel> {
        Cow::Owned(PlanModel::v4(self))
    }
}

impl AsPlanModel for V41Config {
    fn plan_model(&self) -> Cow<'_, PlanModel> {
        Cow::Owned(PlanModel::v41(self))
    }
}

impl AsPlanModel for ModelDescription {
    fn plan_model(&self) -> Cow<'_, PlanModel> {
        match self {
            ModelDescription::V4(c) => c.plan_model(),
            ModelDescription::V41(c) => c.plan_model(),
        }
    }
}
