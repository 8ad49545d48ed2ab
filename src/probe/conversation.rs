//! A user's own conversation as a needle prompt: the `--prompt FILE` rendered by the V4
//! encoder (`chat.rs`), encoded by the real tokenizer, with the token span of every
//! `--needle TEXT` and of the `--answer`.
//!
//! In: a [`ChatRequest`], the needle texts, the expected answer. Out: a [`NeedlePrompt`] whose
//! `needles` are in the order named (`needles[0]` is also `needle`).
//!
//! Rules (docs/prompts.md):
//! - each needle must occur exactly once in the rendered text (occurrences may overlap and are
//!   all counted); none, or several, is an error that says where each one is;
//! - its span is every token overlapping its bytes: a token that BPE merged across an edge is
//!   kept in the span and reported (`glued_before`, `glued_after`), never silently dropped or
//!   shifted;
//! - a needle inside (or holding) a special token is refused;
//! - the answer span is where `--answer` stands inside a needle (the first needle holding it),
//!   else the first needle's span;
//! - "depth" is the first needle's start as a share of the prompt's tokens.

use super::chat::{ChatRequest, RenderedChat};
use super::prompt::{NeedlePrompt, NeedleSpan, PromptError};
use crate::tokenizer::V4Tokenizer;

/// Bytes of context shown either side of an occurrence in errors and listings.
const CONTEXT_BYTES: usize = 40;

/// The prompt of `request` with `needles` located (module docs); `reserve` positions (the
/// tokens to generate) must fit after it within `max_positions`.
pub fn conversation_prompt(
    tok: &V4Tokenizer,
    request: &ChatRequest,
    needles: &[String],
    answer: Option<&str>,
    max_positions: usize,
    reserve: usize,
) -> Result<NeedlePrompt, PromptError> {
    if needles.is_empty() {
        return Err(PromptError::NoNeedle);
    }
    if let Some(index) = needles.iter().position(|n| n.is_empty()) {
        return Err(PromptError::EmptyNeedle { index: index + 1 });
    }
    let rendered = request.render();
    let source_name = request.path.display().to_string();
    let (ids, offsets) = tok.encode_with_offsets(&rendered.text)?;
    if ids.len() + reserve > max_positions {
        return Err(PromptError::PromptTooLong {
            source_name,
            tokens: ids.len(),
            plus: if reserve > 0 {
                format!(" (+{reserve} to generate)")
            } else {
                String::new()
            },
            max_positions,
        });
    }
    let mut spans = Vec::with_capacity(needles.len());
    let mut byte_ranges = Vec::with_capacity(needles.len());
    let in_special = |(s, e): (usize, usize)| {
        let (a, b) = token_span(&offsets, (s, e));
        (a..b).find(|&p| tok.is_control(ids[p]))
    };
    for needle in needles {
        let found = occurrences(&rendered.text, needle);
        // Inside special tokens only (`User` in `<｜User｜>`): refused as such below.
        let found = match found
            .iter()
            .all(|&at| in_special((at, at + needle.len())).is_some())
        {
            true => found.into_iter().take(1).collect(),
            false => found,
        };
        let start = match found.as_slice() {
            [one] => *one,
            [] => {
                return Err(PromptError::NeedleAbsent {
                    needle: needle.clone(),
                    source_name,
                    hint: absent_hint(&rendered.text, needle),
                })
            }
            many => {
                let places: Vec<String> = many
                    .iter()
                    .map(|&at| place(&rendered, &offsets, at, needle.len()))
                    .collect();
                return Err(PromptError::NeedleAmbiguous {
                    needle: needle.clone(),
                    source_name,
                    count: many.len(),
                    places: places.join("; "),
                });
            }
        };
        let bytes = (start, start + needle.len());
        let (a, b) = token_span(&offsets, bytes);
        let location = rendered.locate(start);
        if let Some(position) = in_special(bytes) {
            let (s, e) = offsets[position];
            return Err(PromptError::NeedleInSpecialToken {
                needle: needle.clone(),
                location,
                token: rendered.text[s..e].to_string(),
                id: ids[position],
                position,
            });
        }
        let span_text = tok.decode(&ids[a..b])?;
        spans.push(NeedleSpan::new(needle, (a, b), span_text, &location));
        byte_ranges.push(bytes);
    }
    let answer_value = answer.unwrap_or("").to_string();
    let answer_span = (!answer_value.is_empty())
        .then(|| {
            byte_ranges.iter().find_map(|&(s, e)| {
                let at = rendered.text[s..e].find(&answer_value)? + s;
                Some(token_span(&offsets, (at, at + answer_value.len())))
            })
        })
        .flatten()
        .unwrap_or(spans[0].span);
    let answer_span_text = tok.decode(&ids[answer_span.0..answer_span.1])?;
    let depth = 100.0 * spans[0].span.0 as f64 / ids.len() as f64;
    let depth = (depth * 10.0).round() / 10.0;
    Ok(NeedlePrompt {
        needle: spans[0].span,
        answer: answer_span,
        needle_text: spans[0].text.clone(),
        needle_span_text: spans[0].span_text.clone(),
        needles: spans,
        answer_values: if answer_value.is_empty() {
            Vec::new()
        } else {
            vec![answer_value.clone()]
        },
        answer_value,
        key: String::new(),
        question: rendered
            .question
            .clone()
            .map_or(String::new(), |q| rendered.text[q].to_string()),
        depth_pct: depth,
        actual_depth_pct: depth,
        answer_span_text,
        tokens: ids,
        prompt_text: rendered.text,
    })
}

/// Byte offsets of every occurrence of `needle` in `text`, overlapping ones included.
fn occurrences(text: &str, needle: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(needle) {
        found.push(from + i);
        // The next char boundary after this start.
        from += i + text[from + i..].chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// Every token overlapping `bytes`.
fn token_span(offsets: &[(usize, usize)], (s, e): (usize, usize)) -> (usize, usize) {
    let a = offsets
        .iter()
        .position(|o| o.1 > s)
        .unwrap_or(offsets.len());
    let b = offsets.iter().rposition(|o| o.0 < e).map_or(a, |b| b + 1);
    (a, b.max(a))
}

/// `token 1234 in messages[3]: "...context [needle] context..."`.
fn place(rendered: &RenderedChat, offsets: &[(usize, usize)], at: usize, len: usize) -> String {
    let text = &rendered.text;
    let (a, _) = token_span(offsets, (at, at + len));
    let lo = floor_boundary(text, at.saturating_sub(CONTEXT_BYTES));
    let hi = floor_boundary(text, (at + len + CONTEXT_BYTES).min(text.len()));
    format!(
        "token {a} in {}: {:?}",
        rendered.locate(at),
        format!(
            "{}[{}]{}",
            &text[lo..at],
            &text[at..at + len],
            &text[at + len..hi]
        )
    )
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// What a user probably meant when the needle is not found: a match ignoring case, or with
/// JSON escapes (a needle copied out of the request file, `\n` or `\"` included).
fn absent_hint(text: &str, needle: &str) -> String {
    let unescaped: Option<String> = serde_json::from_str(&format!("\"{needle}\"")).ok();
    if let Some(u) = unescaped.filter(|u| u != needle && text.contains(u.as_str())) {
        return format!(
            "; it occurs with its JSON escapes resolved, as {u:?}: pass the text as the prompt \
             holds it"
        );
    }
    let lower = text.to_lowercase();
    if lower.contains(&needle.to_lowercase()) {
        return "; it occurs with other letter case".into();
    }
    String::new()
}
