//! `--engine URL` / `--engine-capture FILE` (probe): the user's serving engine held against the
//! reference. The flags (turned into a [`EnginePlan`]: `run::sglang` fetches the capture, live
//! from SGLang or from a saved body), the `engine` object of `probe --json` and the engine
//! section of the text output
//! (docs/engines.md, docs/outputs.md).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::probe::capture::EngineCapture;
use crate::record::engine::EngineLayerRecord;
use crate::record::verdict::EngineVerdict;
use crate::run::sglang::{EnginePlan, EngineSource};

/// The largest `--engine-topk`: SGLang's indexer runs 512 or 1024; far past any index_topk a
/// model could have, and small enough that rows x layers x K cannot overflow.
const MAX_ENGINE_TOPK: usize = 1 << 16;
/// The longest `--engine-timeout`: a week.
const MAX_ENGINE_TIMEOUT: usize = 7 * 24 * 3600;

fn parse_engine_topk(s: &str) -> Result<usize, String> {
    let k = super::flags::parse_positive(s)?;
    if k > MAX_ENGINE_TOPK {
        return Err(format!("expected at most {MAX_ENGINE_TOPK}, found {k}"));
    }
    Ok(k)
}

fn parse_engine_timeout(s: &str) -> Result<usize, String> {
    let t = super::flags::parse_positive(s)?;
    if t > MAX_ENGINE_TIMEOUT {
        return Err(format!(
            "expected at most {MAX_ENGINE_TIMEOUT} seconds (a week), found {t}"
        ));
    }
    Ok(t)
}

/// The serving engine's server flags (probe and sweep).
#[derive(Args, Debug, Clone, Default)]
pub struct EngineServerArgs {
    /// Your SGLang server (http://HOST:PORT, started with --enable-return-indexer-topk and --disable-radix-cache: docs/engines.md): each prompt's token ids are sent to its native /generate endpoint and its own indexer selections are held against the reference on every CSA layer
    #[arg(long, value_name = "URL")]
    pub engine: Option<String>,

    /// The engine's top-k when its payload reads two ways or differs from the config's index_topk (it is otherwise read from the payload's length)
    #[arg(long, value_name = "K", value_parser = parse_engine_topk)]
    pub engine_topk: Option<usize>,

    /// Seconds one exchange with --engine may take: connecting, the engine's prefill and generation, reading the response
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = parse_engine_timeout)]
    pub engine_timeout: usize,

    /// With --engine (or probe's --engine-capture): no local forward, the engine's selections and answers only, at the engine's speed; also chosen when --model holds config.json and a tokenizer but no weights
    #[arg(long)]
    pub no_local: bool,
}

impl EngineServerArgs {
    /// Refuses `--engine-topk` and `--no-local` without `--engine`.
    pub fn check(&self) -> anyhow::Result<()> {
        for (flag, given) in [
            ("--engine-topk", self.engine_topk.is_some()),
            ("--no-local", self.no_local),
        ] {
            if self.engine.is_none() && given {
                anyhow::bail!("{flag}: expected --engine URL with it");
            }
        }
        Ok(())
    }

    /// Whether the run is engine-only: `--no-local`, or a model directory without weights.
    pub fn engine_only(&self, model: &std::path::Path) -> bool {
        self.engine.is_some() && (self.no_local || !crate::run::target::has_weights(model))
    }
}

/// probe's serving-engine flags: the server's, a saved response, engine-only mode.
#[derive(Args, Debug, Clone, Default)]
pub struct EngineArgs {
    #[command(flatten)]
    pub server: EngineServerArgs,

    /// A saved response of that request instead of a live server (the JSON body SGLang's /generate returned with return_indexer_topk, as curl saves it: docs/engines.md)
    #[arg(long, value_name = "FILE", conflicts_with = "engine")]
    pub engine_capture: Option<PathBuf>,
}

impl EngineArgs {
    /// Whether a serving engine takes part.
    pub fn is_set(&self) -> bool {
        self.server.engine.is_some() || self.engine_capture.is_some()
    }

    /// `--engine-topk`.
    pub fn engine_topk(&self) -> Option<usize> {
        self.server.engine_topk
    }

    /// Refuses flags that need an engine without one.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.is_set() {
            return Ok(());
        }
        for (flag, given) in [
            ("--no-local", self.server.no_local),
            ("--engine-topk", self.server.engine_topk.is_some()),
        ] {
            if given {
                anyhow::bail!("{flag}: expected --engine URL or --engine-capture FILE with it");
            }
        }
        Ok(())
    }

    /// What the run needs of these flags: where the capture comes from, `--engine-topk`,
    /// `--no-local`; `None` without an engine.
    pub fn plan(&self) -> Option<EnginePlan> {
        let source = match (&self.server.engine, &self.engine_capture) {
            (Some(url), _) => EngineSource::Server {
                url: url.clone(),
                timeout: Duration::from_secs(self.server.engine_timeout as u64),
            },
            (None, Some(file)) => EngineSource::Saved(file.clone()),
            (None, None) => return None,
        };
        Some(EnginePlan {
            source,
            topk: self.server.engine_topk,
            no_local: self.server.no_local,
        })
    }
}

/// What the engine section of a probe shows: the engine's capture and its records against the
/// reference's (`reference`: the driving run's layer records, empty without a local model),
/// the verdict, the engine's answer judged, the reference's driving profile and the needle
/// count.
pub struct EngineSection<'a> {
    pub capture: &'a EngineCapture,
    pub engine_records: &'a [EngineLayerRecord],
    pub reference: &'a [crate::record::LayerRecord],
    pub verdict: &'a EngineVerdict,
    pub answer_correct: Option<bool>,
    pub driving: Option<&'a str>,
    pub needles: usize,
}

/// `probe --json`'s `engine` object (docs/outputs.md).
pub fn engine_json(section: &EngineSection) -> serde_json::Value {
    let EngineSection {
        capture,
        engine_records,
        verdict,
        answer_correct,
        driving,
        needles,
        ..
    } = *section;
    // One entry per (layer, position); overlaps per profile, needle membership per needle.
    let mut layers: Vec<serde_json::Value> = Vec::new();
    let mut keys: Vec<(usize, usize)> = engine_records
        .iter()
        .map(|r| (r.query_pos, r.layer))
        .collect();
    keys.dedup();
    keys.sort_unstable();
    keys.dedup();
    for (pos, layer) in keys {
        let here: Vec<&EngineLayerRecord> = engine_records
            .iter()
            .filter(|r| r.query_pos == pos && r.layer == layer)
            .collect();
        let first = here[0];
        let mut needle_selected = vec![false; needles.max(1)];
        for r in &here {
            if let Some(slot) = needle_selected.get_mut(r.needle) {
                *slot = r.needle_selected;
            }
        }
        let mut overlap = serde_json::Map::new();
        for r in here
            .iter()
            .filter(|r| r.needle == 0 && !r.profile.is_empty())
        {
            if let Some(o) = r.overlap {
                overlap.insert(
                    r.profile.clone(),
                    crate::units::f32_as_in_csv(serde_json::json!(o)),
                );
            }
        }
        layers.push(serde_json::json!({
            "layer": layer,
            "query_pos": pos,
            "phase": first.phase,
            "visible_rows": first.visible_rows,
            "needle_selected": if needles > 1 {
                serde_json::json!(needle_selected)
            } else {
                serde_json::json!(needle_selected[0])
            },
            "selected_rows": first.selected_rows,
            "overlap": overlap,
        }));
    }
    let agreement = |a: &Option<crate::record::verdict::ProfileAgreement>| match a {
        Some(a) => serde_json::json!({
            "profile": a.profile,
            "mean_overlap": crate::units::f32_as_in_csv(serde_json::json!(a.mean_overlap)),
        }),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "kind": "sglang",
        "source": capture.source,
        "topk": capture.topk,
        "prompt_tokens": capture.prompt_tokens,
        "completion_tokens": capture.completion_tokens,
        "cached_tokens": capture.cached_tokens,
        "finish_reason": capture.finish_reason,
        "output_ids": capture.output_ids,
        "answer_text": capture.text,
        "answer_correct": answer_correct,
        "reference_driving": driving,
        "closest_profile": agreement(&verdict.closest),
        "runner_up": agreement(&verdict.runner_up),
        "inconclusive": verdict.inconclusive,
        "lost_layers": verdict.lost,
        "warnings": capture.warnings,
        "conclusion": verdict.conclusion(driving, needles),
        "layers": layers,
    })
}

/// The engine section of the text output: at the answer position, per CSA layer, the engine's
/// selection against the reference, then the agreement and the conclusion.
pub fn print_engine(out: &mut dyn Write, section: &EngineSection) -> anyhow::Result<()> {
    let EngineSection {
        capture,
        engine_records,
        reference,
        verdict,
        answer_correct,
        driving,
        needles,
    } = *section;
    let answer_pos = capture.prompt_tokens - 1;
    writeln!(out)?;
    writeln!(
        out,
        "== engine sglang {} | K {} | {} CSA layers | answer {:?} -> {}",
        capture.source,
        capture.topk,
        capture.csa_layers.len(),
        capture.text,
        match answer_correct {
            Some(true) => "CORRECT",
            Some(false) => "WRONG",
            None => "no verdict",
        }
    )?;
    let profiles: Vec<String> = crate::probe::engine::profile_order()
        .into_iter()
        .filter(|p| engine_records.iter().any(|r| r.profile == *p))
        .map(str::to_string)
        .collect();
    write!(out, "{:>5} {:>8} {:>7}", "layer", "visible", "engine")?;
    if needles > 1 {
        write!(out, " {:>2}", "#")?;
    }
    write!(out, " {:>7}", "needle")?;
    if let Some(d) = driving {
        write!(out, " {:>14}", format!("ref rank[{d}]"))?;
    }
    for p in &profiles {
        write!(out, " {:>w$}", p, w = p.len().max(5))?;
    }
    writeln!(out)?;
    let mut rows: Vec<&EngineLayerRecord> = engine_records
        .iter()
        .filter(|r| r.query_pos == answer_pos)
        .filter(|r| r.profile.is_empty() || profiles.first() == Some(&r.profile))
        .collect();
    rows.sort_by_key(|r| (r.layer, r.needle));
    for r in rows {
        write!(
            out,
            "{:>5} {:>8} {:>7}",
            r.layer, r.visible_rows, r.selected_rows
        )?;
        if needles > 1 {
            write!(out, " {:>2}", r.needle)?;
        }
        let trivial = r.visible_rows <= r.engine_topk;
        write!(
            out,
            " {:>7}",
            match (r.needle_selected, trivial) {
                (true, true) => "trivial",
                (true, false) => "yes",
                (false, _) => "NO",
            }
        )?;
        if let Some(d) = driving {
            let rank = reference
                .iter()
                .find(|l| {
                    l.query_pos == answer_pos
                        && l.layer == r.layer
                        && l.needle == r.needle
                        && l.profile == d
                })
                .and_then(|l| l.needle_rank);
            write!(out, " {:>14}", rank.map_or("-".into(), |x| x.to_string()))?;
        }
        for p in &profiles {
            let o = engine_records
                .iter()
                .find(|s| {
                    s.query_pos == answer_pos
                        && s.layer == r.layer
                        && s.needle == 0
                        && &s.profile == p
                })
                .and_then(|s| s.overlap);
            write!(
                out,
                " {:>w$}",
                o.map_or("-".into(), |x| format!("{x:.3}")),
                w = p.len().max(5)
            )?;
        }
        writeln!(out)?;
    }
    if !profiles.is_empty() {
        writeln!(
            out,
            "(engine = rows the engine selected; needle = whether they hold a needle row; each \
             profile column = the share of the engine's rows in that profile's top-{} on \
             needlescope's hidden states)",
            capture.topk
        )?;
        let means: Vec<String> = verdict
            .agreement
            .iter()
            .map(|a| format!("{} {:.3}", a.profile, a.mean_overlap))
            .collect();
        writeln!(
            out,
            "agreement at the answer position (mean over {} non-trivial CSA layers): {}",
            verdict.nontrivial_layers,
            means.join(", ")
        )?;
    }
    let decode = engine_records
        .iter()
        .filter(|r| r.query_pos > answer_pos)
        .map(|r| r.query_pos)
        .collect::<std::collections::BTreeSet<_>>();
    if !decode.is_empty() {
        let lost: usize = engine_records
            .iter()
            .filter(|r| {
                r.query_pos > answer_pos
                    && !r.needle_selected
                    && r.visible_rows > r.engine_topk
                    && (r.profile.is_empty() || profiles.first() == Some(&r.profile))
            })
            .count();
        writeln!(
            out,
            "decode positions {}-{}: the engine's selection missed a needle on {lost} (layer, position, needle) of them",
            decode.first().unwrap_or(&0),
            decode.last().unwrap_or(&0)
        )?;
    }
    writeln!(out, "engine: {}", verdict.conclusion(driving, needles))?;
    Ok(())
}
