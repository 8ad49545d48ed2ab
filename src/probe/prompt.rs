//! The needle prompt: the V4 chat prompt of EXACTLY the requested token count, with the needle
//! at the requested depth and the exact token spans of the needle and of the answer value.
//!
//! Format (docs/spec/model.md 7.2, no Jinja; BOS written as text and recognised as a special token):
//! `<｜begin▁of▁sentence｜>{system}<｜User｜>{haystack with needle}\n\n{question}<｜Assistant｜></think>`
//! (`<think>` instead of `</think>` in thinking mode). Trailing whitespace of the haystack is
//! dropped before the `\n\n`.
//!
//! Placement: the haystack is a list of units (sentences or lines, `haystack.rs`); the needle is
//! inserted at the unit boundary whose haystack token count is nearest `depth_pct` (0 = first
//! thing after `<｜User｜>`, 100 = last thing before the question). A prose needle is preceded by
//! one space (none at the very start), a line needle ends in `\n`.
//!
//! Exact length: units are counted one by one, then a *filler* (a word prefix of fresh noise
//! sentences, about one token per word) at the haystack end FAR from the needle (the end for
//! depth <= 50, the start otherwise) absorbs the rest. Because token counts are not exactly
//! additive (e.g. `.` + `\n\n` is one token), the whole prompt is re-encoded and the filler (or
//! the number of far-end units) re-sized until the count is exact; repeated states drop a unit,
//! so the loop cannot oscillate. Nothing near the needle changes while sizing.
//!
//! Span convention (precise): spans come from the byte offsets of the final encoding. The needle
//! span `[a, b)` is the smallest token range covering the needle text's bytes;
//! `decode(tokens[a..b]) == ws1 + needle_text + ws2` where `ws1`, `ws2` are whitespace only:
//! `ws1` is the single space BPE glues to the first word (`" The"`), `ws2` the newlines glued to
//! the final punctuation (`".\n"`, `".\n\n"`). The answer span likewise covers the value's bytes
//! (digits come in 1-3 digit groups: all of them). Any token that straddles a span edge with a
//! non-whitespace character is an error, never a silently wrong span; the decode of each span is
//! re-checked against the prompt text.

mod error {
    //! [`PromptError`]: why a needle prompt could not be built; each error names the flag,
    //! scenario or field concerned.

    use crate::probe::scenario::ScenarioError;
    use crate::tokenizer::TokenizerError;

    /// Errors building a prompt; each names the flag or scenario concerned.
    #[derive(Debug, thiserror::Error)]
    pub enum PromptError {
        #[error(transparent)]
        Tokenizer(#[from] TokenizerError),
        #[error(transparent)]
        Scenario(#[from] ScenarioError),
        #[error(transparent)]
        Chat(#[from] crate::probe::chat::ChatError),
        #[error("--needle: expected at least one needle (the text the model loses, as it stands in the prompt), found none")]
        NoNeedle,
        #[error(
            "--needle #{index}: empty; expected the text of a needle as it stands in the prompt"
        )]
        EmptyNeedle { index: usize },
        #[error("--needle {needle:?} does not occur in the rendered prompt of {source_name}; expected it exactly once, as it stands there (case, spaces and escapes included){hint}")]
        NeedleAbsent {
            needle: String,
            source_name: String,
            hint: String,
        },
        #[error("--needle {needle:?} occurs {count} times in the rendered prompt of {source_name}, expected exactly once (lengthen it until it is unique): {places}")]
        NeedleAmbiguous {
            needle: String,
            source_name: String,
            count: usize,
            places: String,
        },
        #[error("--needle {needle:?} (in {location}) lies inside or holds the special token {token:?} (id {id}) at prompt position {position}: a special token is structure the model reads, not text; expected a needle of plain text")]
        NeedleInSpecialToken {
            needle: String,
            location: String,
            token: String,
            id: u32,
            position: usize,
        },
        #[error("--prompt {source_name}: the rendered prompt has {tokens} tokens{plus}, over the model's max_position_embeddings ({max_positions})")]
        PromptTooLong {
            source_name: String,
            tokens: usize,
            plus: String,
            max_positions: usize,
        },
        #[error("--needles {found}: scenario {scenario} needs {why}")]
        NeedleCount {
            found: usize,
            scenario: String,
            why: String,
        },
        #[error("--depth: expected a percentage in 0..=100, found {found}")]
        Depth { found: f64 },
        #[error("--length {target}: too short for scenario {scenario}: the chat template, needle and question alone take {minimum} tokens (minimum length {minimum})")]
        TooShort {
            target: usize,
            scenario: String,
            minimum: usize,
        },
        #[error("--length {target}: over the model's max_position_embeddings ({max_positions})")]
        TooLong { target: usize, max_positions: usize },
        #[error("--length {target}: could not size scenario {scenario}'s haystack to exactly {target} tokens with any of the {draws} needle values drawn for this seed (closest {closest}): its pieces cannot add up to that count; expected a --length it can reach, such as {closest}")]
        LengthNotReached {
            target: usize,
            scenario: String,
            closest: usize,
            /// Needle values tried.
            draws: usize,
        },
        #[error("scenario {scenario}: the {what} does not start and end on token boundaries: expected span text {expected:?} (up to glued whitespace), found {found:?}; put a space before and after {{value}} in the needle (punctuation glued to a word merges with it)")]
        SpanNotExact {
            scenario: String,
            what: &'static str,
            expected: String,
            found: String,
        },
        #[error("scenario {scenario}: the {part} contains the control token {token:?} (id {id}) at prompt position {position}: expected plain text there (control tokens are the chat format's, and the model reads them as structure, not text); remove it from {source_text}")]
        ControlToken {
            scenario: String,
            part: &'static str,
            token: String,
            id: u32,
            position: usize,
            source_text: String,
        },
        #[error("--length {target}: scenario {scenario}: none of the first {tried} sentences of the haystack file {} fits in the {budget} tokens left for the haystack; expected a longer --length (or shorter sentences at the start of the file)", .path.display())]
        FileDoesNotFit {
            scenario: String,
            path: std::path::PathBuf,
            budget: usize,
            target: usize,
            tried: usize,
        },
        #[error("--length {target}: scenario {scenario}: its kv haystack needs more distinct keys and values than its generators give (a line would repeat a key, or the needle's key or value, so the question would have no single answer); expected a larger key/value space ({fields}) or a shorter --length")]
        KeySpaceExhausted {
            scenario: String,
            target: usize,
            fields: &'static str,
        },
        #[error("scenario {scenario}: the value {value:?} occurs {count} times in the prompt, expected exactly once, and so did each of the {draws} values drawn for this seed: the haystack holds the values the scenario's value generator draws; expected a haystack without them, or a value with more possible values (value.n, value.words)")]
        ValueNotUnique {
            scenario: String,
            value: String,
            count: usize,
            /// Needle values tried.
            draws: usize,
        },
    }
}
use super::haystack::{fill, HaystackGen, HaystackLayout, Unit};
use super::scenario::{Ask, Scenario};
use crate::probe::chat::{ChatFormat, ChatRequest, ChatRole, SYSTEM};
use crate::tokenizer::{TokenizerError, V4Tokenizer, ASSISTANT, BOS, THINK_END, THINK_START, USER};
pub use error::PromptError;

/// One needle of a prompt: its text and token span.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NeedleSpan {
    /// The needle text, as named or placed.
    pub text: String,
    /// Token span `[a, b)`: every token that overlaps the text's bytes.
    pub span: (usize, usize),
    /// `decode(tokens[span])`: `glued_before + text + glued_after`.
    pub span_text: String,
    /// Text outside the needle that BPE merged into its first token (`" "` before a word),
    /// empty when the needle starts on a token boundary.
    pub glued_before: String,
    /// Text outside the needle merged into its last token, empty when it ends on a boundary.
    pub glued_after: String,
    /// Where it sits: `haystack` in a scenario's prompt, `messages[3]` in a conversation.
    pub location: String,
}

impl NeedleSpan {
    /// The span from `span_text` (which holds `text` once, with only glued text around it).
    pub fn new(text: &str, span: (usize, usize), span_text: String, location: &str) -> Self {
        let at = span_text.find(text).unwrap_or(0);
        let end = (at + text.len()).min(span_text.len());
        NeedleSpan {
            text: text.to_string(),
            span,
            glued_before: span_text[..at].to_string(),
            glued_after: span_text[end..].to_string(),
            span_text,
            location: location.to_string(),
        }
    }
}

/// A rendered needle prompt.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NeedlePrompt {
    /// Prompt token ids, BOS first; `tokens.len()` is the requested length.
    pub tokens: Vec<u32>,
    /// The first needle's token span `[a, b)` (= `needles[0].span`).
    pub needle: (usize, usize),
    /// Every needle, in order (one for a single-needle scenario); each is ranked on its own.
    pub needles: Vec<NeedleSpan>,
    /// Answer value token span `[a, b)`, inside the needle span.
    pub answer: (usize, usize),
    /// The needle sentence (value and key substituted), no surrounding whitespace.
    pub needle_text: String,
    /// The value the model must reproduce (the asked values joined by ", " with `--ask all`).
    pub answer_value: String,
    /// Every value the answer must hold: one, or each needle's with `--ask all`.
    pub answer_values: Vec<String>,
    /// The kv key asked for ("" when the scenario has none).
    pub key: String,
    /// The question as asked.
    pub question: String,
    /// Requested depth in percent.
    pub depth_pct: f64,
    /// Achieved depth: haystack tokens before the needle / all haystack tokens, in percent.
    pub actual_depth_pct: f64,
    /// `decode(tokens[needle])`: `needle_text` plus glued whitespace (module docs).
    pub needle_span_text: String,
    /// `decode(tokens[answer])`: the value plus glued whitespace.
    pub answer_span_text: String,
    /// The full prompt text (its encoding is `tokens`).
    pub prompt_text: String,
}

impl NeedlePrompt {
    /// Where this prompt put its needle, as a cell's record says it; `target_tokens` is the
    /// length asked for.
    pub fn place(&self, target_tokens: usize) -> crate::record::PromptPlace {
        crate::record::PromptPlace {
            target_tokens,
            prompt_tokens: self.tokens.len(),
            depth_pct: self.depth_pct,
            needle: self.needle,
            answer: self.answer,
        }
    }
}

/// Where the filler goes: the haystack end far from the needle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum FarEnd {
    Start,
    End,
}

/// Whole units are added at the far end while the filler would exceed this many tokens.
const FILLER_MAX: usize = 96;
const MAX_ROUNDS: usize = 40;
/// Units tried after the first that does not fit, before the filler takes over.
const MAX_MISSES: usize = 8;

/// The prompt text with the byte ranges of the needle, its answer value and the haystack body.
pub(super) struct Rendered {
    pub(super) text: String,
    /// Per needle.
    pub(super) needle_bytes: Vec<(usize, usize)>,
    /// Per needle: its value.
    pub(super) value_bytes: Vec<(usize, usize)>,
    pub(super) body_bytes: (usize, usize),
    /// Bytes of the chat markers that open the text (the frame's `lead`).
    pub(super) lead: usize,
}

/// Achieved depths within this many percentage points of the request are accepted at once.
const DEPTH_TOLERANCE_PCT: f64 = 1.0;
/// Placements tried per prompt (each aims past the last miss); the closest one is kept.
const DEPTH_ROUNDS: usize = 4;

/// How many needles a scenario's prompt holds and which one its question asks for
/// (`--needles N`, `--ask`): the first at the requested depth, the others evenly spaced after
/// it (needle i at `depth + i * (100 - depth) / N` percent of the haystack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeedleCount {
    pub count: usize,
    pub ask: Ask,
}

impl Default for NeedleCount {
    fn default() -> Self {
        NeedleCount {
            count: 1,
            ask: Ask::First,
        }
    }
}

/// Builds the prompt for `sc` of exactly `target_tokens` tokens with the needle at `depth_pct`.
///
/// Unit token counts are not additive (BPE merges across unit boundaries, most of all with
/// short haystack lines), so the needle can land off the requested depth; the placement is
/// redone aiming past the miss (at most `DEPTH_ROUNDS` times) and the closest prompt is kept
/// (`actual_depth_pct` says where it is).
///
/// A value that would occur more than once in the prompt (a haystack file holding it), or with
/// which the exact length cannot be reached, is redrawn from the seed's next value stream (at
/// most `VALUE_DRAWS` values, the same ones on every run), so a sweep never stops at one cell
/// of a grid whose other cells build.
pub fn build_prompt(
    tok: &V4Tokenizer,
    sc: &Scenario,
    target_tokens: usize,
    depth_pct: f64,
    seed: u64,
    max_positions: usize,
) -> Result<NeedlePrompt, PromptError> {
    build_prompt_with(
        tok,
        sc,
        target_tokens,
        depth_pct,
        seed,
        max_positions,
        NeedleCount::default(),
    )
}

/// [`build_prompt`] with `needles.count` needles (values and keys all distinct; draw `d` of
/// needle `i` is the seed's value stream `d * count + i`, so one needle draws as before).
pub fn build_prompt_with(
    tok: &V4Tokenizer,
    sc: &Scenario,
    target_tokens: usize,
    depth_pct: f64,
    seed: u64,
    max_positions: usize,
    needles: NeedleCount,
) -> Result<NeedlePrompt, PromptError> {
    build_prompt_for(
        &PromptSpec {
            scenario: sc,
            format: ChatFormat::V4,
            target_tokens,
            depth_pct,
            seed,
            max_positions,
            needles,
        },
        tok,
    )
}

/// Everything a scenario's prompt is built from.
#[derive(Clone, Copy, Debug)]
pub struct PromptSpec<'a> {
    pub scenario: &'a Scenario,
    /// Whose chat format frames it: DeepSeek-V4's, or DeepSeek-V4.1's (its system marker and
    /// reasoning-effort line, exactly as `probe::chat` renders the same conversation).
    pub format: ChatFormat,
    pub target_tokens: usize,
    pub depth_pct: f64,
    pub seed: u64,
    pub max_positions: usize,
    pub needles: NeedleCount,
}

/// [`build_prompt_with`] in the chat format of `spec.format`.
pub fn build_prompt_for(spec: &PromptSpec, tok: &V4Tokenizer) -> Result<NeedlePrompt, PromptError> {
    let PromptSpec {
        scenario: sc,
        format,
        target_tokens,
        depth_pct,
        seed,
        max_positions,
        needles,
    } = *spec;
    if needles.count == 0 {
        return Err(PromptError::NeedleCount {
            found: 0,
            scenario: sc.name.clone(),
            why: "at least one needle".into(),
        });
    }
    let mut last = None;
    for draw in 0..VALUE_DRAWS {
        let built = build_prompt_draw(
            tok,
            (sc, format),
            target_tokens,
            (depth_pct, seed, draw),
            max_positions,
            needles,
        );
        match built {
            Err(
                e @ (PromptError::ValueNotUnique { .. } | PromptError::LengthNotReached { .. }),
            ) => last = Some(e),
            done => return done,
        }
    }
    let mut err = last.expect("at least one draw");
    if let PromptError::ValueNotUnique { draws, .. } | PromptError::LengthNotReached { draws, .. } =
        &mut err
    {
        *draws = VALUE_DRAWS;
    }
    Err(err)
}

/// Values tried per prompt (see [`build_prompt`]).
const VALUE_DRAWS: usize = 8;

/// [`build_prompt`] with the `draw`-th values of the seed.
fn build_prompt_draw(
    tok: &V4Tokenizer,
    (sc, format): (&Scenario, ChatFormat),
    target_tokens: usize,
    (depth_pct, seed, draw): (f64, u64, usize),
    max_positions: usize,
    needles: NeedleCount,
) -> Result<NeedlePrompt, PromptError> {
    let mut aim = depth_pct;
    let mut best: Option<NeedlePrompt> = None;
    for _ in 0..DEPTH_ROUNDS {
        let placed = place_needle(
            tok,
            (sc, format),
            target_tokens,
            (depth_pct, aim),
            (seed, draw),
            max_positions,
            needles,
        );
        let p = match placed {
            Ok(p) => p,
            // A later aim that cannot be sized keeps the earlier, valid prompt.
            Err(_) if best.is_some() => break,
            Err(e) => return Err(e),
        };
        let miss = p.actual_depth_pct - depth_pct;
        if miss.abs() <= DEPTH_TOLERANCE_PCT {
            return Ok(p);
        }
        aim = (aim - miss).clamp(0.0, 100.0);
        if best
            .as_ref()
            .is_none_or(|b| (b.actual_depth_pct - depth_pct).abs() > miss.abs())
        {
            best = Some(p);
        }
    }
    Ok(best.expect("at least one round"))
}

/// The question of a prompt with `keys` (one per needle) under `needles.ask`.
fn question_for(
    sc: &Scenario,
    keys: &[String],
    needles: NeedleCount,
) -> Result<String, PromptError> {
    if needles.count == 1 {
        return Ok(fill(&sc.question, &keys[0], ""));
    }
    let (template, key) = match needles.ask {
        Ask::First => (&sc.ask.first, keys[0].clone()),
        Ask::Last => (&sc.ask.last, keys[keys.len() - 1].clone()),
        Ask::All => (&sc.ask.all, String::new()),
    };
    let Some(template) = template else {
        return Err(PromptError::NeedleCount {
            found: needles.count,
            scenario: sc.name.clone(),
            why: format!(
                "a question for --ask {}: the scenario has no needles.ask_{} (and its question \
                 names no {{key}}); passkey and kv-retrieval have them",
                needles.ask.name(),
                needles.ask.name()
            ),
        });
    };
    Ok(template
        .replace("{keys}", &keys.join(", "))
        .replace("{key}", &key))
}

/// One placement: the first needle at the unit boundary nearest `aim_pct` of the haystack's
/// summed unit counts, the others at theirs after it; `depth_pct` (the request) is what the
/// prompt records.
///
/// Phases (each a helper below, in this order): check the request, draw the needles, build the
/// chat frame, measure the empty prompt, collect the haystack units that fit, cut them at the
/// needles' depths, size the far end to the exact length, check and span the final encoding.
fn place_needle(
    tok: &V4Tokenizer,
    (sc, format): (&Scenario, ChatFormat),
    target_tokens: usize,
    (depth_pct, aim_pct): (f64, f64),
    (seed, draw): (u64, usize),
    max_positions: usize,
    plan: NeedleCount,
) -> Result<NeedlePrompt, PromptError> {
    let p = Placement {
        tok,
        sc,
        target_tokens,
        depth_pct,
        aim_pct,
    };
    p.check_request(max_positions)?;
    let needles = p.draw_needles((seed, draw), plan)?;
    let mut gen = HaystackGen::new(sc, seed, &needles.keys, &needles.values)?;
    let frame = Frame::new(sc, format, &needles, gen.layout());
    let minimum = p.minimum_tokens(&frame)?;
    let budget = target_tokens - minimum;
    let collected = p.collect_units(&mut gen, budget)?;
    let room = (budget - collected.used) as i64;
    let haystack = p.arrange(collected.units, collected.used, plan.count);
    let (rendered, encoding) =
        p.size_exactly(&frame, &mut gen, haystack, collected.pending, room, minimum)?;
    p.finish(&needles, rendered, encoding)
}

/// The fixed inputs of one placement, shared by its phases.
struct Placement<'a> {
    tok: &'a V4Tokenizer,
    sc: &'a Scenario,
    target_tokens: usize,
    /// The requested depth in percent (what the prompt records).
    depth_pct: f64,
    /// Where the first needle is aimed, in percent (the request, or past an earlier miss).
    aim_pct: f64,
}

/// The needles of one placement, drawn from the seed, and the question that asks for them.
struct DrawnNeedles {
    /// Per needle: its sentence (value and key substituted).
    texts: Vec<String>,
    /// Per needle: its value.
    values: Vec<String>,
    /// Per needle: its key ("" when the scenario has none).
    keys: Vec<String>,
    /// Per needle: the byte offset of its value in its sentence.
    value_offsets: Vec<usize>,
    /// The needles the question asks for, in order (the answer holds their values).
    asked: Vec<usize>,
    /// The question as asked.
    question: String,
}

/// The fixed parts of a rendered prompt: the chat frame around the body and the needle units.
struct Frame<'a> {
    needles: &'a DrawnNeedles,
    /// Per needle: its sentence as a haystack unit (a prose needle after a space, a line needle
    /// ending in `\n`).
    units: Vec<Unit>,
    layout: HaystackLayout,
    /// BOS, the system prompt and the User marker.
    prefix: String,
    /// Bytes of the chat markers that open `prefix` (BOS, and DeepSeek-V4.1's system marker).
    lead: usize,
    /// The question, the Assistant marker and the thinking token.
    suffix: String,
}

/// Whole haystack units that fit a token budget, each with its token count alone.
struct Collected {
    units: Vec<(Unit, usize)>,
    /// The units' summed token counts.
    used: usize,
    /// The last unit drawn that did not fit (placed first when units are added later).
    pending: Option<(Unit, usize)>,
}

/// The haystack units of a placement around its needles: before the first needle, between
/// needle i and i + 1 (`gaps[i]`), after the last. The far ends carry their token counts (the
/// sizing moves whole units there).
struct Arranged {
    before: Vec<(Unit, usize)>,
    gaps: Vec<Vec<Unit>>,
    after: Vec<(Unit, usize)>,
}

/// The token ids of a prompt and the byte range of each.
type Encoding = (Vec<u32>, Vec<(usize, usize)>);

impl Placement<'_> {
    /// Token count of `s` encoded alone.
    fn count(&self, s: &str) -> Result<usize, TokenizerError> {
        self.tok.encode(s).map(|v| v.len())
    }

    /// Phase 1: refuses a depth outside 0..=100 and a length beyond the model's positions.
    fn check_request(&self, max_positions: usize) -> Result<(), PromptError> {
        if !(0.0..=100.0).contains(&self.depth_pct) {
            return Err(PromptError::Depth {
                found: self.depth_pct,
            });
        }
        if self.target_tokens > max_positions {
            return Err(PromptError::TooLong {
                target: self.target_tokens,
                max_positions,
            });
        }
        Ok(())
    }

    /// Phase 2: draws every needle's value and key (distinct), its sentence, and the question.
    fn draw_needles(
        &self,
        (seed, draw): (u64, usize),
        plan: NeedleCount,
    ) -> Result<DrawnNeedles, PromptError> {
        let sc = self.sc;
        let n = plan.count;
        let drawn: Vec<(String, String)> = (0..n)
            .map(|i| sc.generate_value_draw(seed, draw * n + i))
            .collect();
        // Several needles need distinct values (and keys): redrawn like a value the haystack
        // holds.
        for (i, (value, key)) in drawn.iter().enumerate() {
            if drawn[..i]
                .iter()
                .any(|(v, k)| v == value || (!key.is_empty() && k == key))
            {
                return Err(PromptError::ValueNotUnique {
                    scenario: sc.name.clone(),
                    value: value.clone(),
                    count: 2,
                    draws: 1,
                });
            }
        }
        let values: Vec<String> = drawn.iter().map(|(v, _)| v.clone()).collect();
        let keys: Vec<String> = drawn.iter().map(|(_, k)| k.clone()).collect();
        let texts: Vec<String> = drawn.iter().map(|(v, k)| fill(&sc.needle, k, v)).collect();
        let value_offsets: Vec<usize> = keys
            .iter()
            .map(|k| fill(sc.needle.split("{value}").next().unwrap_or(""), k, "").len())
            .collect();
        let question = question_for(sc, &keys, plan)?;
        let asked: Vec<usize> = match (n, plan.ask) {
            (1, _) | (_, Ask::First) => vec![0],
            (_, Ask::Last) => vec![n - 1],
            (_, Ask::All) => (0..n).collect(),
        };
        Ok(DrawnNeedles {
            texts,
            values,
            keys,
            value_offsets,
            asked,
            question,
        })
    }

    /// Phase 4: the token count with an empty haystack, refused when above the target.
    fn minimum_tokens(&self, frame: &Frame<'_>) -> Result<usize, PromptError> {
        let n = frame.units.len();
        let no_gaps: Vec<Vec<Unit>> = vec![Vec::new(); n.saturating_sub(1)];
        let minimum = self.count(&frame.render(&[], &no_gaps, &[], &None, FarEnd::End).text)?;
        if self.target_tokens < minimum {
            return Err(PromptError::TooShort {
                target: self.target_tokens,
                scenario: self.sc.name.clone(),
                minimum,
            });
        }
        Ok(minimum)
    }

    /// Phase 5: whole haystack units while they fit `budget` tokens, counted one by one.
    fn collect_units(
        &self,
        gen: &mut HaystackGen,
        budget: usize,
    ) -> Result<Collected, PromptError> {
        let mut units: Vec<(Unit, usize)> = Vec::new();
        let mut used = 0usize;
        let mut misses = 0;
        let mut pending: Option<(Unit, usize)> = None;
        while misses < MAX_MISSES {
            let u = gen.next_unit();
            let c = self.count(&format!("{}{}", u.sep, u.text))?;
            if used + c > budget {
                // Long units (tool definitions): try a few more that may still fit, so the
                // filler stays small.
                misses += 1;
                pending = Some((u, c));
                continue;
            }
            used += c;
            units.push((u, c));
        }
        // A user's text that does not fit at all would be silently replaced by generated filler.
        if let (true, super::scenario::HaystackKind::File(path)) =
            (units.is_empty() && budget > 0, &self.sc.haystack)
        {
            return Err(PromptError::FileDoesNotFit {
                scenario: self.sc.name.clone(),
                path: path.clone().unwrap_or_default(),
                budget,
                target: self.target_tokens,
                tried: MAX_MISSES,
            });
        }
        Ok(Collected {
            units,
            used,
            pending,
        })
    }

    /// Phase 6: cuts the units at the boundaries nearest the needles' depths.
    ///
    /// `units` hold `used` tokens in all; of the `n` needles the first goes at the aim, the
    /// others evenly spaced after the requested depth, each at or after the one before.
    fn arrange(&self, mut units: Vec<(Unit, usize)>, used: usize, n: usize) -> Arranged {
        let depth_pct = self.depth_pct;
        let mut splits = Vec::with_capacity(n);
        let mut from = 0;
        for i in 0..n {
            let pct = if i == 0 {
                self.aim_pct
            } else {
                depth_pct + i as f64 * (100.0 - depth_pct) / n as f64
            };
            let goal = pct / 100.0 * used as f64;
            let mut acc: usize = units[..from].iter().map(|u| u.1).sum();
            let (mut split, mut best) = (from, f64::INFINITY);
            for j in from..=units.len() {
                let d = (acc as f64 - goal).abs();
                if d < best {
                    (best, split) = (d, j);
                }
                if j < units.len() {
                    acc += units[j].1;
                }
            }
            splits.push(split);
            from = split;
        }
        let after: Vec<(Unit, usize)> = units.split_off(splits[n - 1]);
        let mut gaps: Vec<Vec<Unit>> = Vec::with_capacity(n - 1);
        for i in (1..n).rev() {
            gaps.push(
                units
                    .split_off(splits[i - 1])
                    .into_iter()
                    .map(|(u, _)| u)
                    .collect(),
            );
        }
        gaps.reverse();
        Arranged {
            before: units,
            gaps,
            after,
        }
    }

    /// Phase 7: sizes the far end (whole units, then the filler) to exactly the target count.
    ///
    /// The filler takes the `room` tokens the units leave; far-end units move while it would be
    /// negative or large. Returns the prompt with its encoding. `minimum` is the empty
    /// haystack's count (the closest length so far, for the error).
    fn size_exactly(
        &self,
        frame: &Frame<'_>,
        gen: &mut HaystackGen,
        haystack: Arranged,
        mut pending: Option<(Unit, usize)>,
        room: i64,
        minimum: usize,
    ) -> Result<(Rendered, Encoding), PromptError> {
        let (tok, sc, target_tokens) = (self.tok, self.sc, self.target_tokens);
        let layout = frame.layout;
        let Arranged {
            mut before,
            gaps,
            mut after,
        } = haystack;
        let mut far = if self.depth_pct <= 50.0 {
            FarEnd::End
        } else {
            FarEnd::Start
        };
        let mut r = room;
        let mut seen = std::collections::HashSet::new();
        let mut closest = minimum;
        // Once a unit had to be dropped to break a cycle, units are never added again, so the
        // filler (which can take any size) absorbs the rest and the loop terminates.
        let mut frozen = false;
        for _ in 0..MAX_ROUNDS {
            // Keep the filler's share small and non-negative by moving whole far-end units.
            while r < 0 {
                let Some((_, c)) = take_far(&mut before, &mut after, far) else {
                    break;
                };
                r += c as i64;
            }
            while !frozen && r as usize > FILLER_MAX {
                let (u, c) = match pending.take() {
                    Some(p) => p,
                    None => {
                        let u = gen.next_unit();
                        let c = self.count(&format!("{}{}", u.sep, u.text))?;
                        (u, c)
                    }
                };
                if c as i64 > r {
                    pending = Some((u, c));
                    break;
                }
                r -= c as i64;
                match far {
                    FarEnd::End => after.push((u, c)),
                    FarEnd::Start => before.insert(0, (u, c)),
                }
            }
            if r < 0 {
                break;
            }
            let filler = if seen.insert((before.len(), after.len(), r, far)) {
                make_filler(tok, gen, r as usize, far, layout)?
            } else {
                None
            };
            let Some(filler) = filler else {
                // A cycle (e.g. `.` + `\n\n` merging only without a filler) or no exact filler:
                // give the filler one more far-end unit's worth of room, or use the other end
                // when this one has nothing left.
                frozen = true;
                match take_far(&mut before, &mut after, far) {
                    Some((_, c)) => r += c as i64,
                    None if far == FarEnd::Start => far = FarEnd::End,
                    None => far = FarEnd::Start,
                }
                continue;
            };
            let b: Vec<Unit> = before.iter().map(|(u, _)| u.clone()).collect();
            let a: Vec<Unit> = after.iter().map(|(u, _)| u.clone()).collect();
            let rendered = frame.render(&b, &gaps, &a, &filler, far);
            let (ids, offsets) = tok.encode_with_offsets(&rendered.text)?;
            if ids.len().abs_diff(target_tokens) < closest.abs_diff(target_tokens) {
                closest = ids.len();
            }
            if ids.len() == target_tokens {
                if gen.exhausted() {
                    return Err(PromptError::KeySpaceExhausted {
                        scenario: sc.name.clone(),
                        target: target_tokens,
                        fields: if sc.key.is_some() {
                            "key.n / key.words (and value)"
                        } else {
                            "value.n / value.words"
                        },
                    });
                }
                return Ok((rendered, (ids, offsets)));
            }
            r += target_tokens as i64 - ids.len() as i64;
        }
        Err(PromptError::LengthNotReached {
            target: target_tokens,
            scenario: sc.name.clone(),
            closest,
            draws: 1,
        })
    }
}

impl<'a> Frame<'a> {
    /// Phase 3: the chat frame around the body and the needle units in the haystack's `layout`.
    fn new(
        sc: &Scenario,
        format: ChatFormat,
        needles: &'a DrawnNeedles,
        layout: HaystackLayout,
    ) -> Self {
        let units: Vec<Unit> = needles
            .texts
            .iter()
            .map(|text| Unit {
                sep: if layout == HaystackLayout::Prose {
                    " ".into()
                } else {
                    String::new()
                },
                text: if layout == HaystackLayout::Lines {
                    format!("{text}\n")
                } else {
                    text.clone()
                },
            })
            .collect();
        let (prefix, suffix, lead) = match format {
            ChatFormat::V4 => (
                format!("{BOS}{}{USER}", sc.system.as_deref().unwrap_or("")),
                format!(
                    "\n\n{}{ASSISTANT}{}",
                    needles.question,
                    if sc.thinking { THINK_START } else { THINK_END }
                ),
                BOS.len(),
            ),
            ChatFormat::V41 => v41_frame(sc, &needles.question),
        };
        Frame {
            needles,
            units,
            layout,
            prefix,
            lead,
            suffix,
        }
    }

    /// The prompt with the body `[filler] before needle_0 gaps[0] needle_1 ... needle_{n-1}
    /// after [filler]` (the filler at the `far` end), and its byte ranges.
    fn render(
        &self,
        before: &[Unit],
        gaps: &[Vec<Unit>],
        after: &[Unit],
        filler: &Option<Unit>,
        far: FarEnd,
    ) -> Rendered {
        let (n, layout, needles) = (self.units.len(), self.layout, self.needles);
        let mut body = String::new();
        let mut needle_at = vec![0; n];
        // (unit, Some(needle index)), the filler marked by `true`.
        let mut items: Vec<(&Unit, Option<usize>, bool)> = Vec::new();
        if let (Some(f), FarEnd::Start) = (filler, far) {
            items.push((f, None, true));
        }
        items.extend(before.iter().map(|u| (u, None, false)));
        for (i, needle) in self.units.iter().enumerate() {
            if i > 0 {
                items.extend(gaps[i - 1].iter().map(|u| (u, None, false)));
            }
            items.push((needle, Some(i), false));
        }
        items.extend(after.iter().map(|u| (u, None, false)));
        if let (Some(f), FarEnd::End) = (filler, far) {
            items.push((f, None, true));
        }
        // A unit that continues its predecessor's text (a file without spaces) must not glue
        // to a needle (whose last token would merge with it) or to the generated filler.
        let mut after_inserted = false;
        for (u, needle, is_filler) in items {
            if !body.is_empty() {
                body.push_str(&u.sep);
                if after_inserted && u.sep.is_empty() && layout == HaystackLayout::Prose {
                    body.push(' ');
                }
            }
            if let Some(i) = needle {
                needle_at[i] = body.len();
            }
            after_inserted = needle.is_some() || is_filler;
            body.push_str(&u.text);
        }
        let body = body.trim_end();
        let (prefix, suffix) = (&self.prefix, &self.suffix);
        let text = format!("{prefix}{body}{suffix}");
        let at = |i: usize| prefix.len() + needle_at[i];
        Rendered {
            needle_bytes: (0..n)
                .map(|i| (at(i), at(i) + needles.texts[i].len()))
                .collect(),
            value_bytes: (0..n)
                .map(|i| {
                    let v = at(i) + needles.value_offsets[i];
                    (v, v + needles.values[i].len())
                })
                .collect(),
            body_bytes: (prefix.len(), prefix.len() + body.len()),
            lead: self.lead,
            text,
        }
    }
}

/// Removes the unit at the far end (the other end's outermost unit when that side is empty).
fn take_far(
    before: &mut Vec<(Unit, usize)>,
    after: &mut Vec<(Unit, usize)>,
    far: FarEnd,
) -> Option<(Unit, usize)> {
    let front = |v: &mut Vec<(Unit, usize)>| (!v.is_empty()).then(|| v.remove(0));
    match far {
        FarEnd::End => after.pop().or_else(|| front(before)),
        FarEnd::Start => front(before).or_else(|| after.pop()),
    }
}

/// A filler unit whose standalone token count (as rendered at `far`) is exactly `r`.
fn make_filler(
    tok: &V4Tokenizer,
    gen: &mut HaystackGen,
    r: usize,
    far: FarEnd,
    layout: HaystackLayout,
) -> Result<Option<Option<Unit>>, TokenizerError> {
    if r == 0 {
        return Ok(Some(None));
    }
    // Rendered form: prose gets a leading space except at the very start; a line filler at
    // the start ends in `\n` (the next line must not glue to it); at the end the haystack's
    // trailing whitespace is trimmed anyway.
    let lead = if far == FarEnd::End && layout == HaystackLayout::Prose {
        " "
    } else {
        ""
    };
    let tail = if far == FarEnd::Start && layout == HaystackLayout::Lines {
        "\n"
    } else {
        ""
    };
    let count = |s: &str| tok.encode(&format!("{lead}{s}{tail}")).map(|v| v.len());
    for _ in 0..24 {
        // A stream of filler words long enough for r tokens (sentence ends keep their `.`).
        let mut words: Vec<String> = Vec::new();
        while words.len() < r + 8 {
            let mut w = gen.filler_words();
            if let Some(last) = w.last_mut() {
                last.push('.');
            }
            words.extend(w);
        }
        // The first k words without trailing punctuation (which could glue to a following
        // `\n\n`): the count never decreases with k, so a binary search finds the k whose
        // count is r, if there is one.
        let candidate = |k: usize| {
            let s = words[..k].join(" ");
            s.trim_end_matches(|c: char| c.is_ascii_punctuation())
                .to_string()
        };
        let (mut lo, mut hi) = (1usize, words.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if count(&candidate(mid))? < r {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let text = candidate(lo);
        if !text.is_empty() && count(&text)? == r {
            let sep = if layout == HaystackLayout::Prose {
                " "
            } else {
                ""
            };
            return Ok(Some(Some(Unit {
                sep: sep.into(),
                text: format!("{text}{tail}"),
            })));
        }
    }
    Ok(None)
}

/// DeepSeek-V4.1's frame of a scenario prompt, rendered by its encoder (`probe::chat`) around a
/// placeholder body so that prompt and conversation agree byte for byte: `(prefix, suffix,
/// bytes of the opening markers)`. The system message (and, in thinking mode, the effort line)
/// follows `<｜System｜>`; the user turn holds the body, `\n\n` and the question.
fn v41_frame(sc: &Scenario, question: &str) -> (String, String, usize) {
    const BODY: &str = "\u{0}";
    let mut request = ChatRequest::from_text(
        &format!("{BODY}\n\n{question}"),
        std::path::Path::new(&sc.source),
    );
    request.format = ChatFormat::V41;
    request.thinking = sc.thinking;
    if let Some(system) = &sc.system {
        let mut m = request.messages[0].clone();
        m.role = ChatRole::System;
        m.content = system.clone();
        request.messages.insert(0, m);
    }
    let text = request.render().text;
    let (prefix, suffix) = text
        .split_once(BODY)
        .expect("the body placeholder is rendered");
    let lead = BOS.len()
        + if prefix[BOS.len()..].starts_with(SYSTEM) {
            SYSTEM.len()
        } else {
            0
        };
    (prefix.to_string(), suffix.to_string(), lead)
}

// ---------------------------------------------------------------------------------------------
// The exact token spans of a rendered needle prompt (the span convention of `prompt.rs`): the
// needle and answer-value spans from the byte offsets of the final encoding, with the checks
// that refuse a control token outside the chat markers, a value that is not unique, or a
// token that glues non-whitespace onto a span edge. In: the rendered text, its token ids and
// byte offsets `[tokens]`; out: the [`NeedlePrompt`].

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
        b <= r.lead
            || (a >= body.0.saturating_sub(USER.len()) && b <= body.0)
            || a >= r.text.len() - tail
    };
    for (position, (&id, &span)) in ids.iter().zip(offsets).enumerate() {
        if !tok.is_control(id) || structural(span) {
            continue;
        }
        let (part, source_text) = if span.0 < body.0 {
            ("system prompt", "the scenario's `system`".to_string())
        } else if r
            .needle_bytes
            .iter()
            .any(|n| span.0 >= n.0 && span.1 <= n.1)
        {
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

impl Placement<'_> {
    /// Phase 8: checks the final encoding and assembles the [`NeedlePrompt`] with its spans.
    ///
    /// Checks: control tokens, unique values, exact spans. Assembles each needle's span, the
    /// answer span (of the first asked needle's value) and the achieved depth of the first
    /// needle.
    fn finish(
        &self,
        needles: &DrawnNeedles,
        r: Rendered,
        (ids, offsets): Encoding,
    ) -> Result<NeedlePrompt, PromptError> {
        let (tok, sc, depth_pct) = (self.tok, self.sc, self.depth_pct);
        let asked = &needles.asked;
        check_control_tokens(tok, sc, &r, &ids, &offsets)?;
        for value in &needles.values {
            let count = r.text.matches(value.as_str()).count();
            if count != 1 {
                return Err(PromptError::ValueNotUnique {
                    scenario: sc.name.clone(),
                    value: value.clone(),
                    count,
                    draws: 1,
                });
            }
        }
        // (needle span, value span) of each needle, with their decoded text.
        let mut spans = Vec::with_capacity(needles.texts.len());
        for (i, (text, value)) in needles.texts.iter().zip(&needles.values).enumerate() {
            let mut pair = Vec::with_capacity(2);
            for (what, bytes, expected) in [
                ("needle", r.needle_bytes[i], text),
                ("answer value", r.value_bytes[i], value),
            ] {
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
                pair.push((a, b, decoded));
            }
            spans.push(pair);
        }
        let (na, nb, needle_span_text) = spans[0][0].clone();
        let (aa, ab, answer_span_text) = spans[asked[0]][1].clone();
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
        let needle_spans = needles
            .texts
            .iter()
            .zip(&spans)
            .map(|(text, pair)| {
                let (a, b, decoded) = pair[0].clone();
                NeedleSpan::new(text, (a, b), decoded, "haystack")
            })
            .collect();
        let answer_values: Vec<String> = asked.iter().map(|&i| needles.values[i].clone()).collect();
        let asked_keys: Vec<&str> = asked
            .iter()
            .map(|&i| needles.keys[i].as_str())
            .filter(|k| !k.is_empty())
            .collect();
        Ok(NeedlePrompt {
            tokens: ids,
            needle: (na, nb),
            needles: needle_spans,
            answer: (aa, ab),
            needle_text: needles.texts[0].clone(),
            answer_value: answer_values.join(", "),
            answer_values,
            key: asked_keys.join(", "),
            question: needles.question.clone(),
            depth_pct,
            actual_depth_pct,
            needle_span_text,
            answer_span_text,
            prompt_text: r.text,
        })
    }
}
