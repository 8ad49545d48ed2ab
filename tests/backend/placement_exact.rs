//! `placement::place` refuses only when no layout fits: checked against exhaustive searches over
//! every contiguous layout (each used device a non-empty range of layers in device order, an
//! order-preserving subset of the offered devices, the embedding on the first used device and
//! the head and logits on the last), with the plan's own byte figures. The sweep over Flash
//! device sets takes about a second in a release build.

use needlescope::checkpoint::WeightFormat;
use needlescope::config::ModelConfig;
use needlescope::devices::placement::{place, DeviceMemory, Placement, Workload};
use needlescope::devices::plan::{self, Footprint};

const GIB: u64 = 1 << 30;

fn flash() -> (ModelConfig, Footprint) {
    let cfg = ModelConfig::flash();
    let fp = Footprint::of_inventory(&cfg, WeightFormat::Official);
    (cfg, fp)
}

fn devices(free: &[u64]) -> Vec<DeviceMemory> {
    free.iter()
        .enumerate()
        .map(|(i, &free)| DeviceMemory {
            name: format!("cuda:{i}"),
            free,
        })
        .collect()
}

fn gib(sizes: &[f64]) -> Vec<u64> {
    sizes.iter().map(|g| (g * GIB as f64) as u64).collect()
}

/// The byte figures of one run: each layer's load, and a device's charge besides its layers
/// as `[first][last]` used device.
fn figures(cfg: &ModelConfig, fp: &Footprint, w: &Workload) -> (Vec<u64>, [[u64; 2]; 2]) {
    let mut cfg = cfg.clone();
    cfg.index_topk = w.topk.max(1);
    let items = (0..fp.layer_bytes.len())
        .map(|l| fp.layer_bytes[l] + plan::layer_state(&cfg, l, w.context, w.chunk).total())
        .collect();
    let ws = |last| plan::workspace_bytes(&cfg, w.context, w.chunk, last);
    let fixed = [
        [ws(false), ws(true) + fp.last_bytes],
        [
            ws(false) + fp.first_bytes,
            ws(true) + fp.first_bytes + fp.last_bytes,
        ],
    ];
    (items, fixed)
}

/// Checks a placement is a valid layout within every device's free memory.
fn check_layout(p: &Placement, free: &[u64]) {
    assert!(p.used.windows(2).all(|u| u[0] < u[1]), "{:?}", p.used);
    assert!(p.layer_device.windows(2).all(|w| w[0] <= w[1]));
    for (k, d) in p.plan.devices.iter().enumerate() {
        assert!(d.layers.is_some(), "used device {k} without a layer");
        assert_eq!(d.capacity, free[p.used[k]]);
        assert!(d.total <= d.capacity, "{d:?}");
    }
}

/// Whether some layout fits, trying every order-preserving subset of devices and, per subset,
/// every split point reachable within capacity.
fn some_layout_fits(items: &[u64], fixed: [[u64; 2]; 2], free: &[u64]) -> Option<Vec<usize>> {
    let (n, l) = (free.len(), items.len());
    for mask in 1u32..(1 << n) {
        let used: Vec<usize> = (0..n).filter(|d| mask & (1 << d) != 0).collect();
        // reach[j][i]: the first j used devices can hold exactly layers ..i.
        let mut reach = vec![vec![false; l + 1]; used.len() + 1];
        reach[0][0] = true;
        for (j, &d) in used.iter().enumerate() {
            for a in 0..l {
                if !reach[j][a] {
                    continue;
                }
                let mut load = fixed[usize::from(j == 0)][usize::from(j + 1 == used.len())];
                for b in a..l {
                    load += items[b];
                    if load > free[d] {
                        break;
                    }
                    reach[j + 1][b + 1] = true;
                }
            }
        }
        if reach[used.len()][l] {
            return Some(used);
        }
    }
    None
}

/// Offering one more GPU kept every layer on the first devices, left the head alone on the last
/// one, dropped it as layer-less and planned again with the head on a device too small for it:
/// `1x150G,1x12G` fitted while `1x150G,1x8G,1x12G` was refused; `1x141G,1x60G,1x24G` at 1M
/// tokens was refused although layers 0-30 / 31-41 / 42 + head fit in that order.
#[test]
fn offering_another_device_never_refuses_a_layout_that_fits() {
    let (cfg, fp) = flash();
    let w = Workload {
        context: 131072,
        chunk: 2048,
        topk: cfg.index_topk,
    };
    let w1m = Workload {
        context: 1 << 20,
        ..w
    };
    for (sizes, w) in [
        (&[150.0, 12.0][..], w),
        (&[150.0, 8.0, 12.0], w),
        (&[141.0, 60.0, 24.0], w1m),
        (&[141.0, 24.0, 60.0], w1m),
    ] {
        let free = gib(sizes);
        let p = place(&cfg, &fp, &devices(&free), &w)
            .unwrap_or_else(|e| panic!("{sizes:?} at {} tokens refused:\n{e}", w.context));
        check_layout(&p, &free);
    }
    // Still refused when no layout fits, listing every device offered.
    let e = place(&cfg, &fp, &devices(&gib(&[120.0, 8.0, 12.0])), &w).unwrap_err();
    assert!(e.to_string().contains("cuda:0, cuda:1, cuda:2"), "{e}");
}

/// Small random device sets and layer sizes: `place` fits exactly when the exhaustive search
/// finds a layout, and some of them need the search (the balanced and packed splits miss).
#[test]
fn place_fits_exactly_when_some_layout_fits() {
    let cfg = ModelConfig::flash();
    let w = Workload {
        context: 4096,
        chunk: 512,
        topk: cfg.index_topk,
    };
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let (mut fitted, mut refused, mut searched) = (0, 0, 0);
    for _ in 0..20_000 {
        let layers = 1 + next(7) as usize;
        let mut fp = Footprint::from_tensors(layers, std::iter::empty());
        fp.layer_bytes = (0..layers).map(|_| (1 + next(12)) * GIB / 2).collect();
        fp.first_bytes = next(3) * GIB / 2;
        fp.last_bytes = next(3) * GIB / 2;
        let free: Vec<u64> = (0..1 + next(4)).map(|_| (2 + next(30)) * GIB / 2).collect();
        let (items, fixed) = figures(&cfg, &fp, &w);
        let exhaustive = some_layout_fits(&items, fixed, &free);
        match (place(&cfg, &fp, &devices(&free), &w), exhaustive) {
            (Ok(p), Some(_)) => {
                check_layout(&p, &free);
                fitted += 1;
                searched += usize::from(p.plan.strategy == "searched");
            }
            (Err(_), None) => refused += 1,
            (Ok(p), None) => panic!("placed where nothing fits: {free:?} {items:?}: {p:?}"),
            (Err(e), Some(used)) => {
                panic!("refused {free:?} {items:?}, fits on devices {used:?}:\n{e}")
            }
        }
    }
    assert!(
        fitted > 2000 && refused > 2000 && searched > 20,
        "fitted {fitted}, refused {refused}, searched {searched}"
    );
}

/// The Flash checkpoint over 48,668 sets of three devices at 128K and 1M tokens, and the same
/// sets with an 80G fourth device.
#[test]
fn place_matches_exhaustive_search_on_flash() {
    let (cfg, fp) = flash();
    let sizes = [
        5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 30.0, 36.5, 37.0, 40.0, 45.0, 48.0, 60.0,
        70.0, 80.0, 96.0, 141.0, 150.0, 155.0, 160.0, 200.0,
    ];
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (context, chunk) in [
        (131072, 2048),
        (1 << 20, 2048),
        (1 << 20, 8192),
        (131072, 8192),
    ] {
        let w = Workload {
            context,
            chunk,
            topk: cfg.index_topk,
        };
        let (items, fixed) = figures(&cfg, &fp, &w);
        for a in sizes {
            for b in sizes {
                for c in sizes {
                    for set in [vec![a, b, c], vec![a, b, c, 80.0]] {
                        checked += 1;
                        let free = gib(&set);
                        let exhaustive = some_layout_fits(&items, fixed, &free);
                        match (place(&cfg, &fp, &devices(&free), &w), exhaustive) {
                            (Ok(p), Some(_)) => check_layout(&p, &free),
                            (Err(_), None) => {}
                            (got, _) => wrong.push(format!(
                                "{set:?} at {context} (chunk {chunk}): placed {}",
                                got.is_ok()
                            )),
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 2 * 48_668);
    assert!(
        wrong.is_empty(),
        "first disagreements: {:#?}",
        &wrong[..wrong.len().min(20)]
    );
}
