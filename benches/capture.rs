//! Reading a serving engine's capture at Flash scale: throughput and memory of the streamed
//! `/generate` response (docs/engines.md, "Payload sizes").
//!
//! `cargo bench --bench capture [-- TOKENS]` (default 131072 prompt tokens, 2 generated) builds
//! a Flash-shaped response (21 ratio-4 layers, K 512: 43,008 bytes per token, 5.6 GB raw and
//! 7.5 GB of base64 at 128K tokens) as a stream that is never held in memory, and reads it
//! three ways, each printing seconds, MB/s of base64 and the peak RSS above the process's
//! before the read:
//! 1. base64 alone: one 48 MiB block decoded again and again on one core (the decoder's rate);
//! 2. `read_capture` on the stream (JSON walk, base64, row keeping and checks), as
//!    `--engine-capture FILE` reads a saved body;
//! 3. the same over HTTP: a server thread on 127.0.0.1 writes the response, and
//!    `capture_from_server` posts the prompt and reads it, as `--engine URL` does.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use base64::Engine as _;
use needlescope::probe::capture::{read_capture, CaptureExpect};

const LAYERS: usize = 21;
const K: usize = 512;
const GENERATED: usize = 2;

/// The response body as a stream: a JSON head, the base64 of every row (one row's encoding
/// repeated: 43,008 bytes is a multiple of 3, so encodings concatenate), a JSON tail.
struct Body {
    parts: Vec<Vec<u8>>,
    /// (part, repeats left)
    at: usize,
    offset: usize,
    repeats_left: usize,
    rows: usize,
}

impl Body {
    fn new(prompt_tokens: usize) -> Body {
        let head = format!(
            "{{\"text\":\"1234567\",\"output_ids\":[16,17],\"meta_info\":{{\"id\":\"bench\",\
             \"finish_reason\":{{\"type\":\"length\",\"length\":{GENERATED}}},\"prompt_tokens\":\
             {prompt_tokens},\"completion_tokens\":{GENERATED},\"cached_tokens\":0,\
             \"indexer_topk\":\""
        );
        // Rows 0..K-1 at every layer: valid for every position the probe reads.
        let row: Vec<u8> = (0..LAYERS)
            .flat_map(|_| (0..K as i32).flat_map(|v| v.to_le_bytes()))
            .collect();
        let encoded = base64::engine::general_purpose::STANDARD.encode(&row);
        let tail = b"\",\"e2e_latency\":1.0}}".to_vec();
        Body {
            parts: vec![head.into_bytes(), encoded.into_bytes(), tail],
            at: 0,
            offset: 0,
            repeats_left: prompt_tokens + GENERATED - 1,
            rows: prompt_tokens + GENERATED - 1,
        }
    }

    fn base64_bytes(&self) -> u64 {
        self.parts[1].len() as u64 * self.rows as u64
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at < self.parts.len() {
            let part = &self.parts[self.at];
            if self.offset < part.len() {
                let n = buf.len().min(part.len() - self.offset);
                buf[..n].copy_from_slice(&part[self.offset..self.offset + n]);
                self.offset += n;
                return Ok(n);
            }
            self.offset = 0;
            if self.at == 1 && self.repeats_left > 1 {
                self.repeats_left -= 1;
            } else {
                self.at += 1;
            }
        }
        Ok(0)
    }
}

/// VmHWM and VmRSS of this process, bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Resets the peak (VmHWM) to the current RSS, where the kernel allows it.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn expect(prompt_tokens: usize, source: &str) -> CaptureExpect {
    CaptureExpect {
        source: source.into(),
        prompt_tokens,
        csa_layers: (0..LAYERS).map(|i| 2 + 2 * i).collect(),
        config_topk: K,
        engine_topk: None,
        prompt_positions: Vec::new(),
    }
}

fn report(what: &str, bytes: u64, seconds: f64, before: u64) {
    let (peak, _) = rss();
    println!(
        "{what:<34} {:>8.2} s {:>9.0} MB/s of base64   peak RSS +{:>5.0} MiB",
        seconds,
        bytes as f64 / seconds / 1e6,
        peak.saturating_sub(before) as f64 / (1 << 20) as f64
    );
}

fn main() {
    let tokens: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(131_072);
    let body = Body::new(tokens);
    let b64 = body.base64_bytes();
    println!(
        "capture of {tokens} prompt tokens + {GENERATED} generated, Flash shape ({LAYERS} layers \
         x K {K}): {:.2} GB raw, {:.2} GB of base64",
        b64 as f64 / 4.0 * 3.0 / 1e9,
        b64 as f64 / 1e9
    );

    // 1. base64 alone, one core.
    let block = vec![b'A'; 48 << 20];
    let mut out = vec![0u8; block.len() / 4 * 3];
    reset_peak();
    let before = rss().1;
    let t = Instant::now();
    let mut done = 0u64;
    while done < b64.min(8 << 30) {
        base64::engine::general_purpose::STANDARD
            .decode_slice(&block, &mut out)
            .unwrap();
        done += block.len() as u64;
    }
    report(
        "base64 decode (one core)",
        done,
        t.elapsed().as_secs_f64(),
        before,
    );
    drop((block, out));

    // 2. read_capture on the stream.
    reset_peak();
    let before = rss().1;
    let t = Instant::now();
    let c = read_capture(Body::new(tokens), &expect(tokens, "stream")).unwrap();
    report(
        "read_capture (stream)",
        b64,
        t.elapsed().as_secs_f64(),
        before,
    );
    assert_eq!((c.topk, c.rows), (K, tokens + GENERATED - 1));
    assert_eq!(c.selections.len(), GENERATED);

    // 3. over HTTP on 127.0.0.1.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // The request: headers, then the body its Content-Length names.
        let mut req = Vec::new();
        let mut byte = [0u8; 1];
        while !req.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            req.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&req).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut sent = vec![0u8; len];
        s.read_exact(&mut sent).unwrap();
        s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut body = Body::new(tokens);
        std::io::copy(
            &mut body,
            &mut std::io::BufWriter::with_capacity(1 << 20, s),
        )
        .unwrap();
    });
    let ids: Vec<u32> = vec![1; tokens];
    reset_peak();
    let before = rss().1;
    let t = Instant::now();
    let c = needlescope::run::sglang::capture_from_server(
        &url,
        &ids,
        GENERATED,
        Duration::from_secs(3600),
        &expect(tokens, &url),
    )
    .unwrap();
    report(
        "capture_from_server (HTTP)",
        b64,
        t.elapsed().as_secs_f64(),
        before,
    );
    assert_eq!(c.topk, K);
    server.join().unwrap();
}
