//! Environment assets: files a task needs besides its spec (TextWorld's games), which the stages
//! that make tasks hand to the engine as artifacts named `asset-<id>`. A stage that plays or
//! makes tasks ([`Stage::assets_in`]) gets every asset its run has committed, so a resumed run,
//! a replay, a branch or a cluster worker plays exactly the committed files instead of making
//! them again.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::dag::Dag;
use crate::error::Result;
use crate::stage::{ASSET_PREFIX, AssetRef, Assets};
use crate::store::{Store, catalog};

/// The assets run `run_id`'s committed manifests name (a branch's shared iterations included),
/// and which of them were committed before stage `stage` of iteration `iter` (earlier
/// iterations, earlier stages of the same one in the DAG's order).
pub async fn committed(
    store: &Store,
    run_id: &str,
    dag: &Dag,
    iter: u32,
    stage: &str,
) -> Result<Assets> {
    let order = |name: &str| dag.stages().iter().position(|s| s.name() == name);
    let me = order(stage);
    let mut files = BTreeMap::new();
    let mut before = BTreeSet::new();
    let run = catalog::load_run(store, run_id).await?;
    for (at, it) in &run.iters {
        for (name, c) in &it.stages {
            let earlier = *at < iter || (*at == iter && order(name) < me && order(name).is_some());
            for a in &c.manifest.artifacts {
                let Some(id) = a.name.strip_prefix(ASSET_PREFIX) else {
                    continue;
                };
                files.entry(id.to_string()).or_insert_with(|| AssetRef {
                    id: id.to_string(),
                    path: a.path.clone(),
                    digest: a.digest.clone(),
                });
                if earlier {
                    before.insert(id.to_string());
                }
            }
        }
    }
    Ok(Assets {
        store: store.clone(),
        files,
        before,
    })
}
