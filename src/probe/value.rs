//! Needle values and kv keys: the `[value]` / `[key]` tables of a scenario and their seeded
//! generators (`digits` with n, the first non-zero; `words` with n from a word list joined by
//! `sep`; `uuid`, version-4 shaped). Generation uses the portable PRNG (`rng.rs`), so a seed
//! gives the same value on every platform.

use serde::Deserialize;

use super::scenario::ScenarioError;
use super::words::VALUE_WORDS;
use crate::numerics::rng::Rng;

/// How a needle value (or a kv key) is generated.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueSpec {
    /// `n` decimal digits, the first non-zero.
    Digits { n: usize },
    /// `n` words from `list`, joined by `sep`.
    Words {
        n: usize,
        sep: String,
        list: Vec<String>,
    },
    /// A lowercase version-4-shaped UUID (8-4-4-4-12 hex).
    Uuid,
}

impl ValueSpec {
    pub fn generate(&self, rng: &mut Rng) -> String {
        match self {
            ValueSpec::Digits { n } => {
                let mut s = String::with_capacity(*n);
                for i in 0..*n {
                    let d = if i == 0 {
                        rng.range(1, 9)
                    } else {
                        rng.below(10)
                    };
                    s.push(char::from(b'0' + d as u8));
                }
                s
            }
            ValueSpec::Words { n, sep, list } => {
                let words: Vec<&str> = (0..*n).map(|_| rng.pick(list).as_str()).collect();
                words.join(sep)
            }
            ValueSpec::Uuid => {
                let hex = |rng: &mut Rng, k: usize| -> String {
                    (0..k)
                        .map(|_| char::from_digit(rng.below(16) as u32, 16).unwrap_or('0'))
                        .collect()
                };
                let variant = char::from_digit(8 + rng.below(4) as u32, 16).unwrap_or('8');
                format!(
                    "{}-{}-4{}-{}{}-{}",
                    hex(rng, 8),
                    hex(rng, 4),
                    hex(rng, 3),
                    variant,
                    hex(rng, 3),
                    hex(rng, 12)
                )
            }
        }
    }
}

/// A `[value]` or `[key]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawValue {
    pub(crate) kind: String,
    pub(crate) n: Option<i64>,
    pub(crate) sep: Option<String>,
    pub(crate) words: Option<Vec<String>>,
}

/// Validates a `[value]` / `[key]` table (`table` is "value" or "key"); errors name `source`.
/// Whether `text` holds a chat marker or looks like a special token's text (DeepSeek's
/// special tokens are written between `<｜` and `｜>`, with full-width bars).
fn looks_like_special(text: &str) -> bool {
    super::haystack::FORBIDDEN_MARKERS
        .iter()
        .any(|m| text.contains(m))
        || text.contains('｜')
}

pub(crate) fn parse_value(
    raw: &RawValue,
    table: &'static str,
    source: &str,
) -> Result<ValueSpec, ScenarioError> {
    let field = |field: &'static str, expected: &str, found: String| ScenarioError::Field {
        file: source.to_string(),
        field,
        expected: expected.to_string(),
        found,
    };
    let (f_n, f_kind, f_words, f_sep) = if table == "key" {
        ("key.n", "key.kind", "key.words", "key.sep")
    } else {
        ("value.n", "value.kind", "value.words", "value.sep")
    };
    let n_in = |lo: i64, hi: i64| -> Result<usize, ScenarioError> {
        match raw.n {
            Some(n) if (lo..=hi).contains(&n) => Ok(n as usize),
            Some(n) => Err(field(
                f_n,
                &format!("an integer in {lo}..={hi}"),
                n.to_string(),
            )),
            None => Err(field(
                f_n,
                &format!("an integer in {lo}..={hi}"),
                "none".into(),
            )),
        }
    };
    match raw.kind.as_str() {
        "digits" => Ok(ValueSpec::Digits { n: n_in(1, 64)? }),
        "words" => {
            let list: Vec<String> = match &raw.words {
                Some(w) => w.iter().map(|s| s.trim().to_string()).collect(),
                None => VALUE_WORDS.iter().map(|s| s.to_string()).collect(),
            };
            if list.is_empty()
                || list
                    .iter()
                    .any(|w| w.is_empty() || w.chars().any(char::is_whitespace))
            {
                return Err(field(
                    f_words,
                    "a non-empty list of single words",
                    format!("{list:?}"),
                ));
            }
            // A chat marker or a special token's text in a word would end up inside the
            // needle (on some seeds only): refused here, not partway through a sweep.
            if let Some(w) = list.iter().find(|w| looks_like_special(w)) {
                return Err(field(
                    f_words,
                    "plain words without chat markers or special-token text",
                    format!("{w:?}"),
                ));
            }
            // A brace would let a drawn word carry `{value}` or `{key}` into the needle, where
            // it would be substituted again (the separator is refused braces likewise).
            if let Some(w) = list.iter().find(|w| w.contains(['{', '}'])) {
                return Err(field(f_words, "words without braces", format!("{w:?}")));
            }
            let sep = raw.sep.clone().unwrap_or_else(|| "-".into());
            if looks_like_special(&sep) {
                return Err(field(
                    f_sep,
                    "a separator without chat markers or special-token text",
                    format!("{sep:?}"),
                ));
            }
            if sep.chars().any(|c| c == '{' || c == '}') {
                return Err(field(
                    f_sep,
                    "a separator without braces",
                    format!("{sep:?}"),
                ));
            }
            Ok(ValueSpec::Words {
                n: n_in(1, 16)?,
                sep,
                list,
            })
        }
        "uuid" => Ok(ValueSpec::Uuid),
        other => Err(field(
            f_kind,
            "\"digits\", \"words\" or \"uuid\"",
            format!("{other:?}"),
        )),
    }
}
