//! report.html in a real browser: the page `report DIR` writes is opened by headless Chromium
//! (Debian's `chromium-headless-shell`, which .ci/run installs); its DOM after the page's own
//! check has run holds one table row per cell and every image decoded, and a screenshot of it
//! is not blank. A page with one image's bytes damaged is caught by the same check.
//!
//! Without a browser on this machine the browser part is skipped with a line on stderr, except
//! under CI (`CI` set), where a missing browser fails the test. `NEEDLESCOPE_CHROMIUM` names
//! the browser binary explicitly.

use std::path::{Path, PathBuf};
use std::process::Command;

use needlescope::report::{rerender, RunDir};
use needlescope_testkit::report::{run_info, sample_sweep};

/// The headless browser: `NEEDLESCOPE_CHROMIUM`, else the first of Debian's names on PATH.
fn browser() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NEEDLESCOPE_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["chromium-headless-shell", "chromium", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// The browser, or `None` with a line saying the browser checks were skipped (a failure under
/// CI, which installs one).
fn browser_or_skip(test: &str) -> Option<PathBuf> {
    let found = browser();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: no headless Chromium on PATH (.ci/run installs chromium-headless-shell)"
        );
        eprintln!("{test}: no headless Chromium on PATH; browser checks skipped");
    }
    found
}

/// Arguments every browser run takes: no sandbox (CI runs as root), no GPU, no first-run work.
fn headless(browser: &Path) -> Command {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
    ]);
    cmd
}

/// The page's DOM once it has loaded and its script has run.
fn dump_dom(browser: &Path, page: &Path) -> String {
    let url = format!("file://{}", page.display());
    let out = headless(browser)
        .args(["--virtual-time-budget=20000", "--dump-dom", &url])
        .output()
        .expect("run the browser");
    assert!(out.status.success(), "browser failed: {out:?}");
    String::from_utf8(out.stdout).expect("DOM as UTF-8")
}

/// The value of `name="…"` on the `<body>` tag of `dom`.
fn body_attribute(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<body")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!("{name}=\"");
    let at = tag.find(&key)? + key.len();
    Some(tag[at..at + tag[at..].find('"')?].to_string())
}

/// A report directory of `cells` finished sweep cells, rendered by `report`.
fn sample_report(dir: &Path) -> usize {
    let (mut store, _) = RunDir::create_or_resume(dir, run_info(true)).unwrap();
    let sweep = sample_sweep(&[2048, 8192], &[10.0, 50.0, 90.0], false, 1);
    for (c, l, a) in &sweep {
        store.append_cell(c, l, a).unwrap();
    }
    drop(store);
    let (_, files) = rerender(dir, false).unwrap();
    assert!(
        files.iter().any(|f| f.ends_with("report.html")),
        "report.html not among {files:?}"
    );
    sweep.len()
}

#[test]
fn report_html_is_self_contained_with_every_section() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let cells = sample_report(&dir);
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(page.matches("<tr class=\"cell\"").count(), cells);
    assert_eq!(
        page.matches("<section class=\"cell-detail\"").count(),
        cells,
        "one section per cell"
    );
    for id in ["settings", "summary", "heatmaps", "ranks", "cells"] {
        assert!(page.contains(&format!("<section id=\"{id}\">")), "{id}");
    }
    // Every plot written is on the page, embedded.
    let pngs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".png")
        })
        .count();
    assert_eq!(
        page.matches("<img src=\"data:image/png;base64,").count(),
        pngs
    );
    // Nothing is fetched: no URL off the page, no external style sheet or script.
    for outside in ["src=\"http", "href=\"http", "<link", "<script src", "url("] {
        assert!(!page.contains(outside), "{outside:?} on the page");
    }
    assert!(page.contains("synthetic model"), "the synthetic line");
    assert!(page.contains("exact keeps:"), "the summary legend");
    // The sample sweep loses the needle on some layers: their cells say why.
    assert!(page.contains("<p class=\"why\">why: "), "a why line");
}

#[test]
fn report_html_renders_in_headless_chromium() {
    let Some(browser) = browser_or_skip("report_html_renders_in_headless_chromium") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let cells = sample_report(&dir);
    let page = dir.join("report.html");
    let images = std::fs::read_to_string(&page)
        .unwrap()
        .matches("<img ")
        .count();
    assert!(images > cells, "heatmaps, rank plot and layer plots");

    let dom = dump_dom(&browser, &page);
    assert_eq!(
        dom.matches("<tr class=\"cell\"").count(),
        cells,
        "one row per cell in the DOM"
    );
    assert_eq!(
        body_attribute(&dom, "data-images-decoded").as_deref(),
        Some(images.to_string().as_str()),
        "every image decoded: {:?}",
        dom.find("<body").map(|i| &dom[i..i + 120])
    );
    assert_eq!(
        body_attribute(&dom, "data-images-broken").as_deref(),
        Some("0")
    );

    // A screenshot of the top of the page is not blank: many pixels are not the background.
    let shot = tmp.path().join("shot.png");
    let out = headless(&browser)
        .arg("--window-size=1200,1600")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "screenshot: {out:?}");
    let decoder = png::Decoder::new(std::fs::File::open(&shot).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).unwrap();
    let channels = frame.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..frame.buffer_size()].chunks(channels).collect();
    let background = pixels[0];
    let other = pixels.iter().filter(|p| p[..3] != background[..3]).count();
    assert!(
        other * 20 > pixels.len(),
        "screenshot nearly blank: {other} of {} pixels differ from the corner",
        pixels.len()
    );
    let mut colours: Vec<[u8; 3]> = pixels.iter().map(|p| [p[0], p[1], p[2]]).collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(colours.len() > 50, "{} colours", colours.len());
}

/// The page's own check is not vacuous: damage one image's bytes and the browser reports it.
#[test]
fn a_damaged_image_is_reported_broken_by_the_browser() {
    let Some(browser) = browser_or_skip("a_damaged_image_is_reported_broken_by_the_browser") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    sample_report(&dir);
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let marker = "<img src=\"data:image/png;base64,";
    let at = page.find(marker).unwrap() + marker.len();
    // Keep the PNG signature and IHDR (the first 44 base64 characters), replace the rest of
    // the first image's data with the bytes of another format.
    let end = at + page[at..].find('"').unwrap();
    let damaged = format!("{}{}{}", &page[..at + 44], "AAAA".repeat(64), &page[end..]);
    let bad = tmp.path().join("damaged.html");
    std::fs::write(&bad, damaged).unwrap();
    let dom = dump_dom(&browser, &bad);
    assert_eq!(
        body_attribute(&dom, "data-images-broken").as_deref(),
        Some("1"),
        "{:?}",
        dom.find("<body").map(|i| &dom[i..i + 120])
    );
}
