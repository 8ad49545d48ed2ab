//! `needlescope probe`'s text output: the per-layer table of the needle's rank, score and margin
//! under the driving profile and each `--compare` profile, the answer line, and the other
//! probed positions (question tokens, generated tokens) grouped into ranges.

use std::io::Write;

use crate::probe::session::{conclusion, ProbeOptions};
use crate::probe::{NeedlePrompt, Scenario};
use crate::record::BackendRecord;
use crate::record::LayerRecord;
use crate::record::ProbeRun;

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |x| x.to_string())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn print_tables(
    out: &mut dyn Write,
    cfg: &crate::config::ModelConfig,
    scenario: &Scenario,
    prompt: &NeedlePrompt,
    runs: &[ProbeRun],
    opts: &ProbeOptions,
    backend: &BackendRecord,
    marks: crate::run::sweep::ModelMarks,
) -> anyhow::Result<()> {
    let judge_answers = marks.judges_answers(opts.generate);
    let last = prompt.tokens.len() - 1;
    if marks.synthetic {
        write!(out, "{}", crate::report::SYNTHETIC_LINE)?;
    }
    // Same rule as the sweep's lines: more than a point off the request is said.
    let asked = if (prompt.actual_depth_pct - prompt.depth_pct).abs() > 1.0 {
        format!(
            ", asked {}%: the nearest place the haystack offers",
            prompt.depth_pct
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "scenario {} | {} tokens | needle at depth {:.1}% (tokens {}..{}{asked}) | answer value {:?}",
        scenario.name,
        prompt.tokens.len(),
        prompt.actual_depth_pct,
        prompt.needle.0,
        prompt.needle.1,
        prompt.answer_value
    )?;
    writeln!(
        out,
        "CSA layers: {:?}; ranks at the answer position (query {last}); rank 1 = best",
        cfg.layers_of_kind(crate::config::LayerKind::Csa)
    )?;
    writeln!(out, "backend {backend}")?;
    for run in runs {
        writeln!(out)?;
        writeln!(
            out,
            "== index {} | kv {} | top-{} | answer {:?} -> {} ({:.1} s)",
            run.index,
            run.kv,
            run.topk,
            run.answer_text,
            match (judge_answers, run.answer_correct) {
                (false, _) if opts.generate == 0 => "no verdict (--generate 0: nothing generated)",
                (false, _) => "no verdict (synthetic model: its LM path does not answer)",
                (true, Some(true)) => "CORRECT",
                (true, Some(false)) => "WRONG",
                (true, None) =>
                    "no verdict (--generate stopped it before its answer ended: raise --generate)",
            },
            run.wall_seconds
        )?;
        let mut profiles = vec![run.index.clone()];
        profiles.extend(
            opts.compare
                .iter()
                .map(|p| p.name().to_string())
                .filter(|p| *p != run.index),
        );
        write!(out, "{:>5} {:>8} {:>7}", "layer", "visible", "needle")?;
        for p in &profiles {
            write!(out, " {:>14}", format!("rank[{p}]"))?;
        }
        writeln!(out, " {:>10} {:>9} {:>7}", "margin", "selected", "trivial")?;
        let here: Vec<&LayerRecord> = run.layers.iter().filter(|r| r.query_pos == last).collect();
        for driving in here.iter().filter(|r| r.driving) {
            write!(
                out,
                "{:>5} {:>8} {:>7}",
                driving.layer, driving.visible_rows, driving.needle_rows
            )?;
            for p in &profiles {
                let rank = here
                    .iter()
                    .find(|r| r.layer == driving.layer && &r.profile == p)
                    .and_then(|r| r.needle_rank);
                write!(out, " {:>14}", fmt_opt(rank))?;
            }
            writeln!(
                out,
                " {:>10} {:>9} {:>7}",
                driving.margin.map_or("-".into(), |m| format!("{m:+.4}")),
                if driving.selected { "yes" } else { "NO" },
                if driving.trivial { "yes" } else { "no" }
            )?;
        }
        if let Some(why) = crate::record::why::why(run, last) {
            writeln!(out, "why: {why}")?;
        }
        print_other_positions(out, run, last)?;
    }
    if let Some(run) = runs.first() {
        writeln!(out)?;
        writeln!(
            out,
            "attention on the needle at the answer position (index {}, top-{}): share of the softmax on window tokens in the needle span plus compressed rows holding needle tokens",
            run.index, run.topk
        )?;
        writeln!(
            out,
            "{:>5} {:>5} {:>12} {:>12} {:>10} {:>10}",
            "layer", "type", "mass (mean)", "mass (max h)", "in window", "sink"
        )?;
        for a in run.attention.iter().filter(|a| a.query_pos == last) {
            writeln!(
                out,
                "{:>5} {:>5} {:>12.4} {:>12.4} {:>10} {:>10.4}",
                a.layer,
                a.layer_type,
                a.needle_mass_mean,
                a.needle_mass_max_head,
                if a.needle_in_window { "yes" } else { "no" },
                a.sink_mass_mean
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "conclusion: {}", conclusion(runs, last, judge_answers))?;
    Ok(())
}

/// The probed positions other than the answer position (question tokens with `--probe
/// question`, generated tokens) under the driving profile: the worst needle rank over the CSA
/// layers and how many non-trivial layers selected the needle. Consecutive positions of the
/// same phase kind (prompt or decode) with the same figures share one line (`8192-8214`,
/// phases `1-23`), so a long generation does not print a screen of identical rows (every
/// record is in `--json` and `--out`).
fn print_other_positions(out: &mut dyn Write, run: &ProbeRun, last: usize) -> anyhow::Result<()> {
    let mut positions: Vec<(usize, &str)> = run
        .layers
        .iter()
        .filter(|r| r.driving && r.query_pos != last)
        .map(|r| (r.query_pos, r.phase.as_str()))
        .collect();
    positions.sort_unstable();
    positions.dedup();
    if positions.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "other probed positions ({} under {}): worst needle rank over the CSA layers",
        positions.len(),
        run.index
    )?;
    writeln!(
        out,
        "{:>13} {:>7} {:>10} {:>22}",
        "query", "phase", "worst rank", "selected/non-trivial"
    )?;
    // (first position, last position, first phase, last phase, figures)
    type Group<'a> = (
        usize,
        usize,
        &'a str,
        &'a str,
        (Option<usize>, usize, usize),
    );
    let mut groups: Vec<Group> = Vec::new();
    for (pos, phase) in positions {
        let here: Vec<&LayerRecord> = run
            .layers
            .iter()
            .filter(|r| r.driving && r.query_pos == pos)
            .collect();
        let worst = here.iter().filter_map(|r| r.needle_rank).max();
        let nontrivial = here.iter().filter(|r| !r.trivial).count();
        let selected = here.iter().filter(|r| !r.trivial && r.selected).count();
        let figures = (worst, selected, nontrivial);
        match groups.last_mut() {
            Some(g)
                if g.1 + 1 == pos && g.4 == figures && (g.3 == "prompt") == (phase == "prompt") =>
            {
                g.1 = pos;
                g.3 = phase;
            }
            _ => groups.push((pos, pos, phase, phase, figures)),
        }
    }
    for (first, last_pos, phase0, phase1, (worst, selected, nontrivial)) in groups {
        let span = |a: String, b: String| if a == b { a } else { format!("{a}-{b}") };
        writeln!(
            out,
            "{:>13} {:>7} {:>10} {:>22}",
            span(first.to_string(), last_pos.to_string()),
            span(phase0.to_string(), phase1.to_string()),
            fmt_opt(worst),
            format!("{selected}/{nontrivial}")
        )?;
    }
    Ok(())
}
