//! Whether a run may resume a report directory: [`RunInfo::resume_differences`] compares
//! run.json with the run being started, and [`writer`] says which command wrote a directory.
//!
//! `sweep_args` is compared key by key, except that the grid's lists (`lengths`, `depths`,
//! `indexes`, `topks`, `compare`) are sets: the same values in another order are the same
//! cells (each cell's id, seed and records do not depend on the order), and a list missing
//! from an older run.json is the empty one. `sweep_args.scenario` (the name or path given) is
//! not compared when the scenario's name and content fingerprint agree, so a scenario file
//! given by another path resumes.

use crate::record::{writer, RunInfo};
use crate::report::FieldDifference;

/// `sweep_args` keys whose value is a set of grid values written as a list.
const SET_KEYS: [&str; 5] = ["lengths", "depths", "indexes", "topks", "compare"];

impl RunInfo {
    /// Fields in which `now` (the run being started) differs from `self` (run.json): the
    /// model config hash and weights fingerprint, scenario name and content, synthetic flag,
    /// backend numerics (`cpu`, `cuda gemm bf16`, ...) and each differing key of `sweep_args`.
    pub fn resume_differences(&self, now: &RunInfo) -> Vec<FieldDifference> {
        let mut out = Vec::new();
        let mut cmp = |field: String, a: serde_json::Value, b: serde_json::Value| {
            if a != b {
                out.push(FieldDifference {
                    field,
                    expected: a.to_string(),
                    found: b.to_string(),
                });
            }
        };
        cmp(
            "model_config_hash".into(),
            self.model_config_hash.clone().into(),
            now.model_config_hash.clone().into(),
        );
        cmp(
            "model_fingerprint".into(),
            self.model_fingerprint.clone().into(),
            now.model_fingerprint.clone().into(),
        );
        cmp(
            "scenario".into(),
            self.scenario.clone().into(),
            now.scenario.clone().into(),
        );
        cmp(
            "scenario_fingerprint".into(),
            self.scenario_fingerprint.clone().into(),
            now.scenario_fingerprint.clone().into(),
        );
        cmp(
            "synthetic".into(),
            self.synthetic.into(),
            now.synthetic.into(),
        );
        cmp(
            "backend".into(),
            self.backend.numerics().into(),
            now.backend.numerics().into(),
        );
        let (was, is) = (writer(&self.sweep_args), writer(&now.sweep_args));
        if was != is {
            // Every argument would differ: say which command wrote the directory instead.
            cmp("command".into(), was.into(), is.into());
            return out;
        }
        match (&self.sweep_args, &now.sweep_args) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                // A scenario file named by another path (`./sc.toml`, from another folder) is
                // the same scenario when its name and content are: those are compared above.
                let same_scenario = self.scenario == now.scenario
                    && self.scenario_fingerprint == now.scenario_fingerprint;
                for k in keys {
                    if k == "scenario" && same_scenario {
                        continue;
                    }
                    let get = |m: &serde_json::Map<String, serde_json::Value>| {
                        m.get(k).cloned().unwrap_or(serde_json::Value::Null)
                    };
                    let (was, is) = (get(a), get(b));
                    if as_set(k, &was) != as_set(k, &is) {
                        cmp(format!("sweep_args.{k}"), was, is);
                    }
                }
            }
            (a, b) => cmp("sweep_args".into(), a.clone(), b.clone()),
        }
        out
    }
}

/// A grid list as a sorted set (a missing one as empty); any other value as itself.
fn as_set(key: &str, value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    if !SET_KEYS.contains(&key) {
        return value.clone();
    }
    match value {
        Value::Null => Value::Array(Vec::new()),
        Value::Array(items) => {
            let mut items = items.clone();
            items.sort_by_key(|v| v.to_string());
            items.dedup();
            Value::Array(items)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(args: serde_json::Value) -> RunInfo {
        RunInfo::new("m", "sha256:00", "passkey", true, args)
    }

    #[test]
    fn grid_lists_compare_as_sets() {
        let was = run(serde_json::json!({
            "indexes": ["fp8", "bf16"], "lengths": [1024, 2048], "depths": [10.0, 50.0],
            "topks": [64, 128], "kv": "fp8", "samples": 1, "seed": 0,
        }));
        let reordered = run(serde_json::json!({
            "indexes": ["bf16", "fp8"], "lengths": [2048, 1024], "depths": [50.0, 10.0],
            "topks": [128, 64], "kv": "fp8", "samples": 1, "seed": 0, "compare": [],
        }));
        assert_eq!(was.resume_differences(&reordered), vec![]);
        let other = run(serde_json::json!({
            "indexes": ["fp8", "bf16"], "lengths": [1024, 4096], "depths": [10.0, 50.0],
            "topks": [64, 128], "kv": "fp8", "samples": 1, "seed": 0, "compare": ["exact"],
        }));
        let fields: Vec<String> = was
            .resume_differences(&other)
            .into_iter()
            .map(|d| d.field)
            .collect();
        assert_eq!(fields, ["sweep_args.compare", "sweep_args.lengths"]);
        // The scenario file by another path: the same name and content resume; other
        // content (or a built-in of another name) does not.
        let file = |path: &str, content: &str| {
            RunInfo::new(
                "m",
                "sha256:00",
                "my-needle",
                true,
                json!({"scenario": path}),
            )
            .with_fingerprints("w".into(), content.into())
        };
        let was = file("sc.toml", "sha256:aa");
        assert_eq!(
            was.resume_differences(&file("./sc.toml", "sha256:aa")),
            vec![]
        );
        let fields: Vec<String> = was
            .resume_differences(&file("./sc.toml", "sha256:bb"))
            .into_iter()
            .map(|d| d.field)
            .collect();
        assert_eq!(fields, ["scenario_fingerprint", "sweep_args.scenario"]);
        // Not a grid list: order and presence still count.
        assert_eq!(
            as_set("seed", &serde_json::Value::Null),
            serde_json::Value::Null
        );
    }
}
