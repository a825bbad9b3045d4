//! The checkpoint a committed run held at the end of an iteration (for `rla-pipe export`): the
//! artifact the last stage of that iteration wrote — or, when no stage of it wrote one, of the
//! nearest earlier iteration — read from the store and checked against the digest its manifest
//! recorded.

use crate::error::{Error, Result};
use crate::store::manifest::{self, RunManifest};
use crate::store::{Store, catalog};

/// A checkpoint of a committed run.
pub struct CommittedCheckpoint {
    pub run: RunManifest,
    pub bytes: bytes::Bytes,
    /// The artifact's path in the store.
    pub path: String,
    /// The stage and iteration that wrote it.
    pub stage: String,
    pub iter: u32,
}

/// Checkpoint `name` (`policy`, `rm`) of run `run_id` at the end of iteration `iter`.
pub async fn committed_checkpoint(
    store: &Store,
    run_id: &str,
    iter: u32,
    name: &str,
) -> Result<CommittedCheckpoint> {
    let state = catalog::load_run(store, run_id).await?;
    let complete = state.iters.get(&iter).and_then(|s| s.complete.as_ref());
    if complete.is_none() {
        let done: Vec<u32> = state
            .iters
            .iter()
            .filter(|(_, s)| s.complete.is_some())
            .map(|(i, _)| *i)
            .collect();
        return Err(Error::data(format!(
            "run {run_id:?}: iteration {iter} is not committed (committed: {})",
            if done.is_empty() {
                "none".to_string()
            } else {
                format!("{}..={}", done[0], done[done.len() - 1])
            }
        )));
    }
    for at in (0..=iter).rev() {
        let Some(it) = state.iters.get(&at) else {
            continue;
        };
        let Some(complete) = &it.complete else {
            continue;
        };
        // The iteration manifest lists its stages in DAG order: the last writer wins.
        for s in complete.stages.iter().rev() {
            let Some(c) = it.stages.get(&s.stage) else {
                continue;
            };
            let Some(a) = c.manifest.artifacts.iter().find(|a| a.name == name) else {
                continue;
            };
            let bytes =
                read_checked(store, name, &a.path, &a.digest, "its manifest recorded").await?;
            return Ok(CommittedCheckpoint {
                run: state.run.clone(),
                bytes,
                path: a.path.clone(),
                stage: s.stage.clone(),
                iter: at,
            });
        }
    }
    Err(Error::data(format!(
        "run {run_id:?}: no stage wrote a {name} checkpoint up to iteration {iter} (is the model \
         trained in this run? `policy.kind = \"uniform\"` and `reward_model.enabled = false` train none)"
    )))
}

/// The bytes of checkpoint `name` stored at `path`, checked against `digest` (`whose`: where
/// the digest comes from, e.g. "its manifest recorded", for the error).
pub async fn read_checked(
    store: &Store,
    name: &str,
    path: &str,
    digest: &str,
    whose: &str,
) -> Result<bytes::Bytes> {
    let bytes = store
        .get_opt(&object_store::path::Path::from(path))
        .await?
        .ok_or_else(|| {
            Error::data(format!(
                "checkpoint {name}: {path} is missing from the store {}",
                store.url()
            ))
        })?;
    check_digest(name, path, &bytes, digest, whose)?;
    Ok(bytes)
}

/// Refuse checkpoint bytes whose blake3 digest is not `digest`.
pub fn check_digest(name: &str, path: &str, bytes: &[u8], digest: &str, whose: &str) -> Result<()> {
    let got = manifest::digest(bytes);
    if got != digest {
        return Err(Error::Mismatch(format!(
            "checkpoint {name} ({path}): blake3 {} does not match the digest {whose} ({}); refusing to load it",
            &got[..16],
            &digest[..16.min(digest.len())]
        )));
    }
    Ok(())
}
