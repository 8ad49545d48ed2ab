//! Checks of a run's arguments that hold whatever command asks for the run (probe, sweep,
//! trace, bench and a sweep's plan on resume): no value listed twice, no top-k past the
//! model's rows, the positions a prompt takes, DeepSeek-V4.1's profiles and KV rounding.

use crate::config::ModelConfig;
use crate::numerics::profiles::{IndexProfile, KvMode};

/// The positions a run of a `length`-token prompt generating `generate` tokens takes: the
/// prompt's, then one per generated token but the last (which is never fed back).
pub fn positions_taken(length: usize, generate: usize) -> usize {
    length + generate.saturating_sub(1)
}

/// Refuses a list flag that names one value twice (`key` says when two values are the same:
/// an alias and its profile name, say), so that no grid cell is run or recorded twice.
pub fn refuse_duplicates<T, K: PartialEq + std::fmt::Display>(
    flag: &str,
    values: &[T],
    key: impl Fn(&T) -> K,
) -> anyhow::Result<()> {
    let keys: Vec<K> = values.iter().map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].contains(k) {
            anyhow::bail!("{flag}: expected each value once, found {k} twice");
        }
    }
    Ok(())
}

/// A note for `--compare` profiles that are also `--index` ones: every driving profile is
/// scored in every run already, so they add nothing (and would otherwise go unmentioned). Not
/// an error: a report directory started with such arguments must still resume with them.
pub fn compare_of_index_note(indexes: &[IndexProfile], compare: &[IndexProfile]) -> Option<String> {
    let both: Vec<&str> = compare
        .iter()
        .filter(|p| indexes.contains(p))
        .map(|p| p.name())
        .collect();
    (!both.is_empty()).then(|| {
        format!(
            "--compare {}: also among the --index profiles, each of which every run scores \
             already; nothing is added",
            both.join(",")
        )
    })
}

/// Refuses a top-k larger than the compressed rows the model can ever hold
/// (`max_position_embeddings / 4`): it would select every row at every position and only
/// allocate (`[chunk, k]` selections per CSA layer, `[tokens, k]` in a trace).
pub fn refuse_topk_past_rows(
    flag: &str,
    values: &[usize],
    cfg: &ModelConfig,
) -> anyhow::Result<()> {
    let rows = crate::model::max_compressed_rows(cfg);
    if let Some(k) = values.iter().find(|&&k| k > rows) {
        anyhow::bail!(
            "{flag} {k}: expected at most {rows}, the compressed rows of the model's \
             max_position_embeddings ({} tokens, one row per 4); a larger top-k selects every row",
            cfg.max_position_embeddings
        );
    }
    Ok(())
}

/// Refuses profiles and a KV rounding DeepSeek-V4.1 does not have, naming the flag (probe and
/// sweep).
pub fn refuse_non_v41_numerics(
    indexes: &[IndexProfile],
    compare: &[IndexProfile],
    kv: KvMode,
) -> anyhow::Result<()> {
    for (flag, profiles) in [("--index", indexes), ("--compare", compare)] {
        if let Some(p) = profiles.iter().find(|p| !IndexProfile::V41.contains(p)) {
            anyhow::bail!(
                "{flag} {p}: DeepSeek-V4.1 rotates neither index queries nor keys; expected a \
                 profile without a Hadamard rotation ({})",
                names(&IndexProfile::V41)
            );
        }
    }
    if !KvMode::V41.contains(&kv) {
        anyhow::bail!(
            "--kv {}: expected exact or release on DeepSeek-V4.1 (fp8 is DeepSeek-V4's rounding \
             of 448 nope dims in blocks of 64)",
            kv
        );
    }
    Ok(())
}

/// Profile names, comma-separated.
fn names(profiles: &[IndexProfile]) -> String {
    profiles
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last generated token is never fed back, so it takes no position: a prompt of the
    /// model's whole length may still generate one token.
    #[test]
    fn a_run_takes_its_prompt_and_all_but_the_last_generated_token() {
        assert_eq!(positions_taken(2048, 0), 2048);
        assert_eq!(positions_taken(2048, 1), 2048);
        assert_eq!(positions_taken(2025, 24), 2048);
        assert_eq!(positions_taken(2025, 25), 2049);
    }
}
