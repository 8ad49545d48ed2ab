//! The memory plan as a table: one row per device (layer range, what else it holds, weights,
//! state, workspace, total, capacity, free), a total row, then what stays on the host (V4.1's
//! Engram tables), the shortfalls when it does not fit, what is left out, what is where (V4.1's
//! placement notes) and the plan's assumptions.

use std::io::Write;

use crate::devices::plan::{HostPlan, MemoryPlan};
use crate::units::{group_digits, human_bytes};

pub(super) fn print_plan(p: &MemoryPlan, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "memory plan {} at context {} tokens (prefill chunk {}): {}",
        p.devices_spec,
        group_digits(p.context as u64),
        p.chunk,
        if p.fits {
            format!("fits ({})", p.strategy)
        } else {
            "REFUSED, does not fit".to_string()
        }
    )?;
    writeln!(
        out,
        "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}",
        "device", "layers", "also", "weights", "state", "workspace", "total", "capacity", "free"
    )?;
    for d in &p.devices {
        let layers = match d.layers {
            Some([a, b]) if a == b => a.to_string(),
            Some([a, b]) => format!("{a}-{b}"),
            None => "-".into(),
        };
        let also = match (d.holds_embed, d.holds_head) {
            _ if d.idle => "idle",
            (true, true) => "embed+head",
            (true, false) => "embed",
            (false, true) => "head",
            (false, false) => "",
        };
        let free = if d.free >= 0 {
            human_bytes(d.free as u64)
        } else {
            format!("-{}", human_bytes(d.shortfall))
        };
        writeln!(
            out,
            "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}",
            d.device,
            layers,
            also,
            human_bytes(d.weights),
            human_bytes(d.state),
            human_bytes(d.workspace),
            human_bytes(d.total),
            human_bytes(d.capacity),
            free
        )?;
    }
    writeln!(
        out,
        "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "all",
        "",
        "",
        human_bytes(p.weights),
        human_bytes(p.state),
        human_bytes(p.workspace),
        human_bytes(p.total),
        human_bytes(p.capacity)
    )?;
    if p.host_bytes > 0 {
        writeln!(
            out,
            "  host (mapped): Engram tables {} ({} bytes), read by row ({} B a token), on no device",
            human_bytes(p.host_bytes),
            group_digits(p.host_bytes),
            group_digits(p.host_read_bytes_per_token)
        )?;
    }
    if !p.fits {
        for d in p.devices.iter().filter(|d| d.shortfall > 0) {
            writeln!(
                out,
                "shortfall   device {}: needs {} ({} bytes) more than its {}",
                d.device,
                human_bytes(d.shortfall),
                group_digits(d.shortfall),
                human_bytes(d.capacity)
            )?;
        }
        if p.total > p.capacity {
            writeln!(
                out,
                "shortfall   in total: {} ({} bytes) more than all devices hold",
                human_bytes(p.total - p.capacity),
                group_digits(p.total - p.capacity)
            )?;
        }
    }
    let idle: Vec<String> = p
        .devices
        .iter()
        .filter(|d| d.idle)
        .map(|d| d.device.to_string())
        .collect();
    if !idle.is_empty() {
        let (what, them) = if idle.len() == 1 {
            ("device", "it")
        } else {
            ("devices", "them")
        };
        writeln!(
            out,
            "  idle: {what} {} (free memory under the per-device workspace, or no layer in the chosen layout): a run gives {them} no work and charges {them} nothing",
            idle.join(", ")
        )?;
    }
    if p.excluded_vision_bytes > 0 {
        writeln!(
            out,
            "  not placed: MTP draft blocks ({}), vision tower + aligner + image delimiters ({}): never run for a text needle",
            human_bytes(p.excluded_mtp_bytes),
            human_bytes(p.excluded_vision_bytes)
        )?;
    } else {
        writeln!(
            out,
            "  not placed: MTP ({}, never run)",
            human_bytes(p.excluded_mtp_bytes)
        )?;
    }
    for n in &p.placement_notes {
        writeln!(out, "  where: {n}")?;
    }
    for a in &p.assumptions {
        writeln!(out, "  assumes: {a}")?;
    }
    Ok(())
}

/// The CPU host's plan: one line per part (mapped weights, decoded copies, state, workspace),
/// the total against the host's memory, the shortfall when it does not fit, its assumptions.
pub(super) fn print_host_plan(p: &HostPlan, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "host memory plan {} at context {} tokens (prefill chunk {}, weights {}, {} threads): {}",
        p.devices_spec,
        group_digits(p.context as u64),
        p.chunk,
        p.weights,
        p.threads,
        if p.fits {
            "fits"
        } else {
            "REFUSED, does not fit"
        }
    )?;
    let rows = [
        ("mapped weights", p.mapped_weights),
        ("decoded copies", p.decoded_weights),
        ("state", p.state),
        ("workspace", p.workspace),
        ("total", p.total),
    ];
    for (what, bytes) in rows {
        writeln!(out, "  {what:<16} {:>11}", human_bytes(bytes))?;
    }
    writeln!(
        out,
        "  {:<16} {:>11} ({})",
        "host memory",
        human_bytes(p.capacity),
        p.capacity_source
    )?;
    if p.fits {
        writeln!(
            out,
            "  {:<16} {:>11}",
            "free",
            human_bytes(p.capacity - p.total)
        )?;
    } else {
        writeln!(
            out,
            "shortfall   {} ({} bytes) more than the host has",
            human_bytes(p.shortfall),
            group_digits(p.shortfall)
        )?;
    }
    writeln!(
        out,
        "  not read: {} (MTP{})",
        human_bytes(p.excluded_bytes),
        if p.assumptions.iter().any(|a| a.contains("vision")) {
            ", vision tower"
        } else {
            ""
        }
    )?;
    for a in &p.assumptions {
        writeln!(out, "  assumes: {a}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The V4.1 lines of the plan table: the host row, what is left out, what is where.

    use super::*;
    use crate::config::V41Config;
    use crate::devices::plan::Footprint;

    #[test]
    fn a_v41_plan_says_what_stays_on_the_host() {
        let cfg = V41Config::from_json_str(
            include_str!("../../../tests/fixtures/deepseek_v41_flash_config.json"),
            std::path::Path::new("config.json"),
        )
        .unwrap();
        let f = Footprint::of_inventory(&cfg, crate::checkpoint::WeightFormat::Official);
        let p = crate::devices::placement::plan_over(
            &cfg,
            &f,
            &"8x80G".parse().unwrap(),
            131_072,
            2048,
        );
        let mut out = Vec::new();
        print_plan(&p, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        if std::env::var("NEEDLESCOPE_PRINT_PLAN").is_ok() {
            println!("{text}");
        }
        // 768,022,850 rows x 264 B = 202,758,032,400 B = 188.83 GiB; 2 x 24 x 264 B a token.
        for said in [
            "memory plan 8x80G at context 131,072 tokens (prefill chunk 2048): fits",
            "host (mapped): Engram tables 188.83 GiB (202,758,032,400 bytes), read by row (12,672 B a token), on no device",
            "not placed: MTP draft blocks (7.39 GiB), vision tower + aligner + image delimiters (925.58 MiB): never run for a text needle",
            "where: Engram: the tables stay on the host",
            "where: compressed KV and index keys on the KV sources only",
            "where: candidate stage: layer 20",
            "assumes: window on every layer",
        ] {
            assert!(text.contains(said), "{said}:\n{text}");
        }
    }
}
