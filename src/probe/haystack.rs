//! Haystack generators: the text the needle hides in, as a seeded stream of *units*.
//!
//! A unit is one sentence (layout [`HaystackLayout::Prose`]: `noise`, `file`) or one line ending in
//! `\n` (layout [`HaystackLayout::Lines`]: `kv`, `tools`), stored with the whitespace that precedes it
//! (`sep`, dropped when the unit opens the haystack). The needle is inserted *between* units,
//! so it always sits at a sentence or line boundary, and the boundaries are tokenisation-stable
//! for the V4 pre-tokenizer: a sentence ends in punctuation and the next begins with a space and
//! a letter (`.` | ` The`), a line ends in `\n`, which the pre-tokenizer glues to the preceding
//! punctuation (`.\n`), never to the next line's first word.
//!
//! - `noise`: sentences from 40 templates x own word lists (`words.rs`), no digits.
//! - `kv`: distractor lines rendered from the scenario's own needle template with other keys and
//!   values (never the needle's key or value), so every line looks like the needle.
//! - `tools`: one JSON-schema-like function definition per line (agentic system prompts), with
//!   varied names, parameters, enums and path defaults.
//! - `file`: the user's text split into sentences (whitespace kept; runs of 80 words without
//!   sentence punctuation are cut at a space), cycled if too short; chat markers are refused.
//!
//! Fillers (for exact prompt length) are word prefixes of noise sentences (tool-documentation
//! notes for `tools`), see `prompt.rs`.

use std::path::{Path, PathBuf};
use unicode_segmentation::UnicodeSegmentation;

use super::scenario::{HaystackKind, Scenario, ScenarioError, ValueSpec};
use super::words::*;
use crate::numerics::rng::Rng;
use crate::tokenizer::CHAT_MARKERS;

/// How units are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaystackLayout {
    /// Sentences separated by whitespace (usually one space).
    Prose,
    /// Lines, each ending in `\n`, concatenated.
    Lines,
}

/// One haystack unit: `sep` (whitespace written before it unless it opens the haystack) and
/// its text (a line unit includes its trailing `\n`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub sep: String,
    pub text: String,
}

/// A seeded, endless stream of haystack units for one scenario.
pub struct HaystackGen {
    rng: Rng,
    filler_rng: Rng,
    kind: GenKind,
    /// A `kv` line had to repeat a key (or the needle's key or value): the scenario's key or
    /// value space is too small for the haystack ([`Self::exhausted`]).
    exhausted: bool,
}

enum GenKind {
    Noise,
    Kv {
        template: String,
        key: Option<ValueSpec>,
        value: ValueSpec,
        needle_keys: Vec<String>,
        needle_values: Vec<String>,
        /// Keys of the lines so far: a key never comes back with another value.
        used_keys: std::collections::HashSet<String>,
    },
    Tools,
    File {
        units: Vec<Unit>,
        next: usize,
    },
}

impl HaystackGen {
    /// A generator for `sc` whose distractors avoid the needles' keys and values.
    pub fn new(
        sc: &Scenario,
        seed: u64,
        needle_keys: &[String],
        needle_values: &[String],
    ) -> Result<Self, ScenarioError> {
        let kind = match &sc.haystack {
            HaystackKind::Noise => GenKind::Noise,
            HaystackKind::Tools => GenKind::Tools,
            HaystackKind::Kv => GenKind::Kv {
                template: sc.needle.clone(),
                key: sc.key.clone(),
                value: sc.value.clone(),
                needle_keys: needle_keys.to_vec(),
                needle_values: needle_values.to_vec(),
                used_keys: Default::default(),
            },
            HaystackKind::File(path) => {
                let path = path
                    .as_ref()
                    .ok_or_else(|| ScenarioError::MissingHaystackFile {
                        scenario: sc.name.clone(),
                    })?;
                let units = read_file_units(path)?;
                GenKind::File { units, next: 0 }
            }
        };
        Ok(Self {
            rng: Rng::stream(seed, "haystack"),
            filler_rng: Rng::stream(seed, "filler"),
            kind,
            exhausted: false,
        })
    }

    /// Whether a `kv` line so far repeats a key or the needle's key or value (64 draws found no
    /// fresh one): the haystack would then hold the needle's key with another value, or a key
    /// twice, so the question has no single answer; the prompt builder refuses it.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    pub fn layout(&self) -> HaystackLayout {
        match self.kind {
            GenKind::Noise | GenKind::File { .. } => HaystackLayout::Prose,
            GenKind::Kv { .. } | GenKind::Tools => HaystackLayout::Lines,
        }
    }

    /// The next unit of the stream.
    pub fn next_unit(&mut self) -> Unit {
        match &mut self.kind {
            GenKind::Noise => Unit {
                sep: " ".into(),
                text: noise_sentence(&mut self.rng),
            },
            GenKind::Tools => Unit {
                sep: String::new(),
                text: tool_line(&mut self.rng),
            },
            GenKind::Kv {
                template,
                key,
                value,
                needle_keys,
                needle_values,
                used_keys,
            } => {
                // Distinct from the needle's key and value, and a key not used by an earlier
                // line (two values for one key would make the haystack contradict itself);
                // after 64 draws without one (a key or value space too small, e.g. a one-word
                // list) the line is kept and the generator marked exhausted.
                let mut line = String::new();
                let mut fresh = false;
                for _ in 0..64 {
                    let k = key.as_ref().map(|s| s.generate(&mut self.rng));
                    let v = value.generate(&mut self.rng);
                    let k_ok = k.as_deref().is_none_or(|k| {
                        !needle_keys.iter().any(|n| n == k) && !used_keys.contains(k)
                    });
                    line = fill(template, k.as_deref().unwrap_or(""), &v);
                    if k_ok && !needle_values.contains(&v) {
                        if let Some(k) = k {
                            used_keys.insert(k);
                        }
                        fresh = true;
                        break;
                    }
                }
                self.exhausted |= !fresh;
                line.push('\n');
                Unit {
                    sep: String::new(),
                    text: line,
                }
            }
            GenKind::File { units, next, .. } => {
                let mut u = units[*next % units.len()].clone();
                if *next > 0 && *next % units.len() == 0 {
                    u.sep = "\n\n".into();
                } else if *next == 0 && u.sep.is_empty() {
                    // The file's first sentence: it may follow the needle, so it needs a
                    // separator (a sentence never glues to the needle's last word). Later
                    // separator-less units (text without spaces, cut by `file_units`) keep
                    // theirs: the prompt renderer spaces them from the needle and filler.
                    u.sep = " ".into();
                }
                *next += 1;
                u
            }
        }
    }

    /// Words of a fresh filler sentence (no final punctuation), for exact-length padding:
    /// documentation-like notes for tool lists, noise prose for everything else (also for
    /// `file` haystacks: generated words are almost all one token, so any count is reachable).
    pub fn filler_words(&mut self) -> Vec<String> {
        let sentence = match &self.kind {
            GenKind::Tools => {
                let a = self.filler_rng.pick(TOOL_PURPOSES);
                let b = self.filler_rng.pick(PARAM_PURPOSES);
                format!("{b}. {a}")
            }
            _ => noise_sentence(&mut self.filler_rng),
        };
        sentence
            .split_whitespace()
            .map(|w| w.trim_end_matches(['.', '!', '?']).to_string())
            .filter(|w| !w.is_empty())
            .collect()
    }
}

/// Substitutes `{key}` and `{value}` in a template.
pub fn fill(template: &str, key: &str, value: &str) -> String {
    template.replace("{key}", key).replace("{value}", value)
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// One noise sentence: a template with its slots filled, first letter capitalised.
pub fn noise_sentence(rng: &mut Rng) -> String {
    let template = *rng.pick(TEMPLATES);
    let mut out = String::with_capacity(template.len() + 40);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let slot = &rest[open + 1..open + close];
        out.push_str(&slot_text(slot, rng));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    capitalise(&out)
}

fn noun_phrase(rng: &mut Rng) -> String {
    let article = if rng.chance(0.5) { "the" } else { "an old" };
    if rng.chance(0.6) {
        format!("the {} {}", rng.pick(ADJECTIVES), rng.pick(NOUNS))
    } else {
        format!("{article} {}", rng.pick(NOUNS))
    }
}

fn slot_text(slot: &str, rng: &mut Rng) -> String {
    match slot.trim_end_matches('2') {
        "np" => noun_phrase(rng),
        "name" => rng.pick(NAMES).to_string(),
        "place" => rng.pick(PLACES).to_string(),
        "time" => rng.pick(TIMES).to_string(),
        "adv" => rng.pick(ADVERBS).to_string(),
        "adj" => rng.pick(ADJECTIVES).to_string(),
        "noun" => rng.pick(NOUNS).to_string(),
        "nouns" => rng.pick(PLURALS).to_string(),
        "vi" => rng.pick(VERBS_INTRANSITIVE).to_string(),
        "vt" => rng.pick(VERBS_TRANSITIVE).to_string(),
        "unit" => rng.pick(TIME_UNITS).to_string(),
        "thing" => rng.pick(ABSTRACT).to_string(),
        _ => String::new(),
    }
}

/// One tool definition as a single JSON-like line ending in `\n`.
pub fn tool_line(rng: &mut Rng) -> String {
    let verb = *rng.pick(TOOL_VERBS);
    let object = *rng.pick(TOOL_OBJECTS);
    let name = if rng.chance(0.3) {
        format!(
            "{verb}_{object}_{}",
            rng.pick(&["batch", "details", "history", "status"])
        )
    } else {
        format!("{verb}_{object}")
    };
    let readable = object.replace('_', " ");
    let mut desc = format!(
        "{} {} {}.",
        capitalise(verb),
        rng.pick(&["one or more", "the selected", "every matching", "a single"]),
        if readable.ends_with('s') {
            readable.clone()
        } else {
            format!("{readable} entries")
        }
    );
    for _ in 0..rng.range(1, 3) {
        desc.push(' ');
        let purpose: &str = rng.pick::<&str>(TOOL_PURPOSES);
        desc.push_str(purpose);
    }
    let n_params = rng.range(2, 6);
    let mut props = Vec::with_capacity(n_params);
    let mut required = Vec::new();
    let mut used: Vec<&str> = Vec::new();
    for _ in 0..n_params {
        let p = *rng.pick(PARAM_NAMES);
        if used.contains(&p) {
            continue;
        }
        used.push(p);
        let ty = *rng.pick(PARAM_TYPES);
        let mut body = format!(
            "\"type\": \"{ty}\", \"description\": \"{}.\"",
            rng.pick(PARAM_PURPOSES)
        );
        if ty == "string" && rng.chance(0.3) {
            let a = rng.pick(ENUM_VALUES);
            let b = rng.pick(ENUM_VALUES);
            body.push_str(&format!(", \"enum\": [\"{a}\", \"{b}\"]"));
        } else if p == "path" || (ty == "string" && rng.chance(0.2)) {
            body.push_str(&format!(
                ", \"default\": \"/{}/{}/{}\"",
                rng.pick(PATH_PARTS),
                rng.pick(PATH_PARTS),
                rng.pick(VALUE_WORDS)
            ));
        }
        props.push(format!("\"{p}\": {{{body}}}"));
        if rng.chance(0.4) {
            required.push(format!("\"{p}\""));
        }
    }
    format!(
        "{{\"type\": \"function\", \"function\": {{\"name\": \"{name}\", \"description\": \"{desc}\", \"parameters\": {{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [{}]}}}}}}\n",
        props.join(", "),
        required.join(", ")
    )
}

/// The largest haystack file read: 256 MiB of text is some 60M tokens, far past any context.
pub const MAX_HAYSTACK_FILE_BYTES: u64 = 256 << 20;

/// Reads a haystack text file and splits it into sentence units (whitespace preserved). Only a
/// regular file of at most [`MAX_HAYSTACK_FILE_BYTES`] is read (a device such as /dev/urandom
/// would be read until memory runs out), and text with NUL bytes is refused (UTF-16 or binary).
pub fn read_file_units(path: &Path) -> Result<Vec<Unit>, ScenarioError> {
    let err = |problem: String| ScenarioError::HaystackFile {
        path: path.to_path_buf(),
        problem,
    };
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => err("no such file: expected a text file there".into()),
        _ => err(e.to_string()),
    })?;
    if !meta.is_file() {
        return Err(err("not a regular file: expected a text file".into()));
    }
    if meta.len() > MAX_HAYSTACK_FILE_BYTES {
        return Err(err(format!(
            "{} bytes: expected at most {} (256 MiB of text is far past any context)",
            meta.len(),
            MAX_HAYSTACK_FILE_BYTES
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(err(format!(
            "a NUL byte at offset {at}: expected UTF-8 text (UTF-16 or a binary file?)"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| ScenarioError::HaystackFile {
        path: path.to_path_buf(),
        problem: format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })?;
    file_units(&text, path)
}

/// Splits text into sentence units; `path` only names the source in errors.
pub fn file_units(text: &str, path: &Path) -> Result<Vec<Unit>, ScenarioError> {
    let err = |problem: String| ScenarioError::HaystackFile {
        path: PathBuf::from(path),
        problem,
    };
    if let Some(m) = CHAT_MARKERS.iter().find(|m| text.contains(**m)) {
        return Err(err(format!(
            "contains the chat marker {m}, which would break the prompt format"
        )));
    }
    // A byte-order mark is no text; line ends become `\n` (CRLF and lone CR alike).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut units = Vec::new();
    let mut sep = String::new();
    let mut cur = String::new();
    let mut words_in_cur = 0usize;
    // Characters (grapheme clusters) since the last whitespace or unit end.
    let mut run_chars = 0usize;
    // Whole grapheme clusters, so that no unit ends between a letter and its combining mark
    // (Thai tone marks, Devanagari vowel signs), inside an emoji joiner sequence or between
    // the two letters of a flag: the needle goes between units.
    let clusters: Vec<&str> = text.graphemes(true).collect();
    let first_char = |g: &str| g.chars().next().unwrap_or(' ');
    let mut i = 0;
    while i < clusters.len() {
        let g = clusters[i];
        let c = first_char(g);
        if c.is_whitespace() {
            run_chars = 0;
            // Whitespace ends a unit after sentence punctuation or a long run of words.
            let prev = cur
                .trim_end_matches(['"', '\'', ')', ']', '”', '’'])
                .chars()
                .last();
            let ends =
                matches!(prev, Some('.' | '!' | '?' | '。' | '！' | '？')) || words_in_cur >= 80;
            let mut ws = String::new();
            while i < clusters.len() && first_char(clusters[i]).is_whitespace() {
                ws.push_str(clusters[i]);
                i += 1;
            }
            if cur.is_empty() {
                sep.push_str(&ws);
            } else if ends || ws.contains("\n\n") {
                units.push(Unit {
                    sep: std::mem::take(&mut sep),
                    text: std::mem::take(&mut cur),
                });
                words_in_cur = 0;
                sep = ws;
            } else {
                cur.push_str(&ws);
                words_in_cur += 1;
            }
            continue;
        }
        cur.push_str(g);
        i += 1;
        run_chars += 1;
        // Text without spaces (Chinese or Japanese prose, minified code, base64) still ends
        // units: after a full-width sentence mark, or every RUN_CHARS characters of one run,
        // so that no unit outgrows a prompt's budget. The next unit then has no separator.
        let full_stop = matches!(c, '。' | '！' | '？');
        let next_is_space = clusters
            .get(i)
            .is_some_and(|n| first_char(n).is_whitespace());
        if (full_stop || run_chars >= RUN_CHARS) && !next_is_space && i < clusters.len() {
            units.push(Unit {
                sep: std::mem::take(&mut sep),
                text: std::mem::take(&mut cur),
            });
            words_in_cur = 0;
            run_chars = 0;
        }
    }
    if !cur.is_empty() {
        units.push(Unit { sep, text: cur });
    }
    if units.is_empty() {
        return Err(err("contains no text".into()));
    }
    // A unit with an empty separator continues its predecessor's text (no space in the
    // source); the prompt builder puts a space between the needle and such a unit.
    Ok(units)
}

/// Grapheme clusters of one whitespace-free run after which a file unit ends anyway.
const RUN_CHARS: usize = 160;

#[cfg(test)]
mod tests {
    //! Tests of `haystack.rs`: generated sentences, file units and where long runs are cut.

    use super::*;

    #[test]
    fn noise_sentences_vary_and_carry_no_digits() {
        let mut rng = Rng::new(3);
        let s: Vec<String> = (0..200).map(|_| noise_sentence(&mut rng)).collect();
        let distinct: std::collections::HashSet<&String> = s.iter().collect();
        assert!(
            distinct.len() > 190,
            "only {} distinct sentences",
            distinct.len()
        );
        assert!(s.iter().all(|x| !x.chars().any(|c| c.is_ascii_digit())));
        assert!(s.iter().all(|x| x.ends_with('.') && !x.contains('{')));
    }

    #[test]
    fn file_units_reassemble_the_text() {
        let text = "First one. Second, longer sentence!\n\nNew paragraph here? Tail";
        let units = file_units(text, Path::new("t.txt")).unwrap();
        let mut joined = String::new();
        for u in &units {
            joined.push_str(&u.sep);
            joined.push_str(&u.text);
        }
        assert_eq!(joined, text);
        assert_eq!(units.len(), 4);
    }

    /// Text without spaces (here Chinese) is cut after each full-width full stop and within
    /// long runs, and still reassembles to the file's text; a BOM and CR line ends are dropped.
    #[test]
    fn spaceless_text_is_cut_into_small_units() {
        let sentence = "河流是最早的道路。它们运送粮食和石头，也传递消息。";
        let text = format!("\u{feff}{}\r\n{}", sentence.repeat(20), "x".repeat(1000));
        let units = file_units(&text, Path::new("zh.txt")).unwrap();
        let joined: String = units
            .iter()
            .map(|u| format!("{}{}", u.sep, u.text))
            .collect();
        assert_eq!(
            joined,
            format!("{}\n{}", sentence.repeat(20), "x".repeat(1000))
        );
        assert!(units.len() >= 40 + 1000 / RUN_CHARS, "{}", units.len());
        assert!(units.iter().all(|u| u.text.chars().count() <= RUN_CHARS));
        assert!(units[0].text.ends_with('。') && units[1].sep.is_empty());
    }

    /// Long runs are cut between grapheme clusters only: never before a Thai tone mark or
    /// vowel sign, inside an emoji joiner sequence, or between a flag's two letters (the
    /// needle goes between units, so such a cut would break a word or a symbol in two).
    #[test]
    fn spaceless_runs_are_cut_between_whole_characters() {
        let thai = "ข่าวที่น่าสนใจ".repeat(40);
        let family = "👩\u{200d}👩\u{200d}👧".repeat(400);
        let flags = "🇯🇵🇫🇷".repeat(200);
        let accents = "e\u{301}".repeat(400);
        for text in [&thai, &family, &flags, &accents] {
            let units = file_units(text, Path::new("t.txt")).unwrap();
            assert!(units.len() > 1, "the run was not cut at all");
            let joined: String = units.iter().map(|u| u.text.as_str()).collect();
            assert_eq!(&joined, text);
            for u in &units {
                let first = u.text.chars().next().unwrap();
                let last = u.text.chars().last().unwrap();
                let combining = matches!(first, '\u{0e31}' | '\u{0e34}'..='\u{0e3a}' | '\u{0e47}'..='\u{0e4e}' | '\u{301}');
                assert!(!combining, "a unit starts with the mark {first:?}");
                assert!(first != '\u{200d}' && last != '\u{200d}', "cut at a joiner");
                let indicators = u
                    .text
                    .chars()
                    .filter(|c| ('\u{1f1e6}'..='\u{1f1ff}').contains(c))
                    .count();
                assert!(indicators % 2 == 0, "a flag cut in two: {:?}", u.text);
            }
        }
    }
}
