//! Plots render from records alone: every expected PNG is written and decodes as a 1000 x 700
//! PNG (signature and IHDR checked byte by byte). Set NEEDLESCOPE_PLOT_DIR to keep the sample
//! report there for looking at it.

use needlescope_testkit::report as report_support;

use std::path::{Path, PathBuf};

use needlescope::report::{render_all, RunDir};
use report_support::*;

/// (width, height) from a PNG's signature and IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(
        &b[12..16],
        b"IHDR",
        "{}: first chunk is not IHDR",
        path.display()
    );
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    assert!(b.len() > 2000, "{}: only {} bytes", path.display(), b.len());
    (be(16), be(20))
}

fn out_dir(name: &str) -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("NEEDLESCOPE_PLOT_DIR") {
        Some(d) => {
            let p = PathBuf::from(d).join(name);
            let _ = std::fs::remove_dir_all(&p);
            (None, p)
        }
        None => {
            let t = tempfile::tempdir().unwrap();
            let p = t.path().join(name);
            (Some(t), p)
        }
    }
}

fn write_sample(
    dir: &Path,
    synthetic: bool,
    lengths: &[usize],
    depths: &[f64],
    samples: usize,
) -> usize {
    let (mut store, _) = RunDir::create_or_resume(dir, run_info(synthetic)).unwrap();
    let sweep = sample_sweep(lengths, depths, !synthetic, samples);
    for (c, l, a) in &sweep {
        store.append_cell(c, l, a).unwrap();
    }
    sweep.len()
}

#[test]
fn every_png_is_written_at_1000_by_700() {
    let (_keep, dir) = out_dir("answer");
    let lengths = [2048, 4096, 8192, 16384, 32768];
    let depths: Vec<f64> = (0..=10).map(|i| i as f64 * 10.0).collect();
    let n = write_sample(&dir, false, &lengths, &depths, 1);
    let written = render_all(&dir).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "heatmap_fp8_512.png",
        "heatmap_fp8_1024.png",
        "heatmap_bf16_512.png",
        "heatmap_bf16_1024.png",
        "rank_vs_length.png",
        "layers_16-d40-fp8-k512.png",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert_eq!(
        written.len(),
        4 + n + 1,
        "4 heatmaps, one layer plot per cell, one rank plot"
    );
    for p in &written {
        assert!(p.starts_with(&dir));
        assert_eq!(png_size(p), (1000, 700), "{}", p.display());
    }
}

/// The share of `path`'s pixels in one of the heatmap's tile colours.
fn tile_coloured_share(path: &Path) -> f64 {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).unwrap();
    assert_eq!(frame.color_type, png::ColorType::Rgb, "{}", path.display());
    let tiles: [[u8; 3]; 4] = [
        [122, 198, 126],
        [236, 112, 99],
        [247, 190, 85],
        [205, 205, 205],
    ];
    let pixels = buf[..frame.buffer_size()].chunks(3);
    let n = pixels.len();
    let coloured = pixels.filter(|p| tiles.iter().any(|t| t == p)).count();
    coloured as f64 / n as f64
}

/// Every grid shape fills the plot with tiles, including a single length or a single depth
/// (a probe's report; one-depth sweeps), whose axis is one category.
#[test]
fn heatmap_tiles_fill_the_plot_for_every_grid_shape() {
    for (lengths, depths) in [
        (&[2048usize][..], &[50.0f64][..]),
        (&[2048], &[0.0, 50.0, 100.0]),
        (&[2048, 4096, 8192], &[50.0]),
        (&[2048, 4096], &[10.0, 90.0]),
    ] {
        let (_keep, dir) = out_dir(&format!("grid-{}x{}", lengths.len(), depths.len()));
        write_sample(&dir, true, lengths, depths, 1);
        render_all(&dir).unwrap();
        let share = tile_coloured_share(&dir.join("heatmap_fp8_512.png"));
        // The plot area is about 60% of the image; the legend's squares alone are < 0.3%.
        assert!(
            share > 0.3,
            "{} lengths x {} depths: only {:.1}% of the heatmap is tile-coloured",
            lengths.len(),
            depths.len(),
            100.0 * share
        );
    }
}

#[test]
fn synthetic_indexer_only_runs_render_too() {
    let (_keep, dir) = out_dir("synthetic");
    let n = write_sample(
        &dir,
        true,
        &[1024, 4096, 8192, 16384],
        &[0.0, 25.0, 50.0, 75.0, 100.0],
        3,
    );
    let written = render_all(&dir).unwrap();
    assert_eq!(written.len(), 4 + n + 1);
    for p in &written {
        assert_eq!(png_size(p), (1000, 700), "{}", p.display());
    }
}

#[test]
fn cells_without_layer_rows_get_no_layer_plot() {
    let (_keep, dir) = out_dir("no-layers");
    let (mut store, _) = RunDir::create_or_resume(&dir, run_info(false)).unwrap();
    let c = cell(
        "lonely",
        4096,
        50.0,
        needlescope::numerics::modes::IndexProfile::SglangFp8,
        512,
    );
    let (c, rows) = agreeing(c, vec![layer("lonely", 2, "fp8", true, 3)]);
    store
        .append_cell(&c, &rows, &[attention("lonely", 2)])
        .unwrap();
    drop(store);
    // Records without the cell's layer rows (a directory read from disk refuses that as
    // damage, so the plotter is handed them directly).
    let mut records = needlescope::report::RunRecords::read(&dir).unwrap();
    records.layers.clear();
    let written = needlescope::report::render_records(&records, &dir).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["heatmap_fp8_512.png", "rank_vs_length.png"]);
}

#[test]
fn rerender_rewrites_summary_and_returns_the_table() {
    let (_keep, dir) = out_dir("rerender");
    write_sample(&dir, false, &[2048, 8192], &[0.0, 100.0], 1);
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    let (table, written) = needlescope::report::rerender(&dir, false).unwrap();
    assert_eq!(written[0], dir.join("summary.json"));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&written[0]).unwrap()).unwrap();
    assert_eq!(summary["cells_finished"], 16);
    assert_eq!(summary["groups"].as_array().unwrap().len(), 8);
    assert!(table.starts_with("length"), "{table}");
    assert!(written.iter().any(|p| p.ends_with("rank_vs_length.png")));
}
