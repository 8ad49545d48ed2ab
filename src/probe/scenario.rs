//! Scenarios: what one needle test is, loaded from TOML (built-in `scenarios/*.toml`, embedded
//! with `include_str!`, or a user's file passed as `--scenario FILE`).
//!
//! ```toml
//! name = "passkey"
//! description = "..."
//! needle = "The pass key is {value}."       # exactly one {value}; optional {key}
//! question = "What is the pass key?"         # may use {key}, never {value}
//! system = "..."                             # optional system prompt (after BOS)
//! thinking = false                           # true: prompt ends with <think>; answer judged after </think>
//! [value]     kind = "digits" | "words" | "uuid";  n = 7;  sep = "-";  words = [..]
//! [key]       same fields as [value]; required iff the needle uses {key}
//! [answer]    check = "substring" | "regex";  pattern = "\\b{value}\\b"   (regex only)
//! [haystack]  kind = "noise" | "kv" | "tools" | "file";  file = "essay.txt"  (file only)
//! [needles]   ask_first = "..."; ask_last = "..."  (may use {key});  ask_all = "..."  ({keys})
//! ```
//! The optional `[needles]` table holds the questions of a prompt with several needles
//! (`--needles N --ask first|last|all`, docs/prompts.md).
//! Relative `haystack.file` paths resolve against the scenario file's directory. Every error
//! names the scenario source and the field, with what was expected and what was found. Values
//! come from the portable PRNG (`numerics::rng`), so a seed gives the same needle everywhere. Digit
//! values never start with 0 (a leading zero invites "answer" checks to fail on formatting).

use super::words::VALUE_WORDS;
use crate::numerics::rng::Rng;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Built-in scenarios: (name, TOML text).
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "passkey",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/passkey.toml"
        )),
    ),
    (
        "kv-retrieval",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/kv-retrieval.toml"
        )),
    ),
    (
        "code-cwd",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/code-cwd.toml"
        )),
    ),
    (
        "essay",
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/essay.toml")),
    ),
];

/// Errors loading or validating a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("unknown scenario {name:?}: not a built-in ({builtins}) and {what}{suggestion}")]
    Unknown {
        name: String,
        builtins: String,
        /// "no such file", or "a directory, expected a TOML file".
        what: &'static str,
        /// `; did you mean passkey?` for a name close to a built-in's, else empty.
        suggestion: String,
    },
    #[error("scenario file {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("scenario {file}: invalid TOML: {message}")]
    Toml { file: String, message: String },
    #[error("scenario {file}: missing field `{field}`{place}; expected every required field (name, needle, question, [value] with kind, [haystack] with kind)")]
    MissingField {
        file: String,
        field: String,
        /// ` in the table that starts at line N` for a field of a table, else empty.
        place: String,
    },
    #[error("scenario {file}: field `{field}`: expected {expected}, found {found}")]
    Field {
        file: String,
        field: &'static str,
        expected: String,
        found: String,
    },
    #[error("scenario {scenario}: haystack kind `file` needs a text file (pass --haystack-file FILE or set haystack.file in the scenario)")]
    MissingHaystackFile { scenario: String },
    #[error(
        "scenario {scenario}: --haystack-file given, but its haystack kind is `{kind}`, not `file`"
    )]
    HaystackFileNotUsed { scenario: String, kind: String },
    #[error("haystack file {path}: {problem}")]
    HaystackFile { path: PathBuf, problem: String },
}

/// How the generated answer is judged.
#[derive(Clone, Debug, PartialEq)]
pub enum AnswerCheck {
    /// The generated text contains the value.
    Substring,
    /// The pattern (with `{value}` replaced by the escaped value) matches the generated text.
    Regex(String),
}

/// What the haystack is made of (see `haystack.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum HaystackKind {
    Noise,
    Kv,
    Tools,
    File(Option<PathBuf>),
}

impl HaystackKind {
    pub fn name(&self) -> &'static str {
        match self {
            HaystackKind::Noise => "noise",
            HaystackKind::Kv => "kv",
            HaystackKind::Tools => "tools",
            HaystackKind::File(_) => "file",
        }
    }
}

/// A validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// Needle template, trimmed, with exactly one `{value}` and at most one `{key}`.
    pub needle: String,
    /// Question template (may contain `{key}`).
    pub question: String,
    pub system: Option<String>,
    pub thinking: bool,
    pub value: ValueSpec,
    pub key: Option<ValueSpec>,
    pub answer: AnswerCheck,
    pub haystack: HaystackKind,
    /// The questions of a prompt with several needles (`--needles N`, the `[needles]` table).
    pub ask: AskQuestions,
    /// "builtin:NAME" or the file path, for messages and reports.
    pub source: String,
}

/// Which of several needles the question asks for (`--ask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ask {
    /// The first needle (the one at `--depth`).
    #[default]
    First,
    /// The last needle.
    Last,
    /// Every needle: the answer must hold every value.
    All,
}

impl Ask {
    pub fn name(self) -> &'static str {
        match self {
            Ask::First => "first",
            Ask::Last => "last",
            Ask::All => "all",
        }
    }
}

impl std::str::FromStr for Ask {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "first" => Ok(Ask::First),
            "last" => Ok(Ask::Last),
            "all" => Ok(Ask::All),
            other => Err(format!("expected first, last or all, found {other:?}")),
        }
    }
}

/// The `[needles]` table: the question templates of a prompt with several needles. `first` and
/// `last` may use `{key}` (the asked needle's key), `all` may use `{keys}` (every key, joined
/// by ", "); a scenario whose question has `{key}` asks `first` / `last` with it by default.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AskQuestions {
    pub first: Option<String>,
    pub last: Option<String>,
    pub all: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    needle: String,
    question: String,
    system: Option<String>,
    #[serde(default)]
    thinking: bool,
    value: RawValue,
    key: Option<RawValue>,
    answer: Option<RawAnswer>,
    haystack: RawHaystack,
    needles: Option<RawNeedles>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNeedles {
    ask_first: Option<String>,
    ask_last: Option<String>,
    ask_all: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnswer {
    check: String,
    pattern: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHaystack {
    kind: String,
    file: Option<PathBuf>,
}

/// Chat markers that may not appear in scenario text.
const MARKERS: &[&str] = crate::tokenizer::CHAT_MARKERS;

impl Scenario {
    /// The scenario of a user's conversation (`--prompt FILE`): named `prompt:FILE`, judged by
    /// substring (the generated text contains `--answer`; after `</think>` in thinking mode),
    /// its fingerprint covering the file's bytes, the needles and the answer (the haystack
    /// kind `file` with that path). Nothing is generated from it: the conversation is the prompt.
    pub fn conversation(path: &Path, needles: &[String], answer: &str, thinking: bool) -> Self {
        Scenario {
            name: format!("prompt:{}", path.display()),
            description: format!("answer {answer:?}"),
            needle: needles.join("\n"),
            question: String::new(),
            system: None,
            thinking,
            value: ValueSpec::Uuid,
            key: None,
            answer: AnswerCheck::Substring,
            haystack: HaystackKind::File(Some(path.to_path_buf())),
            ask: AskQuestions::default(),
            source: path.display().to_string(),
        }
    }

    /// Names of the built-in scenarios.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// A built-in scenario by name, else a TOML file at that path.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        if let Some((name, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_toml_str(text, &format!("builtin:{name}"), None);
        }
        let path = Path::new(name_or_path);
        if !path.is_file() {
            return Err(ScenarioError::Unknown {
                name: name_or_path.to_string(),
                builtins: Self::builtin_names().join(", "),
                what: if path.is_dir() {
                    "a directory, expected a TOML file"
                } else {
                    "no such file"
                },
                suggestion: Self::builtin_names()
                    .into_iter()
                    .filter(|b| strsim::levenshtein(b, name_or_path) <= 2)
                    .min_by_key(|b| strsim::levenshtein(b, name_or_path))
                    .map_or(String::new(), |b| format!("; did you mean {b}?")),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string(), path.parent())
    }

    /// Parses and validates TOML; `source` names it in errors; relative `haystack.file` paths
    /// resolve against `base_dir`.
    pub fn from_toml_str(
        text: &str,
        source: &str,
        base_dir: Option<&Path>,
    ) -> Result<Self, ScenarioError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| {
            // serde's "missing field `x`" points at the enclosing table (line 1 for a
            // top-level field, the comment line if there is one): name the field instead.
            match e.message().strip_prefix("missing field `") {
                Some(rest) => ScenarioError::MissingField {
                    file: source.to_string(),
                    field: rest.trim_end_matches('`').to_string(),
                    place: match e.span() {
                        Some(span) if span.start > 0 => format!(
                            " in the table that starts at line {}",
                            text[..span.start].matches('\n').count() + 1
                        ),
                        _ => String::new(),
                    },
                },
                None => ScenarioError::Toml {
                    file: source.to_string(),
                    message: e.to_string().trim_end().to_string(),
                },
            }
        })?;
        let field = |field: &'static str, expected: &str, found: String| ScenarioError::Field {
            file: source.to_string(),
            field,
            expected: expected.to_string(),
            found,
        };
        let needle = raw.needle.trim().to_string();
        let question = raw.question.trim().to_string();
        if raw.name.trim().is_empty() {
            return Err(field("name", "a non-empty name", format!("{:?}", raw.name)));
        }
        // The name goes to the terminal, run.json, summary.json and every plot title.
        if raw.name.chars().any(char::is_control) {
            return Err(field(
                "name",
                "a name without control characters (newlines, tabs, escapes)",
                format!("{:?}", raw.name),
            ));
        }
        let n_value = needle.matches("{value}").count();
        if n_value != 1 {
            return Err(field(
                "needle",
                "exactly one {value} slot",
                format!("{n_value}"),
            ));
        }
        let n_key = needle.matches("{key}").count();
        if n_key > 1 {
            return Err(field(
                "needle",
                "at most one {key} slot",
                format!("{n_key}"),
            ));
        }
        let stripped = needle.replace("{value}", "").replace("{key}", "");
        if let Some(pos) = stripped.find('{').filter(|&p| stripped[p..].contains('}')) {
            let slot: String = stripped[pos..].chars().take_while(|&c| c != '}').collect();
            return Err(field(
                "needle",
                "only the slots {value} and {key}",
                format!("{slot}}}"),
            ));
        }
        if question.is_empty() {
            return Err(field("question", "a non-empty question", "\"\"".into()));
        }
        if question.contains("{value}") {
            return Err(field(
                "question",
                "no {value} slot (it would give the answer away)",
                "{value}".into(),
            ));
        }
        let q_key = question.contains("{key}");
        if q_key && n_key == 0 {
            return Err(field(
                "question",
                "{key} only when the needle has {key}",
                "{key}".into(),
            ));
        }
        for (name, text) in [("needle", &needle), ("question", &question)]
            .into_iter()
            .chain(raw.system.as_ref().map(|s| ("system", s)))
        {
            if let Some(m) = MARKERS.iter().find(|m| text.contains(**m)) {
                return Err(field(
                    name,
                    "plain text without chat markers",
                    m.to_string(),
                ));
            }
        }
        let value = parse_value(&raw.value, "value", source)?;
        let key = match (&raw.key, n_key) {
            (Some(k), 1) => Some(parse_value(k, "key", source)?),
            (None, 1) => {
                return Err(field(
                    "key",
                    "a [key] table because the needle uses {key}",
                    "none".into(),
                ))
            }
            (Some(_), _) => {
                return Err(field(
                    "key",
                    "no [key] table unless the needle uses {key}",
                    "[key]".into(),
                ))
            }
            (None, _) => None,
        };
        let answer = match raw.answer {
            None => AnswerCheck::Substring,
            Some(a) => match (a.check.as_str(), a.pattern) {
                ("substring", None) => AnswerCheck::Substring,
                ("substring", Some(_)) => {
                    return Err(field(
                        "answer.pattern",
                        "no pattern with check = \"substring\"",
                        "a pattern".into(),
                    ))
                }
                ("regex", Some(p)) => {
                    // Without the value in the pattern, any answer of that shape would count
                    // as right whatever value it names.
                    if !p.contains("{value}") {
                        return Err(field(
                            "answer.pattern",
                            "a pattern containing {value}",
                            format!("{p:?}"),
                        ));
                    }
                    let probe = p.replace("{value}", &regex::escape("12345"));
                    regex::Regex::new(&probe)
                        .map_err(|e| field("answer.pattern", "a valid regex", e.to_string()))?;
                    AnswerCheck::Regex(p)
                }
                ("regex", None) => {
                    return Err(field(
                        "answer.pattern",
                        "a pattern with check = \"regex\"",
                        "none".into(),
                    ))
                }
                (other, _) => {
                    return Err(field(
                        "answer.check",
                        "\"substring\" or \"regex\"",
                        format!("{other:?}"),
                    ))
                }
            },
        };
        let haystack = match (raw.haystack.kind.as_str(), raw.haystack.file) {
            ("noise", None) => HaystackKind::Noise,
            ("kv", None) => HaystackKind::Kv,
            ("tools", None) => HaystackKind::Tools,
            ("file", f) => HaystackKind::File(f.map(|f| match base_dir {
                Some(d) if f.is_relative() => d.join(f),
                _ => f,
            })),
            ("noise" | "kv" | "tools", Some(_)) => {
                return Err(field(
                    "haystack.file",
                    "a file only with kind = \"file\"",
                    "a file".into(),
                ))
            }
            (other, _) => {
                return Err(field(
                    "haystack.kind",
                    "\"noise\", \"kv\", \"tools\" or \"file\"",
                    format!("{other:?}"),
                ))
            }
        };
        let mut ask = AskQuestions::default();
        if let Some(n) = &raw.needles {
            for (name, text, slot) in [
                ("needles.ask_first", &n.ask_first, "{key}"),
                ("needles.ask_last", &n.ask_last, "{key}"),
                ("needles.ask_all", &n.ask_all, "{keys}"),
            ] {
                let Some(text) = text else { continue };
                let text = text.trim().to_string();
                let other_slot = if slot == "{key}" { "{keys}" } else { "{key}" };
                if text.is_empty() || text.contains("{value}") || text.contains(other_slot) {
                    return Err(field(
                        name,
                        "a non-empty question without {value}; {key} in ask_first / ask_last, {keys} in ask_all",
                        format!("{text:?}"),
                    ));
                }
                if text.contains(slot) && n_key == 0 {
                    return Err(field(
                        name,
                        "no key slot: the needle has no {key}",
                        slot.into(),
                    ));
                }
                if let Some(m) = MARKERS.iter().find(|m| text.contains(**m)) {
                    return Err(field(
                        name,
                        "plain text without chat markers",
                        m.to_string(),
                    ));
                }
                match name {
                    "needles.ask_first" => ask.first = Some(text),
                    "needles.ask_last" => ask.last = Some(text),
                    _ => ask.all = Some(text),
                }
            }
        }
        if q_key {
            ask.first.get_or_insert_with(|| question.clone());
            ask.last.get_or_insert_with(|| question.clone());
        }
        if haystack == HaystackKind::Kv && !(n_key == 1 && q_key) {
            return Err(field(
                "needle",
                "{key} in both needle and question for a kv haystack (the question asks one key)",
                "no {key}".into(),
            ));
        }
        Ok(Scenario {
            name: raw.name.trim().to_string(),
            description: raw.description.trim().to_string(),
            needle,
            question,
            system: raw.system.filter(|s| !s.is_empty()),
            thinking: raw.thinking,
            value,
            key,
            answer,
            haystack,
            ask,
            source: source.to_string(),
        })
    }

    /// `sha256:<hex>` of what the scenario generates from: every field but `source`, and the
    /// haystack file's bytes when it has one (a resumed sweep must run the same scenario, not
    /// one that reuses its name). Fails when the haystack file cannot be read.
    pub fn fingerprint(&self) -> Result<String, ScenarioError> {
        use sha2::{Digest, Sha256};
        let mut content = self.clone();
        content.source.clear();
        // The haystack file counts by its bytes (below), not by how its path was written:
        // `h.txt`, `./h.txt` and a copy elsewhere are the same haystack.
        if let HaystackKind::File(Some(path)) = &mut content.haystack {
            *path = PathBuf::from("--haystack-file");
        }
        let mut h = Sha256::new();
        h.update(format!("{content:?}").as_bytes());
        if let HaystackKind::File(Some(path)) = &self.haystack {
            let bytes = std::fs::read(path).map_err(|source| ScenarioError::Read {
                path: path.clone(),
                source,
            })?;
            h.update(&bytes);
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("sha256:{hex}"))
    }

    /// [`Scenario::load`], then [`Scenario::with_haystack_file`] when `haystack_file` is given
    /// (the `--haystack-file` of `probe` and `sweep`).
    pub fn load_with(
        name_or_path: &str,
        haystack_file: Option<&Path>,
    ) -> Result<Self, ScenarioError> {
        let scenario = Self::load(name_or_path)?;
        match haystack_file {
            Some(path) => scenario.with_haystack_file(path),
            None => Ok(scenario),
        }
    }

    /// Uses `path` as the haystack text (`--haystack-file`); only for kind `file`.
    pub fn with_haystack_file(mut self, path: &Path) -> Result<Self, ScenarioError> {
        match self.haystack {
            HaystackKind::File(_) => {
                self.haystack = HaystackKind::File(Some(path.to_path_buf()));
                Ok(self)
            }
            ref other => Err(ScenarioError::HaystackFileNotUsed {
                scenario: self.name.clone(),
                kind: other.name().to_string(),
            }),
        }
    }

    /// Needle value and key (empty when the needle has no `{key}`) for a seed.
    pub fn generate_value(&self, seed: u64) -> (String, String) {
        self.generate_value_draw(seed, 0)
    }

    /// The `draw`-th value and key of a seed (draw 0 is [`Self::generate_value`]'s), from
    /// their own streams: the prompt builder redraws when a value would not be unique in the
    /// prompt or the length cannot be reached with it, the same way on every run.
    pub fn generate_value_draw(&self, seed: u64, draw: usize) -> (String, String) {
        let stream = |name: &str| match draw {
            0 => Rng::stream(seed, name),
            d => Rng::stream(seed, &format!("{name}#{d}")),
        };
        let value = self.value.generate(&mut stream("value"));
        let key = self
            .key
            .as_ref()
            .map(|k| k.generate(&mut stream("key")))
            .unwrap_or_default();
        (value, key)
    }
}

// ---------------------------------------------------------------------------------------------
// Needle values and kv keys: the `[value]` / `[key]` tables of a scenario and their seeded
// generators (`digits` with n, the first non-zero; `words` with n from a word list joined by
// `sep`; `uuid`, version-4 shaped). Generation uses the portable PRNG (`numerics::rng`), so a seed
// gives the same value on every platform.

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
    crate::tokenizer::CHAT_MARKERS
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

// ---------------------------------------------------------------------------------------------
// How a scenario's answer is judged, and the notes a run prints about its answer: the
// generated text against the needle's value (thinking mode, cut-off answers, hedged digit
// answers), numbers in a `--haystack-file` shaped like the answer, and thinking scenarios
// that need room to reach `</think>`. Methods of [`Scenario`].

impl Scenario {
    /// A note when the `--haystack-file` text holds numbers shaped like this scenario's
    /// answer (a digits value: runs of exactly that many digits), which the model could
    /// answer with instead of the needle's; None when there are none or the value is not
    /// digits. The built-in haystacks never hold such numbers.
    pub fn competing_answers_note(&self) -> Option<String> {
        let (HaystackKind::File(Some(path)), ValueSpec::Digits { n }) =
            (&self.haystack, &self.value)
        else {
            return None;
        };
        let text = std::fs::read_to_string(path).ok()?;
        let runs = digit_runs_of(&text, *n);
        let first: Vec<&str> = runs.iter().take(3).copied().collect();
        (!runs.is_empty()).then(|| {
            format!(
                "--haystack-file {} holds {} {n}-digit number{} ({}{}), shaped like the needle's \
                 answer: the model may answer with one of them",
                path.display(),
                runs.len(),
                if runs.len() == 1 { "" } else { "s" },
                first.join(", "),
                if runs.len() > 3 { ", ..." } else { "" }
            )
        })
    }

    /// A note for a thinking-mode scenario judged by its answer: the answer follows `</think>`,
    /// and a run whose `generate` tokens end before it gets no verdict (the indexer judges it
    /// instead). None for a chat scenario or `--generate 0` (the indexer judges).
    pub fn thinking_note(&self, generate: usize) -> Option<String> {
        (self.thinking && generate > 0).then(|| {
            format!(
                "scenario {} thinks first: its answer follows </think>, and a run whose \
                 {generate} generated tokens end before </think> has no answer to judge (the \
                 indexer's recall judges it instead); give --generate room for the reasoning \
                 (hundreds to thousands of tokens), or --generate 0 to judge by the indexer \
                 alone",
                self.name
            )
        })
    }

    /// Whether the generated text answers correctly for the expected `value`. In thinking
    /// mode only the text after the last `</think>` is the answer (a value repeated while
    /// reasoning is not an answer). `None`, no verdict, when the answer was never reached or
    /// never finished: a thinking run without `</think>`, or a run cut off by the token limit
    /// (not ended by the end-of-sentence token, `ended`) whose answer so far is not right (it
    /// may have stopped inside the value). A too-short generation says nothing about the needle.
    ///
    /// With several expected values (`--ask all`) every one must be there.
    pub fn judge_generated(&self, generated: &str, values: &[String], ended: bool) -> Option<bool> {
        let answer = if self.thinking {
            generated.rsplit_once(crate::tokenizer::THINK_END)?.1
        } else {
            generated
        };
        match self.check_answers(answer, values) {
            true => Some(true),
            false if ended => Some(false),
            false => None,
        }
    }

    /// Whether `generated` answers correctly for the expected `value`: the scenario's check
    /// passes and, for a digits value, no other number of the value's length is offered beside
    /// it (an answer that hedges between candidates has not recalled the needle).
    pub fn check_answer(&self, generated: &str, value: &str) -> bool {
        self.check_answers(generated, &[value.to_string()])
    }

    /// [`Self::check_answer`] for several expected values: each passes the check, and no
    /// number of a value's length other than the expected ones is offered.
    pub fn check_answers(&self, generated: &str, values: &[String]) -> bool {
        let passes = |value: &str| match &self.answer {
            AnswerCheck::Substring => generated.contains(value),
            AnswerCheck::Regex(p) => {
                regex::Regex::new(&p.replace("{value}", &regex::escape(value)))
                    .map(|re| re.is_match(generated))
                    .unwrap_or(false)
            }
        };
        let hedges = |value: &str| match self.value {
            ValueSpec::Digits { .. } => digit_runs_of(generated, value.len())
                .iter()
                .any(|r| !values.iter().any(|v| v == r)),
            _ => false,
        };
        !values.is_empty() && values.iter().all(|v| passes(v) && !hedges(v))
    }
}

/// The maximal runs of ASCII digits in `text` that are exactly `n` long.
fn digit_runs_of(text: &str, n: usize) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|run| run.len() == n)
        .collect()
}
