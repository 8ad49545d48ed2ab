//! Checks of a run's arguments that hold whatever command asks for the run (probe, sweep,
//! trace, bench and a sweep's plan on resume): no value listed twice, no top-k past the
//! model's rows, the positions a prompt takes, DeepSeek-V4.1's profiles and KV rounding.

use crate::backend::WeightResidency;
use crate::config::ModelConfig;
use crate::devices::plan::{host_plan, AsPlanModel, Footprint, HostMemory, HostPlanInput};
use crate::numerics::profiles::{IndexProfile, KvMode};

/// Refuses a device choice DeepSeek-V4.1 cannot run with yet: a GPU (`--device cuda`, its
/// CUDA backend is a later issue) or bf16 products on the CPU (`--cpu-gemm bf16`: its CPU model
/// computes in f32 only). `--gpu-gemm` is ignored on the CPU, as for V4.
pub fn refuse_v41_device(device: &crate::run::device::DeviceChoice) -> anyhow::Result<()> {
    use crate::run::device::DeviceSpec;
    if !matches!(device.device, DeviceSpec::Cpu | DeviceSpec::Auto) {
        anyhow::bail!(
            "--device {}: DeepSeek-V4.1 runs on the CPU reference only for now (--device cpu or \
             auto); its CUDA backend is a later issue",
            device.device
        );
    }
    if device.cpu_gemm == Some(crate::backend::gpu::GemmType::Bf16) {
        anyhow::bail!(
            "--cpu-gemm bf16: DeepSeek-V4.1 runs on the CPU reference in f32 only for now \
             (leave out --cpu-gemm, or give f32)"
        );
    }
    Ok(())
}

/// Refuses a CPU run this host cannot hold, before a weight is read: the host memory plan
/// ([`crate::devices::plan::host_plan`]) of `model` at `context` tokens in chunks of `chunk`
/// with `weights` (resolved) on rayon's threads, against what the process may take
/// ([`crate::devices::host::host_memory_available`]: `NEEDLESCOPE_HOST_MEMORY`, else
/// `MemAvailable` under any cgroup limit). Passes where neither can be read (refusing on a
/// guess would block runs that fit).
pub fn refuse_host_shortfall(
    model: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    context: usize,
    chunk: usize,
    weights: WeightResidency,
) -> anyhow::Result<()> {
    let Some((capacity, source)) =
        crate::devices::host::host_memory_available().map_err(anyhow::Error::msg)?
    else {
        return Ok(());
    };
    let memory = HostMemory {
        capacity,
        source,
        spec: "cpu".into(),
    };
    let run = HostPlanInput {
        context,
        chunk,
        weights,
        threads: rayon::current_num_threads(),
    };
    let plan = host_plan(model, footprint, run, &memory);
    if !plan.fits {
        anyhow::bail!(
            "{}; before loading anything (see it part by part: needlescope inspect --model DIR \
             --devices cpu --context {}; a shorter prompt, a smaller --chunk or fewer --threads \
             need less)",
            plan.refusal(),
            plan.context
        );
    }
    Ok(())
}

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
