//! The argument and result types of [`Backend`] ops: where weights live
//! ([`WeightResidency`]), where the engine is ([`Site`]), the mHC, FFN and routing inputs, a
//! sparse-attention batch and its observed probabilities, a compressor's pooling layout
//! ([`PoolLayout`]: which buffered token and channel feeds each slot of each compressed row),
//! a block of raw index queries ([`RawIndexQueries`]), and a profile row ([`OpTime`]). Shapes
//! are in each type's docs. The index-score block ([`super::IndexScoreBatch`]) lives in
//! `crate::numerics::score_batch`, whose host scorer takes it too.

#[cfg(doc)]
use super::Backend;
use crate::numerics::profiles::IndexProfile;

/// Where linear weights live between uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightResidency {
    /// Decoded to f32 once, at load (fastest; needs ~4 bytes per parameter of RAM).
    Decoded,
    /// Kept in the stored format (the checkpoint's memory map) and decoded per use, a band of
    /// rows at a time: memory stays near the stored size, paged in and out by the OS.
    Streamed,
    /// `Decoded` when the decoded model fits comfortably in memory, else `Streamed` (resolved
    /// by the engine at load, see `model::forward`).
    #[default]
    Auto,
}

impl WeightResidency {
    pub fn name(self) -> &'static str {
        match self {
            WeightResidency::Decoded => "decoded",
            WeightResidency::Streamed => "streamed",
            WeightResidency::Auto => "auto",
        }
    }
}

impl std::fmt::Display for WeightResidency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightResidency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "decoded" => Ok(WeightResidency::Decoded),
            "streamed" => Ok(WeightResidency::Streamed),
            "auto" => Ok(WeightResidency::Auto),
            other => Err(format!(
                "unknown weight residency {other:?}, expected decoded, streamed or auto"
            )),
        }
    }
}

/// A part of the model, for [`Backend::enter_site`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// The token embedding (placed with the first layer).
    Embed,
    /// Decoder layer `i`.
    Layer(usize),
    /// The final mHC head, norm and LM head (placed with the last layer).
    Head,
}

/// The weights of one mHC site as the backend needs them.
pub struct HcWeights<'a, M> {
    /// `[(2+n)·n, n·D]` for a layer site, `[n, n·D]` for the head.
    pub mix: &'a M,
    /// `[(2+n)·n]` (layer site) or `[n]` (head).
    pub base: &'a [f32],
    /// `[3]` (layer site) or `[1]` (head).
    pub scale: &'a [f32],
}

/// One SwiGLU feed-forward network (a routed expert or the shared expert).
pub struct FfnWeights<M> {
    /// Gate projection `[I, D]`.
    pub w1: M,
    /// Down projection `[D, I]`.
    pub w2: M,
    /// Up projection `[I, D]`.
    pub w3: M,
}

/// Expert choice of every token of a chunk: `experts[t*k + s]` with weight `weights[t*k + s]`.
pub struct Routes<'a> {
    /// Experts per token (`num_experts_per_tok`).
    pub per_token: usize,
    pub experts: &'a [usize],
    pub weights: &'a [f32],
}

/// The queries of a chunk and, per query, the key/value rows it attends (MQA: key = value).
/// `Q` holds the tensors: the backend's [`Backend::Act`] for the op, `[f32]` on the host.
pub struct AttentionBatch<'a, Q: ?Sized = [f32]> {
    pub heads: usize,
    pub head_dim: usize,
    /// Logit scale (head_dim^-0.5).
    pub scale: f32,
    /// `[H]` sink logits: in the softmax denominator only, unscaled, no value vector.
    pub sinks: &'a [f32],
    /// `[T, H, head_dim]`.
    pub queries: &'a Q,
    /// The rows the entries index, `[rows, head_dim]` each: the window cache, then the
    /// compressed rows.
    pub kv: [&'a Q; 2],
    /// Per query: the attended rows as indices into `kv[0]` followed by `kv[1]` (index `i` is
    /// row `i` of `kv[0]` below its row count, else row `i - rows(kv[0])` of `kv[1]`), window
    /// tokens first, then compressed rows, in the order the probabilities are reported.
    pub entries: &'a [Vec<u32>],
    /// Per query: whether to return the probabilities (for the observer).
    pub want_probs: &'a [bool],
}

impl<'a, Q: ?Sized> AttentionBatch<'a, Q> {
    /// The same batch over other tensors of the same shapes (e.g. host slices of activations).
    pub fn with_tensors<'b, R: ?Sized>(
        &self,
        queries: &'b R,
        kv: [&'b R; 2],
    ) -> AttentionBatch<'b, R>
    where
        'a: 'b,
    {
        AttentionBatch {
            heads: self.heads,
            head_dim: self.head_dim,
            scale: self.scale,
            sinks: self.sinks,
            queries,
            kv,
            entries: self.entries,
            want_probs: self.want_probs,
        }
    }
}

/// The raw index queries of T tokens, as [`Backend::index_prepare_queries`] takes them (after
/// RoPE, before the profile's rounding). `X` holds the tensors: the backend's [`Backend::Act`]
/// for the op, `[f32]` on the host.
pub struct RawIndexQueries<'a, X: ?Sized = [f32]> {
    /// The index profile whose rounding prepares them.
    pub profile: IndexProfile,
    /// Queries `[T, heads, dim]`.
    pub queries: &'a X,
    /// Raw head weights `[T, heads]` (before the indexer scale, 2^-6.5 on Flash).
    pub weights: &'a X,
    /// Index heads per token.
    pub heads: usize,
    /// Index head dim.
    pub dim: usize,
}

impl<'a, X: ?Sized> RawIndexQueries<'a, X> {
    /// The same queries over other tensors of the same shapes (e.g. host slices of activations).
    pub fn with_tensors<'b, Y: ?Sized>(
        &self,
        queries: &'b Y,
        weights: &'b Y,
    ) -> RawIndexQueries<'b, Y>
    where
        'a: 'b,
    {
        RawIndexQueries {
            profile: self.profile,
            queries,
            weights,
            heads: self.heads,
            dim: self.dim,
        }
    }
}

/// Softmax probabilities of one query, returned when asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionProbs {
    /// `[H, entries]`, head-major.
    pub probs: Vec<f32>,
    /// `[H]`: the sink's share of each head's denominator.
    pub sink: Vec<f32>,
}

/// Which buffered tokens a compressor pools into each output row ([`Backend::compressor_pool`]).
///
/// The buffer holds the projections `[n, width]` of consecutive tokens; output row i pools
/// the window of `ratio` tokens starting at buffer token `first_window + i·ratio` (its
/// *current* window; windows start at multiples of `ratio` in the sequence, so a token's slot
/// `r` in its window is its position mod `ratio`). Without overlap (`width = c`) those `ratio`
/// tokens are the row's slots. With overlap (CSA, `width = 2c`) the row has `2·ratio` slots:
/// first the previous window's tokens (buffer tokens `first_window + (i-1)·ratio + r`) through
/// channels `0..c`, then the current window's through channels `c..2c`; row 0's previous
/// window is missing (-inf logits) unless `first_has_previous`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    pub ratio: usize,
    /// Output width c.
    pub c: usize,
    pub overlap: bool,
    /// Buffer token where output row 0's current window starts.
    pub first_window: usize,
    /// Overlap only: whether output row 0 has a previous window in the buffer (then
    /// `first_window >= ratio`).
    pub first_has_previous: bool,
}

impl PoolLayout {
    /// Projection width per token: `2c` with overlap, else `c`.
    pub fn width(&self) -> usize {
        if self.overlap {
            2 * self.c
        } else {
            self.c
        }
    }

    /// Slots per row: `2·ratio` with overlap, else `ratio`.
    pub fn slots(&self) -> usize {
        if self.overlap {
            2 * self.ratio
        } else {
            self.ratio
        }
    }

    /// Slot `s` of output row `i`: its buffer token and channel offset, or None for a missing
    /// previous window.
    pub fn slot(&self, i: usize, s: usize) -> Option<(usize, usize)> {
        let m = self.ratio;
        if !self.overlap {
            return Some((self.first_window + i * m + s, 0));
        }
        if s >= m {
            return Some((self.first_window + i * m + s - m, self.c));
        }
        if i == 0 && !self.first_has_previous {
            return None;
        }
        Some((self.first_window + i * m + s - m, 0))
    }

    /// Checks the lengths of a [`Backend::compressor_pool`] call (values and logits `[n,
    /// width]`, ape `[ratio, width]`, out `[rows, c]`, n enough for the rows) and returns the
    /// rows. Panics on a mismatch (a caller bug).
    pub fn check(&self, values: usize, logits: usize, ape: usize, out: usize) -> usize {
        let (c, width) = (self.c, self.width());
        let rows = out / c.max(1);
        assert_eq!(rows * c, out, "pool: out not [rows, c]");
        assert_eq!(logits, values, "pool: logits and values differ");
        assert!(
            values >= self.tokens_needed(rows) * width,
            "pool: {values} buffered values, rows need {} tokens of {width}",
            self.tokens_needed(rows)
        );
        assert_eq!(ape, self.ratio * width, "pool: ape not [ratio, width]");
        rows
    }

    /// Buffer tokens the rows `0..rows` read: up to the end of the last current window.
    pub fn tokens_needed(&self, rows: usize) -> usize {
        if rows == 0 {
            0
        } else {
            self.first_window + rows * self.ratio
        }
    }
}

/// Device memory held by an executor's own buffers, in bytes ([`Backend::device_memory`]): what
/// it allocated and has not freed (`held`, the buffer pool's kept buffers included) and that
/// less what the pool keeps (`in_use`: what the device must have, since a full device empties
/// the pool before it fails), now and at most so far. The CUDA context, cuBLAS's workspace and
/// kernels' local memory are not counted (the memory plan's fixed 1 GiB covers them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    pub held: usize,
    pub in_use: usize,
    pub peak_held: usize,
    pub peak_in_use: usize,
}

/// One device's [`MemoryUse`] and the bytes of decoded weight copies among it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemoryUse {
    pub device: String,
    pub memory: MemoryUse,
    pub decoded_copies: usize,
}

/// One row of a backend's operation profile ([`Backend::op_profile`]): an operation (a kernel
/// name, a GEMM shape, an allocation or a copy), how often it ran, and its total wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    pub op: String,
    pub calls: u64,
    pub seconds: f64,
}
