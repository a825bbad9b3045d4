//! Counterfactual branches (`rla-pipe replay --run P --from N --set k=v --into B`): a new run
//! that shares iterations `< N` with its parent by reference — its manifests of those iterations
//! name the parent's files, nothing is copied — and executes from iteration N with the
//! overridden config. `run.json` records the parent, N and the overrides.

use super::{Dag, Engine};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::catalog;
use crate::store::manifest::{self, Branch, IterationManifest, Shared, StageDigest};
use crate::store::{Store, layout};

/// Create (or continue creating) branch `into` of `branch.parent`: write `run.json` and the
/// shared manifests, and return the engine that runs the rest. Idempotent: re-running the same
/// command after an interruption continues; a run `into` made differently is refused.
pub async fn open(
    store: Store,
    into: &str,
    branch: Branch,
    pipeline: impl Fn(&Config) -> Result<Dag>,
) -> Result<Engine> {
    layout::validate_run_id(into)?;
    layout::validate_run_id(&branch.parent)?;
    if into == branch.parent {
        return Err(Error::config(format!(
            "--into {into}: a branch needs a new run id, not its parent's"
        )));
    }
    let parent = catalog::load_run(&store, &branch.parent).await?;
    // Iterations 0, 1, … that the parent completed, up to the first it did not.
    let complete = (0..)
        .take_while(|i| parent.iters.get(i).is_some_and(|s| s.complete.is_some()))
        .count() as u32;
    if branch.from_iter > complete {
        return Err(Error::config(format!(
            "--from {}: run {:?} has {complete} complete iterations (0..{complete}); a branch can start at any of 0..={complete}",
            branch.from_iter, branch.parent
        )));
    }
    let base: Config = parent.config()?;
    let mut config = base.with_sets(
        &format!("run {:?}'s config", branch.parent),
        &branch.overrides,
    )?;
    // The parent's workers may be long gone: a branch runs in this process unless its
    // overrides name workers (`--set 'run.cluster=["host:port"]'`).
    if !branch
        .overrides
        .iter()
        .any(|o| o.starts_with("run.cluster"))
    {
        config.run.cluster.clear();
    }
    let dag = pipeline(&config)?;
    let engine =
        Engine::open_branch(store.clone(), into, config, dag, Some(branch.clone())).await?;

    for iter in 0..branch.from_iter {
        let state = &parent.iters[&iter];
        let done = state.complete.as_ref().expect("checked complete above");
        let mut stages = Vec::new();
        for s in &done.stages {
            let c = state.stages.get(&s.stage).filter(|c| c.digest == s.digest).ok_or_else(|| {
                Error::data(format!(
                    "run {:?}, iteration {iter}: _iteration.json names stage {} (blake3 {}), whose manifest is missing or differs",
                    branch.parent, s.stage, &s.digest[..16.min(s.digest.len())]
                ))
            })?;
            let mut m = c.manifest.clone();
            m.shared = Some(c.manifest.shared.clone().unwrap_or(Shared {
                run: branch.parent.clone(),
                path: c.path.clone(),
                digest: c.digest.clone(),
            }));
            m.run_id = into.to_string();
            m.status = "shared".into();
            let bytes = manifest::to_bytes(&m);
            put_same(
                &store,
                &layout::stage_manifest(into, iter, &s.stage),
                bytes.clone(),
            )
            .await?;
            stages.push(StageDigest {
                stage: s.stage.clone(),
                digest: manifest::digest(&bytes),
            });
        }
        let it = IterationManifest {
            format: manifest::FORMAT,
            run_id: into.to_string(),
            iter,
            code_version: done.code_version.clone(),
            stages,
            seconds: done.seconds,
        };
        put_same(
            &store,
            &layout::iteration_manifest(into, iter),
            manifest::to_bytes(&it),
        )
        .await?;
    }
    Ok(engine)
}

/// Write `bytes` unless the object exists; an existing object must hold the same bytes (an
/// interrupted branch creation being continued), anything else is refused.
async fn put_same(
    store: &Store,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
) -> Result<()> {
    match store.put_if_absent(path, bytes.clone()).await {
        Ok(()) => Ok(()),
        Err(Error::CommitConflict(_)) => {
            if store.get(path).await? == bytes {
                Ok(())
            } else {
                Err(Error::CommitConflict(format!(
                    "{path} exists with other content: the branch run was created differently; choose another --into"
                )))
            }
        }
        Err(e) => Err(e),
    }
}
