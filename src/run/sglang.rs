//! The user's SGLang server: one native `/generate` request for a prompt's token ids with the
//! indexer's selections captured, the response read as a stream (docs/engines.md).
//!
//! The request body is `{"input_ids": [...], "sampling_params": {"temperature": 0,
//! "max_new_tokens": max(1, generate)}, "return_indexer_topk": true}`: greedy, as the local
//! probe decodes, and at least one generated token, because the answer position's row (the
//! last prompt token as the query) exists only when a token is generated. The body is handed
//! to [`crate::probe::capture::read_capture`] as it arrives; nothing of the payload is
//! buffered here.
//!
//! `ureq` carries the HTTP (a small blocking client; the request and its response are one
//! exchange, with no need for an async runtime). `--engine-timeout` bounds the whole exchange:
//! connecting, the engine's prefill and generation, and reading the response.

use std::time::Duration;

use crate::probe::capture::{read_capture, CaptureError, CaptureExpect, EngineCapture};

/// A request the server did not answer with a capture.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("--engine {url}: expected an http:// or https:// URL of the SGLang server (e.g. http://127.0.0.1:30000), found {found:?}")]
    Url { url: String, found: String },
    #[error("--engine {url}: no answer within --engine-timeout {seconds} s (the prefill of a long prompt can take minutes: raise --engine-timeout)")]
    Timeout { url: String, seconds: u64 },
    #[error("--engine {url}: connection refused or failed ({detail}): is the server running and listening there?")]
    Connect { url: String, detail: String },
    #[error("--engine {url}: HTTP status {status} from {endpoint}: {body}")]
    Status {
        url: String,
        endpoint: String,
        status: u16,
        body: String,
    },
    #[error("--engine {url}: {detail}")]
    Transport { url: String, detail: String },
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// The `/generate` request body for `input_ids` (module doc).
pub fn generate_request(input_ids: &[u32], generate: usize) -> serde_json::Value {
    serde_json::json!({
        "input_ids": input_ids,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": generate.max(1),
        },
        "return_indexer_topk": true,
    })
}

/// The endpoint for a server URL: `http://host:port` -> `http://host:port/generate` (a URL that
/// already names `/generate` is kept).
pub fn generate_endpoint(url: &str) -> Result<String, EngineError> {
    let trimmed = url.trim_end_matches('/');
    if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
        return Err(EngineError::Url {
            url: url.into(),
            found: url.into(),
        });
    }
    Ok(if trimmed.ends_with("/generate") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/generate")
    })
}

/// Posts the prompt to the server and reads its response into a checked capture.
pub fn capture_from_server(
    url: &str,
    input_ids: &[u32],
    generate: usize,
    timeout: Duration,
    expect: &CaptureExpect,
) -> Result<EngineCapture, EngineError> {
    let endpoint = generate_endpoint(url)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let body = serde_json::to_vec(&generate_request(input_ids, generate)).map_err(|e| {
        EngineError::Transport {
            url: url.into(),
            detail: e.to_string(),
        }
    })?;
    let seconds = timeout.as_secs();
    let classify = |e: ureq::Error| match e {
        ureq::Error::Timeout(_) => EngineError::Timeout {
            url: url.into(),
            seconds,
        },
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => EngineError::Connect {
            url: url.into(),
            detail: e.to_string(),
        },
        ureq::Error::Io(io) if is_connect_error(&io) => EngineError::Connect {
            url: url.into(),
            detail: io.to_string(),
        },
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => EngineError::Timeout {
            url: url.into(),
            seconds,
        },
        other => EngineError::Transport {
            url: url.into(),
            detail: other.to_string(),
        },
    };
    let response = agent
        .post(&endpoint)
        .header("Content-Type", "application/json")
        .send(&body[..])
        .map_err(classify)?;
    let status = response.status().as_u16();
    let reader = response.into_body().into_reader();
    if status != 200 {
        // An error body is small: the first 2 KiB say why.
        let mut text = String::new();
        use std::io::Read;
        let _ = reader.take(2048).read_to_string(&mut text);
        return Err(EngineError::Status {
            url: url.into(),
            endpoint,
            status,
            body: if text.trim().is_empty() {
                "(empty body)".into()
            } else {
                text.trim().to_string()
            },
        });
    }
    read_capture(reader, expect).map_err(|e| match e {
        CaptureError::Read { detail, .. } if looks_like_timeout(&detail) => EngineError::Timeout {
            url: url.into(),
            seconds,
        },
        other => EngineError::Capture(other),
    })
}

fn is_connect_error(io: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        io.kind(),
        ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | AddrNotAvailable
    )
}

fn looks_like_timeout(detail: &str) -> bool {
    let d = detail.to_ascii_lowercase();
    d.contains("timeout") || d.contains("timed out")
}

/// Where a probe's engine capture comes from: the user's server (`--engine URL`), or a body
/// it returned earlier, saved to a file (`--engine-capture FILE`).
#[derive(Clone, Debug)]
pub enum EngineSource {
    Server {
        url: String,
        /// `--engine-timeout`: the whole exchange.
        timeout: Duration,
    },
    Saved(std::path::PathBuf),
}

impl EngineSource {
    /// Where the capture comes from, as recorded (`source` of the JSON object).
    pub fn name(&self) -> String {
        match self {
            EngineSource::Server { url, .. } => url.clone(),
            EngineSource::Saved(file) => file.display().to_string(),
        }
    }

    /// The capture of `tokens`: posted to the server, or read from the saved body; its
    /// warnings go to stderr. A saved body generating more tokens than `generate` plans for is
    /// refused (the memory plan and the context check counted `--generate`).
    pub fn capture(
        &self,
        tokens: &[u32],
        generate: usize,
        expect: &CaptureExpect,
    ) -> anyhow::Result<EngineCapture> {
        let capture = match self {
            EngineSource::Server { url, timeout } => {
                capture_from_server(url, tokens, generate, *timeout, expect)?
            }
            EngineSource::Saved(file) => {
                let f = std::fs::File::open(file)
                    .map_err(|e| anyhow::anyhow!("--engine-capture {}: {e}", file.display()))?;
                read_capture(std::io::BufReader::with_capacity(1 << 20, f), expect)?
            }
        };
        if capture.output_ids.len() > generate.max(1) {
            anyhow::bail!(
                "{}: the engine generated {} tokens, more than --generate {generate} plans for; \
                 pass --generate {}",
                capture.source,
                capture.output_ids.len(),
                capture.output_ids.len()
            );
        }
        for w in &capture.warnings {
            eprintln!("warning: {w}");
        }
        Ok(capture)
    }
}

/// A probe's serving engine: where its capture comes from, `--engine-topk`, and whether the
/// run is the engine's alone (no local forward).
#[derive(Clone, Debug)]
pub struct EnginePlan {
    pub source: EngineSource,
    pub topk: Option<usize>,
    pub no_local: bool,
}
