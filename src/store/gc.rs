//! Garbage collection: delete the data files and artifacts no committed manifest names (of any
//! run: branches name their parents' files)
//! (interrupted attempts, lost commit races), once they are older than a grace period (a live
//! writer may still commit a young one).

use std::collections::BTreeSet;

use super::catalog;
use super::{Store, layout};
use crate::error::Result;

/// One unreferenced file, removed (or, on a dry run, to be removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub path: String,
    pub bytes: u64,
}

/// Find (and unless `dry_run`, delete) the unreferenced files of one run or of every run.
/// `on_file` is called for each, as it is handled.
pub async fn collect(
    store: &Store,
    run: Option<&str>,
    grace_secs: u64,
    dry_run: bool,
    mut on_file: impl FnMut(&Orphan),
) -> Result<Vec<Orphan>> {
    if let Some(r) = run {
        layout::validate_run_id(r)?;
    }
    let mut out = Vec::new();
    // Files named by any run's manifests: a branch run's manifests name its parent's files.
    let all = catalog::load_runs(store, None).await?;
    let referenced: BTreeSet<String> = all
        .iter()
        .flat_map(|r| r.iters.values())
        .flat_map(|i| i.stages.values())
        .flat_map(|c| {
            let m = &c.manifest;
            m.outputs
                .iter()
                .map(|o| o.path.clone())
                .chain(m.artifacts.iter().map(|a| a.path.clone()))
        })
        .collect();
    let selected = match run {
        Some(r) => vec![catalog::load_run(store, r).await?],
        None => all,
    };
    for r in selected {
        let now = std::time::SystemTime::now();
        for dir in [
            layout::data_dir(&r.run.run_id),
            layout::artifacts_dir(&r.run.run_id),
        ] {
            for meta in store.list(&dir).await? {
                let age = now
                    .duration_since(meta.last_modified.into())
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                if referenced.contains(meta.location.as_ref()) || age < grace_secs {
                    continue;
                }
                if !dry_run {
                    store.delete(&meta.location).await?;
                }
                let orphan = Orphan {
                    path: meta.location.to_string(),
                    bytes: meta.size,
                };
                on_file(&orphan);
                out.push(orphan);
            }
        }
    }
    Ok(out)
}
