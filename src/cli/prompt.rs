//! `needlescope prompt`: renders a `--prompt` conversation, or a scenario at `--length` /
//! `--depth`, without running a model, and shows what a probe would rank: the token count,
//! each needle's span with the text around it, the answer; `--ids-out FILE` writes the ids in
//! the form `trace --tokens` reads, `--json` prints `{"tokens", "text", "needles", "answer"}`.
//! This is how a user checks a 30K-token prompt before a long GPU run.
//!
//! The flags become a [`PromptSource`] (`run::prompt`), the one place that turns them into a
//! scenario and a [`NeedlePrompt`]; `probe` and `trace` share these flag structs.

use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::flags::{parse_depth, parse_token_count};
use crate::probe::prompt::NeedleCount;
use crate::probe::NeedlePrompt;
use crate::run::prompt::PromptSource;
use crate::tokenizer::V4Tokenizer;

#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    #[command(flatten)]
    pub conversation: ConversationArgs,

    /// Scenario: a built-in name (passkey, ...) or a scenario TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "passkey")]
    pub scenario: String,

    /// Prompt length in tokens, e.g. 16000, 16k (= 16384) or 1m
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_parser = parse_token_count, default_value = "16k")]
    pub length: usize,

    /// Needle depth in percent of the haystack: 0 = start, 100 = end
    #[arg(long, allow_negative_numbers = true, value_name = "PCT", value_parser = parse_depth, default_value = "50")]
    pub depth: f64,

    /// Seed of the needle value and the haystack
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = super::flags::parse_seed)]
    pub seed: u64,

    /// Haystack text for scenarios whose haystack kind is `file` (the built-in `essay`, say)
    #[arg(long, value_name = "FILE")]
    pub haystack_file: Option<PathBuf>,

    #[command(flatten)]
    pub needles: NeedlesArgs,

    /// Model directory (or ORG/NAME in the Hugging Face cache) whose tokenizer and context
    /// length to use [default: the built-in V4 tokenizer, no context limit]
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: Option<PathBuf>,

    /// With --model ORG/NAME: the ref or commit of the snapshot [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Write the token ids here (one line, space-separated: what `trace --tokens` reads)
    #[arg(long, value_name = "FILE")]
    pub ids_out: Option<PathBuf>,

    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

/// `--prompt FILE`, `--needle`, `--answer`: a user's conversation instead of a scenario (probe
/// and prompt; trace takes `--prompt` alone).
#[derive(Args, Debug, Clone)]
pub struct ConversationArgs {
    /// Your own conversation instead of a scenario: an OpenAI-style chat request (*.json: messages, tools, chat_template_kwargs.thinking, reasoning_effort) or a messages array; any other file is UTF-8 text, one user message in chat mode. Rendered as DeepSeek-V4's encoder renders it (docs/prompts.md)
    #[arg(long, value_name = "FILE", conflicts_with_all = ["scenario", "length", "depth", "seed", "haystack_file"])]
    pub prompt: Option<PathBuf>,

    /// With --prompt: a needle, the text the model loses, exactly as it stands in the rendered prompt (repeatable, at least one; each must occur there once; each is ranked on every CSA layer)
    #[arg(long, value_name = "TEXT", requires = "prompt")]
    pub needle: Vec<String>,

    /// With --prompt: the expected answer (a reply is correct when it contains it; probe needs it unless --generate 0)
    #[arg(long, value_name = "TEXT", requires = "prompt")]
    pub answer: Option<String>,
}

/// `--needles N` / `--ask`: several needles in a scenario's prompt (RULER's multi-key case).
#[derive(Args, Debug, Clone)]
pub struct NeedlesArgs {
    /// Needles in a scenario's prompt: the first at --depth, the others evenly spaced after it (passkey, kv-retrieval); each is ranked on every CSA layer
    #[arg(long = "needles", value_name = "N", default_value_t = 1, value_parser = super::flags::parse_positive, conflicts_with = "prompt")]
    pub count: usize,

    /// With --needles N: which needle the question asks for: first, last or all (the answer must hold every value)
    #[arg(
        long,
        value_name = "first|last|all",
        default_value = "first",
        conflicts_with = "prompt"
    )]
    pub ask: crate::probe::scenario::Ask,
}

impl NeedlesArgs {
    pub fn count(&self) -> NeedleCount {
        NeedleCount {
            count: self.count,
            ask: self.ask,
        }
    }
}

pub fn run(args: &PromptArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (tok, max_positions) = match &args.model {
        Some(model) => {
            let cfg = crate::config::ModelConfig::load(model)?;
            let tok = crate::run::target::load_tokenizer(model, &cfg)?;
            (tok, cfg.max_position_embeddings)
        }
        None => (V4Tokenizer::builtin()?, usize::MAX),
    };
    let conv = &args.conversation;
    let source = match &conv.prompt {
        Some(path) => PromptSource::Conversation {
            path,
            needles: &conv.needle,
            answer: conv.answer.as_deref(),
        },
        None => PromptSource::Scenario {
            name: &args.scenario,
            haystack_file: args.haystack_file.as_deref(),
            length: args.length,
            depth: args.depth,
            seed: args.seed,
            needles: args.needles.count(),
        },
    };
    let (scenario, prompt) =
        source.build(&tok, crate::probe::chat::ChatFormat::V4, max_positions, 0)?;
    if let Some(path) = &args.ids_out {
        write_ids(path, &prompt.tokens)?;
    }
    if args.json {
        let obj = serde_json::json!({
            "tokens": prompt.tokens,
            "text": prompt.prompt_text,
            "needles": needles_json(&prompt),
            "answer": (!prompt.answer_value.is_empty()).then_some(&prompt.answer_value),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&obj)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} | {} tokens | {}",
        scenario.name,
        prompt.tokens.len(),
        match prompt.answer_value.as_str() {
            "" => "no --answer".to_string(),
            a => format!(
                "answer {a:?} at tokens {}..{}",
                prompt.answer.0, prompt.answer.1
            ),
        }
    )?;
    print_needles(out, &tok, &prompt)?;
    if let Some(path) = &args.ids_out {
        writeln!(
            out,
            "wrote {} token ids to {}",
            prompt.tokens.len(),
            path.display()
        )?;
    }
    Ok(())
}

/// `[{"text", "span": [a, b], "location", "span_text", "glued_before", "glued_after"}]`.
pub fn needles_json(prompt: &NeedlePrompt) -> serde_json::Value {
    serde_json::Value::Array(
        prompt
            .needles
            .iter()
            .map(|n| {
                serde_json::json!({
                    "text": n.text,
                    "span": [n.span.0, n.span.1],
                    "location": n.location,
                    "span_text": n.span_text,
                    "glued_before": n.glued_before,
                    "glued_after": n.glued_after,
                })
            })
            .collect(),
    )
}

/// Tokens shown either side of a needle's span.
const AROUND_TOKENS: usize = 12;

/// One line per needle: its index, span, location and the text around it, with a line for
/// a token BPE merged across an edge.
pub fn print_needles(
    out: &mut dyn Write,
    tok: &V4Tokenizer,
    prompt: &NeedlePrompt,
) -> anyhow::Result<()> {
    for (i, n) in prompt.needles.iter().enumerate() {
        let (a, b) = n.span;
        let before = tok.decode(&prompt.tokens[a.saturating_sub(AROUND_TOKENS)..a])?;
        let after = tok.decode(&prompt.tokens[b..(b + AROUND_TOKENS).min(prompt.tokens.len())])?;
        writeln!(
            out,
            "needle {i}: tokens {a}..{b} ({} tokens) in {}: {:?}",
            b - a,
            n.location,
            format!("{before}[{}]{after}", n.span_text)
        )?;
        for (edge, glued) in [("first", &n.glued_before), ("last", &n.glued_after)] {
            if !glued.is_empty() {
                writeln!(
                    out,
                    "  its {edge} token also holds {glued:?} outside the needle (a BPE merge \
                     across the edge; the span keeps that token)"
                )?;
            }
        }
    }
    Ok(())
}

/// Writes `ids` as one space-separated line, refusing to overwrite a directory.
fn write_ids(path: &Path, ids: &[u32]) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "--ids-out {}: is a directory, expected the path of the token file to write",
            path.display()
        );
    }
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    std::fs::write(path, format!("{}\n", line.join(" ")))
        .map_err(|e| anyhow::anyhow!("--ids-out {}: cannot write: {e}", path.display()))
}
