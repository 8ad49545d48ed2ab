//! Where `--model` points: a model directory as given, or a checkpoint in the user's Hugging
//! Face cache, found without any download.
//!
//! `--model` takes
//! - a directory holding `config.json` (used as it is);
//! - a repository directory of the cache, `.../models--ORG--NAME` (its snapshot of `--revision`);
//! - a repository id `ORG/NAME` (`deepseek-ai/DeepSeek-V4-Flash`) that is not a directory here:
//!   `models--ORG--NAME` in the cache folder, chosen as huggingface_hub chooses it: `HF_HUB_CACHE`,
//!   else `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
//!   else `~/.cache/huggingface/hub`.
//!
//! In a repository directory, `--revision` (default `main`) is a ref name whose file
//! `refs/REVISION` holds the commit of `snapshots/COMMIT/`, or a commit whose snapshot is there
//! (`snapshots/REVISION/`). The hub writes a snapshot's files as symbolic links into
//! `../../blobs/`; they are read through the links. When nothing is found, the error lists
//! every path tried (and the refs and snapshots the repository has).

use std::path::{Path, PathBuf};

/// Why `--model` names no model directory.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "--model {arg}: not a directory here, and not a model in the Hugging Face cache; tried: \
         {}{}",
        tried.join(", "),
        hint
    )]
    NotFound {
        arg: String,
        tried: Vec<String>,
        /// What the repository directory has, when it exists.
        hint: String,
    },
    #[error("--revision {revision}: expected a ref name or a commit, found a path that leaves the repository")]
    BadRevision { revision: String },
    #[error(
        "--revision {revision}: only a Hugging Face cache repository has revisions (ORG/NAME or a \
         models--ORG--NAME directory); {dir} is a plain model directory"
    )]
    RevisionOnPlainDir { revision: String, dir: String },
}

/// The cache folders a lookup may use, as the environment gives them (`None`: unset).
#[derive(Clone, Debug, Default)]
pub struct CacheEnv {
    pub hf_hub_cache: Option<PathBuf>,
    pub huggingface_hub_cache: Option<PathBuf>,
    pub hf_home: Option<PathBuf>,
    pub xdg_cache_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl CacheEnv {
    /// This process's environment.
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        CacheEnv {
            hf_hub_cache: var("HF_HUB_CACHE"),
            huggingface_hub_cache: var("HUGGINGFACE_HUB_CACHE"),
            hf_home: var("HF_HOME"),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
        }
    }

    /// The hub cache folder huggingface_hub would use, and which setting chose it.
    pub fn hub_cache(&self) -> Option<(PathBuf, &'static str)> {
        if let Some(p) = &self.hf_hub_cache {
            return Some((p.clone(), "HF_HUB_CACHE"));
        }
        if let Some(p) = &self.huggingface_hub_cache {
            return Some((p.clone(), "HUGGINGFACE_HUB_CACHE"));
        }
        if let Some(p) = &self.hf_home {
            return Some((p.join("hub"), "HF_HOME"));
        }
        if let Some(p) = &self.xdg_cache_home {
            return Some((p.join("huggingface").join("hub"), "XDG_CACHE_HOME"));
        }
        let home = self.home.as_ref()?;
        Some((home.join(".cache").join("huggingface").join("hub"), "HOME"))
    }
}

/// The model directory `--model ARG [--revision REV]` names, under this process's environment.
pub fn locate_model(arg: &Path, revision: Option<&str>) -> Result<PathBuf, HubError> {
    locate_model_in(arg, revision, &CacheEnv::from_env())
}

/// [`locate_model`] under the cache folders of `env`.
pub fn locate_model_in(
    arg: &Path,
    revision: Option<&str>,
    env: &CacheEnv,
) -> Result<PathBuf, HubError> {
    if let Some(rev) = revision {
        check_revision(rev)?;
    }
    if arg.is_dir() {
        if is_repo_dir(arg) {
            return snapshot(arg, revision.unwrap_or("main"), &arg.display().to_string());
        }
        if let Some(rev) = revision {
            return Err(HubError::RevisionOnPlainDir {
                revision: rev.to_string(),
                dir: arg.display().to_string(),
            });
        }
        return Ok(arg.to_path_buf());
    }
    let text = arg.to_string_lossy().into_owned();
    let Some((org, name)) = repo_id(&text) else {
        // Not a repository id: the path as given, for the model opener to refuse by name.
        if let Some(rev) = revision {
            return Err(HubError::RevisionOnPlainDir {
                revision: rev.to_string(),
                dir: text,
            });
        }
        return Ok(arg.to_path_buf());
    };
    let Some((cache, _)) = env.hub_cache() else {
        return Err(HubError::NotFound {
            arg: text,
            tried: vec![format!("{} (a path here)", arg.display())],
            hint: "; no cache folder: none of HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, \
                   XDG_CACHE_HOME, HOME is set"
                .into(),
        });
    };
    let repo = cache.join(format!("models--{org}--{name}"));
    if !repo.is_dir() {
        return Err(HubError::NotFound {
            arg: text,
            tried: vec![
                format!("{} (a path here)", arg.display()),
                format!("{} (no such directory)", repo.display()),
            ],
            hint: String::new(),
        });
    }
    snapshot(&repo, revision.unwrap_or("main"), &text).map_err(|e| match e {
        HubError::NotFound {
            arg,
            mut tried,
            hint,
        } => {
            tried.insert(0, format!("{} (a path here)", Path::new(&arg).display()));
            HubError::NotFound { arg, tried, hint }
        }
        other => other,
    })
}

/// `ORG/NAME` with both parts non-empty and made of the characters hub ids use.
fn repo_id(text: &str) -> Option<(&str, &str)> {
    let (org, name) = text.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (ok(org) && ok(name)).then_some((org, name))
}

/// A revision must stay inside the repository: no absolute path, no `..` component.
fn check_revision(rev: &str) -> Result<(), HubError> {
    let bad =
        rev.is_empty() || rev.starts_with('/') || rev.split('/').any(|c| c == ".." || c.is_empty());
    if bad {
        return Err(HubError::BadRevision {
            revision: rev.to_string(),
        });
    }
    Ok(())
}

/// Whether `dir` is a cache repository (`snapshots/` inside, as the hub lays it out).
fn is_repo_dir(dir: &Path) -> bool {
    dir.join("snapshots").is_dir()
}

/// The snapshot of `rev` in the repository directory `repo`.
fn snapshot(repo: &Path, rev: &str, arg: &str) -> Result<PathBuf, HubError> {
    let ref_file = repo.join("refs").join(rev);
    let mut tried = Vec::new();
    if let Ok(commit) = std::fs::read_to_string(&ref_file) {
        let commit = commit.trim();
        let dir = repo.join("snapshots").join(commit);
        if !commit.is_empty() && check_revision(commit).is_ok() && dir.is_dir() {
            return Ok(dir);
        }
        tried.push(format!("{} (holds {commit:?})", ref_file.display()));
        tried.push(format!("{} (no such directory)", dir.display()));
    } else {
        tried.push(format!("{} (no such ref)", ref_file.display()));
    }
    let direct = repo.join("snapshots").join(rev);
    if direct.is_dir() {
        return Ok(direct);
    }
    tried.push(format!("{} (no such snapshot)", direct.display()));
    let list = |sub: &str| -> String {
        let mut names: Vec<String> = std::fs::read_dir(repo.join(sub))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    };
    Err(HubError::NotFound {
        arg: arg.to_string(),
        tried,
        hint: format!(
            "; the repository has refs: {}; snapshots: {} (pick one with --revision)",
            list("refs"),
            list("snapshots")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub-style repository: blobs, a snapshot of symbolic links, refs/main.
    fn repo(cache: &Path, id: &str, commit: &str) -> PathBuf {
        let (org, name) = id.split_once('/').unwrap();
        let r = cache.join(format!("models--{org}--{name}"));
        std::fs::create_dir_all(r.join("blobs")).unwrap();
        std::fs::create_dir_all(r.join("refs")).unwrap();
        let snap = r.join("snapshots").join(commit);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(r.join("blobs").join("abc123"), b"{}").unwrap();
        std::os::unix::fs::symlink("../../blobs/abc123", snap.join("config.json")).unwrap();
        std::fs::write(r.join("refs").join("main"), format!("{commit}\n")).unwrap();
        snap
    }

    fn env_with_cache(cache: &Path) -> CacheEnv {
        CacheEnv {
            hf_hub_cache: Some(cache.to_path_buf()),
            ..CacheEnv::default()
        }
    }

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_repo_id_resolves_through_refs_main_to_its_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let snap = repo(tmp.path(), "deepseek-ai/DeepSeek-V4-Flash", COMMIT);
        let env = env_with_cache(tmp.path());
        let got = locate_model_in(Path::new("deepseek-ai/DeepSeek-V4-Flash"), None, &env).unwrap();
        assert_eq!(got, snap);
        // Read through the hub's symbolic link.
        assert_eq!(std::fs::read(got.join("config.json")).unwrap(), b"{}");
        // The repository directory itself, and the commit as a revision.
        let repo_dir = snap.parent().unwrap().parent().unwrap();
        assert_eq!(locate_model_in(repo_dir, None, &env).unwrap(), snap);
        assert_eq!(locate_model_in(repo_dir, Some(COMMIT), &env).unwrap(), snap);
    }

    #[test]
    fn other_refs_and_commits_pick_other_snapshots() {
        let tmp = tempfile::tempdir().unwrap();
        let main = repo(tmp.path(), "org/m", COMMIT);
        let r = main.parent().unwrap().parent().unwrap();
        let other = "fedcba9876543210fedcba9876543210fedcba98";
        std::fs::create_dir_all(r.join("snapshots").join(other)).unwrap();
        std::fs::create_dir_all(r.join("refs").join("pr")).unwrap();
        std::fs::write(r.join("refs").join("pr").join("1"), other).unwrap();
        let env = env_with_cache(tmp.path());
        let at = |rev| locate_model_in(Path::new("org/m"), Some(rev), &env).unwrap();
        assert_eq!(at("pr/1"), r.join("snapshots").join(other));
        assert_eq!(at(other), r.join("snapshots").join(other));
        assert_eq!(at("main"), main);
    }

    #[test]
    fn the_cache_folder_follows_huggingface_hub_precedence() {
        let p = |s: &str| Some(PathBuf::from(s));
        let mut env = CacheEnv {
            hf_hub_cache: p("/a"),
            huggingface_hub_cache: p("/b"),
            hf_home: p("/c"),
            xdg_cache_home: p("/d"),
            home: p("/e"),
        };
        assert_eq!(env.hub_cache().unwrap().0, PathBuf::from("/a"));
        env.hf_hub_cache = None;
        assert_eq!(env.hub_cache().unwrap().0, PathBuf::from("/b"));
        env.huggingface_hub_cache = None;
        assert_eq!(env.hub_cache().unwrap().0, PathBuf::from("/c/hub"));
        env.hf_home = None;
        assert_eq!(
            env.hub_cache().unwrap().0,
            PathBuf::from("/d/huggingface/hub")
        );
        env.xdg_cache_home = None;
        assert_eq!(
            env.hub_cache().unwrap().0,
            PathBuf::from("/e/.cache/huggingface/hub")
        );
        env.home = None;
        assert!(env.hub_cache().is_none());
    }

    #[test]
    fn nothing_found_lists_every_path_tried() {
        let tmp = tempfile::tempdir().unwrap();
        let env = env_with_cache(tmp.path());
        let e = locate_model_in(Path::new("org/missing"), None, &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--model org/missing"), "{e}");
        assert!(
            e.contains("models--org--missing (no such directory)"),
            "{e}"
        );
        repo(tmp.path(), "org/m", COMMIT);
        let e = locate_model_in(Path::new("org/m"), Some("v2"), &env)
            .unwrap_err()
            .to_string();
        for part in [
            "refs/v2 (no such ref)",
            "snapshots/v2 (no such snapshot)",
            "refs: main",
            COMMIT,
        ] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
        // A ref whose snapshot is gone.
        let r = tmp.path().join("models--org--m");
        std::fs::remove_dir_all(r.join("snapshots").join(COMMIT)).unwrap();
        let e = locate_model_in(Path::new("org/m"), None, &env)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refs/main (holds") && e.contains("(no such directory)"),
            "{e}"
        );
    }

    #[test]
    fn plain_directories_and_paths_pass_through_and_take_no_revision() {
        let tmp = tempfile::tempdir().unwrap();
        let env = env_with_cache(tmp.path());
        assert_eq!(locate_model_in(tmp.path(), None, &env).unwrap(), tmp.path());
        let e = locate_model_in(tmp.path(), Some("main"), &env).unwrap_err();
        assert!(matches!(e, HubError::RevisionOnPlainDir { .. }), "{e}");
        // Not an id (absolute, relative with more parts): returned for the opener to refuse.
        for p in ["/no/such/dir", "./x/y", "a/b/c"] {
            assert_eq!(
                locate_model_in(Path::new(p), None, &env).unwrap(),
                Path::new(p)
            );
        }
        for rev in ["../x", "/etc", "a//b", ""] {
            let e = locate_model_in(Path::new("org/m"), Some(rev), &env).unwrap_err();
            assert!(matches!(e, HubError::BadRevision { .. }), "{rev}: {e}");
        }
    }
}
