//! `rla-pipe replay --from N --into NEW`: a branch run, re-executed from iteration N with a
//! changed config.

use anyhow::Result;

use super::args::StoreArgs;

/// How a branch runs: to how many iterations, whether it executes the stages its parent's
/// outputs would answer, whether it prints progress.
pub(super) struct How {
    pub iterations: Option<u32>,
    pub recompute: bool,
    pub quiet: bool,
}

pub(super) async fn branch(
    store: &StoreArgs,
    parent: &str,
    from: u32,
    into: &str,
    overrides: Vec<String>,
    how: How,
) -> Result<()> {
    let How {
        iterations,
        recompute,
        quiet,
    } = how;
    let store = store.open()?;
    let branch = crate::store::manifest::Branch {
        parent: parent.to_string(),
        from_iter: from,
        overrides,
    };
    let mut engine = crate::engine::branch::open(store, into, branch, crate::pipeline::dag).await?;
    engine.verbose = !quiet;
    engine.share_with_parent = !recompute;
    let iterations = iterations.unwrap_or(engine.config().run.iterations);
    if iterations == 0 {
        return Err(crate::error::Error::usage("--iterations must be at least 1").into());
    }
    if !quiet {
        eprintln!(
            "run {into}: a branch of {parent}; iterations 0..{from} shared, executing {from}..{iterations}{}",
            if recompute {
                " (every stage)"
            } else {
                " (a stage whose settings and inputs are the parent's: shared)"
            }
        );
    }
    engine.run(iterations, None).await?;
    if !quiet {
        eprintln!(
            "run {into}: done. Compare: rla-pipe report --store {} {parent} {into} --out compare.html",
            engine.store().url()
        );
    }
    Ok(())
}
