//! Paths of the store layout (DESIGN.md):
//! ```text
//! <run_id>/run.json
//! <run_id>/data/<table>/iter=<NNNNNN>/<attempt>.parquet
//! <run_id>/artifacts/iter=<NNNNNN>/<name>.<digest>.ckpt   (checkpoints: model::checkpoint's byte layout)
//! <run_id>/artifacts/iter=<NNNNNN>/asset-<id>.<digest>.asset   (environment assets: TextWorld's games, web pages)
//! <run_id>/artifacts/iter=<NNNNNN>/screenshot-<of>-<step>.<digest>.png   (web screenshots, env.web.screenshots)
//! <run_id>/_commits/iter=<NNNNNN>/<stage>.json
//! <run_id>/_commits/iter=<NNNNNN>/_iteration.json
//! ```

use object_store::path::Path;

use crate::error::{Error, Result};

/// Check a run id: non-empty, ≤ 128 bytes, no `/`, `\`, `..`, leading `.` or `_`, control or
/// whitespace characters.
pub fn validate_run_id(id: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::store(format!("invalid run id {id:?}: {why}")));
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > 128 {
        return bad("longer than 128 bytes");
    }
    if id.contains('/') || id.contains('\\') {
        return bad("contains a path separator");
    }
    if id.contains("..") {
        return bad("contains `..`");
    }
    if id.starts_with('.') || id.starts_with('_') {
        return bad("starts with `.` or `_`");
    }
    if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("contains control or whitespace characters");
    }
    if !id
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '=' | '@'))
    {
        return bad("use letters, digits and - _ . + = @");
    }
    Ok(())
}

pub fn iter_dir(iter: u32) -> String {
    format!("iter={iter:06}")
}

pub fn run_json(run: &str) -> Path {
    Path::from(format!("{run}/run.json"))
}

pub fn data_file(run: &str, table: &str, iter: u32, attempt: &str) -> Path {
    Path::from(format!(
        "{run}/data/{table}/{}/{attempt}.parquet",
        iter_dir(iter)
    ))
}

/// The prefix of a screenshot's artifact name (`screenshot-<traj_id>-<step_idx>`, stored as
/// `.png`): pixels, which `replay --verify` compares by name only.
pub const SCREENSHOT_PREFIX: &str = "screenshot-";

/// A content-addressed artifact written by a stage of an iteration: a model checkpoint
/// (`<name>.<digest>.ckpt`), an environment asset (`asset-<id>.<digest>.asset`) or a
/// screenshot (`screenshot-<of>-<step>.<digest>.png`).
pub fn artifact(run: &str, iter: u32, name: &str, digest: &str) -> Path {
    let ext = if name.starts_with("asset-") {
        "asset"
    } else if name.starts_with(SCREENSHOT_PREFIX) {
        "png"
    } else {
        "ckpt"
    };
    Path::from(format!(
        "{run}/artifacts/{}/{name}.{digest}.{ext}",
        iter_dir(iter)
    ))
}

/// Where a run's artifacts (checkpoints) live.
pub fn artifacts_dir(run: &str) -> Path {
    Path::from(format!("{run}/artifacts"))
}

pub fn data_dir(run: &str) -> Path {
    Path::from(format!("{run}/data"))
}

pub fn commits_dir(run: &str) -> Path {
    Path::from(format!("{run}/_commits"))
}

pub fn stage_manifest(run: &str, iter: u32, stage: &str) -> Path {
    Path::from(format!("{run}/_commits/{}/{stage}.json", iter_dir(iter)))
}

pub fn iteration_manifest(run: &str, iter: u32) -> Path {
    Path::from(format!("{run}/_commits/{}/_iteration.json", iter_dir(iter)))
}

/// Parse `iter=000012` → 12.
pub fn parse_iter_dir(name: &str) -> Option<u32> {
    name.strip_prefix("iter=")
        .filter(|d| d.len() == 6)
        .and_then(|d| d.parse().ok())
}

/// A fresh, unique attempt name: a counter-free token so that concurrent writers never share a
/// data file name (`<unix-nanos>-<pid>-<nonce>`).
pub fn new_attempt() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids() {
        for ok in ["gridnav", "run-1", "a.b", "x_2", "seed=3"] {
            validate_run_id(ok).unwrap();
        }
        for bad in [
            "", "a/b", "..", "a..b", ".hidden", "_commits", "a\nb", "a b", "a\\b", "a\u{7}",
        ] {
            assert!(validate_run_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            stage_manifest("r", 3, "advantage").as_ref(),
            "r/_commits/iter=000003/advantage.json"
        );
        assert_eq!(
            data_file("r", "steps", 12, "a").as_ref(),
            "r/data/steps/iter=000012/a.parquet"
        );
        assert_eq!(parse_iter_dir("iter=000012"), Some(12));
        assert_eq!(parse_iter_dir("iter=12"), None);
    }

    #[test]
    fn artifact_extensions_follow_the_name() {
        for (name, path) in [
            ("policy", "r/artifacts/iter=000001/policy.d.ckpt"),
            ("asset-ab", "r/artifacts/iter=000001/asset-ab.d.asset"),
            (
                "screenshot-t-0001-3",
                "r/artifacts/iter=000001/screenshot-t-0001-3.d.png",
            ),
        ] {
            assert_eq!(artifact("r", 1, name, "d").as_ref(), path);
        }
    }
}
