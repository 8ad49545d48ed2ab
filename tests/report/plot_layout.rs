//! Plots stay readable whatever the grid: many depths or lengths, many profiles and top-k
//! values, long model names, mixed judging, stopped sweeps. The layout rules are checked as
//! functions (tick thinning, legend rows, header lines, profile colours) and on the PNGs'
//! pixels. Set NEEDLESCOPE_PLOT_DIR to keep the PNGs there for looking at them.

use needlescope_testkit::report as report_support;

use std::path::{Path, PathBuf};

use needlescope::config::ModelConfig;
use needlescope::numerics::modes::IndexProfile;
use needlescope::record::{CellRecord, LayerRecord, RunInfo};
use needlescope::report::plots::{
    ellipsize_middle, flow, header_lines, layer_plot, legend_layout, line_style_legend,
    profile_colour, rank_label, rank_ticks, spaced_ticks, text_width, thin_ticks, HEADER_TEXT_W,
    LABEL_PX, SIZE, TICK_GAP,
};
use needlescope::report::{render_all, render_records, RunDir, RunRecords};
use report_support::*;

const W: usize = 1000;
const H: usize = 700;

fn out_dir(name: &str) -> (Option<tempfile::TempDir>, PathBuf) {
    let (keep, p) = match std::env::var_os("NEEDLESCOPE_PLOT_DIR") {
        Some(d) => (None, PathBuf::from(d).join(name)),
        None => {
            let t = tempfile::tempdir().unwrap();
            let p = t.path().join(name);
            (Some(t), p)
        }
    };
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    (keep, p)
}

/// The RGB pixels of a 1000 x 700 PNG, row by row.
fn pixels(path: &Path) -> Vec<[u8; 3]> {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).unwrap();
    assert_eq!(frame.color_type, png::ColorType::Rgb, "{}", path.display());
    assert_eq!((frame.width, frame.height), (W as u32, H as u32));
    buf[..frame.buffer_size()]
        .chunks(3)
        .map(|p| [p[0], p[1], p[2]])
        .collect()
}

/// How many pixels in columns `xs` and rows `ys` satisfy `pred`.
fn count(
    px: &[[u8; 3]],
    xs: std::ops::Range<usize>,
    ys: std::ops::Range<usize>,
    pred: impl Fn([u8; 3]) -> bool,
) -> usize {
    ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
        .filter(|&(x, y)| pred(px[y * W + x]))
        .count()
}

/// `profile_colour(name)` as bytes.
fn colour(name: &str) -> [u8; 3] {
    let c = profile_colour(name);
    [c.0, c.1, c.2]
}

fn dark(p: [u8; 3]) -> bool {
    p.iter().all(|&c| c < 80)
}

/// Records handed straight to the plotter (no layer rows: no layer plots to wait for).
fn records(dir: &Path, info: RunInfo, cells: Vec<CellRecord>) -> RunRecords {
    RunRecords {
        dir: dir.to_path_buf(),
        info,
        cells,
        layers: vec![],
        attention: vec![],
        engine: vec![],
        notes: vec![],
    }
}

/// A sweep's run.json over this grid (samples per tile as given).
fn sweep_info(lengths: &[usize], depths: &[f64], indexes: &[&str], topks: &[usize]) -> RunInfo {
    let mut info = run_info(false);
    info.sweep_args = serde_json::json!({
        "lengths": lengths, "depths": depths, "indexes": indexes, "topks": topks,
        "kv": "fp8", "samples": 1,
    });
    info
}

fn grid_cells(
    lengths: &[usize],
    depths: &[f64],
    index: IndexProfile,
    topk: usize,
) -> Vec<CellRecord> {
    let mut out = Vec::new();
    for &l in lengths {
        for (j, &d) in depths.iter().enumerate() {
            let mut c = cell(
                &format!("L{l}-d{d}-{}-k{topk}-s0", index.name()),
                l,
                d,
                index,
                topk,
            );
            c.answer_correct = Some(j % 7 != 3);
            c.min_needle_rank = Some(1 + (j * 37 + l) % 900);
            out.push(c);
        }
    }
    out
}

#[test]
fn thinned_ticks_keep_the_first_and_last_and_stay_within_the_limit() {
    assert_eq!(thin_ticks(7, 20), (0..7).collect::<Vec<_>>());
    assert_eq!(
        thin_ticks(1000, 20),
        [0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 999]
    );
    for max in [2usize, 5, 12, 20] {
        for n in 1..=1200usize {
            let t = thin_ticks(n, max);
            assert!(t.len() <= max.max(2), "n {n} max {max}: {t:?}");
            assert_eq!((t[0], *t.last().unwrap()), (0, n - 1), "n {n} max {max}");
            let even = (n - 1) as f64 / (max.max(2) - 1) as f64;
            for w in t.windows(2) {
                assert!(w[1] > w[0], "n {n} max {max}: {t:?}");
                assert!(
                    (w[1] - w[0]) as f64 >= even / 2.0,
                    "n {n} max {max}: {t:?} crowds"
                );
            }
        }
    }
}

#[test]
fn legend_rows_always_end_inside_their_column() {
    for height in [0u32, 40, 300, 607, 628] {
        for rows in 0..=150usize {
            let l = legend_layout(rows, height);
            assert!(
                (20..=28).contains(&l.pitch),
                "{rows} rows in {height}: {l:?}"
            );
            let lines = l.shown + usize::from(l.more);
            if lines > 0 {
                let last_bottom = l.top + l.pitch * (lines as i32 - 1) + 12;
                assert!(
                    last_bottom <= height as i32,
                    "{rows} rows in {height}: {l:?}"
                );
            }
            assert!(l.shown <= rows, "{rows} rows in {height}: {l:?}");
            if l.shown < rows && height >= 36 {
                assert!(
                    l.more,
                    "{rows} rows in {height}: the left-out rows go unsaid"
                );
            }
            if rows as i32 * 20 <= height as i32 - 36 {
                assert_eq!(l.shown, rows, "{rows} rows fit {height} px: {l:?}");
            }
        }
    }
    // Swatches flow onto new lines rather than past the edge.
    let widths = [300u32, 250, 280, 200, 120, 990];
    for (i, (_, x)) in flow(&widths, 26, 960).iter().enumerate() {
        assert!(*x == 0 || x + widths[i] <= 960, "swatch {i} at {x}");
    }
}

#[test]
fn profile_colours_are_distinct_and_never_grey() {
    let mut seen = Vec::new();
    let names: Vec<&str> = IndexProfile::ALL.iter().map(|p| p.name()).collect();
    for name in names.iter().copied().chain(["not-a-profile"]) {
        let c = colour(name);
        let spread = c.iter().max().unwrap() - c.iter().min().unwrap();
        assert!(spread >= 60, "{name} is greyish: {c:?}");
        if name != "not-a-profile" {
            assert!(!seen.contains(&c), "{name} shares {c:?}");
            seen.push(c);
        }
    }
}

#[test]
fn header_lines_fit_the_canvas() {
    let info = {
        let mut i = run_info(true);
        i.model_path = "/models/DeepSeek-V4-Flash-NVFP4".into();
        i
    };
    let names: Vec<&str> = IndexProfile::ALL.iter().map(|p| p.name()).collect();
    let long_id = format!(
        "L1048576-d33.333333-{}-k2048-s12",
        "fp8-no-hadamard-k".repeat(8)
    );
    let cases: Vec<Vec<String>> = vec![
        vec![
            format!("model {}", info.model_name()),
            "scenario passkey".into(),
            format!("index {}", names.join(", ")),
            "top-k 16, 32, 48, 64, 128, 256, 512, 1024".into(),
            "19 of 20 cells".into(),
        ],
        vec![
            format!("model {}", info.model_name()),
            "scenario passkey".into(),
            "index fp8-no-hadamard-k (driving)".to_string(),
            "top-k 2048".into(),
            format!("cell {long_id}"),
        ],
        vec!["x".repeat(400)],
    ];
    for parts in &cases {
        let ((title, px), lines) = header_lines(
            "Needle recall (answer where present, else indexer) by context length and depth",
            true,
            parts,
        );
        assert!(
            px >= 18 && text_width(&title, px) <= HEADER_TEXT_W,
            "{title} at {px}"
        );
        assert!(title.ends_with("(synthetic model)"), "{title}");
        assert!((1..=2).contains(&lines.len()), "{lines:?}");
        for l in &lines {
            assert!(text_width(l, 17) <= HEADER_TEXT_W, "too wide: {l}");
        }
    }
    let s = ellipsize_middle(&long_id, 17, 300);
    assert!(s.starts_with("L1048576-d33") && s.ends_with("k2048-s12") && s.contains('…'));
}

/// 1000 depths (the CLI's maximum) and 101: the tiles' colours fill the plot (no numbers or
/// borders over them), and the depth labels are at most about 20 separate lines of text.
#[test]
fn heatmap_with_many_depths_shows_colours_and_thinned_labels() {
    // 0, 0.1, ..., 99.9 as `--depths 0:99.9:0.1` gives; 0, 1, ..., 100; and 37 depths with
    // every decimal an f64 has (labels wider than usual): depth i is 100 i / span %.
    for (n, span) in [(1000usize, 1000.0), (101, 100.0), (37, 36.0)] {
        let (_keep, dir) = out_dir(&format!("depths-{n}"));
        let depths: Vec<f64> = (0..n).map(|i| i as f64 * 100.0 / span).collect();
        let cells = grid_cells(&[4096], &depths, IndexProfile::SglangFp8, 512);
        let info = sweep_info(&[4096], &depths, &["fp8"], &[512]);
        render_records(&records(&dir, info, cells), &dir).unwrap();
        let px = pixels(&dir.join("heatmap_fp8_512.png"));
        let tiles = [[122u8, 198, 126], [236, 112, 99]];
        let coloured = count(&px, 0..W, 0..H, |p| tiles.contains(&p));
        assert!(
            coloured > W * H * 45 / 100,
            "{n} depths: {coloured} tile pixels"
        );
        let ink = |p: [u8; 3]| p.iter().any(|&c| c < 200);
        assert_eq!(
            count(&px, 0..3, 0..H, ink),
            0,
            "{n} depths: labels cut at the left"
        );
        let left = (0..W).find(|&x| tiles.contains(&px[300 * W + x])).unwrap();
        let black = count(&px, left..950, 100..540, dark);
        assert!(
            black < 200,
            "{n} depths: {black} dark pixels over the tiles"
        );
        // Rows of the label column (right-aligned left of the tiles, the ticks left out)
        // holding text, grouped into labels.
        let inked: Vec<bool> = (0..H)
            .map(|y| count(&px, left - 45..left - 12, y..y + 1, dark) > 0)
            .collect();
        let labels: Vec<(usize, usize)> = inked
            .iter()
            .enumerate()
            .filter(|&(y, &i)| i && (y == 0 || !inked[y - 1]))
            .map(|(y, _)| (y, (y..H).take_while(|&z| inked[z]).count()))
            .collect();
        assert!(
            (2..=21).contains(&labels.len()),
            "{n} depths: {} label lines",
            labels.len()
        );
        assert!(
            labels.iter().all(|l| l.1 <= 20),
            "{n} depths: labels overlap: {labels:?}"
        );
    }
}

/// rank_vs_length.png and a layer plot colour a profile alike; fp8 is not `exact`'s blue.
#[test]
fn rank_plot_colours_series_by_profile() {
    let (_keep, dir) = out_dir("colours");
    let sweep = sample_sweep(&[2048, 8192], &[0.0, 50.0], true, 1);
    let cells: Vec<CellRecord> = sweep.iter().map(|s| s.0.clone()).collect();
    render_records(&records(&dir, run_info(false), cells), &dir).unwrap();
    let px = pixels(&dir.join("rank_vs_length.png"));
    let has = |name: &str| {
        let c = colour(name);
        count(&px, 100..720, 80..640, |p| p == c)
    };
    assert!(
        has("fp8") > 100 && has("bf16") > 100,
        "fp8 {} bf16 {}",
        has("fp8"),
        has("bf16")
    );
    assert_eq!(has("exact"), 0, "no exact series, yet its colour is drawn");
}

/// 8 profiles x 4 top-k and a long model name: the legend ends inside the canvas and the
/// subtitle is not cut at either edge.
#[test]
fn rank_plot_legend_and_header_fit_with_many_series() {
    let (_keep, dir) = out_dir("many-series");
    let names: Vec<&str> = IndexProfile::ALL.iter().map(|p| p.name()).collect();
    let topks = [16usize, 32, 48, 64];
    let mut cells = Vec::new();
    for &p in &IndexProfile::ALL {
        for &k in &topks {
            cells.extend(grid_cells(&[1024, 4096], &[0.0, 50.0], p, k));
        }
    }
    let mut info = sweep_info(&[1024, 4096], &[0.0, 50.0], &names, &topks);
    info.model_path = "/models/DeepSeek-V4-Flash-NVFP4".into();
    render_records(&records(&dir, info, cells), &dir).unwrap();
    let px = pixels(&dir.join("rank_vs_length.png"));
    let ink = |p: [u8; 3]| p.iter().any(|&c| c < 200);
    assert_eq!(
        count(&px, 730..W, H - 14..H, ink),
        0,
        "legend runs off the bottom"
    );
    assert_eq!(
        count(&px, 0..4, 0..100, ink),
        0,
        "header cut at the left edge"
    );
    assert_eq!(
        count(&px, W - 4..W, 0..100, ink),
        0,
        "header cut at the right edge"
    );
}

/// Answer-judged and trivial indexer-judged cells in one heatmap: the grey of the trivial
/// tiles has its legend swatch under the grid.
#[test]
fn mixed_judging_heatmap_has_a_grey_legend_entry() {
    let (_keep, dir) = out_dir("mixed");
    let mut cells = grid_cells(
        &[2048, 4096],
        &[0.0, 50.0, 100.0],
        IndexProfile::SglangFp8,
        512,
    );
    for c in cells.iter_mut().filter(|c| c.target_tokens == 2048) {
        c.answer_correct = None;
        (c.csa_layers_selected, c.csa_layers_nontrivial) = (0, 0);
    }
    let info = sweep_info(&[2048, 4096], &[0.0, 50.0, 100.0], &["fp8"], &[512]);
    render_records(&records(&dir, info, cells), &dir).unwrap();
    let px = pixels(&dir.join("heatmap_fp8_512.png"));
    let grey = count(&px, 0..W, 620..H, |p| p == [205, 205, 205]);
    assert!(grey >= 18 * 18, "legend band has {grey} grey pixels");
}

/// A stopped sweep: planned tiles without cells are hatched, not left blank.
#[test]
fn stopped_sweep_heatmap_hatches_tiles_not_run() {
    let (_keep, dir) = out_dir("stopped");
    let depths = [0.0, 25.0, 50.0, 75.0, 100.0];
    let mut cells = grid_cells(&[1024, 2048, 4096], &depths, IndexProfile::SglangFp8, 64);
    cells.truncate(9);
    let info = sweep_info(&[1024, 2048, 4096], &depths, &["fp8"], &[64]);
    render_records(&records(&dir, info, cells), &dir).unwrap();
    let px = pixels(&dir.join("heatmap_fp8_64.png"));
    let hatch = count(&px, 100..980, 80..560, |p| p == [150, 150, 150]);
    let background = count(&px, 100..980, 80..560, |p| p == [244, 244, 244]);
    assert!(
        hatch > 500 && background > 5000,
        "hatch {hatch}, background {background}"
    );
    let swatch = count(&px, 0..W, 600..H, |p| p == [150, 150, 150]);
    assert!(swatch > 10, "no not-run legend swatch");
}

/// Records shaped like a DeepSeek-V4-Flash probe at 64k tokens: its 21 CSA layers (of 43), all
/// 8 index profiles scored with fp8 driving; exact and bf16-qk equal on every layer, bf16 equal
/// to exact on every other layer only, sglang-fp4 and official-fp4 equal to fp8 on a few.
fn write_flash_shaped(dir: &Path) -> CellRecord {
    let csa = ModelConfig::flash().csa_layers();
    assert_eq!(csa.len(), 21);
    let id = "L65536-d50-fp8-k512-s0";
    let c = cell(id, 65536, 50.0, IndexProfile::SglangFp8, 512);
    let mut rows: Vec<LayerRecord> = Vec::new();
    for (i, &l) in csa.iter().enumerate() {
        let exact = 2 + (i * 37) % 300;
        for p in IndexProfile::ALL {
            let rank = match p {
                IndexProfile::Exact | IndexProfile::Bf16Qk => exact,
                IndexProfile::SglangBf16Keys if i % 2 == 0 => exact,
                IndexProfile::SglangBf16Keys => exact + 3,
                IndexProfile::SglangFp8 => exact * 2 + 1,
                IndexProfile::SglangFp4 | IndexProfile::OfficialFp4 if i % 5 == 0 => exact * 2 + 1,
                IndexProfile::SglangFp4 => exact * 3,
                IndexProfile::OfficialFp4 => exact * 3 + 7,
                IndexProfile::VllmFp8 => exact + 40,
                IndexProfile::Fp8NoHadamardK => exact * 9,
                IndexProfile::V41Fp4 | IndexProfile::SglangV41Fp4 => {
                    unreachable!("not a DeepSeek-V4 profile")
                }
            };
            let mut r = layer(id, l, p.name(), p == IndexProfile::SglangFp8, rank);
            r.visible_rows = 16384;
            rows.push(r);
        }
    }
    let (c, rows) = agreeing(c, rows);
    let attn: Vec<_> = csa.iter().map(|&l| attention(id, l)).collect();
    let (mut store, _) = RunDir::create_or_resume(dir, run_info(false)).unwrap();
    store.append_cell(&c, &rows, &attn).unwrap();
    c
}

/// A Flash-shaped layer plot stays readable: every tick labelled, at CSA layers only, no two
/// labels touching; every legend row drawn in full inside the canvas, naming the identical
/// profiles; and on the PNG each of the 8 profiles' colours shows in the data area (exact and
/// bf16-qk, equal on every layer, side by side rather than one over the other), and the axis
/// has a tick mark exactly where the layout puts a labelled tick.
#[test]
fn flash_shaped_layer_plot_stays_readable() {
    let (_keep, dir) = out_dir("flash-layers");
    let c = write_flash_shaped(&dir);
    render_all(&dir).unwrap();
    let records = RunRecords::read(&dir).unwrap();
    let plot = layer_plot(&records, &c).unwrap();
    let csa = ModelConfig::flash().csa_layers();
    assert_eq!(plot.layers, csa);
    assert_eq!(plot.series.len(), 8);
    let mut marks: Vec<_> = plot.series.iter().map(|s| s.mark).collect();
    marks.dedup();
    assert_eq!(marks.len(), 8, "every profile its own marker");

    // Ticks: labelled, at CSA layers, first and last kept, apart, inside the data area.
    assert!(
        plot.ticks.len() >= 11,
        "{} of 21 layers labelled",
        plot.ticks.len()
    );
    assert_eq!(plot.ticks[0].layer, csa[0]);
    assert_eq!(plot.ticks.last().unwrap().layer, *csa.last().unwrap());
    for t in &plot.ticks {
        assert!(
            csa.contains(&t.layer),
            "tick at layer {} (no CSA layer)",
            t.layer
        );
        assert_eq!(t.label, t.layer.to_string());
        assert!(t.x_px >= plot.data_x.0 && t.x_px <= plot.data_x.1);
    }
    for w in plot.ticks.windows(2) {
        let room = w[1].x_px - w[0].x_px - f64::from(w[0].width_px + w[1].width_px) / 2.0;
        assert!(
            room >= f64::from(TICK_GAP),
            "labels {} and {} touch",
            w[0].label,
            w[1].label
        );
    }

    // Lanes: every profile its own, inside the data area at the outer layers too.
    let mut offsets: Vec<f64> = plot.series.iter().map(|s| s.offset_px).collect();
    offsets.sort_by(f64::total_cmp);
    assert!(
        offsets.windows(2).all(|w| w[1] - w[0] >= 2.0),
        "{offsets:?}"
    );
    for l in [csa[0], *csa.last().unwrap()] {
        for o in &offsets {
            let x = plot.x_px(l as f64) + o;
            assert!(
                x > plot.data_x.0 + 4.0 && x < plot.data_x.1 - 4.0,
                "layer {l} at {x}"
            );
        }
    }

    // Legend: every row drawn, in full, inside the column.
    let legend = plot.legend();
    let l = plot.legend_layout;
    assert_eq!((l.shown, l.more), (legend.len(), false), "{legend:?}");
    assert!(l.pitch >= 20);
    assert!(l.top + l.pitch * (legend.len() as i32 - 1) + 12 <= plot.legend_height as i32);
    assert_eq!(plot.legend_drawn(), legend, "a legend row is shortened");
    assert!(
        legend.iter().any(|r| r == "exact = bf16-qk"),
        "identical profiles not named: {legend:?}"
    );
    assert_eq!(
        plot.identical,
        vec![vec!["exact".to_string(), "bf16-qk".into()]]
    );

    // Pixels: every profile visible in the data area.
    let png = dir.join(format!("layers_{}.png", c.cell_id));
    let px = pixels(&png);
    let (x0, x1) = (plot.data_x.0 as usize, plot.data_x.1 as usize);
    for p in IndexProfile::ALL {
        let shown = count(&px, x0..x1, 90..620, |q| q == colour(p.name()));
        assert!(shown > 150, "{}: {shown} pixels of its colour", p.name());
    }
    // Tick marks: the dark columns just below the x axis are the layout's ticks.
    let axis_y = (600..H)
        .find(|&y| count(&px, x0 + 5..x1 - 5, y..y + 1, dark) > (x1 - x0) / 2)
        .expect("the x axis line");
    let marks: Vec<usize> = (x0..x1)
        .filter(|&x| count(&px, x..x + 1, axis_y + 2..axis_y + 4, dark) == 2)
        .collect();
    let want: Vec<f64> = plot.ticks.iter().map(|t| t.x_px).collect();
    assert_eq!(
        marks.len(),
        want.len(),
        "tick marks at {marks:?}, labelled ticks at {want:?}"
    );
    for (m, w) in marks.iter().zip(&want) {
        assert!(
            (*m as f64 - w).abs() <= 1.5,
            "tick marks at {marks:?}, labelled ticks at {want:?}"
        );
    }
}

/// With 61 layers of which 30 are CSA (V4-Pro's count), the labels thin out and still never
/// touch; irregular gaps between CSA layers too.
#[test]
fn layer_axis_labels_thin_without_touching() {
    let widths = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| text_width(&(2 * i + 1).to_string(), LABEL_PX))
            .collect()
    };
    for (centres, label_widths) in [
        (
            (0..30)
                .map(|i| 110.0 + i as f64 * 20.0)
                .collect::<Vec<f64>>(),
            widths(30),
        ),
        (vec![110.0, 112.0, 300.0, 318.0, 700.0], widths(5)),
        (
            (0..21).map(|i| 110.0 + i as f64 * 29.76).collect(),
            widths(21),
        ),
    ] {
        let ticks = spaced_ticks(&centres, &label_widths, TICK_GAP);
        assert_eq!(ticks[0], 0);
        for w in ticks.windows(2) {
            let room = centres[w[1]]
                - centres[w[0]]
                - f64::from(label_widths[w[0]] + label_widths[w[1]]) / 2.0;
            assert!(room >= f64::from(TICK_GAP), "{centres:?}: {ticks:?}");
        }
        assert!(
            ticks.len() >= centres.len().min(3) / 2,
            "{centres:?}: {ticks:?}"
        );
    }
}

/// The rank axes are ticked at integers only, each with its label (plotters' own key points
/// left ticks without labels between 1 and 10 on short axes).
#[test]
fn rank_axis_ticks_all_carry_a_label() {
    for top in [10.0, 17.5, 25.0, 99.0, 250.0, 2560.0, 1e6] {
        let (labelled, mesh) = rank_ticks(top);
        assert!(labelled.len() >= 2, "{top}: {labelled:?}");
        assert_eq!(labelled[0], 1.0);
        for v in &labelled {
            assert!(!rank_label(v).is_empty(), "{top}: tick {v} has no label");
            assert!(*v <= top);
        }
        assert!(labelled.iter().all(|v| mesh.contains(v)));
    }
    assert_eq!(rank_ticks(25.0).0, [1.0, 2.0, 5.0, 10.0, 20.0]);
    assert_eq!(rank_ticks(2560.0).0, [1.0, 10.0, 100.0, 1000.0]);
}

/// rank_vs_length.png never implies that a line follows one needle position: over several
/// depths the legend says a point gathers them; with one depth it names the depth.
#[test]
fn rank_plot_legend_says_what_a_point_is_taken_over() {
    let text = |depths: &[f64], samples| line_style_legend(depths, samples).join(" ");
    let many = text(&[10.0, 30.0, 50.0, 70.0, 90.0], 1);
    assert!(many.contains("over 5 depths (10% to 90%)"), "{many}");
    assert!(many.contains("may come from different depths"), "{many}");
    assert!(many.contains("not follow one needle position"), "{many}");
    let sampled = text(&[0.0, 100.0], 3);
    assert!(
        sampled.contains("2 depths (0% to 100%) and 3 samples"),
        "{sampled}"
    );
    let one = text(&[50.0], 3);
    assert!(
        one.contains("3 samples per length, all at depth 50%"),
        "{one}"
    );
    assert!(!one.contains("different depths"), "{one}");
    let single = text(&[33.3], 1);
    assert!(
        single.contains("at depth 33.3% (median = worst)"),
        "{single}"
    );
}

/// rank_vs_length.png ticks the measured lengths, every tick labelled: its pixel row just
/// below the x axis has dark tick marks exactly under the 5 lengths of the demo grid.
#[test]
fn rank_plot_ticks_every_measured_length_with_a_label() {
    let (_keep, dir) = out_dir("rank-ticks");
    let lengths = [1024, 2048, 4096, 8192, 16384];
    let mut cells = Vec::new();
    for &p in &[IndexProfile::SglangFp8, IndexProfile::SglangBf16Keys] {
        cells.extend(grid_cells(&lengths, &[10.0, 50.0, 90.0], p, 64));
    }
    let info = sweep_info(&lengths, &[10.0, 50.0, 90.0], &["fp8", "bf16"], &[64]);
    render_records(&records(&dir, info, cells), &dir).unwrap();
    let px = pixels(&dir.join("rank_vs_length.png"));
    let (x0, x1) = (110, SIZE.0 as usize - 270 - 10);
    let axis_y = (600..H)
        .find(|&y| count(&px, x0 + 5..x1 - 5, y..y + 1, dark) > (x1 - x0) / 2)
        .expect("the x axis line");
    let marks: Vec<usize> = (x0..x1)
        .filter(|&x| count(&px, x..x + 1, axis_y + 2..axis_y + 4, dark) == 2)
        .collect();
    assert_eq!(marks.len(), lengths.len(), "tick marks at {marks:?}");
    for &m in &marks {
        let label = count(&px, m - 6..m + 7, axis_y + 8..axis_y + 30, dark);
        assert!(
            label > 10,
            "tick at {m} without a label ({label} dark pixels)"
        );
    }
}

/// Probes at two (length, depth) positions sharing a directory (no plan), one with 3 samples
/// that disagree: the two positions of the grid without a cell are dotted with a "no cell"
/// swatch under the grid (before, they were left blank), and the split tile's `(2/3)` is
/// explained there.
#[test]
fn heatmap_marks_positions_without_a_cell_and_explains_split_counts() {
    let (_keep, dir) = out_dir("no-cell");
    let mut cells = Vec::new();
    for (s, correct) in [true, true, false].into_iter().enumerate() {
        let mut c = cell(
            &format!("L2048-d0-fp8-k64-s{s}"),
            2048,
            0.0,
            IndexProfile::SglangFp8,
            64,
        );
        c.answer_correct = Some(correct);
        c.min_needle_rank = Some(100 + 23 * s);
        cells.push(c);
    }
    cells.push(cell(
        "L4096-d50-fp8-k64-s0",
        4096,
        50.0,
        IndexProfile::SglangFp8,
        64,
    ));
    let mut info = run_info(false);
    info.sweep_args = serde_json::json!({"command": "probe"});
    render_records(&records(&dir, info, cells), &dir).unwrap();
    let px = pixels(&dir.join("heatmap_fp8_64.png"));
    let background = count(&px, 100..980, 80..560, |p| p == [252, 252, 252]);
    let dots = count(&px, 100..980, 80..560, |p| p == [150, 150, 150]);
    assert!(
        background > 20_000 && dots > 500,
        "no-cell tiles: background {background}, dots {dots}"
    );
    let swatch = count(&px, 0..W, 600..H, |p| p == [252, 252, 252]);
    assert!(swatch > 100, "no no-cell legend swatch ({swatch})");
}
