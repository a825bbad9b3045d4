//! `rla-pipe run`: run (or resume) a pipeline.

use anyhow::Result;

use crate::config::Config;
use crate::engine::Engine;
use crate::store::Store;

/// `run`'s flags that override keys of the config's `[run]` section.
pub(super) struct RunOverrides {
    pub(super) store: Option<String>,
    pub(super) iterations: Option<u32>,
    pub(super) cluster: Vec<String>,
}

impl RunOverrides {
    pub(super) fn apply(self, cfg: &mut Config) -> Result<()> {
        if let Some(s) = self.store {
            cfg.run.store = s;
        }
        if !self.cluster.is_empty() {
            crate::config::cluster_urls(&self.cluster)
                .map_err(|e| crate::error::Error::usage(format!("--cluster: {e}")))?;
            cfg.run.cluster = self.cluster;
        }
        if let Some(n) = self.iterations {
            if n == 0 {
                return Err(crate::error::Error::usage("--iterations must be at least 1").into());
            }
            cfg.run.iterations = n;
        }
        Ok(())
    }
}

pub(super) async fn run(
    pipeline: &std::path::Path,
    run_id: Option<String>,
    sets: &[String],
    overrides: RunOverrides,
    until: Option<&str>,
    quiet: bool,
) -> Result<()> {
    let mut cfg = Config::load(pipeline, sets)?;
    overrides.apply(&mut cfg)?;
    let run_id = run_id.unwrap_or_else(|| cfg.run.name.clone());
    let store = Store::open(&cfg.run.store)?;
    let dag = crate::pipeline::dag(&cfg)?;
    let iterations = cfg.run.iterations;
    let mut engine = Engine::open(store, &run_id, cfg, dag).await?;
    engine.verbose = !quiet;
    engine.run(iterations, until).await?;
    if !quiet {
        eprintln!(
            "run {run_id}: done. Query it with: rla-pipe sql --store {} --run {run_id} \"SELECT * FROM stage_runs\"",
            engine.store().url()
        );
    }
    Ok(())
}
