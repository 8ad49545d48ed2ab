//! Per-layer state for a context and the per-device workspace (see the module doc of `plan`).
//! Every byte figure saturates at `u64::MAX` ([`sat_sum`], [`sat_product`]) instead of wrapping.
//! The free functions take a model of either family ([`AsPlanModel`]); the rules are methods of
//! [`PlanModel`].

use super::*;
use serde::Serialize;

/// Per-layer state bytes on the device for a context (see the module docs for the layouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayerStateBytes {
    pub window: u64,
    pub compressed_kv: u64,
    pub index_keys: u64,
    pub compressor_carry: u64,
}

impl LayerStateBytes {
    pub fn total(&self) -> u64 {
        sat_sum([
            self.window,
            self.compressed_kv,
            self.index_keys,
            self.compressor_carry,
        ])
    }
}

/// The product of `factors`, `u64::MAX` if it overflows: byte figures saturate instead of
/// wrapping to a small, plausible number (a saturated figure never fits a device).
pub fn sat_product<const N: usize>(factors: [u64; N]) -> u64 {
    factors.into_iter().fold(1u64, u64::saturating_mul)
}

/// The sum of `terms`, saturating at `u64::MAX` (see [`sat_product`]).
pub fn sat_sum(terms: impl IntoIterator<Item = u64>) -> u64 {
    terms.into_iter().fold(0u64, u64::saturating_add)
}

/// Growth slack of the device caches: they double their allocation when full.
pub const CACHE_GROWTH_SLACK: u64 = 2;

/// State of main layer `layer` after `context` tokens run in prefill chunks of `chunk`.
pub fn layer_state(
    cfg: &(impl AsPlanModel + ?Sized),
    layer: usize,
    context: usize,
    chunk: usize,
) -> LayerStateBytes {
    cfg.plan_model().layer_state(layer, context, chunk)
}

/// The largest single device cache allocation of any layer at `context`: while a cache grows
/// (old and doubled allocation) or drops its front (old and new allocation), two of its
/// allocations coexist for a moment, so every device keeps this much headroom on top of the
/// caches counted in [`layer_state`].
pub fn largest_cache_bytes(cfg: &(impl AsPlanModel + ?Sized), context: usize, chunk: usize) -> u64 {
    cfg.plan_model().largest_cache_bytes(context, chunk)
}

/// Workspace of one device for a prefill chunk of `chunk` tokens at context `context`; `last`
/// adds the probed positions' logits. See [`activation_peak_bytes`] for the chunk's buffers.
pub fn workspace_bytes(
    cfg: &(impl AsPlanModel + ?Sized),
    context: usize,
    chunk: usize,
    last: bool,
) -> u64 {
    cfg.plan_model().workspace_bytes(context, chunk, last)
}

/// The most device bytes a chunk holds at once besides weights, sequence state and logits
/// ([`PlanModel::activation_peak_bytes`]).
pub fn activation_peak_bytes(
    cfg: &(impl AsPlanModel + ?Sized),
    context: usize,
    chunk: usize,
) -> u64 {
    cfg.plan_model().activation_peak_bytes(context, chunk)
}

impl PlanModel {
    /// State of main layer `layer` after `context` tokens run in prefill chunks of `chunk`
    /// (module doc of `plan`): the window on every layer; compressed KV, index keys and the
    /// compressor's carry on a layer that owns its compressor (every CSA / HCA layer of V4,
    /// the KV sources of V4.1); nothing else (V4.1's reuse and reindex layers read their
    /// source's rows).
    pub fn layer_state(&self, layer: usize, context: usize, chunk: usize) -> LayerStateBytes {
        let (c, hd) = (context as u64, self.head_dim as u64);
        let chunk = chunk.min(context).max(1) as u64;
        // f32 rows, allocations up to CACHE_GROWTH_SLACK x the rows held.
        let cache = |rows: u64, width: u64| sat_product([CACHE_GROWTH_SLACK, rows, width, 4]);
        let window = cache((self.sliding_window as u64).saturating_add(chunk), hd);
        let role = *self.roles.get(layer);
        if !role.owns_kv() {
            return LayerStateBytes {
                window,
                ..Default::default()
            };
        }
        let mapping = role
            .rows()
            .expect("a layer with a compressor has compressed rows");
        let (ratio, ihd) = (mapping.ratio as u64, self.index_head_dim as u64);
        let rows = c / ratio;
        // The compressor (and on V4 the indexer's, of the same ratio) carries its unfinished
        // windows' kv and gate projections in f32: two windows of twice the width when
        // overlapping (8 x 2c on CSA), one of the width otherwise (128 x c on HCA, 2 x c on
        // V4.1's ratio 2); a compressor of ratio 1 pools nothing and carries nothing.
        let carry = if mapping.overlap { 2 * 2 } else { 1 };
        let (index_keys, carried_width) = if role.has_indexer() {
            // Raw (what the observer reads) and prepared keys, one multiplier per row.
            let own = if self.indexer_compressor { ihd } else { 0 };
            (
                sat_sum([cache(rows, ihd).saturating_mul(2), cache(rows, 1)]),
                hd.saturating_add(own),
            )
        } else {
            (0, hd)
        };
        let compressor_carry = if ratio > 1 {
            sat_product([ratio * carry * 2 * 4, carried_width])
        } else {
            0
        };
        LayerStateBytes {
            window,
            compressed_kv: cache(rows, hd),
            index_keys,
            compressor_carry,
        }
    }

    /// [`largest_cache_bytes`] of this model.
    pub fn largest_cache_bytes(&self, context: usize, chunk: usize) -> u64 {
        (0..self.layers())
            .map(|l| {
                let s = self.layer_state(l, context, chunk);
                s.window.max(s.compressed_kv).max(s.index_keys)
            })
            .max()
            .unwrap_or(0)
    }
}

/// Query tokens the indexer scores at once (`backend::INDEX_SCORE_TOKENS`).
const INDEX_SCORE_TOKENS: u64 = crate::backend::INDEX_SCORE_TOKENS as u64;

/// Most decoded-weight bytes one banded product holds, and most gathered entry bytes of one
/// tile of the GEMM attention (`backend::gpu::matrix::WORKSPACE_BYTES`).
const BAND_BYTES: u64 = crate::backend::gpu::matrix::WORKSPACE_BYTES as u64;
/// Most dot-product bytes of one indexer score tile (`backend::gpu::scores::TILE_BYTES`), and
/// the query rows (tokens x heads) such a tile aims at (`QUERY_ROWS_PER_TILE`).
const SCORE_TILE_BYTES: u64 = crate::backend::gpu::scores::TILE_BYTES as u64;
const SCORE_TILE_ROWS: u64 = crate::backend::gpu::scores::QUERY_ROWS_PER_TILE as u64;
/// Bound on the top-k selection's buffers of one group of rows besides its candidates
/// (histograms: at most `TOPK_GROUP_CHUNKS` x 16 u32 = 4 MiB; per-row totals and per-chunk
/// counts, well under 1 MiB).
const TOPK_FIXED_BYTES: u64 = 5 << 20;
/// Pool size classes (`backend::gpu::pool`) round an allocation up by at most an eighth.
const CLASS_SLACK_DIVISOR: u64 = 8;

impl PlanModel {
    /// The largest buffer of decoded weight a product may materialise (`gemm_weight`'s band,
    /// f32 at most): the largest linear of the model at 4 B per value, capped at
    /// [`BAND_BYTES`].
    fn band_bytes(&self) -> u64 {
        let u = |v: usize| v as u64;
        let (d, h, hd) = (
            u(self.hidden_size),
            u(self.num_attention_heads),
            u(self.head_dim),
        );
        let ro = sat_product([u(self.o_groups), u(self.o_lora_rank)]);
        let largest = [
            sat_product([u(self.vocab_size), d]),
            sat_product([h, hd, u(self.q_lora_rank)]),
            sat_product([ro, h, hd]) / u(self.o_groups).max(1),
            sat_product([d, ro]),
            sat_product([u(self.q_lora_rank), d]),
            sat_product([hd, d]),
            sat_product([2, 2, hd, d]),
            sat_product([u(self.moe_intermediate_size), d]),
            sat_product([
                u(self.index_n_heads),
                u(self.index_head_dim),
                u(self.q_lora_rank),
            ]),
            sat_product([u(self.hc_mult), d, u(self.hc_mult), u(self.hc_mult) + 2]),
        ]
        .into_iter()
        // V4.1's Engram projection `wkv`: the gathered rows to (hc_mult + 1) x hidden.
        .chain(
            self.engram
                .iter()
                .map(|e| sat_product([u(e.out_width), u(e.rows_per_token), u(e.head_dim)])),
        )
        .max()
        .unwrap_or(0);
        sat_product([4, largest]).min(BAND_BYTES)
    }

    /// [`workspace_bytes`] of this model.
    pub fn workspace_bytes(&self, context: usize, chunk: usize, last: bool) -> u64 {
        let logits = if last {
            sat_product([PROBED_LOGIT_ROWS, self.vocab_size as u64, 4])
        } else {
            0
        };
        sat_sum([
            FIXED_WORKSPACE,
            self.activation_peak_bytes(context, chunk),
            logits,
            self.largest_cache_bytes(context, chunk),
        ])
    }

    /// The most device bytes a chunk of `chunk` tokens at context `context` holds at once
    /// besides weights, sequence state and logits: the largest of the phases of a layer whose
    /// buffers are never live together (GPU backend, `model::layer` / `model::attention` /
    /// `model::moe`, Rust drops a function's buffers when it returns), each phase the sum of
    /// what it holds, plus the largest scratch buffer of capped size, the total plus an eighth
    /// for the pool's size classes. Per token, in f32 values (`n` = hc_mult, `D` = hidden, `H`
    /// x `d` = heads x head_dim):
    /// - every phase: the residual streams `n D`, the normed block input `D`, the mHC post and
    ///   comb `n + n^2` (the layer's base `L`); on DeepSeek-V4.1 with a candidate stage also
    ///   the kept-block table of the candidate source, `min(candidate_topk_blocks, blocks)`
    ///   block ids a token (4 B each), which travels with the chunk from the source to its
    ///   last consumer;
    /// - mHC (`hc_pre` / `hc_post`): `L` + the new streams `n D` + both block outputs `2 D` + the
    ///   stream mixes and their split-K parts `17 n (n + 2)`;
    /// - DeepSeek-V4.1's Engram injection (before the attention of an Engram layer): `L` + the
    ///   gathered rows dequantised and their GEMM-input copy `2 x rows_per_token x head_dim`
    ///   (24 x 256 on the release) + `wkv`'s output `(n + 1) D` + the gates `n`; plus, in
    ///   bytes, the raw rows staged from the host `rows_per_token x row_bytes` (24 x 264) and
    ///   their row ids `rows_per_token x 8`;
    /// - attention, from the query on (`A`): `L` + `q_lora` + queries `H d` + window KV `d` + the
    ///   compressor's kv and gate projections and their held copy `8 d`; then the largest of
    ///   - the indexer (layers with one): `A` + index queries and head weights, raw and
    ///     prepared, `2 (Hi di + Hi)`; per block of 256 tokens its scores `[256, rows]`, the
    ///     bf16 copies of keys and block queries (counted at 4 B), the top-k candidates
    ///     `3 x 256 x k` and `TOPK_FIXED_BYTES`; at a V4.1 candidate source also the block
    ///     scores of the whole chunk, `T x ceil(rows / block_size)` f32 (the bound on the
    ///     transient per-token block scores: at most one f32 per block per token of the chunk,
    ///     even if they were kept for every token at once), and the top-block candidates
    ///     `3 x 256 x kept`;
    ///   - the sparse attention: `A` + output `H d` + probabilities `H E` + entry table `E` +
    ///     softmax terms `2 H`, `E` = window + the most compressed entries of a query (top-k
    ///     with a selection, every visible row without: `C / 128` on HCA), and the gathered
    ///     rows `(T + window + rows) x d` (rows: the most compressed rows of any layer: `C / 4`
    ///     with a CSA layer, else `C / 128`; `C` at V4.1's ratio-1 source);
    ///   - the output projections: `A` + output `H d` and its GEMM-type copy `H d` + `wo_a`'s
    ///     `o_groups x o_lora_rank` + `D`;
    /// - MoE: `L` + both block outputs `2 D` + the routed experts' rows of all `k` slots (gathered
    ///   inputs and outputs `2 D`, gate, up and SwiGLU `3 I`), times 3/2 for the batched
    ///   layout's padding (`padded_group_rows`: under half the real rows) + route tables `3 k`;
    ///   the shared expert runs after them with less.
    ///
    /// Scratch of capped size, one at a time (each is freed before the next phase allocates
    /// another): a product's decoded band (`band_bytes`, Engram's `wkv` among the products),
    /// the GEMM attention's tile of gathered entries (`min(256 MiB, T E d)`), an indexer score
    /// tile (`min(64 MiB, 4096 x rows)`).
    pub fn activation_peak_bytes(&self, context: usize, chunk: usize) -> u64 {
        self.activation_phases(context, chunk).peak()
    }

    /// The phases and the capped scratch of [`PlanModel::activation_peak_bytes`], each in bytes.
    pub fn activation_phases(&self, context: usize, chunk: usize) -> ActivationPhases {
        let t = chunk.min(context).max(1) as u64;
        let c = context as u64;
        let u = |v: usize| v as u64;
        let (n, d) = (u(self.hc_mult), u(self.hidden_size));
        let (h, hd) = (u(self.num_attention_heads), u(self.head_dim));
        let (ih, ihd) = (u(self.index_n_heads), u(self.index_head_dim));
        let (k, inter) = (u(self.num_experts_per_tok), u(self.moe_intermediate_size));
        let window = u(self.sliding_window);
        let roles = &self.roles;
        let rows_of = |mapping: crate::config::RowMapping| c / mapping.ratio as u64;
        // The rows an indexer scores (the most of any layer with one; none without: `csa`
        // false).
        let indexed_rows = roles
            .iter()
            .filter(|r| r.has_indexer())
            .filter_map(|r| r.rows().map(rows_of))
            .max();
        let csa = indexed_rows.is_some();
        // A top-k past the rows the context can have selects them all: it costs no more.
        let topk = u(self.index_topk).min(indexed_rows.unwrap_or(0));
        // Per layer, the compressed entries of a query (its selection's top-k, or every
        // visible row) and its cached rows; the largest of each over the layers.
        let compressed_entries = roles
            .iter()
            .filter_map(|r| {
                let rows = rows_of(r.rows()?);
                Some(if r.uses_selection() { topk } else { rows })
            })
            .max()
            .unwrap_or(0);
        let emax = window.saturating_add(compressed_entries);
        let cache_rows = roles
            .iter()
            .filter_map(|r| r.rows().map(rows_of))
            .max()
            .unwrap_or(0);
        let indexed_rows = indexed_rows.unwrap_or(0);
        let per_tokens = |values: u64| sat_product([4, t, values]);
        let block = t.min(INDEX_SCORE_TOKENS);

        // V4.1's candidate stage: the source's blocks of rows, and the blocks it keeps.
        let (blocks, kept) = match &self.candidate {
            Some(cand) => {
                let rows = roles
                    .iter()
                    .find(|r| r.layer == cand.source)
                    .and_then(|r| r.rows())
                    .map(rows_of)
                    .unwrap_or(0);
                let blocks = rows.div_ceil(u(cand.block_size).max(1));
                (blocks, blocks.min(u(cand.topk_blocks)))
            }
            None => (0, 0),
        };

        let base = sat_sum([sat_product([n, d]), d, n, sat_product([n, n]), kept]);
        let mhc = per_tokens(sat_sum([
            base,
            sat_product([n, d]),
            sat_product([2, d]),
            sat_product([17, n, n + 2]),
        ]));
        let engram = self
            .engram
            .iter()
            .map(|e| {
                let rows = u(e.rows_per_token);
                sat_sum([
                    per_tokens(sat_sum([
                        base,
                        sat_product([2, rows, u(e.head_dim)]),
                        u(e.out_width),
                        n,
                    ])),
                    sat_product([t, rows, e.row_bytes.saturating_add(8)]),
                ])
            })
            .max()
            .unwrap_or(0);
        let attn = sat_sum([
            base,
            u(self.q_lora_rank),
            sat_product([h, hd]),
            hd,
            sat_product([8, hd]),
        ]);
        let indexer = if csa {
            sat_sum([
                per_tokens(sat_sum([
                    attn,
                    sat_product([2, ih, ihd]),
                    sat_product([2, ih]),
                ])),
                sat_product([4, block, indexed_rows]),
                sat_product([4, indexed_rows, ihd]),
                sat_product([4, block, ih, ihd]),
                sat_product([12, block, topk]),
                TOPK_FIXED_BYTES,
                // The candidate source's block scores of the chunk and top-block candidates.
                sat_product([4, t, blocks]),
                sat_product([12, block, kept]),
            ])
        } else {
            0
        };
        let attend = sat_sum([
            per_tokens(sat_sum([
                attn,
                sat_product([h, hd]),
                sat_product([h, emax]),
                emax,
                sat_product([2, h]),
            ])),
            sat_product([4, hd, sat_sum([t, window, cache_rows])]),
        ]);
        let out_proj = per_tokens(sat_sum([
            attn,
            sat_product([2, h, hd]),
            sat_product([u(self.o_groups), u(self.o_lora_rank)]),
            d,
        ]));
        // Routed rows at 4 B x 3/2 (padding) = 6 B per value.
        let moe = sat_sum([
            per_tokens(sat_sum([base, sat_product([2, d]), sat_product([3, k])])),
            sat_product([
                6,
                t,
                k,
                sat_sum([sat_product([2, d]), sat_product([3, inter])]),
            ]),
        ]);
        let score_tile = if csa {
            sat_product([
                4,
                SCORE_TILE_ROWS.min(sat_product([INDEX_SCORE_TOKENS, ih])),
                indexed_rows,
            ])
            .min(SCORE_TILE_BYTES)
        } else {
            0
        };
        let scratch = self
            .band_bytes()
            .max(sat_product([4, t, emax, hd]).min(BAND_BYTES))
            .max(score_tile);
        ActivationPhases {
            mhc,
            engram,
            indexer,
            attend,
            out_proj,
            moe,
            scratch,
        }
    }
}

/// The bytes each phase of a layer holds for one prefill chunk, and the largest scratch buffer
/// of capped size ([`PlanModel::activation_peak_bytes`]); a phase the model does not have is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ActivationPhases {
    pub mhc: u64,
    /// DeepSeek-V4.1's Engram injection.
    pub engram: u64,
    pub indexer: u64,
    /// The sparse attention.
    pub attend: u64,
    pub out_proj: u64,
    pub moe: u64,
    pub scratch: u64,
}

impl ActivationPhases {
    /// The largest phase plus the scratch, plus an eighth for the pool's size classes.
    pub fn peak(&self) -> u64 {
        let phases = [
            self.mhc,
            self.engram,
            self.indexer,
            self.attend,
            self.out_proj,
            self.moe,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let live = sat_sum([phases, self.scratch]);
        sat_sum([live, live.div_ceil(CLASS_SLACK_DIVISOR)])
    }
}
