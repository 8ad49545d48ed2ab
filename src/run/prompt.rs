//! Where a command's prompt comes from: a user's conversation (`--prompt`, `--needle`,
//! `--answer`) or a scenario at a length, depth and seed, turned into the scenario and the
//! [`NeedlePrompt`] a run ranks (`probe`, `prompt`, `trace --prompt`). The CLI fills a
//! [`PromptSource`] from its flags; building it reads files, so it lives here.

use std::path::Path;

use crate::probe::chat::{ChatFormat, ChatRequest};
use crate::probe::conversation::conversation_prompt;
use crate::probe::prompt::{build_prompt_for, NeedleCount, PromptSpec};
use crate::probe::{NeedlePrompt, Scenario};
use crate::tokenizer::V4Tokenizer;

/// Where a probe's prompt comes from.
#[derive(Clone, Copy, Debug)]
pub enum PromptSource<'a> {
    /// A user's conversation (`--prompt`), its needles and expected answer.
    Conversation {
        path: &'a Path,
        needles: &'a [String],
        answer: Option<&'a str>,
    },
    /// A scenario at a length, depth and seed.
    Scenario {
        name: &'a str,
        haystack_file: Option<&'a Path>,
        length: usize,
        depth: f64,
        seed: u64,
        needles: NeedleCount,
    },
}

impl PromptSource<'_> {
    /// The seed of the needle value and haystack (0 for a conversation, which has neither).
    pub fn seed(&self) -> u64 {
        match *self {
            PromptSource::Scenario { seed, .. } => seed,
            PromptSource::Conversation { .. } => 0,
        }
    }

    /// How many needles a scenario places and which the question asks (a conversation's
    /// needles are the user's: the default here).
    pub fn needle_count(&self) -> NeedleCount {
        match *self {
            PromptSource::Scenario { needles, .. } => needles,
            PromptSource::Conversation { .. } => NeedleCount::default(),
        }
    }

    /// The scenario and the prompt in the chat format of `format`; `reserve` positions (tokens to generate) must fit after a
    /// conversation within `max_positions`. Notes (parts not rendered, a text file that looks
    /// like JSON, a haystack file holding numbers shaped like the answer) go to stderr.
    pub fn build(
        &self,
        tok: &V4Tokenizer,
        format: ChatFormat,
        max_positions: usize,
        reserve: usize,
    ) -> anyhow::Result<(Scenario, NeedlePrompt)> {
        match *self {
            PromptSource::Conversation {
                path,
                needles,
                answer,
            } => {
                let request = ChatRequest::from_file_as(path, format)?;
                for note in &request.notes {
                    eprintln!("note: --prompt {}: {note}", path.display());
                }
                let prompt =
                    conversation_prompt(tok, &request, needles, answer, max_positions, reserve)?;
                let scenario =
                    Scenario::conversation(path, needles, answer.unwrap_or(""), request.thinking);
                Ok((scenario, prompt))
            }
            PromptSource::Scenario {
                name,
                haystack_file,
                length,
                depth,
                seed,
                needles,
            } => {
                let scenario = Scenario::load_with(name, haystack_file)?;
                if let Some(note) = scenario.competing_answers_note() {
                    eprintln!("note: {note}");
                }
                let spec = PromptSpec {
                    scenario: &scenario,
                    format,
                    target_tokens: length,
                    depth_pct: depth,
                    seed,
                    max_positions,
                    needles,
                };
                let prompt = build_prompt_for(&spec, tok)?;
                Ok((scenario, prompt))
            }
        }
    }
}
