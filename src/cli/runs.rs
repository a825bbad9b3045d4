//! `rla-pipe runs`: the runs of a store.

use anyhow::Result;

use super::args::StoreArgs;
use crate::store::catalog;

pub(super) async fn list_runs(store: &StoreArgs) -> Result<()> {
    let store = store.open()?;
    let runs = if catalog::run_ids(&store).await?.is_empty() {
        Vec::new()
    } else {
        catalog::load_runs(&store, None).await?
    };
    if runs.is_empty() {
        println!("no runs in {}", store.url());
    } else {
        println!(
            "{:<24} {:>10} {:>8}  {:<12}  {:<20}  code",
            "run", "iterations", "stages", "config", "created"
        );
    }
    for r in runs {
        let complete = r.iters.values().filter(|i| i.complete.is_some()).count();
        let stages: usize = r.iters.values().map(|i| i.stages.len()).sum();
        println!(
            "{:<24} {:>10} {:>8}  {:<12}  {:<20}  {}",
            r.run.run_id,
            complete,
            stages,
            &r.run.config_hash[..12],
            r.run.created_at,
            r.run.code_version
        );
    }
    Ok(())
}
