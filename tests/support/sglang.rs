//! A stand-in SGLang server for the tests: it speaks the native `/generate` wire format with
//! `return_indexer_topk` (docs/engines.md) on 127.0.0.1, backed by needlescope's own CPU engine
//! driving a chosen index profile, and returns every row shuffled within itself and padded
//! with -1 as SGLang's radix top-k does. It serves at most `max_requests` requests and stops by
//! itself after `lifetime`, whatever happens to the test.
//!
//! Faults make it send what a broken deployment sends: a payload of the wrong length, a value
//! out of range, a row selected twice, no `indexer_topk` field (capture not enabled), HTTP 500,
//! or an answer slower than the client's timeout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use needlescope::checkpoint::Checkpoint;
use needlescope::config::LayerKind;
use needlescope::model::forward::{LogitsRequest, Model, ModelOptions};
use needlescope::model::Observer;
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::numerics::rng::Rng;
use needlescope::probe::session::argmax;
use needlescope::tokenizer::V4Tokenizer;

/// What the stand-in gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    None,
    /// The payload loses its last K values.
    WrongLength,
    /// One value of the answer position's first layer equals its visible row count.
    OutOfRange,
    /// One row of the answer position's first layer appears twice.
    Repeat,
    /// No `meta_info.indexer_topk` (the server was started without capture).
    NoField,
    /// HTTP 500 with an error body.
    Http500,
    /// Sleeps this long before answering.
    Slow(Duration),
}

/// A running stand-in; `url` is its base URL, `served` counts the requests it took. Its
/// thread is not joined: it ends after its requests or its lifetime, or with the test binary.
pub struct StandIn {
    pub url: String,
    pub served: Arc<AtomicUsize>,
}

/// Records every position's selection at every CSA layer (the engine's parity hook hands the
/// whole chunk's `[tokens, k]` selections over; they are left as they are).
#[derive(Default)]
struct AllSelections {
    /// layer -> position -> K values
    rows: BTreeMap<usize, BTreeMap<usize, Vec<i32>>>,
}

impl Observer for AllSelections {
    fn replace_selection(
        &mut self,
        layer: usize,
        first_pos: usize,
        k: usize,
        selected: &mut [i32],
    ) {
        let per = self.rows.entry(layer).or_default();
        for (i, row) in selected.chunks(k.max(1)).enumerate() {
            per.insert(first_pos + i, row.to_vec());
        }
    }
}

/// The response body the stand-in sends for `input_ids` (also what a saved capture holds).
#[allow(clippy::too_many_arguments)]
pub fn generate_body(
    engine: &mut Model<needlescope::backend::CpuBackend>,
    tok: &V4Tokenizer,
    profile: IndexProfile,
    kv: KvMode,
    input_ids: &[u32],
    max_new_tokens: usize,
    fault: Fault,
    seed: u64,
) -> serde_json::Value {
    let cfg = engine.config().clone();
    let k = cfg.index_topk;
    engine
        .set_options(ModelOptions {
            index: profile,
            kv,
            topk: Some(k),
            chunk: 2048,
        })
        .expect("stand-in engine options");
    let mut obs = AllSelections::default();
    let mut state = engine.new_sequence();
    let out = engine
        .forward(&mut state, input_ids, &mut obs, LogitsRequest::Last)
        .expect("stand-in prefill");
    let mut logits = out.logits.into_iter().last().map(|(_, l)| l).unwrap();
    let mut output = Vec::new();
    let mut stopped = false;
    while output.len() < max_new_tokens {
        let next = argmax(&logits).expect("finite logits");
        output.push(next);
        if next == cfg.eos_token_id {
            stopped = true;
            break;
        }
        if output.len() == max_new_tokens {
            break;
        }
        let out = engine
            .forward(&mut state, &[next], &mut obs, LogitsRequest::Last)
            .expect("stand-in decode");
        logits = out.logits.into_iter().last().map(|(_, l)| l).unwrap();
    }
    let csa = cfg.layers_of_kind(LayerKind::Csa);
    let rows = input_ids.len() + output.len() - 1;
    let mut rng = Rng::new(seed);
    let mut values: Vec<i32> = Vec::with_capacity(rows * csa.len() * k);
    for pos in 0..rows {
        for &layer in &csa {
            let mut row = obs.rows[&layer][&pos].clone();
            // Shuffled: SGLang's row order carries no meaning.
            for i in (1..row.len()).rev() {
                let j = rng.below(i + 1);
                row.swap(i, j);
            }
            values.extend(row);
        }
    }
    let answer_row = (input_ids.len() - 1) * csa.len() * k;
    match fault {
        Fault::WrongLength => values.truncate(values.len() - k),
        Fault::OutOfRange => {
            let n_t = input_ids.len() / 4;
            let slot = &mut values[answer_row..answer_row + k];
            let i = slot.iter().position(|&v| v >= 0).unwrap();
            slot[i] = n_t as i32;
        }
        Fault::Repeat => {
            let slot = &mut values[answer_row..answer_row + k];
            let first = slot.iter().position(|&v| v >= 0).unwrap();
            let v = slot[first];
            let other = slot
                .iter()
                .enumerate()
                .position(|(i, &w)| i != first && w >= 0)
                .unwrap();
            slot[other] = v;
        }
        _ => {}
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let text_ids: Vec<u32> = output
        .iter()
        .copied()
        .filter(|&t| t != cfg.eos_token_id)
        .collect();
    let mut meta = serde_json::json!({
        "id": "stand-in",
        "finish_reason": if stopped {
            serde_json::json!({"type": "stop", "matched": cfg.eos_token_id})
        } else {
            serde_json::json!({"type": "length", "length": max_new_tokens})
        },
        "prompt_tokens": input_ids.len(),
        "weight_version": "default",
        "completion_tokens": output.len(),
        "cached_tokens": 0,
    });
    if fault != Fault::NoField {
        meta["indexer_topk"] =
            serde_json::json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    serde_json::json!({
        "text": tok.decode(&text_ids).unwrap(),
        "output_ids": output,
        "meta_info": meta,
    })
}

/// Starts a stand-in for `model` driving `profile` (KV `kv`) on 127.0.0.1.
pub fn start(
    model: &Path,
    profile: IndexProfile,
    kv: KvMode,
    fault: Fault,
    max_requests: usize,
    lifetime: Duration,
) -> StandIn {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let model: PathBuf = model.to_path_buf();
    std::thread::spawn(move || {
        let ckpt = Checkpoint::open(&model).expect("stand-in model");
        let mut engine = Model::load(&ckpt, ModelOptions::default()).expect("stand-in engine");
        let tok = V4Tokenizer::builtin().unwrap();
        let deadline = Instant::now() + lifetime;
        while count.load(Ordering::SeqCst) < max_requests {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Ok(Some(mut req)) = server.recv_timeout(left) else {
                break;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let mut body = String::new();
            let _ = req.as_reader().read_to_string(&mut body);
            if fault == Fault::Http500 {
                let _ = req.respond(
                    tiny_http::Response::from_string(r#"{"error": "stand-in: internal error"}"#)
                        .with_status_code(500),
                );
                continue;
            }
            if let Fault::Slow(d) = fault {
                std::thread::sleep(d);
            }
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON request");
            assert_eq!(
                v["return_indexer_topk"], true,
                "the client asks for the capture"
            );
            assert_eq!(v["sampling_params"]["temperature"], 0.0, "greedy");
            let ids: Vec<u32> = serde_json::from_value(v["input_ids"].clone()).unwrap();
            let m = v["sampling_params"]["max_new_tokens"].as_u64().unwrap() as usize;
            let out = generate_body(&mut engine, &tok, profile, kv, &ids, m, fault, 7);
            let response = tiny_http::Response::from_string(out.to_string()).with_header(
                "Content-Type: application/json"
                    .parse::<tiny_http::Header>()
                    .unwrap(),
            );
            let _ = req.respond(response);
        }
    });
    StandIn { url, served }
}
