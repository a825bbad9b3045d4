//! `rla-pipe replay --from N --into NEW`: a branch run, re-executed from iteration N with a
//! changed config.

use anyhow::Result;

use super::args::StoreArgs;

pub(super) async fn branch(
    store: &StoreArgs,
    parent: &str,
    from: u32,
    into: &str,
    overrides: Vec<String>,
    iterations: Option<u32>,
    quiet: bool,
) -> Result<()> {
    let store = store.open()?;
    let branch = crate::store::manifest::Branch {
        parent: parent.to_string(),
        from_iter: from,
        overrides,
    };
    let mut engine = crate::engine::branch::open(store, into, branch, crate::pipeline::dag).await?;
    engine.verbose = !quiet;
    let iterations = iterations.unwrap_or(engine.config().run.iterations);
    if iterations == 0 {
        return Err(crate::error::Error::usage("--iterations must be at least 1").into());
    }
    if !quiet {
        eprintln!(
            "run {into}: a branch of {parent}; iterations 0..{from} shared, executing {from}..{iterations}"
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
