//! Whether a run may resume a report directory: [`RunInfo::resume_differences`] compares
//! run.json with the run being started, [`RunInfo::resume_with`] decides (the same run, a grid
//! that grows, or a refusal naming every field), and [`writer`] says which command wrote a
//! directory.
//!
//! Grids grow: a sweep rerun on its directory with other `lengths`, `depths`, `indexes`, `topks`
//! or `samples` (an engine-only sweep: `lengths`, `depths`, `samples`) keeps every finished cell
//! (a cell's id, prompt, seed and records depend only on its own length, depth, profile, top-k
//! and sample) and computes the cells of its own grid that are missing; run.json then records
//! the union of both grids (lists: the recorded values in their order, then the new ones;
//! `samples`: the larger count), which is what the report shows and checks cells against.
//! Every other difference (model, scenario, `kv`, `compare`, `seed`, `generate`, backend
//! numerics, ...) would change finished cells and is refused by name.
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

/// `sweep_args` keys a sweep's rerun may extend (see the module docs).
const SWEEP_GRID_KEYS: [&str; 5] = ["lengths", "depths", "indexes", "topks", "samples"];
/// The same for an engine-only sweep (one engine K, no local profiles).
const ENGINE_ONLY_GRID_KEYS: [&str; 3] = ["lengths", "depths", "samples"];

/// What a run started on a directory with a run.json may do ([`RunInfo::resume_with`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Resume {
    /// The same run: go on with run.json as it is.
    Same,
    /// A sweep whose grid differs only in values a rerun may add: `info` (run.json with the
    /// union of both grids) replaces run.json, `grown` says what was added, one part per key
    /// (`lengths + 4096, 8192`, `samples 1 -> 3`); empty when the new grid lies inside the
    /// recorded one (nothing to record, only cells to fill in).
    Grown {
        info: Box<RunInfo>,
        grown: Vec<String>,
    },
    /// Differences that would change finished cells, each by name.
    Refused(Vec<FieldDifference>),
}

impl RunInfo {
    /// How the run `now` may go on in the directory whose run.json records `self`.
    pub fn resume_with(&self, now: &RunInfo) -> Resume {
        let differences = self.resume_differences(now);
        if differences.is_empty() {
            return Resume::Same;
        }
        let keys: &[&str] = match writer(&self.sweep_args) {
            "sweep" => &SWEEP_GRID_KEYS,
            _ if crate::record::engine::is_engine_only(&self.sweep_args) => &ENGINE_ONLY_GRID_KEYS,
            _ => &[],
        };
        let grid_key = |field: &str| {
            field
                .strip_prefix("sweep_args.")
                .is_some_and(|k| keys.contains(&k))
        };
        let fixed: Vec<FieldDifference> = differences
            .iter()
            .filter(|d| !grid_key(&d.field))
            .cloned()
            .collect();
        if !fixed.is_empty() {
            return Resume::Refused(fixed);
        }
        let mut info = self.clone();
        let mut grown = Vec::new();
        for d in &differences {
            let key = d.field.trim_start_matches("sweep_args.");
            let was = self.sweep_args.get(key).cloned().unwrap_or_default();
            let is = now.sweep_args.get(key).cloned().unwrap_or_default();
            let (merged, part) = grow(key, &was, &is);
            if let Some(part) = part {
                grown.push(part);
            }
            info.sweep_args[key] = merged;
        }
        Resume::Grown {
            info: Box::new(info),
            grown,
        }
    }

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

/// One grid key of run.json (`was`) grown by the rerun's (`is`): a list keeps its values in
/// their order and gains the new ones in the rerun's order; `samples` takes the larger count.
/// Returns the merged value and what was added (`None`: nothing).
fn grow(
    key: &str,
    was: &serde_json::Value,
    is: &serde_json::Value,
) -> (serde_json::Value, Option<String>) {
    use serde_json::Value;
    match (was, is) {
        (Value::Array(was), Value::Array(is)) => {
            let added: Vec<&Value> =
                is.iter()
                    .filter(|v| !was.contains(v))
                    .fold(Vec::new(), |mut acc, v| {
                        if !acc.contains(&v) {
                            acc.push(v);
                        }
                        acc
                    });
            let mut merged = was.clone();
            merged.extend(added.iter().map(|v| (*v).clone()));
            let part = (!added.is_empty()).then(|| {
                let names: Vec<String> = added
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                format!("{key} + {}", names.join(", "))
            });
            (Value::Array(merged), part)
        }
        (Value::Number(a), Value::Number(b)) => match (a.as_u64(), b.as_u64()) {
            (Some(a), Some(b)) if b > a => (b.into(), Some(format!("{key} {a} -> {b}"))),
            _ => (Value::Number(a.clone()), None),
        },
        // A key the recorded run lacks (an older run.json): the rerun's value.
        (Value::Null, is) => (is.clone(), Some(format!("{key} {is}"))),
        (was, _) => (was.clone(), None),
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

    fn sweep_args(lengths: &[usize], indexes: &[&str], samples: usize) -> serde_json::Value {
        json!({
            "scenario": "passkey", "lengths": lengths, "depths": [50.0],
            "indexes": indexes, "topks": [64], "kv": "exact", "samples": samples, "seed": 0,
            "generate": 0,
        })
    }

    #[test]
    fn a_sweep_grid_grows_by_union_and_other_changes_are_refused_by_name() {
        let was = run(sweep_args(&[1024, 2048], &["fp8"], 1));
        let now = run(sweep_args(&[4096, 1024], &["bf16", "fp8"], 3));
        let Resume::Grown { info, grown } = was.resume_with(&now) else {
            panic!("a grown grid resumes");
        };
        assert_eq!(info.sweep_args["lengths"], json!([1024, 2048, 4096]));
        assert_eq!(info.sweep_args["indexes"], json!(["fp8", "bf16"]));
        assert_eq!(info.sweep_args["samples"], json!(3));
        assert_eq!(info.start_time, was.start_time, "the recorded run goes on");
        assert_eq!(
            grown,
            ["indexes + bf16", "lengths + 4096", "samples 1 -> 3"]
        );
        // A grid inside the recorded one: nothing to record, its missing cells to fill in.
        let inside = run(sweep_args(&[2048], &["fp8"], 1));
        assert_eq!(
            was.resume_with(&inside),
            Resume::Grown {
                info: Box::new(was.clone()),
                grown: vec![]
            }
        );
        assert_eq!(was.resume_with(&was.clone()), Resume::Same);
        // A change that would alter finished cells is refused, naming only it.
        let mut other = now.sweep_args.clone();
        other["kv"] = json!("fp8");
        other["compare"] = json!(["exact"]);
        let Resume::Refused(d) = was.resume_with(&run(other)) else {
            panic!("kv and compare are refused");
        };
        let fields: Vec<&str> = d.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, ["sweep_args.compare", "sweep_args.kv"]);
        let mut model = run(sweep_args(&[4096], &["fp8"], 1));
        model.model_config_hash = "sha256:ff".into();
        assert!(matches!(was.resume_with(&model), Resume::Refused(_)));
    }

    #[test]
    fn probes_never_grow_and_engine_only_sweeps_grow_without_their_engine_k() {
        let probe =
            |topks: &[usize]| run(json!({"command": "probe", "indexes": ["fp8"], "topks": topks}));
        assert!(matches!(
            probe(&[64]).resume_with(&probe(&[64, 128])),
            Resume::Refused(_)
        ));
        let engine = |lengths: &[usize], topk: usize| {
            run(
                json!({"command": "sweep", "local": false, "lengths": lengths,
                       "depths": [50.0], "topks": [topk], "samples": 1}),
            )
        };
        let Resume::Grown { grown, .. } = engine(&[1024], 64).resume_with(&engine(&[2048], 64))
        else {
            panic!("an engine-only grid grows");
        };
        assert_eq!(grown, ["lengths + 2048"]);
        let Resume::Refused(d) = engine(&[1024], 64).resume_with(&engine(&[1024], 128)) else {
            panic!("another engine K is refused");
        };
        assert_eq!(d[0].field, "sweep_args.topks");
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
