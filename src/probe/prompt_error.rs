//! [`PromptError`]: why a needle prompt could not be built (a part of `prompt.rs`, kept apart so
//! that file stays readable); each error names the flag, scenario or field concerned.

use crate::probe::scenario::ScenarioError;
use crate::probe::tokenizer::TokenizerError;

/// Errors building a prompt; each names the flag or scenario concerned.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
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
