//! The DeepSeek-V4 chat encoder: a user's conversation (an OpenAI-style chat request body, a
//! bare messages array, or a text file) rendered into the exact prompt text the model reads.
//!
//! In: the bytes of a `--prompt FILE`. Out: [`ChatRequest`] (validated messages, tools,
//! thinking mode, reasoning effort) and, from [`ChatRequest::render`], the prompt text with the
//! byte range of every rendered message ([`RenderedChat`]); special tokens are written as text
//! and become single ids when `crate::tokenizer` encodes it.
//!
//! The rules are those of the Python encoder shipped with the V4 release, as SGLang's port
//! `python/sglang/srt/entrypoints/openai/encoding_dsv4.py` (sgl-project/sglang commit
//! 00370f2784265e663d500abcc6a59b13854840f5) implements them, followed byte for byte, with
//! SGLang's request handling in front of it (`serving_chat.py`, commit
//! 002897c23becbd522d88b8115a763a21765f978a); docs/prompts.md states them, and
//! `tests/reference/chat/` holds renderings made by that encoder:
//! - an empty system message is inserted at index 0 when the first message is not a system
//!   message; the request's `tools` go on that first message and render after its text
//!   (`\n\n## Tools ...`, one schema per line as Python's `json.dumps(ensure_ascii=False)`
//!   writes it: [`python_json`]);
//! - tool messages (and user messages next to them) merge into one user turn of
//!   `<tool_result>...</tool_result>` / text blocks joined by `\n\n`, the results sorted by the
//!   preceding assistant's call order;
//! - in thinking mode without tools, reasoning before the last user turn is dropped, and so are
//!   developer messages before it;
//! - assistant turns are `{reasoning}</think>` (thinking mode, kept turns only), the content,
//!   the DSML tool-call block, EOS; the last user turn ends in `<｜Assistant｜>` and `<think>`
//!   (thinking) or `</think>` (chat);
//! - `reasoning_effort: "max"` in thinking mode puts the effort preamble right after BOS.
//!
//! Numerical / textual choices that are not obvious: JSON objects keep their key order (the
//! request is read into [`Json`], not a sorted map) because the tool schemas are re-serialised;
//! floats are written as Python's `repr` writes them (`1.0`, `1e-05`, `1e+16`).

use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::tokenizer::{ASSISTANT, BOS, EOS, THINK_END, THINK_START, USER};

/// The DSML marker of tool calls (an added token of the V4 tokenizer, id 128825).
pub const DSML: &str = "｜DSML｜";

/// The `reasoning_effort: "max"` preamble, written after BOS in thinking mode.
pub const REASONING_EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// DeepSeek-V4.1's system marker (id 128799 in V4.1's tokenizer, docs/spec/v41.md 6): it opens a
/// system message, and index 0 whenever an effort line is written.
pub use crate::tokenizer::SYSTEM_V41 as SYSTEM;

/// DeepSeek-V4.1's image placeholder: refused inside text (images come as parts).
pub const IMAGE_PLACEHOLDER: &str = "<｜deepseek_image｜>";

/// DeepSeek-V4.1's reasoning-effort line for a budget of 1..=100 (thinking mode, index 0).
pub fn effort_line_v41(budget: u32) -> String {
    format!(
        "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the \
         reasoning)\n\n"
    )
}

/// DeepSeek-V4.1's named effort tiers and their budgets.
pub const EFFORT_TIERS_V41: [(&str, u32); 4] =
    [("low", 25), ("high", 50), ("xhigh", 75), ("max", 100)];

/// Which release's encoder renders a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFormat {
    /// DeepSeek-V4's (`encoding_dsv4.py`).
    V4,
    /// DeepSeek-V4.1's (`encoding_dsv41.py`, docs/spec/v41.md 6).
    V41,
}

/// Why a conversation could not be read or rendered; every error names the file and the JSON
/// path (`messages[3].role`) or position concerned.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("--prompt {}: cannot read: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--prompt {}: not UTF-8 text: invalid byte 0x{byte:02x} at byte offset {offset} (line {line}); expected a UTF-8 text file or a JSON chat request", .path.display())]
    NotUtf8 {
        path: PathBuf,
        offset: usize,
        line: usize,
        byte: u8,
    },
    #[error("--prompt {}: malformed JSON at line {line}, column {column}: {message}", .path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("--prompt {}: {field}: expected {expected}, found {found}", .path.display())]
    Field {
        path: PathBuf,
        field: String,
        expected: String,
        found: String,
    },
    #[error("--prompt {}: {field}: unknown role {role:?}; expected one of system, developer, user, assistant, tool", .path.display())]
    UnknownRole {
        path: PathBuf,
        field: String,
        role: String,
    },
    #[error("--prompt {}: messages[{index}] is a tool result for call id {id:?}, but {why}; expected a `tool_call_id` naming one of the `tool_calls` of the assistant message before it", .path.display())]
    UnmatchedToolResult {
        path: PathBuf,
        index: usize,
        id: String,
        why: String,
    },
    #[error("--prompt {}: the last message (messages[{index}]) is the assistant's: there is nothing left for the model to answer; expected the conversation to end with a user, developer or tool message (drop the reply the model gave, keep the turn it answered)", .path.display())]
    EndsWithAssistant { path: PathBuf, index: usize },
    #[error("--prompt {}: messages[{index}].task = {task:?}: the encoder's internal task tokens (<｜{task}｜>) are not part of an operator's chat and are not rendered; expected a message without `task`", .path.display())]
    Task {
        path: PathBuf,
        index: usize,
        task: String,
    },
    #[error("--prompt {}: no messages: expected at least one user or developer message", .path.display())]
    Empty { path: PathBuf },
}

// ---------------------------------------------------------------------------------------------
// JSON with its key order, and Python's json.dumps

/// A JSON value that keeps object keys in the order written (Python dicts do; the tool schemas
/// are re-serialised from it). A key written twice keeps its first place and its last value,
/// as Python's `json.loads` does.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    /// An integer literal (Python int).
    Int(i128),
    /// A literal with a fraction or exponent (Python float).
    Float(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// A short description of the value's kind, for errors.
    fn kind(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Int(_) | Json::Float(_) => "a number".into(),
            Json::String(s) if s.chars().count() > 40 => "a string".into(),
            Json::String(s) => format!("the string {s:?}"),
            Json::Array(_) => "an array".into(),
            Json::Object(_) => "an object".into(),
        }
    }

    /// Python truthiness (`if value:`).
    fn truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Int(i) => *i != 0,
            Json::Float(f) => *f != 0.0,
            Json::String(s) => !s.is_empty(),
            Json::Array(a) => !a.is_empty(),
            Json::Object(o) => !o.is_empty(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
                Ok(Json::Int(i.into()))
            }
            fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
                Ok(Json::Int(u.into()))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Json, E> {
                Ok(Json::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element()? {
                    items.push(v);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut entries: Vec<(String, Json)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Json>()? {
                    match entries.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => entries.push((k, v)),
                    }
                }
                Ok(Json::Object(entries))
            }
        }
        d.deserialize_any(V)
    }
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it: `", "` and `": "`
/// separators, keys in their order, non-ASCII characters as they are, control characters
/// escaped (`\n`, `\u001b`), floats as Python's `repr`.
pub fn python_json(value: &Json) -> String {
    let mut out = String::new();
    write_python_json(value, &mut out);
    out
}

fn write_python_json(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Json::Float(f) => out.push_str(&python_float_repr(*f)),
        Json::String(s) => write_python_string(s, out),
        Json::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(v, out);
            }
            out.push(']');
        }
        Json::Object(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_string(k, out);
                out.push_str(": ");
                write_python_json(v, out);
            }
            out.push('}');
        }
    }
}

fn write_python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that read back, fixed notation for decimal
/// exponents -4..16 (always with a fraction, `1.0`), else `d.ddde+XX` with at least two
/// exponent digits; `NaN`, `Infinity`, `-Infinity` as `json.dumps` writes them.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e3", "-5e-7", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            if n > exp + 1 {
                let (a, b) = digits.split_at((exp + 1) as usize);
                format!("{a}.{b}")
            } else {
                format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

// ---------------------------------------------------------------------------------------------
// The request

/// A message's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl ChatRole {
    pub fn name(self) -> &'static str {
        match self {
            ChatRole::System => "system",
            ChatRole::Developer => "developer",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
            ChatRole::Tool => "tool",
        }
    }
}

/// One assistant tool call (OpenAI form: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as given: a JSON string (the OpenAI form), or a JSON value, which the
    /// encoder cannot parse as a string and so renders as one `arguments` parameter.
    pub arguments: Json,
}

/// One message after validation; `content` is the text the encoder sees (null as `""`, text
/// parts joined by a space as SGLang flattens them).
#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: String,
    /// DeepSeek-V4.1, a user message given as content parts: one rendered block per part
    /// (text as it is, another part type as `[Unsupported TYPE]`), joined by `\n\n`.
    pub parts: Option<Vec<String>>,
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

/// A conversation ready to render.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The file it came from (for messages).
    pub path: PathBuf,
    pub messages: Vec<ChatMessage>,
    /// The `function` objects of the request's `tools`, in order.
    pub tools: Vec<Json>,
    /// Thinking mode (`chat_template_kwargs.thinking`); chat mode otherwise.
    pub thinking: bool,
    /// `reasoning_effort` "max" (the only value that changes the prompt, and only in thinking
    /// mode); "high" and null render alike, other values read as null, as SGLang does.
    pub effort_max: bool,
    /// DeepSeek-V4.1's effort budget (1..=100; 50 = `high`, the default), rendered in thinking
    /// mode only.
    pub effort_budget: u32,
    /// Which release's encoder renders it.
    pub format: ChatFormat,
    /// Things read but not rendered (image parts, ...), for the user to see.
    pub notes: Vec<String>,
}

impl ChatRequest {
    /// Reads `--prompt FILE`: a `.json` file is a chat request body or a bare messages array;
    /// any other file is UTF-8 text, one user message in chat mode.
    pub fn from_file(path: &Path) -> Result<Self, ChatError> {
        Self::from_file_as(path, ChatFormat::V4)
    }

    /// [`ChatRequest::from_file`] for the encoder of `format`.
    pub fn from_file_as(path: &Path, format: ChatFormat) -> Result<Self, ChatError> {
        let bytes = std::fs::read(path).map_err(|source| ChatError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let offset = e.valid_up_to();
            ChatError::NotUtf8 {
                path: path.to_path_buf(),
                offset,
                line: bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1,
                byte: bytes[offset],
            }
        })?;
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if is_json {
            Self::from_json_str_as(text, path, format)
        } else {
            let mut request = Self::from_text(text, path);
            request.format = format;
            let t = text.trim();
            if (t.starts_with('{') && t.ends_with('}')) || (t.starts_with('[') && t.ends_with(']'))
            {
                request.notes.push(format!(
                    "{} looks like JSON but is read as text (one user message); name it *.json \
                     to read it as a chat request",
                    path.display()
                ));
            }
            Ok(request)
        }
    }

    /// A text prompt: one user message, chat mode.
    pub fn from_text(text: &str, path: &Path) -> Self {
        ChatRequest {
            path: path.to_path_buf(),
            messages: vec![ChatMessage {
                role: ChatRole::User,
                content: text.to_string(),
                parts: None,
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
            }],
            tools: Vec::new(),
            thinking: false,
            effort_max: false,
            effort_budget: 50,
            format: ChatFormat::V4,
            notes: Vec::new(),
        }
    }

    /// A chat request body (`{"messages": [...], "tools": [...], ...}`) or a messages array.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ChatError> {
        Self::from_json_str_as(text, path, ChatFormat::V4)
    }

    /// [`ChatRequest::from_json_str`] for the encoder of `format`.
    pub fn from_json_str_as(
        text: &str,
        path: &Path,
        format: ChatFormat,
    ) -> Result<Self, ChatError> {
        let value: Json = serde_json::from_str(text).map_err(|e| ChatError::Json {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        Reader {
            path,
            format,
            notes: Vec::new(),
        }
        .request(&value)
    }
}

/// Walks the parsed JSON, naming the JSON path of anything it refuses.
struct Reader<'a> {
    path: &'a Path,
    format: ChatFormat,
    notes: Vec<String>,
}

impl Reader<'_> {
    fn field(&self, field: impl Into<String>, expected: &str, found: &Json) -> ChatError {
        ChatError::Field {
            path: self.path.to_path_buf(),
            field: field.into(),
            expected: expected.into(),
            found: found.kind(),
        }
    }

    fn request(mut self, value: &Json) -> Result<ChatRequest, ChatError> {
        let (messages, body) = match value {
            Json::Array(_) => (value, None),
            Json::Object(_) => (
                value.get("messages").ok_or_else(|| ChatError::Field {
                    path: self.path.to_path_buf(),
                    field: "messages".into(),
                    expected: "an array of messages".into(),
                    found: "no `messages` field".into(),
                })?,
                Some(value),
            ),
            other => {
                return Err(self.field(
                    "(top level)",
                    "a chat request object or a messages array",
                    other,
                ))
            }
        };
        let Json::Array(items) = messages else {
            return Err(self.field("messages", "an array of messages", messages));
        };
        let mut tools = Vec::new();
        let mut thinking = false;
        let mut effort: Option<&Json> = None;
        let (mut kw_effort, mut top_effort): (Option<&Json>, Option<&Json>) = (None, None);
        if let Some(body) = body {
            match body.get("tools") {
                None | Some(Json::Null) => {}
                Some(Json::Array(list)) => {
                    for (i, tool) in list.iter().enumerate() {
                        let Json::Object(_) = tool else {
                            return Err(self.field(format!("tools[{i}]"), "a tool object", tool));
                        };
                        match tool.get("function") {
                            Some(f @ Json::Object(_)) if self.format == ChatFormat::V41 => {
                                tools.push(v41_function(f))
                            }
                            Some(f @ Json::Object(_)) => tools.push(f.clone()),
                            Some(other) => {
                                return Err(self.field(
                                    format!("tools[{i}].function"),
                                    "an object (name, description, parameters)",
                                    other,
                                ))
                            }
                            None => {
                                return Err(ChatError::Field {
                                    path: self.path.to_path_buf(),
                                    field: format!("tools[{i}]"),
                                    expected: "a `function` object ({\"type\": \"function\", \
                                               \"function\": {\"name\", \"description\", \
                                               \"parameters\"}})"
                                        .into(),
                                    found: "no `function` field".into(),
                                })
                            }
                        }
                    }
                }
                Some(other) => return Err(self.field("tools", "an array of tools", other)),
            }
            match body.get("chat_template_kwargs") {
                None | Some(Json::Null) => {}
                Some(kwargs @ Json::Object(_)) => {
                    thinking = kwargs.get("thinking").is_some_and(Json::truthy);
                    effort = kwargs.get("reasoning_effort");
                    kw_effort = effort;
                }
                Some(other) => {
                    return Err(self.field("chat_template_kwargs", "an object", other));
                }
            }
            if let Some(e) = body.get("reasoning_effort") {
                effort = Some(e);
                top_effort = Some(e);
            }
        }
        let effort_budget = match self.format {
            ChatFormat::V41 => self.effort_v41(top_effort, kw_effort)?,
            ChatFormat::V4 => 50,
        };
        if self.format == ChatFormat::V41 {
            effort = None;
        }
        let effort_max = match effort {
            None | Some(Json::Null) => false,
            Some(Json::String(s)) if s == "max" => true,
            Some(Json::String(s)) if s == "high" => false,
            Some(Json::String(s)) => {
                self.notes.push(format!(
                    "reasoning_effort {s:?} renders as none (only \"max\" and \"high\" reach the \
                     V4 encoder; SGLang drops other values)"
                ));
                false
            }
            Some(other) => {
                return Err(self.field("reasoning_effort", "\"max\", \"high\" or null", other))
            }
        };
        let mut messages = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            messages.push(self.message(i, item)?);
        }
        let request = ChatRequest {
            path: self.path.to_path_buf(),
            messages,
            tools,
            thinking,
            effort_max,
            effort_budget,
            format: self.format,
            notes: self.notes,
        };
        request.check()?;
        Ok(request)
    }

    /// DeepSeek-V4.1's effort budget as SGLang resolves it (docs/spec/v41.md 6): the top-level
    /// `reasoning_effort` must be a tier or a number in [0, 0.99]; a non-null
    /// `chat_template_kwargs.reasoning_effort` wins over it; an int in 1..=100 is the budget, a
    /// float v is `min(100, max(1, round(100 v)))` (ties to even, as Python rounds), `low`,
    /// `high`, `xhigh`, `max` are 25, 50, 75, 100, and anything else falls back to `high`.
    fn effort_v41(&mut self, top: Option<&Json>, kw: Option<&Json>) -> Result<u32, ChatError> {
        const TIERS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
        let expected = "a tier (none, minimal, low, medium, high, xhigh, max) or a number in \
                        [0, 0.99]";
        let top = match top {
            None | Some(Json::Null) => None,
            Some(Json::String(t)) if TIERS.contains(&t.as_str()) => top,
            Some(v @ (Json::Int(_) | Json::Float(_))) => {
                let f = match v {
                    Json::Int(i) => *i as f64,
                    Json::Float(f) => *f,
                    _ => unreachable!("matched a number"),
                };
                if !(0.0..=0.99).contains(&f) {
                    return Err(self.field("reasoning_effort", expected, v));
                }
                Some(v)
            }
            Some(other) => return Err(self.field("reasoning_effort", expected, other)),
        };
        let (chosen, top_level) = match kw {
            Some(v) if *v != Json::Null => (Some(v), false),
            _ => (top, true),
        };
        let budget = match chosen {
            None | Some(Json::Null) | Some(Json::Bool(_)) => None,
            Some(Json::Int(i)) if top_level => {
                Some((*i as f64 * 100.0).round_ties_even().clamp(1.0, 100.0) as u32)
            }
            Some(Json::Int(i)) => (1..=100).contains(i).then_some(*i as u32),
            Some(Json::Float(f)) => Some((f * 100.0).round_ties_even().clamp(1.0, 100.0) as u32),
            Some(Json::String(t)) => EFFORT_TIERS_V41
                .iter()
                .find(|(name, _)| name == t)
                .map(|&(_, b)| b),
            Some(_) => None,
        };
        if budget.is_none() {
            if let Some(v) = chosen.filter(|v| **v != Json::Null) {
                self.notes.push(format!(
                    "reasoning_effort {} renders as high (50): DeepSeek-V4.1 takes low, high, \
                     xhigh, max, an int 1-100 or a fraction, and SGLang falls back to high",
                    python_json(v)
                ));
            }
        }
        Ok(budget.unwrap_or(50))
    }

    fn string_or_null(&self, field: String, v: Option<&Json>) -> Result<Option<String>, ChatError> {
        match v {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.field(field, "a string or null", other)),
        }
    }

    fn message(&mut self, i: usize, item: &Json) -> Result<ChatMessage, ChatError> {
        let at = |f: &str| format!("messages[{i}].{f}");
        let Json::Object(_) = item else {
            return Err(self.field(format!("messages[{i}]"), "a message object", item));
        };
        let role = match item.get("role") {
            Some(Json::String(r)) => match r.as_str() {
                "system" => ChatRole::System,
                "developer" => ChatRole::Developer,
                "user" => ChatRole::User,
                "assistant" => ChatRole::Assistant,
                "tool" => ChatRole::Tool,
                _ => {
                    return Err(ChatError::UnknownRole {
                        path: self.path.to_path_buf(),
                        field: at("role"),
                        role: r.clone(),
                    })
                }
            },
            Some(other) => return Err(self.field(at("role"), "a role string", other)),
            None => {
                return Err(ChatError::Field {
                    path: self.path.to_path_buf(),
                    field: format!("messages[{i}]"),
                    expected: "a `role`".into(),
                    found: "no `role` field".into(),
                })
            }
        };
        if let Some(task) = item.get("task").filter(|t| **t != Json::Null) {
            let task = match task {
                Json::String(s) => s.clone(),
                other => python_json(other),
            };
            return Err(ChatError::Task {
                path: self.path.to_path_buf(),
                index: i,
                task,
            });
        }
        let mut parts_v41: Option<Vec<String>> = None;
        let content = match item.get("content") {
            None | Some(Json::Null) => String::new(),
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(parts)) if self.format == ChatFormat::V41 => {
                let (content, blocks) = self.parts_v41(i, role, parts)?;
                parts_v41 = blocks;
                content
            }
            Some(Json::Array(parts)) => {
                let mut texts = Vec::new();
                for (j, part) in parts.iter().enumerate() {
                    let kind = match part.get("type") {
                        Some(Json::String(t)) => t.as_str(),
                        _ => {
                            return Err(self.field(
                                format!("messages[{i}].content[{j}].type"),
                                "a content part type (text, ...)",
                                part.get("type").unwrap_or(&Json::Null),
                            ))
                        }
                    };
                    match (kind, part.get("text")) {
                        ("text" | "input_text", Some(Json::String(t))) => texts.push(t.clone()),
                        ("text" | "input_text", other) => {
                            return Err(self.field(
                                format!("messages[{i}].content[{j}].text"),
                                "a string",
                                other.unwrap_or(&Json::Null),
                            ))
                        }
                        (other, _) => self.notes.push(format!(
                            "messages[{i}].content[{j}]: a {other:?} part is not rendered (the V4 \
                             encoder reads text only)"
                        )),
                    }
                }
                texts.join(" ")
            }
            Some(other) => {
                return Err(self.field(at("content"), "a string, null or content parts", other))
            }
        };
        let reasoning_content =
            self.string_or_null(at("reasoning_content"), item.get("reasoning_content"))?;
        let tool_call_id = self.string_or_null(at("tool_call_id"), item.get("tool_call_id"))?;
        let mut tool_calls = Vec::new();
        match item.get("tool_calls") {
            None | Some(Json::Null) => {}
            Some(Json::Array(calls)) => {
                for (j, call) in calls.iter().enumerate() {
                    let f = format!("messages[{i}].tool_calls[{j}]");
                    let function = match call.get("function") {
                        Some(func @ Json::Object(_)) => func,
                        other => {
                            return Err(self.field(
                                format!("{f}.function"),
                                "an object with `name` and `arguments`",
                                other.unwrap_or(&Json::Null),
                            ))
                        }
                    };
                    let name = match function.get("name") {
                        Some(Json::String(n)) => n.clone(),
                        other => {
                            return Err(self.field(
                                format!("{f}.function.name"),
                                "a string",
                                other.unwrap_or(&Json::Null),
                            ))
                        }
                    };
                    let mut arguments = function.get("arguments").cloned().unwrap_or(Json::Null);
                    if self.format == ChatFormat::V41 {
                        // SGLang's V4.1 request handling: a string must be a JSON object's
                        // text, and the encoder takes nothing but an object.
                        if let Json::String(text) = &arguments {
                            arguments = serde_json::from_str::<Json>(text).map_err(|e| {
                                ChatError::Field {
                                    path: self.path.to_path_buf(),
                                    field: format!("{f}.function.arguments"),
                                    expected: "valid JSON (a JSON object's text)".into(),
                                    found: format!("{e}"),
                                }
                            })?;
                        }
                        if !matches!(arguments, Json::Object(_)) {
                            return Err(self.field(
                                format!("{f}.function.arguments"),
                                "a JSON object (DeepSeek-V4.1's encoder takes no other \
                                 arguments)",
                                &arguments,
                            ));
                        }
                    }
                    // `id or function.id`, as the encoder looks it up.
                    let non_empty = |v: Option<&Json>| match v {
                        Some(Json::String(s)) if !s.is_empty() => Some(s.clone()),
                        _ => None,
                    };
                    let id = non_empty(call.get("id"))
                        .or_else(|| non_empty(function.get("id")))
                        .unwrap_or_default();
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
            }
            Some(other) => {
                return Err(self.field(at("tool_calls"), "an array of tool calls", other))
            }
        }
        if self.format == ChatFormat::V41 {
            for (f, text) in [
                ("content", Some(&content)),
                ("reasoning_content", reasoning_content.as_ref()),
            ] {
                if text.is_some_and(|t| t.contains(IMAGE_PLACEHOLDER)) {
                    return Err(ChatError::Field {
                        path: self.path.to_path_buf(),
                        field: at(f),
                        expected: "text without the image placeholder (images come as image \
                                   parts, which needlescope does not run)"
                            .into(),
                        found: format!("the text {IMAGE_PLACEHOLDER}"),
                    });
                }
            }
        }
        if role == ChatRole::Developer && content.is_empty() {
            return Err(ChatError::Field {
                path: self.path.to_path_buf(),
                field: at("content"),
                expected: "text (the encoder refuses an empty developer message)".into(),
                found: "empty content".into(),
            });
        }
        Ok(ChatMessage {
            role,
            content,
            parts: parts_v41,
            reasoning_content,
            tool_calls,
            tool_call_id,
        })
    }

    /// DeepSeek-V4.1's content parts of message `i` (docs/spec/v41.md 6): the message text is
    /// its `text` parts joined by `\n\n`; a user message keeps one block per part (another
    /// type renders as `[Unsupported TYPE]`), and so does a tool result, whose text is then its
    /// blocks joined. Image parts are refused: needlescope runs no vision path.
    fn parts_v41(
        &mut self,
        i: usize,
        role: ChatRole,
        parts: &[Json],
    ) -> Result<(String, Option<Vec<String>>), ChatError> {
        let mut texts = Vec::new();
        let mut blocks = Vec::new();
        for (j, part) in parts.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            let kind = match part.get("type") {
                Some(Json::String(t)) => t.as_str(),
                other => {
                    return Err(self.field(
                        format!("{at}.type"),
                        "a content part type (text, ...)",
                        other.unwrap_or(&Json::Null),
                    ))
                }
            };
            match (kind, part.get("text")) {
                ("image" | "image_url", _) => {
                    return Err(ChatError::Field {
                        path: self.path.to_path_buf(),
                        field: at,
                        expected: "text parts (needlescope runs DeepSeek-V4.1's text path only)"
                            .into(),
                        found: format!("an {kind} part"),
                    })
                }
                ("text", Some(Json::String(t))) => {
                    texts.push(t.clone());
                    blocks.push(t.clone());
                }
                ("text", other) => {
                    return Err(self.field(
                        format!("{at}.text"),
                        "a string",
                        other.unwrap_or(&Json::Null),
                    ))
                }
                (other, _) => blocks.push(format!("[Unsupported {other}]")),
            }
        }
        Ok(match role {
            ChatRole::User => (texts.join("\n\n"), Some(blocks)),
            ChatRole::Tool => (blocks.join("\n\n"), None),
            _ => (texts.join("\n\n"), None),
        })
    }
}

/// DeepSeek-V4.1's tool payload (SGLang's request handling): the `function` fields the encoder
/// knows (name, description, parameters, strict, defer_loading), nulls dropped, `name`,
/// `description`, `parameters` first, the rest in their order.
fn v41_function(f: &Json) -> Json {
    const FIELDS: [&str; 5] = [
        "description",
        "name",
        "parameters",
        "strict",
        "defer_loading",
    ];
    let Json::Object(entries) = f else {
        return f.clone();
    };
    let kept: Vec<&(String, Json)> = entries
        .iter()
        .filter(|(k, v)| FIELDS.contains(&k.as_str()) && *v != Json::Null)
        .collect();
    let first = ["name", "description", "parameters"];
    let mut out: Vec<(String, Json)> = first
        .iter()
        .filter_map(|n| kept.iter().find(|(k, _)| k == n).map(|&e| e.clone()))
        .collect();
    out.extend(
        kept.into_iter()
            .filter(|(k, _)| !first.contains(&k.as_str()))
            .cloned(),
    );
    Json::Object(out)
}

impl ChatRequest {
    /// The checks the encoder leaves to its caller: something to answer at the end, and every
    /// tool result answering a call of the assistant turn before it.
    fn check(&self) -> Result<(), ChatError> {
        let path = || self.path.to_path_buf();
        let Some(last) = self.messages.last() else {
            return Err(ChatError::Empty { path: path() });
        };
        if last.role == ChatRole::Assistant {
            return Err(ChatError::EndsWithAssistant {
                path: path(),
                index: self.messages.len() - 1,
            });
        }
        if !self.messages.iter().any(|m| {
            matches!(
                m.role,
                ChatRole::User | ChatRole::Developer | ChatRole::Tool
            )
        }) {
            return Err(ChatError::Empty { path: path() });
        }
        let mut calls: Option<&[ToolCall]> = None;
        for (index, m) in self.messages.iter().enumerate() {
            match m.role {
                ChatRole::Assistant => calls = Some(&m.tool_calls),
                ChatRole::Tool => {
                    let id = m.tool_call_id.clone().unwrap_or_default();
                    let why = match calls {
                        None => Some("no assistant message comes before it".to_string()),
                        Some([]) => {
                            Some("the assistant message before it makes no tool calls".into())
                        }
                        Some(c) if !c.iter().any(|tc| tc.id == id) => Some(format!(
                            "the assistant message before it calls {}",
                            c.iter()
                                .map(|tc| format!("{:?} ({})", tc.id, tc.name))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                        Some(_) => None,
                    };
                    if let Some(why) = why {
                        return Err(ChatError::UnmatchedToolResult {
                            path: path(),
                            index,
                            id,
                            why,
                        });
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// One block of a merged user turn.
#[derive(Clone, Debug)]
enum Block {
    Text(String),
    ToolResult { call_id: String, content: String },
}

/// A message as the encoder renders it (after tool results are merged into user turns).
#[derive(Clone, Debug)]
struct Turn {
    role: ChatRole,
    content: String,
    /// User turns: their text and tool-result blocks.
    blocks: Vec<Block>,
    reasoning_content: Option<String>,
    tool_calls: Vec<ToolCall>,
    /// Carries the request's tools (the first message).
    tools: bool,
    /// The request messages it renders.
    sources: Vec<usize>,
}

/// The rendered prompt and where each message went.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedChat {
    /// The prompt text, BOS first, special tokens as text.
    pub text: String,
    /// Per rendered turn: the request messages it renders (an inserted system message has
    /// none; a merged user turn has several) and its byte range in `text`.
    pub turns: Vec<(Vec<usize>, Range<usize>)>,
    /// Byte range of the last user turn's own text (the question), if it has text.
    pub question: Option<Range<usize>>,
}

impl RenderedChat {
    /// Which request messages the byte `at` belongs to, e.g. `messages[3]`, `messages[4..6]`,
    /// or `the inserted system message`.
    pub fn locate(&self, at: usize) -> String {
        match self.turns.iter().find(|(_, r)| r.contains(&at)) {
            Some((s, _)) if s.is_empty() => "the inserted system message (tools)".into(),
            Some((s, _)) if s.len() == 1 => format!("messages[{}]", s[0]),
            Some((s, _)) => format!("messages[{}..={}]", s[0], s[s.len() - 1]),
            None => "the chat markers".into(),
        }
    }
}

impl ChatRequest {
    /// Renders the conversation as the V4 encoder does (module docs).
    pub fn render(&self) -> RenderedChat {
        let mut turns = self.merged_turns();
        let has_tools = turns.iter().any(|t| t.tools);
        let drop_thinking = !has_tools;
        let v41 = self.format == ChatFormat::V41;
        if self.thinking && drop_thinking {
            turns = drop_earlier_thinking(turns, self.format);
        }
        let last_user = last_user_turn(&turns, self.format);
        let effort_v41 = if v41 && self.thinking {
            effort_line_v41(self.effort_budget)
        } else {
            String::new()
        };
        let names = DsmlNames::of(self.format);
        let mut text = String::from(BOS);
        let mut spans = Vec::with_capacity(turns.len());
        let mut question = None;
        for (i, turn) in turns.iter().enumerate() {
            let start = text.len();
            if i == 0 && self.thinking && self.effort_max && !v41 {
                text.push_str(REASONING_EFFORT_MAX);
            }
            if v41 && i == 0 && (!effort_v41.is_empty() || turn.role == ChatRole::System) {
                text.push_str(SYSTEM);
                text.push_str(&effort_v41);
            }
            match turn.role {
                ChatRole::System => {
                    if v41 && i > 0 {
                        text.push_str(SYSTEM);
                    }
                    text.push_str(&turn.content);
                    if turn.tools {
                        text.push_str("\n\n");
                        text.push_str(&render_tools(&self.tools, names));
                    }
                }
                ChatRole::Developer => {
                    text.push_str(USER);
                    if Some(i) == last_user {
                        question = Some(text.len()..text.len() + turn.content.len());
                    }
                    text.push_str(&turn.content);
                    if turn.tools {
                        text.push_str("\n\n");
                        text.push_str(&render_tools(&self.tools, names));
                    }
                }
                ChatRole::User => {
                    text.push_str(USER);
                    for (j, block) in turn.blocks.iter().enumerate() {
                        if j > 0 {
                            text.push_str("\n\n");
                        }
                        match block {
                            Block::Text(t) => {
                                if Some(i) == last_user && !t.is_empty() {
                                    question = Some(text.len()..text.len() + t.len());
                                }
                                text.push_str(t);
                            }
                            Block::ToolResult { content, .. } => {
                                text.push_str("<tool_result>");
                                text.push_str(content);
                                text.push_str("</tool_result>");
                            }
                        }
                    }
                }
                ChatRole::Assistant => {
                    let keep_reasoning = !drop_thinking || last_user.is_none_or(|u| i > u);
                    if self.thinking && keep_reasoning {
                        text.push_str(turn.reasoning_content.as_deref().unwrap_or(""));
                        text.push_str(THINK_END);
                    }
                    text.push_str(&turn.content);
                    if !turn.tool_calls.is_empty() {
                        text.push_str("\n\n");
                        text.push_str(&render_tool_calls(&turn.tool_calls, names));
                    }
                    text.push_str(EOS);
                }
                ChatRole::Tool => unreachable!("tool messages are merged into user turns"),
            }
            let next_is_assistant = turns
                .get(i + 1)
                .is_some_and(|t| t.role == ChatRole::Assistant);
            let is_last = i + 1 == turns.len();
            // V4.1 answers a system message after index 0 as it answers a user turn.
            let asks = matches!(turn.role, ChatRole::User | ChatRole::Developer)
                || (v41 && turn.role == ChatRole::System && i > 0);
            if (is_last || next_is_assistant) && asks {
                text.push_str(ASSISTANT);
                let think = self.thinking && (!drop_thinking || last_user.is_some_and(|u| i >= u));
                text.push_str(if think { THINK_START } else { THINK_END });
            }
            spans.push((turn.sources.clone(), start..text.len()));
        }
        RenderedChat {
            text,
            turns: spans,
            question,
        }
    }

    /// The encoder's input: an empty system message first when the first message is not a
    /// system message (carrying the tools), tool results and the user messages next to them
    /// merged into one user turn, results in the calls' order.
    fn merged_turns(&self) -> Vec<Turn> {
        let mut turns: Vec<Turn> = Vec::new();
        let first_is_system = self.messages.first().map(|m| m.role) == Some(ChatRole::System);
        // V4's request handling always inserts it; V4.1's only when there are tools.
        let insert = match self.format {
            ChatFormat::V4 => !first_is_system,
            ChatFormat::V41 => !first_is_system && !self.tools.is_empty(),
        };
        if insert {
            turns.push(Turn {
                role: ChatRole::System,
                content: String::new(),
                blocks: Vec::new(),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tools: false,
                sources: Vec::new(),
            });
        }
        for (i, m) in self.messages.iter().enumerate() {
            // A V4.1 user message given as parts adds one block per part.
            if let (ChatRole::User, Some(parts)) = (m.role, &m.parts) {
                let blocks = parts.iter().map(|p| Block::Text(p.clone()));
                match turns.last_mut() {
                    Some(t) if t.role == ChatRole::User => {
                        t.blocks.extend(blocks);
                        t.sources.push(i);
                    }
                    _ => turns.push(Turn {
                        role: ChatRole::User,
                        content: String::new(),
                        blocks: blocks.collect(),
                        reasoning_content: None,
                        tool_calls: Vec::new(),
                        tools: false,
                        sources: vec![i],
                    }),
                }
                continue;
            }
            let block = match m.role {
                ChatRole::User => Some(Block::Text(m.content.clone())),
                ChatRole::Tool => Some(Block::ToolResult {
                    call_id: m.tool_call_id.clone().unwrap_or_default(),
                    content: m.content.clone(),
                }),
                _ => None,
            };
            match (block, turns.last_mut()) {
                (Some(b), Some(t)) if t.role == ChatRole::User => {
                    t.blocks.push(b);
                    t.sources.push(i);
                }
                (Some(b), _) => turns.push(Turn {
                    role: ChatRole::User,
                    content: String::new(),
                    blocks: vec![b],
                    reasoning_content: None,
                    tool_calls: Vec::new(),
                    tools: false,
                    sources: vec![i],
                }),
                (None, _) => turns.push(Turn {
                    role: m.role,
                    content: m.content.clone(),
                    blocks: Vec::new(),
                    reasoning_content: m.reasoning_content.clone(),
                    tool_calls: m.tool_calls.clone(),
                    tools: false,
                    sources: vec![i],
                }),
            }
        }
        if !self.tools.is_empty() && !turns.is_empty() {
            turns[0].tools = true;
        }
        // Tool results in the order of the calls of the assistant turn before them (a stable
        // sort; an unknown id sorts as call 0, as the encoder does).
        let mut order: Vec<(String, usize)> = Vec::new();
        for t in &mut turns {
            if t.role == ChatRole::Assistant && !t.tool_calls.is_empty() {
                order = t
                    .tool_calls
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| !c.id.is_empty())
                    .map(|(k, c)| (c.id.clone(), k))
                    .collect();
            } else if t.role == ChatRole::User {
                let results: Vec<usize> = (0..t.blocks.len())
                    .filter(|&k| matches!(t.blocks[k], Block::ToolResult { .. }))
                    .collect();
                if results.len() > 1 && !order.is_empty() {
                    let rank = |b: &Block| match b {
                        Block::ToolResult { call_id, .. } => order
                            .iter()
                            .rev()
                            .find(|(id, _)| id == call_id)
                            .map_or(0, |(_, k)| *k),
                        Block::Text(_) => 0,
                    };
                    let mut sorted: Vec<Block> =
                        results.iter().map(|&k| t.blocks[k].clone()).collect();
                    sorted.sort_by_key(|b| rank(b));
                    for (&k, b) in results.iter().zip(sorted) {
                        t.blocks[k] = b;
                    }
                }
            }
        }
        turns
    }
}

/// The last turn that asks for an answer: a user or developer turn, and for V4.1 also a
/// system message after index 0.
fn last_user_turn(turns: &[Turn], format: ChatFormat) -> Option<usize> {
    turns.iter().enumerate().rposition(|(i, t)| {
        matches!(t.role, ChatRole::User | ChatRole::Developer)
            || (format == ChatFormat::V41 && t.role == ChatRole::System && i > 0)
    })
}

/// Thinking mode without tools: before the last user (or developer) turn, assistant turns
/// lose their reasoning and developer turns are dropped.
fn drop_earlier_thinking(turns: Vec<Turn>, format: ChatFormat) -> Vec<Turn> {
    let last_user = last_user_turn(&turns, format);
    turns
        .into_iter()
        .enumerate()
        .filter_map(|(i, mut t)| {
            if last_user.is_none_or(|u| i >= u)
                || matches!(t.role, ChatRole::User | ChatRole::System)
            {
                return Some(t);
            }
            match t.role {
                ChatRole::Assistant => {
                    t.reasoning_content = None;
                    Some(t)
                }
                _ => None,
            }
        })
        .collect()
}

/// The DSML tag names of a release: V4's `tool_calls`, `invoke`, `parameter`; V4.1's
/// ` calls`, ` invoke`, ` parameter` (a leading space); and whether arguments given as a JSON
/// object are used as they are (V4.1) or, not being a string, wrapped as one `arguments`
/// parameter (V4's fallback).
#[derive(Clone, Copy, Debug)]
struct DsmlNames {
    calls: &'static str,
    invoke: &'static str,
    parameter: &'static str,
    object_arguments: bool,
}

impl DsmlNames {
    fn of(format: ChatFormat) -> Self {
        match format {
            ChatFormat::V4 => DsmlNames {
                calls: "tool_calls",
                invoke: "invoke",
                parameter: "parameter",
                object_arguments: false,
            },
            ChatFormat::V41 => DsmlNames {
                calls: " calls",
                invoke: " invoke",
                parameter: " parameter",
                object_arguments: true,
            },
        }
    }
}

/// The `## Tools` block: the instructions, then one schema per line.
fn render_tools(tools: &[Json], names: DsmlNames) -> String {
    let schemas: Vec<String> = tools.iter().map(python_json).collect();
    let DsmlNames {
        calls,
        invoke,
        parameter,
        ..
    } = names;
    format!(
        "## Tools\n\n\
You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{DSML}{calls}>\" block like the following:\n\n\
<{DSML}{calls}>\n\
<{DSML}{invoke} name=\"$TOOL_NAME\">\n\
<{DSML}{parameter} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}{parameter}>\n\
...\n\
</{DSML}{invoke}>\n\
<{DSML}{invoke} name=\"$TOOL_NAME2\">\n\
...\n\
</{DSML}{invoke}>\n\
</{DSML}{calls}>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n\
### Available Tool Schemas\n\n\
{}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
        schemas.join("\n")
    )
}

/// The DSML block of an assistant turn's tool calls.
fn render_tool_calls(calls: &[ToolCall], names: DsmlNames) -> String {
    let DsmlNames {
        calls: block,
        invoke,
        ..
    } = names;
    let invokes: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "<{DSML}{invoke} name=\"{}\">\n{}\n</{DSML}{invoke}>",
                c.name,
                render_arguments(&c.arguments, names)
            )
        })
        .collect();
    format!("<{DSML}{block}>\n{}\n</{DSML}{block}>", invokes.join("\n"))
}

/// One `parameter` line per argument: strings as they are (`string="true"`), anything else
/// as JSON. Arguments that are not a JSON object string become one `arguments` parameter
/// holding what was given, as the encoder's fallback does.
fn render_arguments(arguments: &Json, names: DsmlNames) -> String {
    let parameter = names.parameter;
    let parsed = match arguments {
        Json::String(s) => serde_json::from_str::<Json>(s).ok(),
        // V4.1's arguments were checked to be an object when read.
        object @ Json::Object(_) if names.object_arguments => Some(object.clone()),
        _ => None,
    };
    let entries: Vec<(String, Json)> = match parsed {
        Some(Json::Object(entries)) => entries,
        _ => vec![("arguments".to_string(), arguments.clone())],
    };
    entries
        .iter()
        .map(|(k, v)| {
            let (is_str, value) = match v {
                Json::String(s) => ("true", s.clone()),
                other => ("false", python_json(other)),
            };
            format!(
                "<{DSML}{parameter} name=\"{k}\" string=\"{is_str}\">{value}</{DSML}{parameter}>"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ChatRequest, ChatError> {
        ChatRequest::from_json_str(text, Path::new("p.json"))
    }

    #[test]
    fn python_float_repr_matches_python() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (100000.0, "100000.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn python_json_keeps_key_order_and_escapes_like_python() {
        let v: Json =
            serde_json::from_str(r#"{"z": 1, "a": [true, null, 2.0], "é": "x\"\n\u001b"}"#)
                .unwrap();
        assert_eq!(
            python_json(&v),
            r#"{"z": 1, "a": [true, null, 2.0], "é": "x\"\n\u001b"}"#
        );
    }

    #[test]
    fn a_tool_without_function_an_unknown_role_and_a_task_are_refused() {
        let e =
            parse(r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("tools[0]") && e.contains("function"), "{e}");
        let e = parse(r#"[{"role":"bot","content":"x"}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("messages[0].role") && e.contains("\"bot\""),
            "{e}"
        );
        let e = parse(r#"[{"role":"user","content":"x","task":"query"}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("messages[0].task") && e.contains("query"), "{e}");
    }
}
