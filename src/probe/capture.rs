//! A serving engine's captured indexer selections: SGLang's native `/generate` response body with
//! `return_indexer_topk`, read as a stream (docs/engines.md, the wire format).
//!
//! In: any `Read` of the response's JSON body (a live HTTP body or a saved file) and what was
//! sent ([`CaptureExpect`]: the prompt's length, the config's ratio-4 layers and `index_topk`,
//! the probed prompt positions). Out: [`EngineCapture`]: the answer (`text`, `output_ids`,
//! `finish_reason`), the token counts, the engine's top-k K, and the selections of the probed
//! positions only, `[ratio-4 layer slot][K]` per position, as the engine sent them (unordered,
//! `-1` padding).
//!
//! The payload, `meta_info.indexer_topk`, is base64 of little-endian int32 with shape
//! `(rows, ratio-4 layers, K)`: row i is the selection made when token i was the query, and
//! rows is `prompt_tokens + completion_tokens - 1` or one more at the stop edge. A Flash
//! capture is 43,008 bytes per token (7.5 GB of base64 at 128K tokens), so it is never held:
//! the JSON is walked with `struson` (its string reader streams one value), the base64 decoded
//! in blocks, and only two things are kept:
//! - the rows of probed prompt positions before the last prompt token (`--probe question`),
//!   located with the expected K (`--engine-topk`, else the config's `index_topk`), and
//! - the tail of the payload, at most [`TAIL_BYTES`], which holds the answer position's row and
//!   every decode row whatever K turns out to be.
//!
//! K is read from the payload's length once it has ended: `values = rows x layers x K` for
//! exactly one of the two row counts; when both divide, the reading whose K is the config's
//! `index_topk` is taken, else both are named and `--engine-topk` settles it.
//!
//! Checks: every value of the payload lies in [-1, the largest visible row count of any row)
//! (streaming, without K); every kept row exactly: values in [-1, n_t) with n_t =
//! floor((t+1)/4), no repeats, and min(K, n_t) selected rows (else a warning naming layer and
//! position). A failed check is a [`CaptureError`] naming position, layer, value or field.

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;

use base64::Engine as _;
use struson::reader::{JsonReader, JsonStreamReader, ValueType};

use super::rows::RowKind;

/// The payload's tail kept whatever K is: room for the answer and decode rows of, for example,
/// V4-Pro (30 layers, K 1024) with 500 generated tokens (61 MB).
pub const TAIL_BYTES: usize = 64 << 20;

/// Base64 characters decoded per block (a multiple of 16, so each block decodes to whole int32
/// values).
const BLOCK_CHARS: usize = 1 << 20;

/// What was sent and what the local model says the capture must look like.
#[derive(Clone, Debug)]
pub struct CaptureExpect {
    /// Where the capture came from (the URL or the file), for messages.
    pub source: String,
    /// The prompt's length in tokens, as sent.
    pub prompt_tokens: usize,
    /// The decoder layers whose `compress_ratios` entry is 4, in order (layer slot m is the
    /// m-th of them).
    pub csa_layers: Vec<usize>,
    /// The config's `index_topk`.
    pub config_topk: usize,
    /// `--engine-topk`: the engine's K when the user knows it.
    pub engine_topk: Option<usize>,
    /// Probed prompt positions besides the last prompt token (whose row is always kept).
    pub prompt_positions: Vec<usize>,
}

/// What the engine returned, reduced to what the probe reads.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineCapture {
    pub source: String,
    pub text: String,
    pub output_ids: Vec<u32>,
    /// `meta_info.finish_reason.type` (`stop`, `length`, `abort`), when given.
    pub finish_reason: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// The engine's top-k, read from the payload's length.
    pub topk: usize,
    /// Rows in the payload (`prompt_tokens + completion_tokens - 1`, or one more).
    pub rows: usize,
    /// Layer slot m's decoder layer.
    pub csa_layers: Vec<usize>,
    /// Decoded payload size in bytes.
    pub payload_bytes: u64,
    /// Query position -> `[slot][K]` values as sent.
    pub selections: BTreeMap<usize, Vec<i32>>,
    /// Named, non-fatal findings (a row selecting fewer than min(K, n_t) rows, a cached prefix).
    pub warnings: Vec<String>,
}

impl EngineCapture {
    /// The engine's selection at `query_pos` on decoder layer `layer`, padding included.
    pub fn selection(&self, query_pos: usize, layer: usize) -> Option<&[i32]> {
        let slot = self.csa_layers.iter().position(|&l| l == layer)?;
        let row = self.selections.get(&query_pos)?;
        row.get(slot * self.topk..(slot + 1) * self.topk)
    }

    /// Whether the engine's generation ended on its own (EOS or a stop string), as opposed to
    /// `max_new_tokens`.
    pub fn ended(&self) -> bool {
        self.finish_reason.as_deref() == Some("stop")
    }
}

/// A capture that cannot be used; each names what it read and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{source_name}: reading the response failed: {detail}")]
    Read { source_name: String, detail: String },
    #[error("{source_name}: the response is not the JSON of SGLang's /generate: {detail}")]
    Json { source_name: String, detail: String },
    #[error(
        "{source_name}: the response has no meta_info.indexer_topk: the server does not capture \
         the indexer's selections (start SGLang with --enable-return-indexer-topk, which needs \
         DP attention or TP 1; docs/engines.md)"
    )]
    NoCapture { source_name: String },
    #[error("{source_name}: field {field}: expected {expected}, found {found}")]
    Field {
        source_name: String,
        field: String,
        expected: String,
        found: String,
    },
    #[error("{source_name}: meta_info.indexer_topk: {detail}")]
    Payload { source_name: String, detail: String },
    #[error(
        "{source_name}: meta_info.indexer_topk, query position {query_pos} ({phase}), layer \
         {layer} (slot {slot}): {detail}"
    )]
    Row {
        source_name: String,
        query_pos: usize,
        phase: String,
        layer: usize,
        slot: usize,
        detail: String,
    },
}

impl CaptureError {
    fn field(
        src: &str,
        field: &str,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        CaptureError::Field {
            source_name: src.into(),
            field: field.into(),
            expected: expected.into(),
            found: found.into(),
        }
    }
}

/// Reads a `/generate` response body (a JSON object, or an array holding one) and returns the
/// capture of the probed positions, checked (module doc).
pub fn read_capture<R: Read>(
    body: R,
    expect: &CaptureExpect,
) -> Result<EngineCapture, CaptureError> {
    let src = expect.source.as_str();
    let json_err = |e: struson::reader::ReaderError| classify_reader_error(src, e);
    let mut json = JsonStreamReader::new(body);
    let mut wrapped = false;
    if json.peek().map_err(json_err)? == ValueType::Array {
        json.begin_array().map_err(json_err)?;
        if !json.has_next().map_err(json_err)? {
            return Err(CaptureError::field(
                src,
                "response",
                "one result",
                "an empty array",
            ));
        }
        wrapped = true;
    }
    if json.peek().map_err(json_err)? != ValueType::Object {
        return Err(CaptureError::field(
            src,
            "response",
            "a JSON object",
            format!("{:?}", json.peek().map_err(json_err)?),
        ));
    }
    let mut sink = PayloadSink::new(expect);
    let mut text = None;
    let mut output_ids = None;
    let mut meta = Meta::default();
    let mut error_body = serde_json::Map::new();
    json.begin_object().map_err(json_err)?;
    while json.has_next().map_err(json_err)? {
        let name = json.next_name().map(str::to_string).map_err(json_err)?;
        match name.as_str() {
            "text" => text = Some(read_string(&mut json, src, "text")?),
            "output_ids" => output_ids = Some(read_ids(&mut json, src)?),
            "meta_info" => read_meta(&mut json, src, &mut meta, &mut sink)?,
            // An error body: SGLang's {"error": ...} or the OpenAI-compatible
            // {"object": "error", "message": ..., "code": ...}; the message is quoted.
            "error" if json.peek().map_err(json_err)? != ValueType::Null => {
                let detail =
                    serde_json::to_string(&read_small_value(&mut json, src)?).unwrap_or_default();
                return Err(CaptureError::field(
                    src,
                    "error",
                    "a /generate result",
                    detail,
                ));
            }
            "object" | "message" | "code" if json.peek().map_err(json_err)? != ValueType::Null => {
                let v = read_small_value(&mut json, src)?;
                error_body.insert(name, v);
            }
            _ => json.skip_value().map_err(json_err)?,
        }
    }
    json.end_object().map_err(json_err)?;
    if wrapped {
        while json.has_next().map_err(json_err)? {
            json.skip_value().map_err(json_err)?;
        }
        json.end_array().map_err(json_err)?;
    }
    json.consume_trailing_whitespace().map_err(json_err)?;
    if error_body.get("object").and_then(|o| o.as_str()) == Some("error")
        || (text.is_none() && error_body.contains_key("message"))
    {
        let message = error_body
            .get("message")
            .map(|m| m.as_str().map_or(m.to_string(), str::to_string))
            .unwrap_or_else(|| serde_json::Value::Object(error_body.clone()).to_string());
        return Err(CaptureError::field(
            src,
            "message",
            "a /generate result",
            format!("an error body: {message}"),
        ));
    }

    let text = text.ok_or_else(|| CaptureError::field(src, "text", "a string", "nothing"))?;
    let output_ids = output_ids
        .ok_or_else(|| CaptureError::field(src, "output_ids", "a list of token ids", "nothing"))?;
    let prompt_tokens = meta
        .prompt_tokens
        .ok_or_else(|| CaptureError::field(src, "meta_info.prompt_tokens", "a count", "nothing"))?;
    if prompt_tokens != expect.prompt_tokens {
        return Err(CaptureError::field(
            src,
            "meta_info.prompt_tokens",
            format!("{} (the prompt's length as sent)", expect.prompt_tokens),
            prompt_tokens.to_string(),
        ));
    }
    let completion_tokens = meta.completion_tokens.unwrap_or(output_ids.len());
    if completion_tokens != output_ids.len() {
        return Err(CaptureError::field(
            src,
            "meta_info.completion_tokens",
            format!("{} (the length of output_ids)", output_ids.len()),
            completion_tokens.to_string(),
        ));
    }
    if let Some(message) = &meta.abort {
        return Err(CaptureError::field(
            src,
            "meta_info.finish_reason",
            "a finished request",
            format!("the engine aborted it: {message}"),
        ));
    }
    if !meta.saw_capture {
        return Err(CaptureError::NoCapture {
            source_name: src.into(),
        });
    }
    let mut warnings = Vec::new();
    if meta.cached_tokens > 0 {
        warnings.push(format!(
            "meta_info.cached_tokens is {}: the engine reused a cached prefix, so the rows of \
             those tokens may belong to an earlier request (start SGLang with \
             --disable-radix-cache; docs/engines.md)",
            meta.cached_tokens
        ));
    }
    let mut capture = sink.finish(prompt_tokens, completion_tokens)?;
    capture.text = text;
    capture.output_ids = output_ids;
    capture.finish_reason = meta.finish_reason;
    capture.cached_tokens = meta.cached_tokens;
    warnings.append(&mut capture.warnings);
    capture.warnings = warnings;
    Ok(capture)
}

/// A struson error as a [`CaptureError`]: an I/O failure of the body (a timeout, a dropped
/// connection) apart from malformed JSON.
fn classify_reader_error(src: &str, e: struson::reader::ReaderError) -> CaptureError {
    match e {
        struson::reader::ReaderError::IoError { error, .. } => CaptureError::Read {
            source_name: src.into(),
            detail: error.to_string(),
        },
        other => CaptureError::Json {
            source_name: src.into(),
            detail: other.to_string(),
        },
    }
}

#[derive(Default)]
struct Meta {
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    cached_tokens: usize,
    finish_reason: Option<String>,
    /// The message of a `finish_reason` of type `abort`.
    abort: Option<String>,
    saw_capture: bool,
}

fn read_string<R: Read>(
    json: &mut JsonStreamReader<R>,
    src: &str,
    field: &str,
) -> Result<String, CaptureError> {
    match json.peek().map_err(|e| classify_reader_error(src, e))? {
        ValueType::String => json
            .next_string()
            .map_err(|e| classify_reader_error(src, e)),
        ValueType::Null => {
            json.next_null()
                .map_err(|e| classify_reader_error(src, e))?;
            Ok(String::new())
        }
        other => Err(CaptureError::field(
            src,
            field,
            "a string",
            format!("{other:?}"),
        )),
    }
}

fn read_count<R: Read>(
    json: &mut JsonStreamReader<R>,
    src: &str,
    field: &str,
) -> Result<usize, CaptureError> {
    let e = |e| classify_reader_error(src, e);
    match json.peek().map_err(e)? {
        ValueType::Number => {
            let s = json.next_number_as_string().map_err(e)?;
            s.parse::<usize>()
                .map_err(|_| CaptureError::field(src, field, "a whole number", s))
        }
        other => Err(CaptureError::field(
            src,
            field,
            "a whole number",
            format!("{other:?}"),
        )),
    }
}

fn read_ids<R: Read>(json: &mut JsonStreamReader<R>, src: &str) -> Result<Vec<u32>, CaptureError> {
    let e = |e| classify_reader_error(src, e);
    if json.peek().map_err(e)? != ValueType::Array {
        let found = format!("{:?}", json.peek().map_err(e)?);
        return Err(CaptureError::field(
            src,
            "output_ids",
            "a list of token ids",
            found,
        ));
    }
    json.begin_array().map_err(e)?;
    let mut ids = Vec::new();
    while json.has_next().map_err(e)? {
        let field = format!("output_ids[{}]", ids.len());
        let id = read_count(json, src, &field)?;
        ids.push(
            u32::try_from(id)
                .map_err(|_| CaptureError::field(src, &field, "a token id", id.to_string()))?,
        );
    }
    json.end_array().map_err(e)?;
    Ok(ids)
}

/// A small JSON value (an error message, a finish reason) read whole.
fn read_small_value<R: Read>(
    json: &mut JsonStreamReader<R>,
    src: &str,
) -> Result<serde_json::Value, CaptureError> {
    let e = |e| classify_reader_error(src, e);
    Ok(match json.peek().map_err(e)? {
        ValueType::Null => {
            json.next_null().map_err(e)?;
            serde_json::Value::Null
        }
        ValueType::Boolean => serde_json::Value::Bool(json.next_bool().map_err(e)?),
        ValueType::Number => {
            let s = json.next_number_as_string().map_err(e)?;
            serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s))
        }
        ValueType::String => serde_json::Value::String(json.next_string().map_err(e)?),
        ValueType::Array => {
            json.begin_array().map_err(e)?;
            let mut items = Vec::new();
            while json.has_next().map_err(e)? {
                items.push(read_small_value(json, src)?);
            }
            json.end_array().map_err(e)?;
            serde_json::Value::Array(items)
        }
        ValueType::Object => {
            json.begin_object().map_err(e)?;
            let mut map = serde_json::Map::new();
            while json.has_next().map_err(e)? {
                let k = json.next_name().map(str::to_string).map_err(e)?;
                let v = read_small_value(json, src)?;
                map.insert(k, v);
            }
            json.end_object().map_err(e)?;
            serde_json::Value::Object(map)
        }
    })
}

fn read_meta<R: Read>(
    json: &mut JsonStreamReader<R>,
    src: &str,
    meta: &mut Meta,
    sink: &mut PayloadSink,
) -> Result<(), CaptureError> {
    let e = |e| classify_reader_error(src, e);
    if json.peek().map_err(e)? != ValueType::Object {
        let found = format!("{:?}", json.peek().map_err(e)?);
        return Err(CaptureError::field(src, "meta_info", "an object", found));
    }
    json.begin_object().map_err(e)?;
    while json.has_next().map_err(e)? {
        let name = json.next_name().map(str::to_string).map_err(e)?;
        match name.as_str() {
            "prompt_tokens" => {
                meta.prompt_tokens = Some(read_count(json, src, "meta_info.prompt_tokens")?)
            }
            "completion_tokens" => {
                meta.completion_tokens = Some(read_count(json, src, "meta_info.completion_tokens")?)
            }
            "cached_tokens" => {
                meta.cached_tokens = read_count(json, src, "meta_info.cached_tokens")?
            }
            "finish_reason" => {
                let v = read_small_value(json, src)?;
                meta.finish_reason = match &v {
                    serde_json::Value::Object(m) => {
                        m.get("type").and_then(|t| t.as_str()).map(str::to_string)
                    }
                    serde_json::Value::String(s) => Some(s.clone()),
                    _ => None,
                };
                if meta.finish_reason.as_deref() == Some("abort") {
                    meta.abort = Some(
                        v.get("message")
                            .map(|m| m.as_str().map_or(m.to_string(), str::to_string))
                            .unwrap_or_else(|| v.to_string()),
                    );
                }
            }
            "indexer_topk" => match json.peek().map_err(e)? {
                ValueType::String => {
                    meta.saw_capture = true;
                    let reader = json.next_string_reader().map_err(e)?;
                    decode_base64_stream(reader, src, sink)?;
                }
                // Capture asked for but not enabled on the server: null (docs/engines.md).
                ValueType::Null => json.next_null().map_err(e)?,
                other => {
                    return Err(CaptureError::field(
                        src,
                        "meta_info.indexer_topk",
                        "a base64 string of little-endian int32",
                        format!("{other:?}"),
                    ))
                }
            },
            _ => json.skip_value().map_err(e)?,
        }
    }
    json.end_object().map_err(e)
}

/// Decodes standard base64 from `reader` in blocks of `BLOCK_CHARS` into `sink`.
///
/// Two threads in a pipeline: this one reads the characters (the JSON string reader walks them
/// one by one, the slower half), a scoped second one decodes each block and feeds the sink, so
/// a capture reads at the JSON reader's pace. Each block but the last holds a multiple of 16
/// characters (whole int32 values); three buffers circulate, so memory stays at a few MiB.
pub fn decode_base64_stream<R: Read>(
    mut reader: R,
    src: &str,
    sink: &mut PayloadSink,
) -> Result<(), CaptureError> {
    use std::sync::mpsc::sync_channel;
    // (buffer, characters in it, last block)
    let (full_tx, full_rx) = sync_channel::<(Vec<u8>, usize, bool)>(2);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(3);
    for _ in 0..3 {
        let _ = empty_tx.send(vec![0u8; BLOCK_CHARS]);
    }
    std::thread::scope(|scope| {
        let decoder = scope.spawn(move || -> Result<(), CaptureError> {
            let mut bytes = vec![0u8; BLOCK_CHARS / 4 * 3];
            let mut offset = 0u64; // base64 characters decoded so far
            for (chars, len, last) in full_rx {
                if last && len % 4 != 0 {
                    return Err(CaptureError::Payload {
                        source_name: src.into(),
                        detail: format!(
                            "{} base64 characters, expected a multiple of 4 (a truncated string?)",
                            offset + len as u64
                        ),
                    });
                }
                let n = base64::engine::general_purpose::STANDARD
                    .decode_slice(&chars[..len], &mut bytes)
                    .map_err(|err| CaptureError::Payload {
                        source_name: src.into(),
                        detail: format!(
                            "invalid base64 in the characters from offset {offset}: {err}"
                        ),
                    })?;
                sink.push_bytes(&bytes[..n])?;
                offset += len as u64;
                // The reader may have finished already: a buffer nobody takes back is dropped.
                let _ = empty_tx.try_send(chars);
            }
            Ok(())
        });
        // Characters read past the last whole group of the previous block.
        let mut spill: Vec<u8> = Vec::with_capacity(16);
        let read_result = (|| -> Result<(), CaptureError> {
            loop {
                let Ok(mut chars) = empty_rx.recv() else {
                    return Ok(()); // the decoder stopped: its error is joined below
                };
                chars[..spill.len()].copy_from_slice(&spill);
                let mut filled = spill.len();
                let mut done = false;
                while filled < BLOCK_CHARS {
                    let n =
                        reader
                            .read(&mut chars[filled..])
                            .map_err(|err| CaptureError::Read {
                                source_name: src.into(),
                                detail: err.to_string(),
                            })?;
                    if n == 0 {
                        done = true;
                        break;
                    }
                    filled += n;
                }
                let whole = if done { filled } else { filled / 16 * 16 };
                spill.clear();
                spill.extend_from_slice(&chars[whole..filled]);
                if (whole > 0 || done) && full_tx.send((chars, whole, done)).is_err() {
                    return Ok(()); // the decoder stopped
                }
                if done {
                    return Ok(());
                }
            }
        })();
        drop(full_tx);
        let decoded = decoder.join().unwrap_or_else(|_| {
            Err(CaptureError::Payload {
                source_name: src.into(),
                detail: "the base64 decoder stopped unexpectedly".into(),
            })
        });
        // A decoding error explains a reader that stopped early; else the reader's own.
        decoded.and(read_result)
    })
}

/// Receives the decoded payload as int32 values and keeps only what the probe reads.
pub struct PayloadSink {
    src: String,
    csa_layers: Vec<usize>,
    config_topk: usize,
    engine_topk: Option<usize>,
    /// Row width (values) under the expected K: layers x K.
    expected_row: usize,
    /// Early probed positions (before the last prompt token), ascending.
    early: Vec<usize>,
    early_rows: BTreeMap<usize, Vec<i32>>,
    /// Values seen so far.
    values: u64,
    /// Bytes of an int32 split across two blocks.
    carry: Vec<u8>,
    /// The values of the block being pushed (reused).
    scratch: Vec<i32>,
    tail: VecDeque<i32>,
    tail_cap: usize,
    /// The first value below -1 (offset, value).
    first_below: Option<(u64, i32)>,
    /// The largest value and the offset of its first occurrence.
    largest: Option<(u64, i32)>,
}

impl PayloadSink {
    pub fn new(expect: &CaptureExpect) -> Self {
        let k = expect.engine_topk.unwrap_or(expect.config_topk);
        let last = expect.prompt_tokens.saturating_sub(1);
        let mut early: Vec<usize> = expect
            .prompt_positions
            .iter()
            .copied()
            .filter(|&p| p < last)
            .collect();
        early.sort_unstable();
        early.dedup();
        PayloadSink {
            src: expect.source.clone(),
            csa_layers: expect.csa_layers.clone(),
            config_topk: expect.config_topk,
            engine_topk: expect.engine_topk,
            expected_row: expect.csa_layers.len() * k,
            early,
            early_rows: BTreeMap::new(),
            values: 0,
            carry: Vec::new(),
            scratch: Vec::new(),
            tail: VecDeque::new(),
            tail_cap: TAIL_BYTES / 4,
            first_below: None,
            largest: None,
        }
    }

    /// A smaller tail (tests of the tail's limit).
    pub fn with_tail_values(mut self, values: usize) -> Self {
        self.tail_cap = values;
        self
    }

    /// Appends decoded bytes (any length; int32 values may straddle calls).
    pub fn push_bytes(&mut self, mut bytes: &[u8]) -> Result<(), CaptureError> {
        if !self.carry.is_empty() {
            let need = 4 - self.carry.len();
            let take = need.min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() == 4 {
                let c = std::mem::take(&mut self.carry);
                let mut one = std::mem::take(&mut self.scratch);
                one.clear();
                one.push(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                self.push_values(&one);
                self.scratch = one;
            }
        }
        let whole = bytes.len() / 4 * 4;
        // One reused buffer: no allocation per block.
        let mut vals = std::mem::take(&mut self.scratch);
        vals.clear();
        vals.extend(
            bytes[..whole]
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        self.push_values(&vals);
        self.scratch = vals;
        self.carry.extend_from_slice(&bytes[whole..]);
        Ok(())
    }

    fn push_values(&mut self, vals: &[i32]) {
        let start = self.values;
        // One pass for the range check; the offending offset is looked up only when needed.
        let (low, high) = vals
            .iter()
            .fold((i32::MAX, i32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if low < -1 && self.first_below.is_none() {
            if let Some(i) = vals.iter().position(|&v| v < -1) {
                self.first_below = Some((start + i as u64, vals[i]));
            }
        }
        if !vals.is_empty() && self.largest.is_none_or(|(_, v)| high > v) {
            let i = vals.iter().position(|&v| v == high).unwrap_or(0);
            self.largest = Some((start + i as u64, high));
        }
        // Early rows under the expected K.
        if self.expected_row > 0 {
            let w = self.expected_row as u64;
            for &p in &self.early {
                let (a, b) = (p as u64 * w, (p as u64 + 1) * w);
                let end = start + vals.len() as u64;
                if b <= start || a >= end {
                    continue;
                }
                let row = self.early_rows.entry(p).or_default();
                let lo = a.max(start);
                let hi = b.min(end);
                row.extend_from_slice(&vals[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        // The tail, grown to its cap exactly (no doubling past it).
        let keep = vals.len().min(self.tail_cap);
        let over = (self.tail.len() + keep).saturating_sub(self.tail_cap);
        self.tail.drain(..over);
        let want = self.tail.len() + keep;
        if want > self.tail.capacity() {
            let grown = (self.tail.capacity() * 2).max(want).min(self.tail_cap);
            self.tail.reserve_exact(grown - self.tail.len());
        }
        self.tail.extend(&vals[vals.len() - keep..]);
        self.values += vals.len() as u64;
    }

    /// The payload has ended: K from its length, the kept rows cut out and checked.
    pub fn finish(
        self,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) -> Result<EngineCapture, CaptureError> {
        let src = self.src.clone();
        let payload_err = |detail: String| CaptureError::Payload {
            source_name: src.clone(),
            detail,
        };
        if !self.carry.is_empty() {
            return Err(payload_err(format!(
                "{} bytes, expected a whole number of int32 values (4 bytes each)",
                self.values * 4 + self.carry.len() as u64
            )));
        }
        if prompt_tokens == 0 || completion_tokens == 0 {
            return Err(payload_err(format!(
                "prompt_tokens {prompt_tokens}, completion_tokens {completion_tokens}: the answer \
                 position's row (the last prompt token as the query) exists only with a prompt \
                 and at least one generated token (max_new_tokens >= 1)"
            )));
        }
        let layers = self.csa_layers.len();
        let total = self.values;
        let short_rows = (prompt_tokens + completion_tokens).saturating_sub(1);
        let readings: Vec<(usize, usize)> = [short_rows, short_rows + 1]
            .into_iter()
            .filter(|&r| {
                r > 0 && layers > 0 && total > 0 && total.is_multiple_of((r * layers) as u64)
            })
            .map(|r| (r, (total / (r * layers) as u64) as usize))
            .collect();
        let shape = |r: usize, k: usize| format!("{r} rows x {layers} layers x K {k}");
        let (rows, topk) = match self.engine_topk {
            Some(k) => *readings.iter().find(|&&(_, rk)| rk == k).ok_or_else(|| {
                payload_err(format!(
                    "{total} int32 values, expected {} or {} for --engine-topk {k} ({} or {} \
                     rows of {layers} ratio-4 layers: prompt_tokens {prompt_tokens} + \
                     completion_tokens {completion_tokens} - 1, or one more)",
                    short_rows * layers * k,
                    (short_rows + 1) * layers * k,
                    short_rows,
                    short_rows + 1
                ))
            })?,
            None => match readings.as_slice() {
                [] => {
                    return Err(payload_err(format!(
                        "{total} int32 values is not rows x {layers} ratio-4 layers x K for {} or \
                         {} rows (prompt_tokens {prompt_tokens} + completion_tokens \
                         {completion_tokens} - 1, or one more): a payload of another model's \
                         layers, or a truncated one",
                        short_rows,
                        short_rows + 1
                    )))
                }
                [one] => *one,
                several => match several.iter().find(|&&(_, k)| k == self.config_topk) {
                    Some(r) => *r,
                    None => {
                        let named: Vec<String> =
                            several.iter().map(|&(r, k)| shape(r, k)).collect();
                        return Err(payload_err(format!(
                            "{total} int32 values read two ways, {}, and neither K is the \
                             config's index_topk {}: pass --engine-topk K",
                            named.join(" or "),
                            self.config_topk
                        )));
                    }
                },
            },
        };
        let width = layers * topk;
        let most_visible = RowKind::Csa.visible_rows(rows.saturating_sub(1));
        let mut capture = EngineCapture {
            source: src.clone(),
            text: String::new(),
            output_ids: Vec::new(),
            finish_reason: None,
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            topk,
            rows,
            csa_layers: self.csa_layers.clone(),
            payload_bytes: total * 4,
            selections: BTreeMap::new(),
            warnings: Vec::new(),
        };
        let locate = |at: u64| {
            (
                (at / width as u64) as usize,
                ((at % width as u64) as usize) / topk,
            )
        };
        if let Some((at, v)) = self.first_below {
            let (pos, slot) = locate(at);
            return Err(row_error(
                &capture,
                pos,
                slot,
                format!("value {v}, expected -1 or a row index >= 0"),
            ));
        }
        // Every value below the most rows any query of the request sees; the exact bound of
        // each position is checked on the kept rows below.
        if let Some((at, v)) = self
            .largest
            .filter(|&(_, v)| v >= 0 && v as usize >= most_visible)
        {
            let (pos, slot) = locate(at);
            return Err(row_error(
                &capture,
                pos,
                slot,
                format!(
                    "value {v}, expected a row index below {} (the visible rows of that position)",
                    RowKind::Csa.visible_rows(pos)
                ),
            ));
        }
        // Early rows: only valid under the K they were cut with.
        if !self.early.is_empty() && width != self.expected_row {
            let expected_k = self.engine_topk.unwrap_or(self.config_topk);
            return Err(payload_err(format!(
                "the engine's K is {topk} (from the payload's length), not {expected_k}: the rows \
                 of the probed question positions were read with K {expected_k}; pass \
                 --engine-topk {topk}"
            )));
        }
        for (pos, row) in self.early_rows {
            capture.selections.insert(pos, row);
        }
        // The answer row and every decode row, from the tail.
        let first_tail = total - self.tail.len() as u64;
        let answer = prompt_tokens - 1;
        if (answer as u64) * (width as u64) < first_tail {
            return Err(payload_err(format!(
                "the rows from the answer position {answer} on take {} bytes, more than the {} \
                 bytes kept of the payload's end (more generated tokens than a probe reads)",
                (total - answer as u64 * width as u64) * 4,
                self.tail_cap * 4
            )));
        }
        // Reuses the ring's buffer (no second copy of the tail).
        let tail: Vec<i32> = Vec::from(self.tail);
        for pos in answer..rows {
            let a = (pos as u64 * width as u64 - first_tail) as usize;
            capture.selections.insert(pos, tail[a..a + width].to_vec());
        }
        let positions: Vec<usize> = capture.selections.keys().copied().collect();
        for pos in positions {
            check_row(&mut capture, pos)?;
        }
        Ok(capture)
    }
}

fn phase_of(pos: usize, prompt_tokens: usize) -> String {
    crate::record::phase_label(pos, prompt_tokens)
}

fn row_error(c: &EngineCapture, pos: usize, slot: usize, detail: String) -> CaptureError {
    CaptureError::Row {
        source_name: c.source.clone(),
        query_pos: pos,
        phase: match phase_of(pos, c.prompt_tokens).as_str() {
            "prompt" => "prompt".into(),
            step => format!("decode step {step}"),
        },
        layer: c.csa_layers.get(slot).copied().unwrap_or(slot),
        slot,
        detail,
    }
}

/// One kept row's exact checks (module doc).
fn check_row(c: &mut EngineCapture, pos: usize) -> Result<(), CaptureError> {
    let n_t = RowKind::Csa.visible_rows(pos);
    let k = c.topk;
    let row = c.selections[&pos].clone();
    let mut seen = vec![false; n_t];
    for (slot, values) in row.chunks(k).enumerate() {
        seen.iter_mut().for_each(|s| *s = false);
        let mut count = 0;
        for &v in values {
            if v == -1 {
                continue;
            }
            if v < -1 || v as usize >= n_t {
                return Err(row_error(
                    c,
                    pos,
                    slot,
                    format!("value {v}, expected -1 or a row index in [0, {n_t}) (n_t = floor(({pos}+1)/4))"),
                ));
            }
            if std::mem::replace(&mut seen[v as usize], true) {
                return Err(row_error(c, pos, slot, format!("row {v} selected twice")));
            }
            count += 1;
        }
        let want = k.min(n_t);
        if count != want {
            let w = row_error(
                c,
                pos,
                slot,
                format!("{count} rows selected, expected min(K {k}, visible {n_t}) = {want}"),
            );
            c.warnings.push(w.to_string());
        }
    }
    Ok(())
}
