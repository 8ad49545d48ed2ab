//! The GPU backend's environment switches, parsed once per process into one [`GpuSwitches`]
//! ([`GpuSwitches::from_env`]). Every reader takes its value from there: the backend (GEMM
//! attention, batched experts), both executors (op profile, buffer pool) and the run layer
//! (decoded-copy cap). A command refuses a bad value before a GPU run starts by calling
//! [`GpuSwitches::from_env`] itself; the error names the variable, what it expects and what it
//! found (a misspelt `batch` must not silently run the path the user meant to avoid).
//!
//! | variable | values | default |
//! |---|---|---|
//! | [`ATTENTION_ENV`] | `gemm`: sparse attention as batched GEMMs | per-product kernels |
//! | [`MOE_ENV`] | `batched`: routed experts as batched GEMMs | expert by expert |
//! | [`PROFILE_ENV`] | `1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off` (any case) | off |
//! | [`POOL_ENV`] | MiB a device's buffer pool keeps (0: no pool) | [`DEFAULT_POOL_BYTES`] |
//! | [`DECODE_CACHE_ENV`] | MiB cap on decoded weight copies per device (0: none) | the plan's headroom |
//!
//! Unset or empty is the default everywhere.

use std::sync::OnceLock;

/// Picks the GEMM attention (`gemm`; unset or empty: the per-product kernels).
pub const ATTENTION_ENV: &str = "NEEDLESCOPE_ATTENTION";
/// Picks the batched routed experts (`batched`; unset or empty: expert by expert).
pub const MOE_ENV: &str = "NEEDLESCOPE_MOE";
/// Turns the op profile on (`executor::OpProfile`).
pub const PROFILE_ENV: &str = "NEEDLESCOPE_PROFILE";
/// Bytes a device's buffer pool keeps, in MiB (`pool::BufferPool`).
pub const POOL_ENV: &str = "NEEDLESCOPE_POOL_MIB";
/// Caps the decoded weight copies per device, in MiB (0 turns them off; `matrix`).
pub const DECODE_CACHE_ENV: &str = "NEEDLESCOPE_DECODE_CACHE_MIB";

/// Default bytes a pool keeps; [`POOL_ENV`] overrides it (0 turns pooling off).
pub const DEFAULT_POOL_BYTES: usize = 4 << 30;

/// The GPU backend's switches, as the environment sets them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSwitches {
    /// Sparse attention as batched cuBLAS GEMMs ([`ATTENTION_ENV`]).
    pub attention_gemm: bool,
    /// Routed experts as batched GEMMs ([`MOE_ENV`]).
    pub moe_batched: bool,
    /// Device time per operation, kernel, GEMM shape, allocation and copy ([`PROFILE_ENV`]).
    pub profile: bool,
    /// Bytes a real device's buffer pool keeps; 0: no pool ([`POOL_ENV`]).
    pub pool_bytes: usize,
    /// Cap on the decoded weight copies of one device, in bytes; `None`: the plan's headroom
    /// alone ([`DECODE_CACHE_ENV`]).
    pub decode_cache_bytes: Option<usize>,
}

impl Default for GpuSwitches {
    fn default() -> Self {
        GpuSwitches {
            attention_gemm: false,
            moe_batched: false,
            profile: false,
            pool_bytes: DEFAULT_POOL_BYTES,
            decode_cache_bytes: None,
        }
    }
}

impl GpuSwitches {
    /// The process's switches, parsed on the first call and kept (the environment of a run does
    /// not change under it); the first bad variable is the error, on every call.
    pub fn from_env() -> Result<&'static GpuSwitches, String> {
        static PARSED: OnceLock<Result<GpuSwitches, String>> = OnceLock::new();
        PARSED
            .get_or_init(|| {
                Self::parse(|var| match std::env::var(var) {
                    Ok(v) => Ok(Some(v)),
                    Err(std::env::VarError::NotPresent) => Ok(None),
                    Err(e) => Err(e.to_string()),
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The process's switches, or the defaults where a value is bad: for constructors whose
    /// callers have refused a bad value already ([`GpuSwitches::from_env`]).
    pub fn or_default() -> GpuSwitches {
        Self::from_env().cloned().unwrap_or_default()
    }

    /// The switches `lookup` gives (`Ok(None)`: unset; `Err`: the value cannot be read, e.g.
    /// not UTF-8).
    pub fn parse(
        lookup: impl Fn(&str) -> Result<Option<String>, String>,
    ) -> Result<GpuSwitches, String> {
        let value = |var: &str| -> Result<Option<String>, String> {
            Ok(lookup(var)
                .map_err(|e| format!("{var}: {e}"))?
                .filter(|v| !v.trim().is_empty()))
        };
        let choice = |var: &str, on: &str| -> Result<bool, String> {
            match value(var)? {
                None => Ok(false),
                Some(v) if v.trim() == on => Ok(true),
                Some(v) => Err(format!(
                    "{var}: expected {on:?} (or unset for the default), found {v:?}"
                )),
            }
        };
        let mib = |var: &str| -> Result<Option<usize>, String> {
            value(var)?
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map(|m| m.saturating_mul(1 << 20))
                        .map_err(|_| format!("{var}: expected a whole number of MiB, found {v:?}"))
                })
                .transpose()
        };
        let profile = match value(PROFILE_ENV)? {
            None => false,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "0" | "false" | "no" | "off" => false,
                "1" | "true" | "yes" | "on" => true,
                _ => {
                    return Err(format!(
                        "{PROFILE_ENV}: expected 1 (profile the GPU operations) or 0 (also \
                         true/false, yes/no, on/off), found {v:?}"
                    ))
                }
            },
        };
        Ok(GpuSwitches {
            attention_gemm: choice(ATTENTION_ENV, "gemm")?,
            moe_batched: choice(MOE_ENV, "batched")?,
            profile,
            pool_bytes: mib(POOL_ENV)?.unwrap_or(DEFAULT_POOL_BYTES),
            decode_cache_bytes: mib(DECODE_CACHE_ENV)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<GpuSwitches, String> {
        GpuSwitches::parse(|var| {
            Ok(vars
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string()))
        })
    }

    #[test]
    fn unset_and_empty_are_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), GpuSwitches::default());
        let empty: Vec<(&str, &str)> = [
            ATTENTION_ENV,
            MOE_ENV,
            PROFILE_ENV,
            POOL_ENV,
            DECODE_CACHE_ENV,
        ]
        .iter()
        .map(|v| (*v, " "))
        .collect();
        assert_eq!(parse(&empty).unwrap(), GpuSwitches::default());
    }

    #[test]
    fn each_switch_reads_its_values() {
        let s = parse(&[
            (ATTENTION_ENV, "gemm"),
            (MOE_ENV, " batched "),
            (PROFILE_ENV, "Yes"),
            (POOL_ENV, " 64 "),
            (DECODE_CACHE_ENV, "1024"),
        ])
        .unwrap();
        assert!(s.attention_gemm && s.moe_batched && s.profile);
        assert_eq!(s.pool_bytes, 64 << 20);
        assert_eq!(s.decode_cache_bytes, Some(1 << 30));
        let off = parse(&[
            (PROFILE_ENV, "off"),
            (POOL_ENV, "0"),
            (DECODE_CACHE_ENV, "0"),
        ])
        .unwrap();
        assert!(!off.profile);
        assert_eq!((off.pool_bytes, off.decode_cache_bytes), (0, Some(0)));
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_variable_and_the_value() {
        for (var, bad) in [
            (ATTENTION_ENV, "gemmm"),
            (MOE_ENV, "batch"),
            (PROFILE_ENV, "maybe"),
            (POOL_ENV, "4G"),
            (DECODE_CACHE_ENV, "lots"),
        ] {
            let err = parse(&[(var, bad)]).unwrap_err();
            assert!(err.starts_with(var) && err.contains(bad), "{err}");
        }
        let unreadable = GpuSwitches::parse(|var| {
            if var == MOE_ENV {
                Err("not unicode".into())
            } else {
                Ok(None)
            }
        })
        .unwrap_err();
        assert!(unreadable.contains(MOE_ENV) && unreadable.contains("not unicode"));
    }
}
