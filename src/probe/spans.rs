//! The exact token spans of a rendered needle prompt (the span convention of `prompt.rs`): the
//! needle and answer-value spans from the byte offsets of the final encoding, with the checks
//! that refuse a control token outside the chat markers, a value that is not unique, or a
//! token that glues non-whitespace onto a span edge. In: the rendered text, its token ids and
//! byte offsets `[tokens]`; out: the [`NeedlePrompt`].

use super::prompt::{NeedlePrompt, PromptError, Rendered};
use super::scenario::Scenario;
use crate::tokenizer::{V4Tokenizer, ASSISTANT, BOS, THINK_END, THINK_START, USER};

/// Refuses a control token (any added token of the tokenizer: tool-call, FIM, search or
/// placeholder markers, `<|EOT|>`, ...) anywhere but the chat format's own markers (BOS, the
/// User marker, the Assistant marker and the thinking token), naming the part of the prompt it
/// came from. Such text in a haystack file, the needle, the question or the system prompt is
/// split out as structure by the tokenizer, whatever the user meant.
fn check_control_tokens(
    tok: &V4Tokenizer,
    sc: &Scenario,
    r: &Rendered,
    ids: &[u32],
    offsets: &[(usize, usize)],
) -> Result<(), PromptError> {
    let body = r.body_bytes;
    let tail = ASSISTANT.len() + if sc.thinking { THINK_START } else { THINK_END }.len();
    let structural = |(a, b): (usize, usize)| {
        b <= BOS.len()
            || (a >= body.0.saturating_sub(USER.len()) && b <= body.0)
            || a >= r.text.len() - tail
    };
    for (position, (&id, &span)) in ids.iter().zip(offsets).enumerate() {
        if !tok.is_control(id) || structural(span) {
            continue;
        }
        let (part, source_text) = if span.0 < body.0 {
            ("system prompt", "the scenario's `system`".to_string())
        } else if span.0 >= r.needle_bytes.0 && span.1 <= r.needle_bytes.1 {
            (
                "needle",
                "the scenario's `needle` (or its value / key words)".to_string(),
            )
        } else if span.0 < body.1 {
            (
                "haystack",
                match &sc.haystack {
                    super::scenario::HaystackKind::File(Some(path)) => {
                        format!("the haystack file {}", path.display())
                    }
                    _ => "the scenario's haystack".to_string(),
                },
            )
        } else {
            (
                "question",
                "the scenario's `question` (or its key words)".to_string(),
            )
        };
        return Err(PromptError::ControlToken {
            scenario: sc.name.clone(),
            part,
            token: r.text[span.0..span.1].to_string(),
            id,
            position,
            source_text,
        });
    }
    Ok(())
}

/// Smallest token range covering `bytes`; checks that only whitespace is glued on.
fn span_of(
    text: &str,
    offsets: &[(usize, usize)],
    bytes: (usize, usize),
) -> Option<(usize, usize, String)> {
    let a = offsets.iter().position(|o| o.1 > bytes.0)?;
    let b = offsets.iter().rposition(|o| o.0 < bytes.1)? + 1;
    if b <= a {
        return None;
    }
    let (s, e) = (offsets[a].0.min(bytes.0), offsets[b - 1].1.max(bytes.1));
    let covered = text.get(s..e)?.to_string();
    let glued_ok = text.get(s..bytes.0)?.chars().all(char::is_whitespace)
        && text.get(bytes.1..e)?.chars().all(char::is_whitespace);
    glued_ok.then_some((a, b, covered))
}

/// Checks the final encoding (control tokens, a unique value, exact spans) and assembles the
/// [`NeedlePrompt`]: the needle and answer spans and the achieved depth.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    tok: &V4Tokenizer,
    sc: &Scenario,
    r: Rendered,
    ids: Vec<u32>,
    offsets: Vec<(usize, usize)>,
    needle_text: String,
    value: String,
    key: String,
    question: String,
    depth_pct: f64,
) -> Result<NeedlePrompt, PromptError> {
    check_control_tokens(tok, sc, &r, &ids, &offsets)?;
    let count = r.text.matches(value.as_str()).count();
    if count != 1 {
        return Err(PromptError::ValueNotUnique {
            scenario: sc.name.clone(),
            value,
            count,
            draws: 1,
        });
    }
    let mut spans = [(0, 0, String::new()), (0, 0, String::new())];
    for (i, (what, bytes, expected)) in [
        ("needle", r.needle_bytes, &needle_text),
        ("answer value", r.value_bytes, &value),
    ]
    .into_iter()
    .enumerate()
    {
        let not_exact = |found: String| PromptError::SpanNotExact {
            scenario: sc.name.clone(),
            what,
            expected: expected.clone(),
            found,
        };
        let (a, b, covered) = span_of(&r.text, &offsets, bytes).ok_or_else(|| {
            let lo = offsets.iter().position(|o| o.1 > bytes.0).unwrap_or(0);
            let hi = offsets
                .iter()
                .rposition(|o| o.0 < bytes.1)
                .map_or(lo, |h| h + 1);
            not_exact(tok.decode(&ids[lo..hi.max(lo)]).unwrap_or_default())
        })?;
        let decoded = tok.decode(&ids[a..b])?;
        if decoded != covered || decoded.trim() != expected.as_str() {
            return Err(not_exact(decoded));
        }
        spans[i] = (a, b, decoded);
    }
    let [(na, nb, needle_span_text), (aa, ab, answer_span_text)] = spans;
    // Haystack token range: tokens whose bytes lie in the body.
    let h0 = offsets
        .iter()
        .position(|o| o.0 >= r.body_bytes.0)
        .unwrap_or(0);
    let h1 = offsets
        .iter()
        .position(|o| o.0 >= r.body_bytes.1)
        .unwrap_or(offsets.len());
    let others = (h1 - h0).saturating_sub(nb - na);
    let actual_depth_pct = if others == 0 {
        depth_pct
    } else {
        100.0 * na.saturating_sub(h0) as f64 / others as f64
    };
    Ok(NeedlePrompt {
        tokens: ids,
        needle: (na, nb),
        answer: (aa, ab),
        needle_text,
        answer_value: value,
        key,
        question,
        depth_pct,
        actual_depth_pct,
        needle_span_text,
        answer_span_text,
        prompt_text: r.text,
    })
}
