//! Reading a serving engine's captured indexer selections (`probe::capture`): SGLang's native
//! `/generate` body with `meta_info.indexer_topk` (base64 of little-endian int32, shape
//! `(rows, ratio-4 layers, K)`), K from the payload's length, only the probed rows kept, every
//! defect named.

use std::io::Read;

use base64::Engine as _;
use needlescope::probe::capture::{
    decode_base64_stream, read_capture, CaptureError, CaptureExpect, EngineCapture, PayloadSink,
};

/// The K values of row `t`, layer slot `slot`.
type Values = Box<dyn Fn(usize, usize) -> Vec<i32>>;

/// The CSA rows visible to query position `t`: floor((t+1)/4).
fn visible(t: usize) -> usize {
    (t + 1) / 4
}

/// The first min(K, n_t) row indices in reverse order, then -1 padding.
fn reversed(k: usize, t: usize) -> Vec<i32> {
    let c = k.min(visible(t));
    let mut v: Vec<i32> = (0..c as i32).rev().collect();
    v.resize(k, -1);
    v
}

/// Like [`reversed`] but different per layer slot: rows `(slot + j) mod n_t`, j < min(K, n_t).
fn shifted(k: usize, t: usize, slot: usize) -> Vec<i32> {
    let n_t = visible(t);
    let c = k.min(n_t);
    let mut v: Vec<i32> = (0..c).rev().map(|j| ((slot + j) % n_t) as i32).collect();
    v.resize(k, -1);
    v
}

/// A `/generate` response body built from explicit parameters.
struct Body {
    n: usize,
    m: usize,
    layers: usize,
    k: usize,
    stop_edge: bool,
    values: Values,
    omit: Vec<&'static str>,
    meta_first: bool,
    wrap: bool,
    finish: &'static str,
    cached: usize,
    claim_prompt: Option<usize>,
    claim_completion: Option<usize>,
}

impl Body {
    /// N prompt tokens, M generated, L ratio-4 layers, K per layer; rows N+M-1, [`reversed`].
    fn new(n: usize, m: usize, layers: usize, k: usize) -> Self {
        Body {
            n,
            m,
            layers,
            k,
            stop_edge: false,
            values: Box::new(move |t, _| reversed(k, t)),
            omit: Vec::new(),
            meta_first: false,
            wrap: false,
            finish: "stop",
            cached: 0,
            claim_prompt: None,
            claim_completion: None,
        }
    }

    fn values(mut self, f: impl Fn(usize, usize) -> Vec<i32> + 'static) -> Self {
        self.values = Box::new(f);
        self
    }

    fn shifted(self) -> Self {
        let k = self.k;
        self.values(move |t, s| shifted(k, t, s))
    }

    /// One more row, at the stop edge (N+M rows).
    fn stop_edge(mut self) -> Self {
        self.stop_edge = true;
        self
    }

    /// Leaves out a field: text, output_ids, prompt_tokens, completion_tokens, cached_tokens,
    /// finish_reason, indexer_topk.
    fn omit(mut self, field: &'static str) -> Self {
        self.omit.push(field);
        self
    }

    fn meta_first(mut self) -> Self {
        self.meta_first = true;
        self
    }

    fn wrapped(mut self) -> Self {
        self.wrap = true;
        self
    }

    fn finish(mut self, reason: &'static str) -> Self {
        self.finish = reason;
        self
    }

    fn cached(mut self, c: usize) -> Self {
        self.cached = c;
        self
    }

    fn claim_prompt(mut self, p: usize) -> Self {
        self.claim_prompt = Some(p);
        self
    }

    fn claim_completion(mut self, c: usize) -> Self {
        self.claim_completion = Some(c);
        self
    }

    fn rows(&self) -> usize {
        self.n + self.m - 1 + usize::from(self.stop_edge)
    }

    /// Row `t` as sent: `[slot][K]`.
    fn row(&self, t: usize) -> Vec<i32> {
        let mut out = Vec::with_capacity(self.layers * self.k);
        for s in 0..self.layers {
            let v = (self.values)(t, s);
            assert_eq!(
                v.len(),
                self.k,
                "the values closure gives K values (row {t})"
            );
            out.extend(v);
        }
        out
    }

    fn payload(&self) -> Vec<i32> {
        (0..self.rows()).flat_map(|t| self.row(t)).collect()
    }

    fn output_ids(&self) -> Vec<u32> {
        (0..self.m as u32).map(|i| 1000 + 7 * i).collect()
    }

    fn json(&self) -> String {
        self.json_with_payload(&format!("\"{}\"", b64(&le_bytes(&self.payload()))))
    }

    /// The body with `payload` (JSON text: a string literal, `null`, ...) as indexer_topk.
    fn json_with_payload(&self, payload: &str) -> String {
        let has = |f: &str| !self.omit.contains(&f);
        let mut meta = vec![
            "\"id\": \"5f0c\"".to_string(),
            "\"e2e_latency\": 0.25".to_string(),
            "\"weight_version\": \"default\"".to_string(),
        ];
        if has("finish_reason") {
            meta.push(format!(
                "\"finish_reason\": {{\"type\": \"{}\", \"matched\": 1}}",
                self.finish
            ));
        }
        if has("prompt_tokens") {
            meta.push(format!(
                "\"prompt_tokens\": {}",
                self.claim_prompt.unwrap_or(self.n)
            ));
        }
        if has("completion_tokens") {
            meta.push(format!(
                "\"completion_tokens\": {}",
                self.claim_completion.unwrap_or(self.m)
            ));
        }
        if has("cached_tokens") {
            meta.push(format!("\"cached_tokens\": {}", self.cached));
        }
        meta.push("\"spec_verify_ct\": [0, {\"a\": null}]".to_string());
        if has("indexer_topk") {
            meta.push(format!("\"indexer_topk\": {payload}"));
        }
        let meta = format!("\"meta_info\": {{{}}}", meta.join(", "));
        let mut top = Vec::new();
        if has("text") {
            top.push("\"text\": \"The code is \\\"7431\\\".\"".to_string());
        }
        let ids = self.output_ids();
        if has("output_ids") {
            top.push(format!("\"output_ids\": {ids:?}"));
        }
        if self.meta_first {
            top.insert(0, meta);
        } else {
            top.push(meta);
        }
        let obj = format!("{{{}}}", top.join(", "));
        if self.wrap {
            format!("[{obj}]\n")
        } else {
            format!("{obj}\n")
        }
    }
}

fn le_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What was sent: N prompt tokens, layer slots on decoder layers 1, 3, 5, ...
fn expect(n: usize, layers: usize, config_topk: usize) -> CaptureExpect {
    CaptureExpect {
        source: "capture.json".into(),
        prompt_tokens: n,
        csa_layers: (0..layers).map(|i| 2 * i + 1).collect(),
        config_topk,
        engine_topk: None,
        prompt_positions: Vec::new(),
    }
}

fn read(body: &str, e: &CaptureExpect) -> Result<EngineCapture, CaptureError> {
    read_capture(body.as_bytes(), e)
}

fn fails(body: &str, e: &CaptureExpect) -> (CaptureError, String) {
    let err = read(body, e).expect_err("the capture is refused");
    let msg = err.to_string();
    (err, msg)
}

fn has_all(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "{n:?} not in: {msg}");
    }
}

/// A reader handing out 1 to 7 bytes per call.
struct Trickle<'a> {
    data: &'a [u8],
    calls: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.calls += 1;
        let want = 1 + (self.calls * 5 + 3) % 7;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn trickle(data: &[u8]) -> Trickle<'_> {
    Trickle { data, calls: 0 }
}

/// Asserts the kept rows are exactly `positions`, each as sent.
fn kept_as_sent(c: &EngineCapture, body: &Body, positions: &[usize]) {
    let kept: Vec<usize> = c.selections.keys().copied().collect();
    assert_eq!(kept, positions);
    for &p in positions {
        assert_eq!(c.selections[&p], body.row(p), "row {p}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. K, rows, the kept rows and the fields read.

#[test]
fn k_is_read_from_the_payload_length() {
    let (n, l, k) = (41, 3, 8);
    for m in [1, 5] {
        for stop_edge in [false, true] {
            let mut body = Body::new(n, m, l, k).shifted();
            if stop_edge {
                body = body.stop_edge();
            }
            let rows = body.rows();
            // The config's K is not the engine's: only the length says K.
            let c = read(&body.json(), &expect(n, l, 1024)).unwrap();
            let what = format!("M {m}, stop edge {stop_edge}");
            assert_eq!(c.topk, k, "{what}");
            assert_eq!(c.rows, rows, "{what}");
            assert_eq!(c.payload_bytes, (rows * l * k * 4) as u64, "{what}");
            assert_eq!(c.prompt_tokens, n);
            assert_eq!(c.completion_tokens, m);
            assert_eq!(c.csa_layers, vec![1, 3, 5]);
            // The answer position N-1 and every decode row, nothing else.
            let want: Vec<usize> = (n - 1..rows).collect();
            kept_as_sent(&c, &body, &want);
            assert!(c.warnings.is_empty(), "{what}: {:?}", c.warnings);
        }
    }
}

#[test]
fn selection_returns_each_layers_slot_of_a_kept_row() {
    let (n, m, l, k) = (41, 5, 3, 8);
    let body = Body::new(n, m, l, k).shifted();
    let c = read(&body.json(), &expect(n, l, k)).unwrap();
    for pos in n - 1..n + m - 1 {
        for (slot, layer) in [1, 3, 5].into_iter().enumerate() {
            assert_eq!(
                c.selection(pos, layer).unwrap(),
                shifted(k, pos, slot).as_slice(),
                "position {pos}, layer {layer}"
            );
        }
        // The slots differ (the test would not tell them apart otherwise).
        assert_ne!(c.selection(pos, 1), c.selection(pos, 3));
        // A layer that is not ratio-4.
        assert_eq!(c.selection(pos, 2), None);
        assert_eq!(c.selection(pos, 0), None);
    }
    // Positions not kept.
    assert_eq!(c.selection(n - 2, 1), None);
    assert_eq!(c.selection(3, 1), None);
    assert_eq!(c.selection(n + m - 1, 1), None);
}

#[test]
fn the_answer_fields_are_read() {
    let (n, m, l, k) = (40, 6, 2, 4);
    let body = Body::new(n, m, l, k);
    let c = read(&body.json(), &expect(n, l, k)).unwrap();
    assert_eq!(c.source, "capture.json");
    assert_eq!(c.text, "The code is \"7431\".");
    assert_eq!(c.output_ids, body.output_ids());
    assert_eq!(c.finish_reason.as_deref(), Some("stop"));
    assert!(c.ended());
    assert_eq!(c.cached_tokens, 0);

    let c = read(
        &Body::new(n, m, l, k).finish("length").json(),
        &expect(n, l, k),
    )
    .unwrap();
    assert_eq!(c.finish_reason.as_deref(), Some("length"));
    assert!(!c.ended());

    let c = read(
        &Body::new(n, m, l, k).omit("finish_reason").json(),
        &expect(n, l, k),
    )
    .unwrap();
    assert_eq!(c.finish_reason, None);
    assert!(!c.ended());

    // completion_tokens may be left out: output_ids says it.
    let c = read(
        &Body::new(n, m, l, k).omit("completion_tokens").json(),
        &expect(n, l, k),
    )
    .unwrap();
    assert_eq!(c.completion_tokens, m);
    assert_eq!(c.rows, n + m - 1);
}

#[test]
fn key_order_and_a_one_element_array_do_not_change_the_capture() {
    let (n, m, l, k) = (44, 4, 2, 6);
    let e = expect(n, l, k);
    let plain = read(&Body::new(n, m, l, k).shifted().json(), &e).unwrap();
    for body in [
        Body::new(n, m, l, k).shifted().meta_first(),
        Body::new(n, m, l, k).shifted().wrapped(),
        Body::new(n, m, l, k).shifted().meta_first().wrapped(),
    ] {
        assert_eq!(read(&body.json(), &e).unwrap(), plain);
    }
    // A second result in the array is skipped.
    let one = Body::new(n, m, l, k).shifted().json();
    let two = format!("[{}, {}]", one.trim_end(), one.trim_end());
    assert_eq!(read(&two, &e).unwrap(), plain);
}

#[test]
fn escaped_slashes_in_the_base64_string_read_the_same() {
    // -1 padding encodes as "////": JSON may escape '/' as "\/".
    let (n, m, l, k) = (40, 3, 2, 16);
    let body = Body::new(n, m, l, k);
    let json = body.json();
    let payload_at = json.find("\"indexer_topk\": \"").unwrap();
    let (head, payload) = json.split_at(payload_at);
    assert!(payload.contains('/'));
    let escaped = format!("{head}{}", payload.replace('/', "\\/"));
    let e = expect(n, l, k);
    assert_eq!(read(&escaped, &e).unwrap(), read(&json, &e).unwrap());
}

// ---------------------------------------------------------------------------------------------
// 2. Two readings of the length.

/// N 40 + M 4 - 1 = 43 rows x 2 layers x K 44 = 44 rows x 2 layers x K 43 = 3784 values.
const AMBIGUOUS: (usize, usize, usize) = (40, 4, 2);

#[test]
fn when_both_row_counts_divide_the_configs_k_decides() {
    let (n, m, l) = AMBIGUOUS;
    let short = Body::new(n, m, l, 44).shifted();
    let edge = Body::new(n, m, l, 43).shifted().stop_edge();
    assert_eq!(short.payload().len(), edge.payload().len());

    let c = read(&short.json(), &expect(n, l, 44)).unwrap();
    assert_eq!((c.rows, c.topk), (43, 44));
    kept_as_sent(&c, &short, &[39, 40, 41, 42]);

    let c = read(&edge.json(), &expect(n, l, 43)).unwrap();
    assert_eq!((c.rows, c.topk), (44, 43));
    kept_as_sent(&c, &edge, &[39, 40, 41, 42, 43]);
}

#[test]
fn when_neither_reading_is_the_configs_k_both_are_named() {
    let (n, m, l) = AMBIGUOUS;
    let short = Body::new(n, m, l, 44).shifted();
    let (err, msg) = fails(&short.json(), &expect(n, l, 2048));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(
        &msg,
        &[
            "3784 int32 values",
            "43 rows x 2 layers x K 44",
            "44 rows x 2 layers x K 43",
            "index_topk 2048",
            "--engine-topk",
        ],
    );
}

#[test]
fn engine_topk_picks_the_reading() {
    let (n, m, l) = AMBIGUOUS;
    let short = Body::new(n, m, l, 44).shifted();
    let edge = Body::new(n, m, l, 43).shifted().stop_edge();

    let mut e = expect(n, l, 2048);
    e.engine_topk = Some(43);
    let c = read(&edge.json(), &e).unwrap();
    assert_eq!((c.rows, c.topk), (44, 43));
    kept_as_sent(&c, &edge, &[39, 40, 41, 42, 43]);

    e.engine_topk = Some(44);
    let c = read(&short.json(), &e).unwrap();
    assert_eq!((c.rows, c.topk), (43, 44));
    kept_as_sent(&c, &short, &[39, 40, 41, 42]);

    // --engine-topk also settles it against the config's index_topk.
    let mut e = expect(n, l, 44);
    e.engine_topk = Some(43);
    let c = read(&edge.json(), &e).unwrap();
    assert_eq!((c.rows, c.topk), (44, 43));

    // A K that neither reading has.
    e.engine_topk = Some(7);
    let (err, msg) = fails(&edge.json(), &e);
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(
        &msg,
        &["3784 int32 values", "--engine-topk 7", "602 or 616"],
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The payload's length and encoding.

#[test]
fn a_length_that_is_no_rows_x_layers_x_k_is_refused() {
    let (n, m, l, k) = (40, 6, 2, 8);
    let body = Body::new(n, m, l, k);
    let mut values = body.payload();
    values.push(-1);
    let json = body.json_with_payload(&format!("\"{}\"", b64(&le_bytes(&values))));
    let (err, msg) = fails(&json, &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["721 int32 values", "45 or 46 rows", "indexer_topk"]);

    // An empty payload.
    let (err, msg) = fails(&body.json_with_payload("\"\""), &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["0 int32 values"]);
}

#[test]
fn a_byte_count_not_a_multiple_of_four_is_refused() {
    let (n, m, l, k) = (40, 6, 2, 8);
    let body = Body::new(n, m, l, k);
    let mut bytes = le_bytes(&body.payload());
    bytes.extend([0, 0]);
    let json = body.json_with_payload(&format!("\"{}\"", b64(&bytes)));
    let (err, msg) = fails(&json, &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["2882 bytes", "whole number of int32"]);
}

#[test]
fn invalid_base64_names_an_offset() {
    let (n, m, l, k) = (40, 6, 2, 8);
    let body = Body::new(n, m, l, k);
    let mut enc = b64(&le_bytes(&body.payload())).into_bytes();
    enc[100] = b'*';
    let json = body.json_with_payload(&format!("\"{}\"", String::from_utf8(enc).unwrap()));
    let (err, msg) = fails(&json, &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["invalid base64", "offset 0"]);

    // A string cut inside a 4-character group.
    let enc = b64(&le_bytes(&body.payload()));
    let json = body.json_with_payload(&format!("\"{}\"", &enc[..enc.len() - 1]));
    let (err, msg) = fails(&json, &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["multiple of 4"]);
}

#[test]
fn indexer_topk_of_another_json_type_is_a_field_error() {
    let (n, m, l, k) = (40, 6, 2, 8);
    let body = Body::new(n, m, l, k);
    for other in ["[1, 2]", "12", "{\"b64\": \"\"}"] {
        let (err, msg) = fails(&body.json_with_payload(other), &expect(n, l, k));
        match &err {
            CaptureError::Field { field, .. } => assert_eq!(field, "meta_info.indexer_topk"),
            other => panic!("{other:?}"),
        }
        has_all(&msg, &["base64"]);
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Row checks.

#[test]
fn a_value_past_the_answer_rows_visible_rows_is_named() {
    let (n, m, l, k) = (40, 5, 3, 4);
    // n_t at position 39 is 10; the payload's largest visible count (row 43) is 11, so only the
    // exact check of the kept row catches 10.
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 39 && s == 1 {
            v[2] = 10;
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    match &err {
        CaptureError::Row {
            query_pos,
            layer,
            slot,
            phase,
            ..
        } => {
            assert_eq!((*query_pos, *layer, *slot), (39, 3, 1));
            assert_eq!(phase, "prompt");
        }
        other => panic!("{other:?}"),
    }
    has_all(
        &msg,
        &["query position 39", "layer 3", "value 10", "[0, 10)"],
    );
}

#[test]
fn a_value_past_the_decode_rows_visible_rows_is_named_with_its_step() {
    let (n, m, l, k) = (40, 5, 2, 4);
    // Row 42 sees 10 rows; 10 is below the payload's largest count (11).
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 42 && s == 0 {
            v[3] = 10;
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 42,
                layer: 1,
                slot: 0,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &["query position 42", "decode step 3", "value 10"]);
}

#[test]
fn a_value_past_every_rows_visible_count_is_named_even_in_a_row_not_kept() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 5 && s == 1 {
            v[1] = 1000;
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 5,
                layer: 3,
                slot: 1,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &["value 1000", "below 1"]);
}

#[test]
fn a_value_below_minus_one_anywhere_is_named() {
    let (n, m, l, k) = (40, 5, 2, 4);
    // In a row that is not kept.
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 2 && s == 1 {
            v[0] = -2;
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 2,
                layer: 3,
                slot: 1,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &["value -2"]);

    // In the answer row.
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 39 && s == 0 {
            v[3] = i32::MIN;
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 39,
                layer: 1,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &[&format!("value {}", i32::MIN)]);
}

#[test]
fn a_row_selected_twice_is_named() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 41 && s == 1 {
            v[0] = v[2];
        }
        v
    });
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 41,
                layer: 3,
                slot: 1,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &["selected twice", "query position 41"]);
}

#[test]
fn a_row_selecting_fewer_than_min_k_and_visible_is_a_warning() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 41 && s == 1 {
            v[1] = -1;
        }
        v
    });
    let c = read(&body.json(), &expect(n, l, k)).unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    has_all(
        &c.warnings[0],
        &["query position 41", "layer 3", "3 rows selected", "= 4"],
    );
    // The row is kept as sent.
    assert_eq!(c.selections[&41], body.row(41));
}

#[test]
fn order_within_a_row_is_free_and_padding_may_sit_anywhere() {
    let (n, m, l, k) = (40, 5, 2, 8);
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = shifted(k, t, s);
        v.rotate_left(3 + s);
        v
    });
    let c = read(&body.json(), &expect(n, l, k)).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    kept_as_sent(&c, &body, &[39, 40, 41, 42, 43]);
}

// ---------------------------------------------------------------------------------------------
// 5. Fields and malformed bodies.

#[test]
fn a_missing_capture_names_the_server_flag() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let e = expect(n, l, k);
    let (err, msg) = fails(&Body::new(n, m, l, k).omit("indexer_topk").json(), &e);
    assert!(matches!(err, CaptureError::NoCapture { .. }), "{err:?}");
    has_all(&msg, &["--enable-return-indexer-topk", "capture.json"]);

    let (err, msg) = fails(&Body::new(n, m, l, k).json_with_payload("null"), &e);
    assert!(matches!(err, CaptureError::NoCapture { .. }), "{err:?}");
    has_all(&msg, &["--enable-return-indexer-topk"]);
}

#[test]
fn a_prompt_length_other_than_sent_is_a_field_error() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).claim_prompt(41);
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    match &err {
        CaptureError::Field {
            field,
            expected,
            found,
            ..
        } => {
            assert_eq!(field, "meta_info.prompt_tokens");
            assert!(expected.contains("40"), "{expected}");
            assert_eq!(found, "41");
        }
        other => panic!("{other:?}"),
    }
    has_all(&msg, &["meta_info.prompt_tokens", "40", "41"]);

    let (err, _) = fails(
        &Body::new(n, m, l, k).omit("prompt_tokens").json(),
        &expect(n, l, k),
    );
    assert!(
        matches!(&err, CaptureError::Field { field, .. } if field == "meta_info.prompt_tokens"),
        "{err:?}"
    );
}

#[test]
fn completion_tokens_other_than_the_output_ids_is_a_field_error() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).claim_completion(6);
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    match &err {
        CaptureError::Field {
            field,
            expected,
            found,
            ..
        } => {
            assert_eq!(field, "meta_info.completion_tokens");
            assert!(expected.contains('5'), "{expected}");
            assert_eq!(found, "6");
        }
        other => panic!("{other:?}"),
    }
    has_all(&msg, &["output_ids"]);
}

#[test]
fn missing_text_or_output_ids_is_a_field_error() {
    let (n, m, l, k) = (40, 5, 2, 4);
    for field in ["text", "output_ids"] {
        let (err, _) = fails(&Body::new(n, m, l, k).omit(field).json(), &expect(n, l, k));
        assert!(
            matches!(&err, CaptureError::Field { field: f, .. } if f == field),
            "{err:?}"
        );
    }
}

#[test]
fn a_cached_prefix_is_a_warning_naming_the_flag() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let c = read(&Body::new(n, m, l, k).cached(16).json(), &expect(n, l, k)).unwrap();
    assert_eq!(c.cached_tokens, 16);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    has_all(
        &c.warnings[0],
        &["cached_tokens is 16", "--disable-radix-cache"],
    );
}

#[test]
fn an_error_body_is_an_error_not_a_panic() {
    let e = expect(40, 2, 4);
    for body in [
        r#"{"object": "error", "message": "x", "type": "BadRequestError", "code": 400}"#,
        r#"{"error": {"message": "The server is overloaded", "code": 503}}"#,
        r#"[{"object": "error", "message": "x"}]"#,
    ] {
        let (err, msg) = fails(body, &e);
        assert!(matches!(err, CaptureError::Field { .. }), "{body}: {err:?}");
        has_all(&msg, &["a /generate result"]);
    }
    // The message of an OpenAI-style error is quoted.
    let (_, msg) = fails(
        r#"{"object": "error", "message": "Input length 300000 exceeds the context", "code": 400}"#,
        &e,
    );
    has_all(
        &msg,
        &["an error body: Input length 300000 exceeds the context"],
    );
    // Bodies that are JSON but not an object.
    for body in ["[]", "\"Internal Server Error\"", "42", "[1]", "null"] {
        let (err, _) = fails(body, &e);
        assert!(matches!(err, CaptureError::Field { .. }), "{body}: {err:?}");
    }
    // An object without any of the fields.
    let (err, _) = fails(r#"{"detail": "Not Found"}"#, &e);
    assert!(matches!(err, CaptureError::Field { .. }), "{err:?}");
}

#[test]
fn malformed_json_is_a_json_error() {
    let e = expect(40, 2, 4);
    for body in [
        "",
        "<html>502 Bad Gateway</html>",
        "{\"text\": \"a\",]",
        "{\"text\" \"a\"}",
        "{'text': 'a'}",
    ] {
        let (err, _) = fails(body, &e);
        assert!(
            matches!(err, CaptureError::Json { .. }),
            "{body:?}: {err:?}"
        );
    }
    // Trailing junk after a whole result.
    let body = format!("{} x", Body::new(40, 5, 2, 4).json().trim_end());
    let (err, _) = fails(&body, &e);
    assert!(matches!(err, CaptureError::Json { .. }), "{err:?}");
}

#[test]
fn every_truncation_of_a_body_is_an_error_not_a_panic() {
    let (n, m, l, k) = (12, 2, 2, 4);
    let e = expect(n, l, k);
    for body in [
        Body::new(n, m, l, k).json(),
        Body::new(n, m, l, k).meta_first().wrapped().json(),
    ] {
        let body = body.trim_end();
        read(body, &e).unwrap();
        let start = body.find("\"indexer_topk\": \"").unwrap() + 17;
        for cut in 0..body.len() {
            let r = read(&body[..cut], &e);
            let err = r.expect_err(&format!("cut at {cut}"));
            if (start..start + 100).contains(&cut) {
                // Inside the base64 string.
                assert!(
                    matches!(
                        err,
                        CaptureError::Json { .. }
                            | CaptureError::Read { .. }
                            | CaptureError::Payload { .. }
                    ),
                    "cut at {cut}: {err:?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Rows of the question's positions (`--probe question`).

#[test]
fn probed_question_rows_are_kept_as_sent() {
    let (n, m, l, k) = (60, 4, 3, 8);
    for stop_edge in [false, true] {
        let mut body = Body::new(n, m, l, k).shifted();
        if stop_edge {
            body = body.stop_edge();
        }
        let mut e = expect(n, l, k);
        // Unsorted, repeated, the answer position and a decode position too.
        e.prompt_positions = vec![33, 1, 20, 33, n - 1, n + 1, 58];
        let c = read(&body.json(), &e).unwrap();
        let mut want = vec![1, 20, 33, 58];
        want.extend(n - 1..body.rows());
        want.sort_unstable();
        want.dedup();
        kept_as_sent(&c, &body, &want);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.selection(1, 5).unwrap().iter().all(|&v| v == -1));
        assert_eq!(c.selection(20, 3).unwrap(), shifted(k, 20, 1).as_slice());
    }
}

#[test]
fn question_rows_read_with_the_wrong_k_ask_for_engine_topk() {
    let (n, m, l, k) = (60, 4, 3, 8);
    let body = Body::new(n, m, l, k).shifted();
    let mut e = expect(n, l, 16);
    e.prompt_positions = vec![20, 33];
    let (err, msg) = fails(&body.json(), &e);
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["the engine's K is 8", "not 16", "--engine-topk 8"]);

    // Passing it reads them.
    e.engine_topk = Some(8);
    let c = read(&body.json(), &e).unwrap();
    kept_as_sent(&c, &body, &[20, 33, 59, 60, 61, 62]);
}

#[test]
fn question_rows_are_checked_like_the_answer_row() {
    let (n, m, l, k) = (60, 4, 2, 8);
    // Row 20 sees 5 rows; 5 is below the payload's largest count.
    let body = Body::new(n, m, l, k).values(move |t, s| {
        let mut v = reversed(k, t);
        if t == 20 && s == 1 {
            v[6] = 5;
        }
        v
    });
    let mut e = expect(n, l, k);
    e.prompt_positions = vec![20];
    let (err, msg) = fails(&body.json(), &e);
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 20,
                layer: 3,
                ..
            }
        ),
        "{err:?}"
    );
    has_all(&msg, &["value 5", "[0, 5)"]);
    // Not probed: not checked exactly.
    read(&body.json(), &expect(n, l, k)).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 7. Streaming.

#[test]
fn a_body_read_a_few_bytes_at_a_time_gives_the_same_capture() {
    let (n, m, l, k) = (57, 6, 3, 8);
    let mut e = expect(n, l, k);
    e.prompt_positions = vec![9, 30, 55];
    for body in [
        Body::new(n, m, l, k).shifted(),
        Body::new(n, m, l, k)
            .shifted()
            .stop_edge()
            .meta_first()
            .wrapped(),
        Body::new(n, m, l, k).shifted().cached(3).finish("length"),
    ] {
        let json = body.json();
        let whole = read(&json, &e).unwrap();
        let mut r = trickle(json.as_bytes());
        let streamed = read_capture(&mut r, &e).unwrap();
        assert!(r.calls > json.len() / 7);
        assert_eq!(streamed, whole);
    }
}

/// More than one 1 MiB block of base64: N 8000, 3 layers, K 10 (960 KB, 1.28 M characters);
/// width 30 values, so the first block's end (value 196,608) falls inside row 6553.
fn big() -> Body {
    Body::new(8000, 3, 3, 10).shifted()
}

#[test]
fn a_payload_longer_than_one_block_streams_the_same() {
    let body = big();
    let json = body.json();
    assert!(json.len() > (1 << 20) + 100_000);
    let mut e = expect(body.n, body.layers, body.k);
    e.prompt_positions = vec![6553, 6552, 6554, 100, 7998];
    let whole = read(&json, &e).unwrap();
    let mut want = vec![100, 6552, 6553, 6554, 7998];
    want.extend(7999..8002);
    kept_as_sent(&whole, &body, &want);
    assert_eq!(whole.payload_bytes, (8002 * 30 * 4) as u64);
    assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
    let streamed = read_capture(trickle(json.as_bytes()), &e).unwrap();
    assert_eq!(streamed, whole);
}

#[test]
fn defects_past_the_first_block_are_located() {
    let body = big();
    let e = expect(body.n, body.layers, body.k);
    // A value below -1 in the second block.
    let mut values = body.payload();
    let at = 7000 * 30 + 2 * 10 + 4;
    values[at] = -5;
    let json = body.json_with_payload(&format!("\"{}\"", b64(&le_bytes(&values))));
    let (err, _) = fails(&json, &e);
    assert!(
        matches!(
            err,
            CaptureError::Row {
                query_pos: 7000,
                layer: 5,
                slot: 2,
                ..
            }
        ),
        "{err:?}"
    );

    // Invalid base64 in the second block: the block's offset is named.
    let mut enc = b64(&le_bytes(&body.payload())).into_bytes();
    enc[(1 << 20) + 1234] = b'#';
    let json = body.json_with_payload(&format!("\"{}\"", String::from_utf8(enc).unwrap()));
    let (err, msg) = fails(&json, &e);
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["invalid base64", "offset 1048576"]);
}

// ---------------------------------------------------------------------------------------------
// 8. The payload sink: bytes in any pieces, the tail's limit.

#[test]
fn bytes_pushed_in_any_pieces_give_the_same_capture() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k).shifted();
    let mut e = expect(n, l, k);
    e.prompt_positions = vec![17];
    let bytes = le_bytes(&body.payload());

    let mut sink = PayloadSink::new(&e);
    sink.push_bytes(&bytes).unwrap();
    let whole = sink.finish(n, m).unwrap();
    kept_as_sent(&whole, &body, &[17, 39, 40, 41, 42, 43]);

    let mut sink = PayloadSink::new(&e);
    let mut rest = bytes.as_slice();
    let mut i = 0;
    while !rest.is_empty() {
        let take = [1, 3, 2, 5, 7, 0, 6][i % 7].min(rest.len());
        sink.push_bytes(&rest[..take]).unwrap();
        rest = &rest[take..];
        i += 1;
    }
    assert_eq!(sink.finish(n, m).unwrap(), whole);

    // Through the base64 decoder.
    let mut sink = PayloadSink::new(&e);
    decode_base64_stream(trickle(b64(&bytes).as_bytes()), "capture.json", &mut sink).unwrap();
    assert_eq!(sink.finish(n, m).unwrap(), whole);
}

#[test]
fn answer_rows_larger_than_the_tail_are_refused_by_name() {
    let (n, m, l, k) = (40, 5, 2, 4);
    let body = Body::new(n, m, l, k);
    let e = expect(n, l, k);
    let bytes = le_bytes(&body.payload());
    // Rows 39..44 take 5 x 8 values = 160 bytes.
    let mut sink = PayloadSink::new(&e).with_tail_values(39);
    sink.push_bytes(&bytes).unwrap();
    let err = sink.finish(n, m).unwrap_err();
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(
        &err.to_string(),
        &[
            "answer position 39",
            "160 bytes",
            "156 bytes kept of the payload's end",
        ],
    );

    // Just enough.
    let mut sink = PayloadSink::new(&e).with_tail_values(40);
    for piece in bytes.chunks(12) {
        sink.push_bytes(piece).unwrap();
    }
    let c = sink.finish(n, m).unwrap();
    kept_as_sent(&c, &body, &[39, 40, 41, 42, 43]);
}

/// No generated token: the payload has rows up to N-2 only, so the answer position's row is
/// missing; refused by name instead of a capture without it.
#[test]
fn a_capture_without_a_generated_token_is_refused() {
    let (n, l, k) = (40, 2, 8);
    let body = Body::new(n, 0, l, k);
    let (err, msg) = fails(&body.json(), &expect(n, l, k));
    assert!(matches!(err, CaptureError::Payload { .. }), "{err:?}");
    has_all(&msg, &["completion_tokens 0", "max_new_tokens >= 1"]);
}

/// An aborted request (HTTP 200, finish_reason abort, no capture) is named as such, with the
/// engine's message, not taken for a server without capture.
#[test]
fn an_aborted_request_is_named_with_its_message() {
    let e = expect(40, 2, 4);
    let body = r#"{"text": "", "output_ids": [], "meta_info": {"id": "a", "finish_reason": {"type": "abort", "message": "memory pool is full"}, "prompt_tokens": 40, "completion_tokens": 0, "cached_tokens": 0}}"#;
    let (err, msg) = fails(body, &e);
    assert!(matches!(err, CaptureError::Field { .. }), "{err:?}");
    has_all(
        &msg,
        &["meta_info.finish_reason", "aborted", "memory pool is full"],
    );
    assert!(!msg.contains("--enable-return-indexer-topk"), "{msg}");
}
