//! `report.html`: the one page a person reads (docs/outputs.md). Written beside the records by
//! every writer of a report directory (`probe --out`, `sweep`, `demo`) and by `report DIR`,
//! after the PNGs, from the same records ([`RunRecords`]) and the PNGs just written.
//!
//! The page is self-contained: every image is embedded as a `data:image/png;base64,` URI, the
//! style sheet and one small script are inline, and nothing is fetched (no font, no script,
//! no link off the page), so the file can be mailed or opened offline. Sections, in order:
//! the run's settings (run.json), the summary table with its legend (the terminal table's
//! rows, [`super::summary::table_rows`]), the heatmaps, the rank-vs-length plot, the serving
//! engine beside the reference (engine.csv, when there is one), the cells table (one
//! `<tr class="cell">` per finished cell, linking to its section) and one section per cell
//! with its numbers, its `why:` line ([`crate::record::verdict::why_of`]) and its layer plot.
//!
//! The script (`SCRIPT`) marks each image `data-decoded="yes"` once the browser has decoded it
//! to more than one colour (`blank`, `no` otherwise) and sets `data-images-decoded` /
//! `data-images-broken` on `<body>`: a headless browser's DOM dump says whether every picture
//! on the page renders (tests/report/html.rs).
//!
//! Every text that comes from records or the command line is HTML-escaped (`html-escape`);
//! the page is written through a temporary file renamed into place.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use html_escape::{encode_double_quoted_attribute as attr, encode_text as text};

use super::error::{ReportError, Result};
use super::store::EngineOnlyRecords;
use super::store::RunRecords;
use super::summary::{self, RECALL_COLUMN};
use crate::record::verdict::LayerWord;
use crate::record::{file_stem, CellRecord, LayerRecord, RunInfo};
use crate::units::{format_tokens, percent_label};

/// The page's file name in a report directory.
pub const REPORT_HTML: &str = "report.html";

/// Writes `report.html` into `out_dir` from `records` and the PNGs `plots` (paths as
/// [`super::render_records`] returned them); returns its path.
pub fn write_report_html(
    records: &RunRecords,
    out_dir: &Path,
    plots: &[PathBuf],
) -> Result<PathBuf> {
    write_page(out_dir, render(records, out_dir, plots)?)
}

/// Writes `report.html` of an engine-only directory (`store::engine_only`: no reference
/// records, no plots): settings and the engine's cells table.
pub fn write_engine_only_html(records: &EngineOnlyRecords, out_dir: &Path) -> Result<PathBuf> {
    let mut page = head(out_dir, records.info.synthetic);
    page.push_str(&settings(
        &records.info,
        records.cells.len(),
        &records.notes,
    ));
    page.push_str(
        "<section id=\"cells\">\n<h2>Cells (engine only: no local forward)</h2>\n\
         <p>The serving engine's own selection at the answer position.</p>\n\
         <table class=\"cells\">\n<thead><tr>",
    );
    for h in EngineOnlyRecords::HEAD {
        let _ = write!(page, "<th>{}</th>", text(h));
    }
    page.push_str("</tr></thead>\n<tbody>\n");
    for (row, lost) in records.rows() {
        page.push_str("<tr class=\"cell\">");
        for (i, value) in row.iter().enumerate() {
            let class = match (i, lost) {
                (4, true) => " class=\"recall-none\"",
                (4, false) => " class=\"recall-all\"",
                _ => "",
            };
            let _ = write!(page, "<td{class}>{}</td>", text(value));
        }
        page.push_str("</tr>\n");
    }
    let _ = write!(
        page,
        "</tbody>\n</table>\n<p class=\"legend\">{}</p>\n</section>\n",
        text(EngineOnlyRecords::LEGEND)
    );
    page.push_str(&tail());
    write_page(out_dir, page)
}

/// The page's start: doctype, style, title and the synthetic-model line.
fn head(out_dir: &Path, synthetic: bool) -> String {
    let mut page = String::new();
    let title = format!("needlescope report: {}", out_dir.display());
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        text(&title),
        text(&title)
    );
    if synthetic {
        let _ = writeln!(
            page,
            "<p class=\"synthetic\">{}</p>",
            text(super::SYNTHETIC_LINE.trim_end())
        );
    }
    page
}

/// The page's end: the image check and the closing tags.
fn tail() -> String {
    format!("<script>{SCRIPT}</script>\n</body>\n</html>\n")
}

/// `page` into `out_dir/report.html`, through a temporary renamed into place.
fn write_page(out_dir: &Path, page: String) -> Result<PathBuf> {
    let path = out_dir.join(REPORT_HTML);
    let tmp = out_dir.join(format!(".{REPORT_HTML}.partial"));
    let failed = |e: std::io::Error| ReportError::Io {
        path: path.clone(),
        source: e,
    };
    std::fs::write(&tmp, page).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        failed(e)
    })?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        failed(e)
    })?;
    Ok(path)
}

/// The PNG at `path` as an `<img>` whose source is a data URI; `alt` says what it shows.
fn image(path: &Path, alt: &str) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| ReportError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok(format!(
        "<img src=\"data:image/png;base64,{}\" alt=\"{}\" width=\"1000\" height=\"700\">",
        base64::engine::general_purpose::STANDARD.encode(bytes),
        attr(alt)
    ))
}

/// The PNG at `path` as a figure captioned with its file name.
fn figure(path: &Path) -> Result<String> {
    let name = file_name(path);
    Ok(format!(
        "<figure>{}<figcaption>{}</figcaption></figure>\n",
        image(path, &name)?,
        text(&name)
    ))
}

/// The plot of `plots` whose file name is `name`, if it was written.
fn plot<'a>(plots: &'a [PathBuf], name: &str) -> Option<&'a PathBuf> {
    plots
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == name))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The whole page.
fn render(records: &RunRecords, out_dir: &Path, plots: &[PathBuf]) -> Result<String> {
    let mut page = head(out_dir, records.info.synthetic);
    page.push_str(&nav(records, plots));
    page.push_str(&settings(
        &records.info,
        records.cells.len(),
        &records.notes,
    ));
    page.push_str(&summary_section(records));
    page.push_str(&plots_section(records, plots)?);
    page.push_str(&engine_section(records, plots)?);
    page.push_str(&cells_table(records));
    for cell in &records.cells {
        page.push_str(&cell_section(records, cell, plots)?);
    }
    page.push_str(&tail());
    Ok(page)
}

/// Links to the page's sections.
fn nav(records: &RunRecords, plots: &[PathBuf]) -> String {
    let mut links = vec![("settings", "Run"), ("summary", "Summary")];
    let names: Vec<String> = plots.iter().map(|p| file_name(p)).collect();
    if names
        .iter()
        .any(|n| n.starts_with("heatmap_") && !n.starts_with("heatmap_engine_"))
    {
        links.push(("heatmaps", "Heatmaps"));
    }
    if names.iter().any(|n| n == "rank_vs_length.png") {
        links.push(("ranks", "Rank vs length"));
    }
    if !records.engine.is_empty() {
        links.push(("engine", "Serving engine"));
    }
    links.push(("cells", "Cells"));
    let mut out = String::from("<nav>");
    for (id, label) in links {
        let _ = write!(out, "<a href=\"#{id}\">{label}</a>");
    }
    out.push_str("</nav>\n");
    out
}

/// run.json as a two-column table, with the finished cells and the notes of reading them.
fn settings(info: &RunInfo, finished: usize, notes: &[String]) -> String {
    // Every invocation that wrote cells: a grown grid's later lengths came from a later one.
    let invocations = info.invocations();
    let commands: Vec<(String, String)> = match invocations.len() {
        1 => vec![("command".to_string(), invocations[0].join(" "))],
        _ => invocations
            .iter()
            .enumerate()
            .map(|(i, line)| (format!("command {}", i + 1), line.join(" ")))
            .collect(),
    };
    let mut rows: Vec<(&str, String)> = commands
        .iter()
        .map(|(label, line)| (label.as_str(), line.clone()))
        .collect();
    rows.extend([
        ("model", info.model_path.clone()),
        ("config hash", info.model_config_hash.clone()),
        ("scenario", info.scenario.clone()),
        (
            "backend",
            match &info.backend.gemm {
                Some(g) => format!("{} (gemm {g})", info.backend.kind),
                None => info.backend.kind.clone(),
            },
        ),
        ("started", info.start_time.clone()),
        ("needlescope", info.needlescope_version.clone()),
        (
            "cells",
            match info.cells_planned() {
                Some(planned) => format!("{finished} finished of {planned} planned"),
                None => format!("{finished} finished"),
            },
        ),
    ]);
    if !info.backend.devices.is_empty() {
        rows.push(("devices", info.backend.devices.join(", ")));
    }
    if let Some(args) = info.sweep_args.as_object() {
        for (key, value) in args {
            let shown = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            rows.push(("argument", format!("{key} = {shown}")));
        }
    }
    let mut out =
        String::from("<section id=\"settings\">\n<h2>Run</h2>\n<table class=\"settings\">\n");
    for (key, value) in rows {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            text(key),
            text(&value)
        );
    }
    for note in notes {
        let _ = writeln!(out, "<tr><th>note</th><td>{}</td></tr>", text(note));
    }
    out.push_str("</table>\n</section>\n");
    out
}

/// The summary table, as the terminal writes it, with its legend under it.
fn summary_section(records: &RunRecords) -> String {
    let exact_keeps_by = crate::record::verdict::exact_keeps_by_cell(&records.cells);
    let groups = summary::summarize(&records.cells, &exact_keeps_by);
    let mut out = String::from(
        "<section id=\"summary\">\n<h2>Summary</h2>\n<table class=\"summary\">\n<thead><tr>",
    );
    let word = LayerWord::of(&records.layers);
    for head in summary::summary_head(word) {
        let _ = write!(out, "<th>{}</th>", text(&head));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for (row, tone) in summary::table_rows(&groups) {
        out.push_str("<tr class=\"group\">");
        for (i, value) in row.iter().enumerate() {
            if i == RECALL_COLUMN {
                let _ = write!(
                    out,
                    "<td class=\"{}\">{}</td>",
                    tone.css_class(),
                    text(value)
                );
            } else if i == 1 || i == 2 {
                let _ = write!(out, "<td class=\"text\">{}</td>", text(value));
            } else {
                let _ = write!(out, "<td>{}</td>", text(value));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n<ul class=\"legend\">\n");
    for line in summary::summary_legend(word).lines() {
        let _ = writeln!(out, "<li>{}</li>", text(line));
    }
    out.push_str("</ul>\n</section>\n");
    out
}

/// The reference's heatmaps and the rank-vs-length plot.
fn plots_section(records: &RunRecords, plots: &[PathBuf]) -> Result<String> {
    let mut out = String::new();
    let heatmaps: Vec<&PathBuf> = plots
        .iter()
        .filter(|p| {
            let n = file_name(p);
            n.starts_with("heatmap_") && !n.starts_with("heatmap_engine_")
        })
        .collect();
    if !heatmaps.is_empty() {
        out.push_str(
            "<section id=\"heatmaps\">\n<h2>Recall heatmaps</h2>\n<p>One per index profile and \
             top-k: context length across, needle depth down; each square is the worst \
             needle rank over the samples written there.</p>\n",
        );
        for p in heatmaps {
            out.push_str(&figure(p)?);
        }
        out.push_str("</section>\n");
    }
    if let Some(p) = plot(plots, "rank_vs_length.png") {
        let _ = writeln!(
            out,
            "<section id=\"ranks\">\n<h2>Needle rank against context length</h2>\n\
             <figure>{}<figcaption>rank_vs_length.png ({} cells)</figcaption></figure>\n</section>",
            image(p, "rank_vs_length.png")?,
            records.cells.len()
        );
    }
    Ok(out)
}

/// The serving engine beside the reference: its conclusion per cell and its heatmaps.
fn engine_section(records: &RunRecords, plots: &[PathBuf]) -> Result<String> {
    let conclusions = super::engine_conclusions(records);
    if conclusions.is_empty() {
        return Ok(String::new());
    }
    let mut out = String::from(
        "<section id=\"engine\">\n<h2>Serving engine against the reference</h2>\n\
         <table class=\"engine\">\n<thead><tr><th>cell</th><th>engine K</th><th>conclusion</th>\
         </tr></thead>\n<tbody>\n",
    );
    for c in &conclusions {
        let _ = writeln!(
            out,
            "<tr><td><a href=\"#cell-{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            attr(&file_stem(&c.cell_id)),
            text(&c.cell_id),
            c.engine_topk,
            text(&c.conclusion)
        );
    }
    out.push_str("</tbody>\n</table>\n");
    for p in plots
        .iter()
        .filter(|p| file_name(p).starts_with("heatmap_engine_"))
    {
        out.push_str(&figure(p)?);
    }
    out.push_str("</section>\n");
    Ok(out)
}

/// The verdict of a cell as the cells table writes it.
fn verdict(cell: &CellRecord) -> (&'static str, &'static str) {
    match (cell.answer_correct, cell.is_evidence(), cell.recalled()) {
        (Some(true), _, _) => ("answer correct", "recall-all"),
        (Some(false), _, _) => ("answer wrong", "recall-none"),
        (None, false, _) => ("trivial", "recall-trivial"),
        (None, true, true) => ("selected (idx)", "recall-all"),
        (None, true, false) => ("lost (idx)", "recall-none"),
    }
}

/// One row per finished cell.
fn cells_table(records: &RunRecords) -> String {
    let word = LayerWord::of(&records.layers);
    let mut out = format!(
        "<section id=\"cells\">\n<h2>Cells</h2>\n<table class=\"cells\">\n<thead><tr>\
         <th>cell</th><th>length</th><th>prompt tokens</th><th>depth</th><th>index</th>\
         <th>kv</th><th>top-k</th><th>verdict</th><th>worst rank</th><th>{word} lost</th>\
         <th>exact keeps</th><th>answer</th><th>seconds</th></tr></thead>\n<tbody>\n",
    );
    for cell in &records.cells {
        let (verdict, class) = verdict(cell);
        let _ = writeln!(
            out,
            "<tr class=\"cell\" data-cell=\"{}\"><td><a href=\"#cell-{}\">{}</a></td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td>\
             <td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{:.1}</td></tr>",
            attr(&cell.cell_id),
            attr(&file_stem(&cell.cell_id)),
            text(&cell.cell_id),
            format_tokens(cell.target_tokens),
            cell.prompt_tokens,
            text(&percent_label(cell.depth_pct)),
            text(cell.index.name()),
            text(&cell.kv.to_string()),
            cell.topk,
            verdict,
            cell.min_needle_rank
                .map_or_else(|| "-".to_string(), |r| r.to_string()),
            cell.layers_lost(),
            cell.csa_layers_nontrivial,
            cell.exact_keeps
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            text(&cell.answer_text),
            cell.wall_seconds
        );
    }
    let layer = word.noun();
    let _ = write!(
        out,
        "</tbody>\n</table>\n<ul class=\"legend\">\n<li>verdict: the answer when the model \
         answered, else indexer recall (idx: needle selected on every non-trivial {layer} at \
         the answer position); trivial: every {layer} had n_t &lt;= k.</li>\n<li>worst rank: \
         the needle rank on the {layer} where it ranked worst (rank 1 = best).</li>\n\
         <li>{word} lost: non-trivial {layer}s that did not select the needle / non-trivial \
         {layer}s.</li>\n<li>exact keeps: of those lost, the layers the exact profile selects on \
         the same hidden states (lost to rounding; the rest the exact math loses too: the top-k \
         is too small there); -: exact not scored.</li>\n</ul>\n</section>\n",
    );
    out
}

/// A cell's numbers at its answer position, its why line and its layer plot.
fn cell_section(records: &RunRecords, cell: &CellRecord, plots: &[PathBuf]) -> Result<String> {
    let answer = cell.answer_position();
    let layers: Vec<LayerRecord> = records
        .layers
        .iter()
        .filter(|r| r.cell_id == cell.cell_id)
        .cloned()
        .collect();
    let here: Vec<&LayerRecord> = layers.iter().filter(|r| r.query_pos == answer).collect();
    let mut profiles: Vec<&str> = vec![cell.index.name()];
    for r in &here {
        if !profiles.contains(&r.profile.as_str()) {
            profiles.push(&r.profile);
        }
    }
    let several = here.iter().any(|r| r.needle > 0);
    let mut out = String::new();
    let (verdict, class) = verdict(cell);
    let _ = writeln!(
        out,
        "<section class=\"cell-detail\" id=\"cell-{}\">\n<h3>{}</h3>\n<p>{} prompt tokens; \
         needle tokens {}..{} (depth {}); index {}, kv {}, top-{}; answer {}: \
         <span class=\"{class}\">{verdict}</span>; {:.1} s</p>",
        attr(&file_stem(&cell.cell_id)),
        text(&cell.cell_id),
        cell.prompt_tokens,
        cell.needle_start,
        cell.needle_end,
        text(&percent_label(cell.depth_pct)),
        text(cell.index.name()),
        text(&cell.kv.to_string()),
        cell.topk,
        text(&format!("{:?}", cell.answer_text)),
        cell.wall_seconds
    );
    if let Some(why) = crate::record::verdict::why_of(&layers, cell.index.name(), cell.topk, answer)
    {
        let _ = writeln!(out, "<p class=\"why\">why: {}</p>", text(&why));
    }
    let _ = write!(
        out,
        "<table class=\"layers\">\n<thead><tr><th>layer</th><th>visible</th><th>needle</th>{}",
        if several { "<th>#</th>" } else { "" }
    );
    for p in &profiles {
        let _ = write!(out, "<th>rank[{}]</th>", text(p));
    }
    out.push_str("<th>margin</th><th>selected</th><th>trivial</th></tr></thead>\n<tbody>\n");
    for driving in here.iter().filter(|r| r.driving) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td>",
            driving.layer, driving.visible_rows, driving.needle_rows
        );
        if several {
            let _ = write!(out, "<td>{}</td>", driving.needle);
        }
        for p in &profiles {
            let rank = here
                .iter()
                .find(|r| r.layer == driving.layer && r.needle == driving.needle && r.profile == *p)
                .and_then(|r| r.needle_rank);
            let _ = write!(
                out,
                "<td>{}</td>",
                rank.map_or_else(|| "-".to_string(), |r| r.to_string())
            );
        }
        let lost = !driving.trivial && !driving.selected;
        let _ = writeln!(
            out,
            "<td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            driving
                .margin
                .map_or_else(|| "-".to_string(), |m| format!("{m:+.4}")),
            if lost { "recall-none" } else { "" },
            if driving.selected { "yes" } else { "NO" },
            if driving.trivial { "yes" } else { "no" }
        );
    }
    out.push_str("</tbody>\n</table>\n");
    let name = format!("layers_{}.png", file_stem(&cell.cell_id));
    if let Some(p) = plot(plots, &name) {
        out.push_str(&figure(p)?);
    }
    out.push_str("</section>\n");
    Ok(out)
}

const STYLE: &str = "
body { font-family: 'DejaVu Sans', Verdana, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
table.summary td, table.cells td, table.layers td { white-space: nowrap; }
th { background: #f2f2f2; } table.settings th { text-align: left; } table.settings td { text-align: left; }
td:first-child, td.text { text-align: left; }
nav a { margin-right: 1em; }
.recall-all { background: #d9f2d9; } .recall-some { background: #fff2c6; }
.recall-none { background: #f8d0d0; } .recall-trivial { color: #888; }
.synthetic { background: #fff2c6; padding: 0.5em; }
.why { background: #f4f4fb; padding: 0.5em; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; border: 1px solid #ddd; }
.legend { font-size: 0.85em; color: #444; }
";

/// Once the page has loaded, draws each image onto a small canvas (which decodes it in full)
/// and marks it `data-decoded="yes"` when it has a size and more than one colour, `blank`
/// when it decodes to one colour, `no` when it does not decode; counts on `<body>`.
const SCRIPT: &str = "
window.addEventListener('load', function () {
  var images = Array.prototype.slice.call(document.images);
  var canvas = document.createElement('canvas');
  canvas.width = 250; canvas.height = 175;
  var ctx = canvas.getContext('2d', { willReadFrequently: true });
  var decoded = 0;
  images.forEach(function (img) {
    var state = 'no';
    if (img.complete && img.naturalWidth > 0) {
      try {
        ctx.clearRect(0, 0, canvas.width, canvas.height);
        ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
        var px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        state = 'blank';
        for (var i = 4; i < px.length; i += 4) {
          if (px[i] !== px[0] || px[i + 1] !== px[1] || px[i + 2] !== px[2]) { state = 'yes'; break; }
        }
      } catch (e) { state = 'no'; }
    }
    img.dataset.decoded = state;
    if (state === 'yes') { decoded += 1; }
  });
  document.body.dataset.imagesDecoded = String(decoded);
  document.body.dataset.imagesBroken = String(images.length - decoded);
});
";
