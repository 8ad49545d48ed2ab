//! `synth` and `inspect` through the real binary: tiny checkpoints round-trip, the Flash config
//! reproduces the published byte totals, the memory plan fits or refuses with a shortfall.

use cli_support::{flash_config, inspect_model, run, synth_tiny};
use needlescope_testkit::cli as cli_support;
use std::io::Read;
use std::process::Stdio;

#[test]
fn synth_tiny_then_inspect_prints_the_schedule_and_a_clean_inventory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]).stdout_has(&["tensors", "bytes", "files", "time", "schedule"]);
    inspect_model(&dir).ok().stdout_has(&[
        "schedule    4 layers: 1 SWA, 2 CSA, 1 HCA",
        "map       SCHC",
        "CSA         2 layers: 1, 3",
        "hash moe    2 layers: 0-1",
        "routed experts",
        "F8_E8M0",
        "inventory   OK",
    ]);
}

#[test]
fn sharded_and_bf16_and_nvfp4_checkpoints_inspect_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let sharded = tmp.path().join("sharded");
    synth_tiny(&sharded, &["--shards", "3"]).stdout_has(&["3 safetensors", "index.json"]);
    inspect_model(&sharded)
        .ok()
        .stdout_has(&["3 shard files", "inventory   OK"]);
    for format in ["bf16", "nvfp4"] {
        let dir = tmp.path().join(format);
        cli_support::synth_tiny_as(&dir, format, &[]);
        inspect_model(&dir)
            .ok()
            .stdout_has(&[&format!("format      {format}"), "inventory   OK"]);
    }
}

#[test]
fn flash_config_reproduces_the_published_byte_totals() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    run(&["inspect", "--config", cfg.to_str().unwrap()])
        .ok()
        .stdout_has(&[
            "43 layers: 2 SWA, 21 CSA, 20 HCA; 3 hash + 40 score routers",
            "CSA        21 layers: 2-42/2",
            // total including MTP, main model without it, tensor count (docs/spec/model.md 8)
            "159,609,485,896",
            "156,015,698,140",
            "69,187",
            "284,332,230,231",
            "147,169,738,752",
        ]);
}

#[test]
fn flash_fits_8x96g_at_128k() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let r = run(&[
        "inspect",
        "--config",
        cfg.to_str().unwrap(),
        "--devices",
        "8x96G",
        "--context",
        "128k",
    ])
    .ok()
    .stdout_has(&[
        "memory plan 8x96G at context 131,072 tokens",
        "fits (balanced)",
        "0-",
    ]);
    assert!(
        r.stdout.contains("embed") && r.stdout.contains("head"),
        "{}",
        r.dump()
    );
}

/// Devices too small for a share of the layers are left idle, as a run leaves them, instead
/// of being charged a workspace they cannot hold: 8x96G alone fits, so 8x96G,2x0.5G does too.
#[test]
fn small_devices_are_shown_idle_not_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let args = ["inspect", "--config", cfg.to_str().unwrap(), "--devices"];
    let r = run(&[&args[..], &["8x96G,2x0.5G"]].concat())
        .ok()
        .stdout_has(&["fits", "idle: devices 8, 9", "     9  -       idle"]);
    assert!(!r.stdout.contains("REFUSED"), "{}", r.stdout);
    let r = run(&[&args[..], &["8x96G,2x0.5G", "--json"]].concat()).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let devices = v["plan"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 10);
    assert_eq!(devices[7]["holds_head"], true);
    assert_eq!(devices[9]["idle"], true);
    assert_eq!(devices[9]["total"], 0);
}

#[test]
fn flash_is_refused_on_1x96g_with_a_shortfall() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let args = [
        "inspect",
        "--config",
        cfg.to_str().unwrap(),
        "--devices",
        "1x96G",
        "--context",
        "128k",
    ];
    let r = run(&args)
        .fails()
        .stdout_has(&["REFUSED", "shortfall   device 0"])
        .stderr_has(&[
            "memory plan refused",
            "1x96G",
            "the devices over capacity are short by",
            "more than all devices hold together",
        ]);
    assert_eq!(r.code, Some(1));
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let r = run(&json_args).fails();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("--json prints JSON");
    let short = v["plan"]["shortfall"].as_u64().unwrap();
    assert!(
        (50_000_000_000..70_000_000_000).contains(&short),
        "shortfall {short} is not roughly 60 GB"
    );
    assert_eq!(v["plan"]["fits"], false);
}

#[test]
fn inspect_json_is_one_object_with_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let r = run(&[
        "inspect",
        "--config",
        cfg.to_str().unwrap(),
        "--devices",
        "8x96G",
        "--json",
    ])
    .ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    assert_eq!(v["footprint"]["total"]["bytes"], 159_609_485_896u64);
    assert_eq!(v["footprint"]["main"]["bytes"], 156_015_698_140u64);
    assert_eq!(v["footprint"]["mtp"]["tensors"], 1575);
    assert_eq!(v["schedule"].as_array().unwrap().len(), 43);
    assert_eq!(v["schedule"][2]["kind"], "csa");
    assert_eq!(v["schedule"][2]["router"], "hash");
    assert_eq!(v["plan"]["fits"], true);
    assert_eq!(v["plan"]["devices"].as_array().unwrap().len(), 8);
    assert_eq!(v["source"]["format"], "official");
    assert!(v["inventory"].is_null());

    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]);
    let r = run(&["inspect", "--model", dir.to_str().unwrap(), "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    assert_eq!(v["inventory"]["clean"], true);
    assert_eq!(v["source"]["kind"], "checkpoint");
}

/// The layer-role table (`config::layers`) under `"layers"`: on Flash every CSA layer is its
/// own KV and index source, every HCA layer its own KV source only, the SWA layers neither, and
/// no layer is in a candidate stage; the text shows one line per distinct role.
#[test]
fn inspect_json_lists_the_layer_roles_of_flash() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let r = run(&["inspect", "--config", cfg.to_str().unwrap(), "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    let layers = v["layers"].as_array().expect("a layers array");
    assert_eq!(layers.len(), 43);
    let ratios = needlescope::config::ModelConfig::flash().compress_ratios;
    for (l, entry) in layers.iter().enumerate() {
        let (kind, kv, index) = match ratios[l] {
            0 => ("swa", serde_json::Value::Null, serde_json::Value::Null),
            4 => ("csa", serde_json::json!(l), serde_json::json!(l)),
            128 => ("hca", serde_json::json!(l), serde_json::Value::Null),
            r => panic!("ratio {r}"),
        };
        let want = serde_json::json!({
            "layer": l, "kind": kind, "ratio": ratios[l], "kv_source": kv,
            "index_source": index, "candidate_stage": null,
        });
        assert_eq!(entry, &want, "layer {l}");
    }
    assert_eq!(layers[0]["kind"], "swa");
    assert_eq!(layers[2]["index_source"], 2);
    assert_eq!(layers[3]["kv_source"], 3);
    assert!(layers[3]["index_source"].is_null());

    run(&["inspect", "--config", cfg.to_str().unwrap()])
        .ok()
        .stdout_has(&[
            "  roles     kind  ratio  kv    index stage  layers",
            "            SWA       0  -     -     -      0-1\n",
            "            CSA       4  own   own   -      2-42/2\n",
            "            HCA     128  own   -     -      3-41/2\n",
        ]);
}

#[test]
fn nvfp4_config_weighs_more_than_official() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let bytes = |format: &str| {
        let r = run(&[
            "inspect",
            "--config",
            cfg.to_str().unwrap(),
            "--format",
            format,
            "--json",
        ])
        .ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        v["footprint"]["total"]["bytes"].as_u64().unwrap()
    };
    assert!(bytes("nvfp4") > bytes("official"));
    assert!(bytes("bf16") > bytes("nvfp4"));

    // Without --format the config's quant_method decides: ModelOpt's "modelopt" is NVFP4.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["quantization_config"]["quant_method"] = serde_json::json!("modelopt");
    let modelopt = tmp.path().join("modelopt.json");
    std::fs::write(&modelopt, v.to_string()).unwrap();
    let r = run(&["inspect", "--config", modelopt.to_str().unwrap(), "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["source"]["format"], "nvfp4");
    assert_eq!(
        v["footprint"]["total"]["bytes"].as_u64().unwrap(),
        bytes("nvfp4")
    );

    // NVIDIA's DeepSeek-V4 export (ModelOpt examples/deepseek/deepseek_v4) keeps the official
    // quant_method "fp8" and adds moe_quant_algo "NVFP4" (plus fields we do not read): that is
    // NVFP4 too, not the official release.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    let q = &mut v["quantization_config"];
    assert_eq!(q["quant_method"], "fp8");
    q["moe_quant_algo"] = serde_json::json!("NVFP4");
    q["quant_algo"] = serde_json::json!("MIXED_PRECISION");
    q["group_size"] = serde_json::json!(16);
    q["ignore"] = serde_json::json!(["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]);
    let nvidia = tmp.path().join("nvidia.json");
    std::fs::write(&nvidia, v.to_string()).unwrap();
    let r = run(&["inspect", "--config", nvidia.to_str().unwrap(), "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["source"]["format"], "nvfp4", "{}", r.dump());
    assert_eq!(
        v["footprint"]["total"]["bytes"].as_u64().unwrap(),
        bytes("nvfp4")
    );
    // What the published nvidia/DeepSeek-V4-Flash-NVFP4 holds (third-party count of its 46
    // shards: 135,235 tensors; its shard files total 168,281,985,176 bytes, i.e. this payload
    // plus about 15 MB of safetensors headers): NVFP4 trunk experts, MXFP4 MTP experts.
    assert_eq!(v["footprint"]["total"]["tensors"], 135_235);
    assert_eq!(v["footprint"]["total"]["bytes"], 168_266_793_544u64);
}

#[test]
fn missing_model_dir_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    let r = inspect_model(&missing).fails();
    assert!(r.stderr.contains(missing.to_str().unwrap()), "{}", r.dump());
    assert_eq!(r.code, Some(1));
    let cfg = tmp.path().join("no-such-config.json");
    run(&["inspect", "--config", cfg.to_str().unwrap()])
        .fails()
        .stderr_has(&[cfg.to_str().unwrap()]);
}

#[test]
fn a_closed_stdout_is_not_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let mut child = cli_support::bin()
        .args([
            "inspect",
            "--config",
            cfg.to_str().unwrap(),
            "--devices",
            "8x96G",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Flags that would be ignored are refused instead: `--format` with `--model` (the checkpoint
/// says its format), `--context` / `--chunk` without `--devices` (no plan to use them); and a
/// context past the model's positions is refused, not planned.
#[test]
fn ignored_or_impossible_flags_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]);
    let m = dir.to_str().unwrap();
    let r = run(&["inspect", "--model", m, "--format", "nvfp4"]).fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    r.stderr_has(&["--format nvfp4", "--config only"]);
    for flag in ["--context", "--chunk"] {
        let r = run(&["inspect", "--model", m, flag, "4k"]).fails();
        assert_eq!(r.code, Some(2), "{}", r.dump());
        r.stderr_has(&["--devices"]);
    }
    let cfg = flash_config(tmp.path());
    let r = run(&[
        "inspect",
        "--config",
        cfg.to_str().unwrap(),
        "--devices",
        "8x96G",
        "--context",
        "2m",
    ])
    .fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    r.stderr_has(&["--context 2097152", "max_position_embeddings (1048576)"]);
}

/// Config values that used to be accepted and then gave wrong answers: an overflowing size
/// (`vocab_size` 2^63 showed embed / head as `0 B` and a plan that fits), a zero
/// `max_position_embeddings`, another quantisation method, another model type.
#[test]
fn bad_config_values_are_refused_at_load_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, serde_json::Value, &[&str]); 4] = [
        (
            "vocab_size",
            serde_json::json!(1u64 << 63),
            &["`vocab_size` is 9223372036854775808", "at most"],
        ),
        (
            "max_position_embeddings",
            serde_json::json!(0),
            &["`max_position_embeddings` is 0", "positive"],
        ),
        (
            "quant_method",
            serde_json::json!("gptq"),
            &[
                "`quantization_config.quant_method` is \"gptq\"",
                "\"fp8\"",
                "\"modelopt\"",
            ],
        ),
        (
            "model_type",
            serde_json::json!("llama"),
            &["`model_type` is \"llama\"", "\"deepseek_v4\""],
        ),
    ];
    for (field, value, needles) in cases {
        let mut v = needlescope::config::flash_config_json();
        if field == "quant_method" {
            v["quantization_config"][field] = value;
        } else {
            v[field] = value;
        }
        let dir = tmp.path().join(field);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, v.to_string()).unwrap();
        let r = run(&[
            "inspect",
            "--config",
            path.to_str().unwrap(),
            "--devices",
            "8x96G",
        ])
        .fails()
        .stderr_has(&[&path.display().to_string()]);
        r.stderr_has(needles);
    }
}

#[test]
fn a_directory_named_config_json_is_reported_as_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("config.json");
    std::fs::create_dir(&dir).unwrap();
    run(&["inspect", "--config", dir.to_str().unwrap()])
        .fails()
        .stderr_has(&[&format!(
            "{} is a directory, expected a file",
            dir.display()
        )]);
}

/// A config declaring draft stages beyond its MTP layer (Flash-0731: 46 compress_ratios for 43
/// layers, three DSpark stages replacing the MTP layer, under mtp.*) is inspected clean apart
/// from the draft stages' tensors, which the inventory does not describe and no run uses: said
/// in a note, not a MISMATCH. The same tensors under a base config are a mismatch.
#[test]
fn draft_stages_of_a_dspark_config_are_noted_not_mismatched() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]).ok();
    cli_support::rebuild(&dir.join("model.safetensors"), |list| {
        let gone = list
            .iter()
            .position(|e| e.name.starts_with("mtp.0."))
            .unwrap();
        list.remove(gone);
        list.push(cli_support::Entry {
            name: "mtp.1.main_proj.weight".into(),
            dtype: "BF16".into(),
            shape: vec![2, 2],
            bytes: vec![0; 8],
        });
    });
    inspect_model(&dir)
        .fails()
        .stdout_has(&["inventory   MISMATCH", "1 missing, 1 extra"]);
    let config = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
    let ratios = cfg["compress_ratios"].as_array_mut().unwrap();
    ratios.resize(layers + 3, serde_json::json!(0));
    std::fs::write(&config, cfg.to_string()).unwrap();
    inspect_model(&dir).ok().stdout_has(&[
        "inventory   OK",
        "the config declares 3 draft stages beyond its MTP layer(s) (DSpark, as in Flash-0731)",
        "so 2 difference(s) there are not counted",
    ]);
}

/// A DeepSeek-V4.1 config (both dialects) is read as V4.1, never misread as a V4 config:
/// the official index's totals, the V4.1 facts, the role table and the component split.
#[test]
fn a_deepseek_v41_config_is_read_as_v41() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in [
        "deepseek_v41_flash_config.json",
        "deepseek_v41_flash_inference_config.json",
    ] {
        let path = fixtures.join(name);
        let path = path.to_str().unwrap();
        run(&["inspect", "--config", path]).ok().stdout_has(&[
            "fp8 e4m3 32x32-block linears",
            "sources     KV + index keys on 2-20/6; indexers on 2-20/6, 24-36/4",
            "candidates  layer 20 keeps its top 2,048 blocks of 8 rows (16,384 rows)",
            "engram      layer 1 384,006,168 rows, layer 14 384,016,682 rows x 256 wide",
            "map       SS22222222222222222211111111111111111111",
            "CSA1      1  L20   own   consumer 24-36/4",
            "Engram (tables, projections)        12",
            "203,073,076,240",
            "total                           96,085",
            "510,286,023,000",
        ]);
        let json = run(&["inspect", "--config", path, "--json"]).ok().stdout;
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["family"], "DeepSeek-V4.1");
        assert_eq!(v["v41"]["candidate_source"], 20);
        assert_eq!(v["v41"]["kv_sources"], serde_json::json!([2, 8, 14, 20]));
        assert_eq!(v["footprint"]["total"]["bytes"], 510_286_023_000u64);
        assert_eq!(v["layers"][24]["candidate_stage"], "consumer");
        // bf16: the same tensors less their scales.
        run(&["inspect", "--config", path, "--format", "bf16"])
            .ok()
            .stdout_has(&["format      bf16"]);
        run(&["inspect", "--config", path, "--format", "nvfp4"])
            .ok()
            .stdout_has(&["format      nvfp4", "188,245", "527,273,322,840"]);
    }
    // NVIDIA's config names its re-quantisation: nvfp4 is implied.
    let mut nv: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("deepseek_v41_flash_config.json")).unwrap(),
    )
    .unwrap();
    nv["quantization_config"]["moe_quant_algo"] = "NVFP4".into();
    let tmp = tempfile::tempdir().unwrap();
    let nv_path = tmp.path().join("config.json");
    std::fs::write(&nv_path, nv.to_string()).unwrap();
    run(&["inspect", "--config", nv_path.to_str().unwrap()])
        .ok()
        .stdout_has(&["format      nvfp4: NVIDIA NVFP4 re-quantisation", "188,245"]);
    // The memory plan: backbone on the GPUs, the Engram tables on the host, state only where
    // the roles put it; refused with a shortfall on too few devices.
    let released = fixtures.join("deepseek_v41_flash_config.json");
    let released = released.to_str().unwrap();
    let plan = ["--devices", "8x80G", "--context", "128k", "--chunk", "2048"];
    let args: Vec<&str> = ["inspect", "--config", released]
        .into_iter()
        .chain(plan)
        .collect();
    run(&args).ok().stdout_has(&[
        "memory plan 8x80G at context 131,072 tokens (prefill chunk 2048): fits",
        "host (mapped): Engram tables 188.83 GiB (202,758,032,400 bytes), read by row",
        "layer 20 (device 4): 131,072 rows (ratio 1)",
    ]);
    let json: serde_json::Value =
        serde_json::from_str(&run(&[args.as_slice(), &["--json"]].concat()).ok().stdout).unwrap();
    assert_eq!(json["plan"]["host_bytes"], 202_758_032_400u64);
    assert_eq!(
        json["plan"]["devices"][4]["layers"],
        serde_json::json!([20, 24])
    );
    run(&[
        "inspect",
        "--config",
        released,
        "--devices",
        "3x80G",
        "--context",
        "128k",
    ])
    .fails()
    .stdout_has(&["REFUSED, does not fit"])
    .stderr_has(&["memory plan refused: 3x80G cannot hold the model at context 131072"]);
    // Both dialects describe one model: one config hash.
    let hash = |name: &str| {
        let p = fixtures.join(name);
        let json = run(&["inspect", "--config", p.to_str().unwrap(), "--json"])
            .ok()
            .stdout;
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["config_hash"].clone()
    };
    assert_eq!(
        hash("deepseek_v41_flash_config.json"),
        hash("deepseek_v41_flash_inference_config.json")
    );
}

/// A command that runs the model refuses a DeepSeek-V4.1 checkpoint by name, naming itself
/// and the config file; a V4 config given where V4.1 is expected is named the other way.
#[test]
fn commands_that_run_refuse_a_v41_checkpoint_naming_themselves() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v41");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        fixtures.join("deepseek_v41_flash_config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    let config = dir.join("config.json").display().to_string();
    let tokens = tmp.path().join("tokens.json");
    std::fs::write(&tokens, "[1, 2, 3]").unwrap();
    let trace_out = tmp.path().join("t.safetensors");
    let (tokens, trace_out) = (tokens.to_str().unwrap(), trace_out.to_str().unwrap());
    // bench still runs DeepSeek-V4 only.
    run(&["bench", "--model", d, "--lengths", "256"])
        .fails()
        .stderr_has(&[
            "needlescope bench does not run DeepSeek-V4.1 checkpoints yet",
            &config,
            "DeepSeek-V4.1 (model_type deepseek_v41) is not supported by this command yet",
        ]);
    // probe, sweep and trace run DeepSeek-V4.1 (tests/cli/probe_v41.rs, trace_v41.rs); a
    // directory without weights is named, and nothing is written.
    run(&["probe", "--model", d, "--length", "512"])
        .fails()
        .stderr_has(&[d]);
    let sweep_out = tmp.path().join("sweep");
    run(&["sweep", "--model", d, "--out", sweep_out.to_str().unwrap()])
        .fails()
        .stderr_has(&[d]);
    assert!(!sweep_out.exists(), "sweep wrote nothing");
    run(&[
        "trace", "--model", d, "--tokens", tokens, "--out", trace_out,
    ])
    .fails()
    .stderr_has(&[d]);
    assert!(
        !std::path::Path::new(trace_out).exists(),
        "trace wrote nothing"
    );
}
