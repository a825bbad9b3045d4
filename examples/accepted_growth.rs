//! Accepted-task growth of a run with the Polars LazyFrame API (the same numbers as
//! `pipelines/sql/accepted_growth.sql`): candidates accepted per iteration and the running total.
//!
//! cargo run --features polars --example accepted_growth -- ./runs gridnav

use polars::prelude::*;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(store), Some(run)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: accepted_growth STORE RUN");
    };
    let store = rla_pipe::store::Store::open_existing(&store)?;
    // Resolve the committed files (async: the catalog reads the store); Polars then executes
    // the plan outside the async runtime (it blocks on its own threads).
    let (tasks, adaptations) = tokio::runtime::Runtime::new()?.block_on(async {
        let tasks = rla_pipe::frames::scan(&store, &run, "tasks").await?;
        let adaptations = rla_pipe::frames::scan(&store, &run, "adaptations").await?;
        Ok::<_, rla_pipe::error::Error>((tasks, adaptations))
    })?;
    let iters = tasks
        .select([col("run_id"), col("iter")])
        .unique(None, UniqueKeepStrategy::Any);
    let accepted = adaptations
        .filter(col("decision").eq(lit("accepted")))
        .group_by([col("run_id"), col("iter")])
        .agg([len().alias("accepted")]);
    let growth = iters
        .join(
            accepted,
            [col("run_id"), col("iter")],
            [col("run_id"), col("iter")],
            JoinArgs::new(JoinType::Left),
        )
        .with_column(col("accepted").fill_null(lit(0u32)))
        .sort(["iter"], Default::default())
        .collect()?;
    // The running total (Polars' cum_sum needs its `cum_agg` feature; a fold is as clear).
    let mut total = 0u32;
    let accepted = growth.column("accepted")?.u32()?;
    let cumulative: Vec<u32> = (0..accepted.len())
        .map(|i| {
            total += accepted.get(i).unwrap_or(0);
            total
        })
        .collect();
    // (Polars' table printing is its `fmt` feature, left off to keep the build small.)
    let iters = growth.column("iter")?.u32()?;
    println!("run_id,iter,accepted,cumulative");
    for (i, total) in cumulative.iter().enumerate() {
        println!(
            "{run},{},{},{total}",
            iters.get(i).unwrap_or_default(),
            accepted.get(i).unwrap_or(0)
        );
    }
    Ok(())
}
