//! The names of the numerics switches: [`IndexProfile`] (`--index`, docs/architecture.md section 5) and [`KvMode`]
//! (`--kv`), with canonical names, aliases, parsing (an unknown name lists the valid ones) and
//! serde as the canonical names. What each profile computes lives in `profiles.rs`.

use super::FormatError;
use std::fmt;
use std::str::FromStr;

/// How index queries and keys are rounded (the table in [`super::profiles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum IndexProfile {
    #[serde(rename = "exact")]
    Exact,
    #[serde(rename = "fp8", alias = "sglang-fp8")]
    SglangFp8,
    #[serde(rename = "bf16", alias = "sglang-bf16-keys")]
    SglangBf16Keys,
    #[serde(rename = "bf16-qk")]
    Bf16Qk,
    #[serde(rename = "sglang-fp4")]
    SglangFp4,
    #[serde(rename = "official-fp4")]
    OfficialFp4,
    #[serde(rename = "vllm-fp8")]
    VllmFp8,
    #[serde(rename = "fp8-no-hadamard-k")]
    Fp8NoHadamardK,
    #[serde(rename = "v41-fp4")]
    V41Fp4,
    #[serde(rename = "sglang-v41-fp4")]
    SglangV41Fp4,
}

impl IndexProfile {
    /// Every profile, in the order of docs/architecture.md section 5.
    pub const ALL: [IndexProfile; 8] = [
        IndexProfile::Exact,
        IndexProfile::SglangFp8,
        IndexProfile::SglangBf16Keys,
        IndexProfile::Bf16Qk,
        IndexProfile::SglangFp4,
        IndexProfile::OfficialFp4,
        IndexProfile::VllmFp8,
        IndexProfile::Fp8NoHadamardK,
    ];

    /// Every profile of either family: [`Self::ALL`] (DeepSeek-V4's, the order of reports) then
    /// the DeepSeek-V4.1-only ones.
    pub const EVERY: [IndexProfile; 10] = [
        IndexProfile::Exact,
        IndexProfile::SglangFp8,
        IndexProfile::SglangBf16Keys,
        IndexProfile::Bf16Qk,
        IndexProfile::SglangFp4,
        IndexProfile::OfficialFp4,
        IndexProfile::VllmFp8,
        IndexProfile::Fp8NoHadamardK,
        IndexProfile::V41Fp4,
        IndexProfile::SglangV41Fp4,
    ];

    /// The profiles of DeepSeek-V4.1, which rotates nothing: the un-rotated ones of [`Self::ALL`]
    /// and its release's own ([`IndexProfile::V41Fp4`]).
    pub const V41: [IndexProfile; 5] = [
        IndexProfile::Exact,
        IndexProfile::Bf16Qk,
        IndexProfile::V41Fp4,
        IndexProfile::SglangV41Fp4,
        IndexProfile::VllmFp8,
    ];

    /// Whether scores follow REF's bf16 arithmetic (`numerics::profiles`): the official
    /// reference's of either family.
    pub fn bf16_scores(&self) -> bool {
        matches!(self, IndexProfile::OfficialFp4 | IndexProfile::V41Fp4)
    }

    /// Whether the profile models DeepSeek-V4.1's indexer only (a V4 model refuses it).
    pub fn v41_only(&self) -> bool {
        matches!(self, IndexProfile::V41Fp4 | IndexProfile::SglangV41Fp4)
    }

    /// Canonical name (CLI, CSV, JSON).
    pub fn name(&self) -> &'static str {
        match self {
            IndexProfile::Exact => "exact",
            IndexProfile::SglangFp8 => "fp8",
            IndexProfile::SglangBf16Keys => "bf16",
            IndexProfile::Bf16Qk => "bf16-qk",
            IndexProfile::SglangFp4 => "sglang-fp4",
            IndexProfile::OfficialFp4 => "official-fp4",
            IndexProfile::VllmFp8 => "vllm-fp8",
            IndexProfile::Fp8NoHadamardK => "fp8-no-hadamard-k",
            IndexProfile::V41Fp4 => "v41-fp4",
            IndexProfile::SglangV41Fp4 => "sglang-v41-fp4",
        }
    }

    /// One line on what the profile models (for help texts and reports).
    pub fn describe(&self) -> &'static str {
        match self {
            IndexProfile::Exact => "f32 q and k, f32 scores (the un-quantised math)",
            IndexProfile::SglangFp8 => {
                "SGLang default: Hadamard, e4m3 with fp32 scales per row / head"
            }
            IndexProfile::SglangBf16Keys => "SGLang with bf16 index keys (query as fp8)",
            IndexProfile::Bf16Qk => "q and k rounded to bf16, f32 accumulation",
            IndexProfile::SglangFp4 => "SGLang fp4 indexer (e2m1 per 32, ties to smaller)",
            IndexProfile::OfficialFp4 => "official reference: Hadamard, e2m1 per 32, bf16 scores",
            IndexProfile::VllmFp8 => "vLLM: no Hadamard, e4m3 with power-of-two scales",
            IndexProfile::Fp8NoHadamardK => "fp8 with the key not rotated (serving bug)",
            IndexProfile::V41Fp4 => {
                "DeepSeek-V4.1 release: no Hadamard, e2m1 per 32 with power-of-two scales, bf16 \
                 scores"
            }
            IndexProfile::SglangV41Fp4 => {
                "SGLang on DeepSeek-V4.1: the release's e2m1, keys packed again with scale \
                 floor 1e-4 (ties down), f32 scores"
            }
        }
    }

    /// Whether the query goes through the Hadamard rotation.
    pub fn rotates_query(&self) -> bool {
        !matches!(
            self,
            IndexProfile::Exact
                | IndexProfile::Bf16Qk
                | IndexProfile::VllmFp8
                | IndexProfile::V41Fp4
                | IndexProfile::SglangV41Fp4
        )
    }

    /// Whether the key goes through the Hadamard rotation.
    pub fn rotates_key(&self) -> bool {
        self.rotates_query() && *self != IndexProfile::Fp8NoHadamardK
    }

    /// Checks that this profile can run at index head dim `dim` (rotations need a power of two).
    pub fn check_dim(&self, dim: usize) -> Result<(), FormatError> {
        if self.rotates_query() && !dim.is_power_of_two() {
            return Err(FormatError::NotPowerOfTwo { n: dim });
        }
        Ok(())
    }
}

impl fmt::Display for IndexProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown profile or mode name; the message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} '{given}'; valid: {valid}")]
pub struct ParseNameError {
    pub kind: &'static str,
    pub given: String,
    pub valid: &'static str,
}

impl FromStr for IndexProfile {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let alias = match t.as_str() {
            "sglang-fp8" => Some(IndexProfile::SglangFp8),
            "sglang-bf16-keys" => Some(IndexProfile::SglangBf16Keys),
            _ => None,
        };
        alias
            .or_else(|| IndexProfile::EVERY.into_iter().find(|p| p.name() == t))
            .ok_or_else(|| ParseNameError {
                kind: "index profile",
                given: s.to_string(),
                valid: "exact, fp8 (sglang-fp8), bf16 (sglang-bf16-keys), bf16-qk, sglang-fp4, \
                        official-fp4, vllm-fp8, fp8-no-hadamard-k; DeepSeek-V4.1: v41-fp4, sglang-v41-fp4",
            })
    }
}

/// Main-attention KV rounding (`--kv`): `exact` keeps f32, `fp8` applies
/// [`kv_fp8_sim`](super::quant::kv_fp8_sim) (bf16 row, e4m3 blocks of 64 on the nope dims).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum KvMode {
    #[serde(rename = "exact")]
    Exact,
    #[serde(rename = "fp8")]
    Fp8,
    /// DeepSeek-V4.1's release rounding: window KV e4m3 per 32 over all dims (power-of-two
    /// scales), compressed KV e2m1 per 16 with E4M3 scales (docs/spec/v41.md 5.8).
    #[serde(rename = "release")]
    Release,
}

impl KvMode {
    pub const ALL: [KvMode; 3] = [KvMode::Exact, KvMode::Fp8, KvMode::Release];
    /// The modes of a DeepSeek-V4 model.
    pub const V4: [KvMode; 2] = [KvMode::Exact, KvMode::Fp8];
    /// The modes of a DeepSeek-V4.1 model.
    pub const V41: [KvMode; 2] = [KvMode::Exact, KvMode::Release];

    /// Canonical name.
    pub fn name(&self) -> &'static str {
        match self {
            KvMode::Exact => "exact",
            KvMode::Fp8 => "fp8",
            KvMode::Release => "release",
        }
    }
}

impl fmt::Display for KvMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvMode {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        KvMode::ALL
            .into_iter()
            .find(|m| m.name() == t)
            .ok_or_else(|| ParseNameError {
                kind: "kv mode",
                given: s.to_string(),
                valid: "exact, fp8 (DeepSeek-V4), release (DeepSeek-V4.1)",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_including_aliases_and_case() {
        for p in IndexProfile::EVERY {
            assert_eq!(p.name().parse::<IndexProfile>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
        }
        let alias = |s: &str| s.parse::<IndexProfile>().unwrap();
        assert_eq!(alias("sglang-fp8"), IndexProfile::SglangFp8);
        assert_eq!(alias("sglang-bf16-keys"), IndexProfile::SglangBf16Keys);
        assert_eq!(alias(" FP8 "), IndexProfile::SglangFp8);
        let names: Vec<&str> = IndexProfile::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "exact",
                "fp8",
                "bf16",
                "bf16-qk",
                "sglang-fp4",
                "official-fp4",
                "vllm-fp8",
                "fp8-no-hadamard-k"
            ]
        );
    }

    #[test]
    fn bad_profile_name_lists_the_valid_ones() {
        let msg = "fp16".parse::<IndexProfile>().unwrap_err().to_string();
        assert!(msg.contains("'fp16'"), "{msg}");
        for p in IndexProfile::EVERY {
            assert!(msg.contains(p.name()), "{msg} lacks {}", p.name());
        }
        assert!(msg.contains("sglang-bf16-keys"), "{msg}");
    }

    #[test]
    fn kv_mode_names_parse() {
        assert_eq!("exact".parse::<KvMode>().unwrap(), KvMode::Exact);
        assert_eq!("fp8".parse::<KvMode>().unwrap(), KvMode::Fp8);
        assert_eq!("release".parse::<KvMode>().unwrap(), KvMode::Release);
        assert_eq!(KvMode::Fp8.to_string(), "fp8");
        let msg = "bf16".parse::<KvMode>().unwrap_err().to_string();
        assert!(msg.contains("exact, fp8"), "{msg}");
    }

    #[test]
    fn serde_uses_canonical_names_and_accepts_aliases() {
        let json = serde_json::to_string(&IndexProfile::ALL).unwrap();
        let back: Vec<IndexProfile> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, IndexProfile::ALL);
        assert_eq!(
            serde_json::to_string(&IndexProfile::SglangFp8).unwrap(),
            "\"fp8\""
        );
        let p: IndexProfile = serde_json::from_str("\"sglang-bf16-keys\"").unwrap();
        assert_eq!(p, IndexProfile::SglangBf16Keys);
        assert_eq!(serde_json::to_string(&KvMode::Exact).unwrap(), "\"exact\"");
    }

    #[test]
    fn rotating_profiles_need_power_of_two_dims() {
        assert!(IndexProfile::Exact.check_dim(24).is_ok());
        assert!(IndexProfile::VllmFp8.check_dim(24).is_ok());
        assert!(IndexProfile::SglangFp8.check_dim(24).is_err());
        assert!(IndexProfile::Fp8NoHadamardK.check_dim(32).is_ok());
        assert!(!IndexProfile::Fp8NoHadamardK.rotates_key());
        assert!(IndexProfile::Fp8NoHadamardK.rotates_query());
    }
}
