//! Accepted-task growth of a run with the Polars LazyFrame API (the same numbers as
//! `pipelines/sql/accepted_growth.sql`): candidates accepted per iteration and the running total.
//!
//! cargo run --features polars --example accepted_growth -- ./runs gridnav

use polars::prelude::*;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(store), Some(run)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: accepted_growth STORE RUN");
    };
    let store = rla_pipe::store::Store::open_existing(&store)?;
    let iters = rla_pipe::frames::scan(&store, &run, "tasks")
        .await?
        .select([col("run_id"), col("iter")])
        .unique(None, UniqueKeepStrategy::Any);
    let accepted = rla_pipe::frames::scan(&store, &run, "adaptations")
        .await?
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
    let growth = growth.hstack(&[Column::new("cumulative".into(), cumulative)])?;
    println!("{growth}");
    Ok(())
}
