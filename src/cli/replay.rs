//! `rla-pipe replay --iter N --verify`: audit a committed iteration (the branch form,
//! `--from N --into NEW`, is [`super::branch`]).

use anyhow::Result;

use super::args::StoreArgs;
use crate::engine::replay;
use crate::store::layout;

pub(super) async fn replay_verify(
    store: &StoreArgs,
    run: &str,
    iter: u32,
    stage: Option<&str>,
) -> Result<()> {
    let store = store.open()?;
    layout::validate_run_id(run)?;
    let report = replay::verify(&store, run, iter, stage, crate::pipeline::dag).await?;
    for v in &report {
        println!(
            "ok  {:<14} {:<18} {:>10} rows  blake3 {}  ({})",
            v.stage,
            v.table,
            v.rows,
            &v.digest[..16],
            v.how
        );
    }
    println!(
        "iteration {iter} of run {run}: verified ({} tables)",
        report.len()
    );
    Ok(())
}
