//! What the memory plan needs to know of a model ([`PlanModel`]), built from either family: the
//! layer-role table, the dimensions its state and workspace are sized by, and what only
//! DeepSeek-V4.1 has (the candidate stage, the Engram tables, index keys without a compressor
//! of their own). Every function of the plan takes a model through [`AsPlanModel`], so a
//! DeepSeek-V4 [`ModelConfig`], a DeepSeek-V4.1 [`V41Config`] or a [`ModelDescription`] of
//! either plans with the same code.

use std::borrow::Cow;

use crate::config::{CandidateStage, Family, LayerRoles, ModelConfig, ModelDescription, V41Config};

/// Columns sharing one E8M0 scale in an Engram table row (docs/spec/v41.md 4.1: `embed.scale`
/// is `[rows, head_dim / 32]`).
pub const ENGRAM_SCALE_BLOCK: usize = 32;

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
    pub engram: Vec<EngramTable>,
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

/// One Engram table (docs/spec/v41.md 5.2): `rows` rows of `head_dim` e4m3 values and one
/// e8m0 scale per [`ENGRAM_SCALE_BLOCK`] columns, of which each token reads `rows_per_token`
/// (one per n-gram size and head) and projects their concatenation to `out_width` values
/// (`(hc_mult + 1) x hidden`: a key per residual copy and the value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramTable {
    pub layer: usize,
    pub rows: u64,
    pub head_dim: usize,
    pub rows_per_token: usize,
    pub out_width: usize,
}

impl EngramTable {
    /// Stored bytes of one row: the e4m3 values and their e8m0 scales.
    pub fn row_bytes(&self) -> u64 {
        (self.head_dim + self.head_dim.div_ceil(ENGRAM_SCALE_BLOCK)) as u64
    }

    /// Stored bytes of the table (values and scales), saturating.
    pub fn bytes(&self) -> u64 {
        self.rows.saturating_mul(self.row_bytes())
    }

    /// Bytes one token reads from the table.
    pub fn read_bytes_per_token(&self) -> u64 {
        (self.rows_per_token as u64).saturating_mul(self.row_bytes())
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

    /// A DeepSeek-V4.1 model (its main layers; the draft blocks are never planned).
    pub fn v41(cfg: &V41Config) -> Self {
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
            .map(|(&layer, &rows)| EngramTable {
                layer,
                rows,
                head_dim: t.engram_head_dim,
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
        super::sat_sum(self.engram.iter().map(EngramTable::read_bytes_per_token))
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
