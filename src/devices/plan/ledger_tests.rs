//! The memory plan's activation peak against an independent ledger of the buffers the GPU
//! backend holds at Flash scale (the emulator's measured peaks only cover small dimensions).

use super::*;
use crate::config::ModelConfig;

/// An independent ledger of the device buffers the GPU backend holds at the worst moments of a
/// prefill chunk of `t` tokens at context `c` (what `backend::gpu` and `model::{layer,
/// attention, indexer, compressor, moe}` allocate, read off the code, each at its pool size
/// class), for `--gpu-gemm bf16` and `f32` (bf16 copies of GEMM inputs vs 4-byte expert rows),
/// the kernel and GEMM attention, routed experts one by one or batched (padding < 1/2), no
/// decoded copies (every quantised product bands through the capped workspace). Returns
/// `(moment, bytes)`; the memory plan's activation peak must bound every one of them.
fn flash_ledger(cfg: &ModelConfig, c: u64, t: u64) -> Vec<(String, u64)> {
    use crate::backend::gpu::pool::BufferPool;
    let cls = |b: u64| BufferPool::class(b as usize) as u64;
    let sum = |v: &[u64]| v.iter().map(|&b| cls(b)).sum::<u64>();
    let u = |v: usize| v as u64;
    let (n, d) = (u(cfg.hc_mult), u(cfg.hidden_size));
    let (h, hd, ql) = (
        u(cfg.num_attention_heads),
        u(cfg.head_dim),
        u(cfg.q_lora_rank),
    );
    let (ih, ihd, k) = (
        u(cfg.index_n_heads),
        u(cfg.index_head_dim),
        u(cfg.index_topk),
    );
    let (ek, inter, ro) = (
        u(cfg.num_experts_per_tok),
        u(cfg.moe_intermediate_size),
        u(cfg.o_groups) * u(cfg.o_lora_rank),
    );
    let (w, v) = (u(cfg.sliding_window), u(cfg.vocab_size));
    let f = |values: u64| 4 * values;
    // A banded product's workspace (no decoded copy): rows of `cols` in the GEMM type.
    let band = |rows: u64, cols: u64, es: u64| {
        let b = ((256u64 << 20) / (cols * es)).clamp(1, rows);
        b * cols * es
    };
    let mut out = Vec::new();
    for (ty, es) in [("bf16", 2u64), ("f32", 4u64)] {
        let copy = |values: u64| if es == 2 { 2 * values } else { 0 };
        // Held by Layer::forward (and the engine's streams) through the whole layer.
        let layer = vec![f(t * n * d), f(t * d), f(t * n), f(t * n * n)];
        let with = |extra: &[u64]| {
            let mut all = layer.clone();
            all.extend_from_slice(extra);
            sum(&all)
        };
        let mix = (2 + n) * n;
        out.push((
            format!("{ty} hc_pre: mixes + split-K parts"),
            with(&[f(t * mix), f(16 * t * mix)]),
        ));
        out.push((
            format!("{ty} hc_post (ffn): both block outputs + new streams"),
            with(&[f(t * d), f(t * d), f(t * n * d)]),
        ));
        // Attention::forward: qr, q, kv stay bound until it returns.
        let (qr, q, kv) = (f(t * ql), f(t * h * hd), f(t * hd));
        out.push((
            format!("{ty} q rms_norm (rows T x H)"),
            with(&[qr, q, f(t * h * 32 * 2), f(t * h)]),
        ));
        out.push((
            format!("{ty} wq_b product"),
            with(&[qr, q, copy(t * ql), band(h * hd, ql, es)]),
        ));
        // CSA main compressor: width 2 hd, the chunk's projections and the held copies.
        let width = 2 * hd;
        out.push((
            format!("{ty} CSA compressor append"),
            with(&[
                qr,
                q,
                kv,
                f(t * width),
                f(t * width),
                f((t + 7) * width),
                f((t + 7) * width),
                f(14 * width),
            ]),
        ));
        // CSA indexer, one block of 256 query tokens against c/4 rows.
        let block = t.min(256);
        let rows = c / 4;
        let tile_tokens = (4096 / ih).max(1).min(block);
        let tile_rows = ((64u64 << 20) / 4 / (tile_tokens * ih))
            .max(1)
            .min(rows.max(1));
        let indexer = [
            qr,
            q,
            kv,
            f(t * ih * ihd),
            f(t * ih),
            f(t * ih * ihd),
            f(t * ih),
            f(block * rows),
            copy(block * ih * ihd),
            copy(rows * ihd),
            f(tile_tokens * ih * tile_rows),
        ];
        out.push((format!("{ty} indexer scores"), with(&indexer)));
        let chunks = (rows.div_ceil(256.max(rows.div_ceil(1024)))).max(1);
        let lanes = chunks.next_multiple_of(32);
        let mut topk = indexer[..8].to_vec();
        topk.extend([
            block * lanes * 16 * 4,
            block * 16 * 4,
            block * chunks * 8,
            3 * block * k * 4,
        ]);
        out.push((format!("{ty} indexer top-k"), with(&topk)));
        // Sparse attention at a CSA and an HCA layer (the last chunk: every row visible).
        for (kind, entries, compressed) in [
            ("CSA", w + k.min(c / 4), (c / 4).min(t * k)),
            ("HCA", w + c / 128, c / 128),
        ] {
            let unique = t + w - 1 + compressed;
            let attend = vec![
                qr,
                q,
                kv,
                f(t * h * hd),
                f(t * h * entries),
                f(t * h),
                f(t * h),
                f(t * entries),
                f(t),
                f(unique),
                f(unique * hd),
                f(h),
            ];
            out.push((
                format!("{ty} {kind} sparse attention (kernels)"),
                with(&attend),
            ));
            let tile = ((256u64 << 20) / (entries * hd * 4)).clamp(1, t);
            let mut gemm = attend.clone();
            gemm.push(f(tile * entries * hd));
            out.push((format!("{ty} {kind} sparse attention (GEMM)"), with(&gemm)));
        }
        // Output projections: o and its GEMM-type copy, z, a wo_a band; then wo_b.
        let o = f(t * h * hd);
        out.push((
            format!("{ty} wo_a (grouped)"),
            with(&[
                qr,
                q,
                kv,
                o,
                f(t * ro),
                copy(t * h * hd),
                band(ro / 8, h * hd / 8, es),
            ]),
        ));
        out.push((
            format!("{ty} wo_b"),
            with(&[
                qr,
                q,
                kv,
                o,
                f(t * ro),
                f(t * d),
                copy(t * ro),
                band(d, ro, es),
            ]),
        ));
        // Routed experts: the attention output, the MoE output, all slots' rows (padded by
        // less than a half when batched), the route tables, a w1 band.
        for (mode, slots) in [("one by one", t * ek), ("batched", t * ek * 3 / 2)] {
            out.push((
                format!("{ty} routed experts ({mode})"),
                with(&[
                    f(t * d),
                    f(t * d),
                    slots * d * es,
                    f(slots * inter),
                    f(slots * inter),
                    slots * inter * es,
                    f(slots * d),
                    f(slots),
                    f(slots),
                    f(t * ek),
                    band(inter, d, es),
                ]),
            ));
        }
        out.push((
            format!("{ty} shared expert"),
            with(&[
                f(t * d),
                f(t * d),
                f(t * d),
                copy(t * d),
                f(t * inter),
                f(t * inter),
                t * inter * es,
                f(t * d),
                band(inter, d, es),
            ]),
        ));
        // The head of the last device, PROBED_LOGIT_ROWS positions (charged apart: logits).
        let p = PROBED_LOGIT_ROWS.min(t);
        out.push((
            format!("{ty} head ({p} positions, less the logits)"),
            sum(&[
                f(t * n * d),
                f(p * n * d),
                f(p * d),
                copy(p * d),
                band(v, d, es),
            ]),
        ));
    }
    out
}

/// The plan's activation peak bounds every moment of the ledger above at Flash's dimensions,
/// over the contexts and chunks a Flash run uses (the emulator measures small dimensions
/// only, where the capped scratch buffers dwarf every per-token term).
#[test]
fn the_activation_peak_bounds_the_flash_ledger() {
    let cfg = ModelConfig::flash();
    for c in [131_072u64, 1 << 20] {
        for t in [2048u64, 4096, 8192] {
            let planned = activation_peak_bytes(&cfg, c as usize, t as usize);
            let ledger = flash_ledger(&cfg, c, t);
            for (moment, bytes) in &ledger {
                assert!(
                    *bytes <= planned,
                    "context {c}, chunk {t}: {moment} holds {bytes} B, the plan charges {planned} B"
                );
            }
            if std::env::var("NEEDLESCOPE_PRINT_LEDGER").is_ok() {
                println!(
                    "context {c} chunk {t}: planned {:.3} GiB",
                    planned as f64 / (1u64 << 30) as f64
                );
                for (moment, bytes) in &ledger {
                    println!(
                        "  {:>8.3} GiB  {moment}",
                        *bytes as f64 / (1u64 << 30) as f64
                    );
                }
            }
        }
    }
}
