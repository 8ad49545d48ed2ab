//! How a scenario's answer is judged, and the notes a run prints about its answer: the
//! generated text against the needle's value (thinking mode, cut-off answers, hedged digit
//! answers), numbers in a `--haystack-file` shaped like the answer, and thinking scenarios
//! that need room to reach `</think>`. Methods of [`Scenario`], kept apart from its loading.

use super::scenario::{AnswerCheck, HaystackKind, Scenario};
use super::value::ValueSpec;

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
    pub fn judge_generated(&self, generated: &str, value: &str, ended: bool) -> Option<bool> {
        let answer = if self.thinking {
            generated.rsplit_once(crate::tokenizer::THINK_END)?.1
        } else {
            generated
        };
        match self.check_answer(answer, value) {
            true => Some(true),
            false if ended => Some(false),
            false => None,
        }
    }

    /// Whether `generated` answers correctly for the expected `value`: the scenario's check
    /// passes and, for a digits value, no other number of the value's length is offered beside
    /// it (an answer that hedges between candidates has not recalled the needle).
    pub fn check_answer(&self, generated: &str, value: &str) -> bool {
        let passes = match &self.answer {
            AnswerCheck::Substring => generated.contains(value),
            AnswerCheck::Regex(p) => {
                regex::Regex::new(&p.replace("{value}", &regex::escape(value)))
                    .map(|re| re.is_match(generated))
                    .unwrap_or(false)
            }
        };
        let hedges = match self.value {
            ValueSpec::Digits { .. } => digit_runs_of(generated, value.len())
                .iter()
                .any(|r| *r != value),
            _ => false,
        };
        passes && !hedges
    }
}

/// The maximal runs of ASCII digits in `text` that are exactly `n` long.
fn digit_runs_of(text: &str, n: usize) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|run| run.len() == n)
        .collect()
}
