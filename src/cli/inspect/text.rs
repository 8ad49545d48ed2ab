//! The text rendering of an [`InspectReport`]: source and dimensions, the layer schedule (a
//! one-letter map and compact layer ranges per kind and router), the layer-role table (one line
//! per distinct role, with its layers as compact ranges), the component and number
//! format tables, the inventory verdict and the `--verify` findings; the memory plan table is
//! [`super::plan_table`].

use std::io::Write;

use super::plan_table::{print_host_plan, print_plan};
use super::report::{Dims, InspectReport, LayerRoleRow, V41Facts};
use crate::config::LayerKind;
use crate::devices::plan;
use crate::units::{group_digits, human_bytes};

/// Sorted indices -> `0-1, 2, 3-41/2` (runs of three or more with a common step are ranges,
/// `/s` marks a step other than 1).
pub fn compact_ranges(v: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        if j < v.len() {
            let step = v[j] - v[i];
            while j + 1 < v.len() && v[j + 1] - v[j] == step {
                j += 1;
            }
            let run = j - i + 1;
            if step > 0 && (run >= 3 || (run == 2 && step == 1)) {
                parts.push(if step == 1 {
                    format!("{}-{}", v[i], v[j])
                } else {
                    format!("{}-{}/{}", v[i], v[j], step)
                });
                i = j + 1;
                continue;
            }
        }
        parts.push(v[i].to_string());
        i += 1;
    }
    parts.join(", ")
}

/// The layer-role table grouped by role: one `(kind, ratio, kv, index, stage)` description per
/// distinct role, in order of first appearance, with its layers. A source is `own` when it is
/// the layer itself, `-` when absent, else `L<n>`; so V4's alternating CSA / HCA layers make
/// three lines, not one per layer.
pub(super) fn role_groups(rows: &[LayerRoleRow]) -> Vec<([String; 5], Vec<usize>)> {
    let source = |s: Option<usize>, layer: usize| match s {
        None => "-".to_string(),
        Some(l) if l == layer => "own".to_string(),
        Some(l) => format!("L{l}"),
    };
    let mut groups: Vec<([String; 5], Vec<usize>)> = Vec::new();
    for r in rows {
        let key = [
            r.kind.to_uppercase(),
            r.ratio.to_string(),
            source(r.kv_source, r.layer),
            source(r.index_source, r.layer),
            r.candidate_stage.unwrap_or("-").to_string(),
        ];
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, layers)) => layers.push(r.layer),
            None => groups.push((key, vec![r.layer])),
        }
    }
    groups
}

pub(super) fn print_text(r: &InspectReport, out: &mut dyn Write) -> anyhow::Result<()> {
    let d = &r.dims;
    let s = &r.source;
    match s.shards {
        Some(n) => writeln!(
            out,
            "checkpoint  {} ({} shard file{})",
            s.path.display(),
            n,
            if n == 1 { "" } else { "s" }
        )?,
        None => writeln!(
            out,
            "config      {} (no weights; sizes from the implied inventory)",
            s.path.display()
        )?,
    }
    writeln!(out, "format      {}: {}", s.format, s.format_note)?;
    writeln!(out, "config hash {}", r.config_hash)?;
    writeln!(
        out,
        "dims        hidden {}, vocab {}, {} heads x {} (rope {}), q_lora {}, o_lora {} x {} groups",
        d.hidden_size, d.vocab_size, d.attention_heads, d.head_dim, d.rope_dim, d.q_lora_rank, d.o_lora_rank, d.o_groups
    )?;
    writeln!(
        out,
        "            indexer {} heads x {}, top-k {}; experts {} routed ({} active, {} wide) + {} shared",
        d.index_heads, d.index_head_dim, d.index_topk, d.routed_experts, d.experts_per_token, d.moe_intermediate, d.shared_experts
    )?;
    match &r.v41 {
        None => writeln!(
            out,
            "            window {}, mHC {} streams, {} MTP layer(s) (never run)",
            d.sliding_window, d.hc_mult, d.mtp_layers
        )?,
        Some(v) => print_v41_facts(v, d, out)?,
    }

    // Schedule.
    writeln!(out)?;
    writeln!(out, "schedule    {}", r.schedule_summary)?;
    let map: String = r
        .schedule
        .iter()
        .map(|l| match l.kind {
            "swa" => 'S',
            "csa" => 'C',
            "csa2" => '2',
            "csa1" => '1',
            _ => 'H',
        })
        .collect();
    let legend = if r.v41.is_some() {
        "S = SWA, 2 = ratio-2 CSA, 1 = ratio-1 CSA"
    } else {
        "S = SWA, C = CSA, H = HCA"
    };
    writeln!(out, "  map       {map}   ({legend}, layer 0 first)")?;
    for kind in [
        LayerKind::Swa,
        LayerKind::Csa,
        LayerKind::Hca,
        LayerKind::Csa2,
        LayerKind::Csa1,
    ] {
        let layers: Vec<usize> = r
            .schedule
            .iter()
            .filter(|l| l.kind == kind.name())
            .map(|l| l.layer)
            .collect();
        if !layers.is_empty() {
            writeln!(
                out,
                "  {:<9} {:>3} layers: {}",
                kind.name().to_uppercase(),
                layers.len(),
                compact_ranges(&layers)
            )?;
        }
    }
    for router in ["hash", "score"] {
        let layers: Vec<usize> = r
            .schedule
            .iter()
            .filter(|l| l.router == router)
            .map(|l| l.layer)
            .collect();
        if !layers.is_empty() {
            writeln!(
                out,
                "  {:<9} {:>3} layers: {}",
                format!("{router} moe"),
                layers.len(),
                compact_ranges(&layers)
            )?;
        }
    }
    writeln!(
        out,
        "  roles     {:<5} {:>5}  {:<5} {:<5} {:<6} layers   (kv / index: whose compressed KV / selection it uses: own, - none, L<n>)",
        "kind", "ratio", "kv", "index", "stage"
    )?;
    for ([kind, ratio, kv, index, stage], layers) in role_groups(&r.layers) {
        writeln!(
            out,
            "            {kind:<5} {ratio:>5}  {kv:<5} {index:<5} {stage:<6} {}",
            compact_ranges(&layers)
        )?;
    }

    // Components and formats.
    let f = &r.footprint;
    writeln!(out)?;
    writeln!(
        out,
        "{:<28} {:>9} {:>18} {:>18} {:>11}",
        "component", "tensors", "params", "bytes", ""
    )?;
    for row in &f.components {
        write_tally(out, row.label, &row.tally, "")?;
    }
    let main = if r.v41.is_some() {
        "main model (without MTP, vision)"
    } else {
        "main model (without MTP)"
    };
    write_tally(out, main, &f.main, "")?;
    write_tally(out, "total", &f.total, "")?;
    writeln!(
        out,
        "  params: logical weights (packed fp4 counts 2 per byte); scales, tid2eid tables and router biases count 0"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<28} {:>9} {:>18} {:>18} {:>11}",
        "format (safetensors dtype)", "tensors", "params", "bytes", ""
    )?;
    for row in &f.formats {
        write_tally(out, &row.dtype, &row.tally, row.note)?;
    }

    // Inventory.
    if let Some(inv) = &r.inventory {
        writeln!(out)?;
        if inv.clean {
            writeln!(
                out,
                "inventory   OK: {} tensors, exactly the {}-format inventory the config implies",
                group_digits(f.total.tensors),
                inv.expected_format
            )?;
        } else {
            writeln!(
                out,
                "inventory   MISMATCH against the {}-format inventory the config implies: {} missing, {} extra, {} mismatched",
                inv.expected_format, inv.missing_count, inv.extra_count, inv.mismatched_count
            )?;
            for (label, list, count) in [
                ("missing", &inv.missing, inv.missing_count),
                ("extra", &inv.extra, inv.extra_count),
                ("mismatched", &inv.mismatched, inv.mismatched_count),
            ] {
                for e in list {
                    writeln!(out, "  {label:<10} {e}")?;
                }
                if count > list.len() {
                    writeln!(out, "  {label:<10} ... and {} more", count - list.len())?;
                }
            }
        }
        if let Some(first) = inv.unindexed.first() {
            writeln!(
                out,
                "  note      {} tensor(s) in the shards are not listed in index.json's weight_map \
                 (first: {first}); they are read like the listed ones, as serving engines do",
                inv.unindexed_count
            )?;
        }
        if inv.draft_stages > 0 {
            writeln!(
                out,
                "  note      the config declares {} draft stages beyond its MTP layer(s) (DSpark, \
                 as in Flash-0731), stored under mtp.*: their tensors are not in the inventory \
                 (no run uses them), so {} difference(s) there are not counted",
                inv.draft_stages, inv.draft_differences
            )?;
        }
        if !inv.fp8_compressor_linears.is_empty() {
            writeln!(
                out,
                "  note      FP8 blocks + E8M0 scales, not the release's BF16, for {} (the \
                 stored dtype is used; every layer is expected so)",
                inv.fp8_compressor_linears.join(", ")
            )?;
        }
    }

    // Values read by --verify.
    if let Some(v) = &r.verify {
        writeln!(out)?;
        if v.clean() {
            writeln!(
                out,
                "verify      OK: verified {} tensors, {}, no NaN/Inf/all-zero",
                group_digits(v.tensors as u64),
                human_bytes(v.bytes)
            )?;
        } else {
            writeln!(
                out,
                "verify      FOUND {} of {} tensors ({} read) with NaN or infinite values, or only zeros:",
                v.findings.len(),
                group_digits(v.tensors as u64),
                human_bytes(v.bytes)
            )?;
            for f in &v.findings {
                let what = if f.all_zero { "all-zero" } else { "NaN/Inf" };
                writeln!(out, "  {what:<10} {f}")?;
            }
        }
        if let Some(first) = v.zero_biases.first() {
            writeln!(
                out,
                "  note      {} additive bias tensor(s) (ape, attn_sink, gate bias) are all zero, a \
                 valid value for a bias, so not counted (first: {first})",
                v.zero_biases.len()
            )?;
        }
    }

    // Memory plan.
    if let Some(p) = &r.plan {
        print_plan(p, out)?;
    }
    if let Some(p) = &r.host_plan {
        print_host_plan(p, out)?;
    }
    Ok(())
}

/// The DeepSeek-V4.1 lines under the dimensions: sources, candidate stage, Engram, draft
/// blocks, vision.
fn print_v41_facts(v: &V41Facts, d: &Dims, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "            window {}, mHC {} streams (no hc_head), {} draft block(s) of {} experts (never run)",
        d.sliding_window, d.hc_mult, v.draft_blocks, v.draft_experts
    )?;
    writeln!(
        out,
        "sources     KV + index keys on {}; indexers on {}",
        compact_ranges(&v.kv_sources),
        compact_ranges(&v.index_sources)
    )?;
    match v.candidate_source {
        Some(c) => writeln!(
            out,
            "candidates  layer {c} keeps its top {} blocks of {} rows ({} rows); later indexers pick their top-{} inside them",
            group_digits(v.candidate_topk_blocks as u64),
            v.candidate_block_size,
            group_digits((v.candidate_topk_blocks * v.candidate_block_size) as u64),
            d.index_topk
        )?,
        None => writeln!(out, "candidates  none (candidate_source_layer_id < 0)")?,
    }
    let tables: Vec<String> = v
        .engram_layers
        .iter()
        .zip(&v.engram_rows)
        .map(|(l, rows)| format!("layer {l} {} rows", group_digits(*rows)))
        .collect();
    if tables.is_empty() {
        writeln!(out, "engram      none (engram_layer_ids is empty)")?;
    } else {
        writeln!(
            out,
            "engram      {} x {} wide, {} heads, n-grams 2-{}",
            tables.join(", "),
            v.engram_width,
            v.engram_heads,
            v.engram_max_ngram
        )?;
    }
    match v.vision_blocks {
        Some(b) => writeln!(
            out,
            "vision      {b} blocks + aligner (text needles never use them)"
        ),
        None => writeln!(out, "vision      none (no vision_config)"),
    }
}

fn write_tally(
    out: &mut dyn Write,
    label: &str,
    t: &plan::Tally,
    note: &str,
) -> std::io::Result<()> {
    let line = format!(
        "{:<28} {:>9} {:>18} {:>18} {:>11}  {}",
        label,
        group_digits(t.tensors),
        if t.params == 0 {
            "-".to_string()
        } else {
            group_digits(t.params)
        },
        group_digits(t.bytes),
        human_bytes(t.bytes),
        note
    );
    writeln!(out, "{}", line.trim_end())
}
