//! Stage `pool`: this iteration's `tasks`. Iteration 0 draws `env.initial_tasks` seed tasks from
//! the environment's difficulty distribution (seeded by the run seed), one per slot. A later
//! iteration applies the previous iteration's `adaptations` to the previous pool
//! (`pool_next.sql`): accepted candidates take over their parent's slot, new candidates join as
//! `pending` (judged by this iteration's `judge`). Every row keeps its slot's seed task (what
//! `adapt.rewrite_from = "seed"` rewrites).
//!
//! Then the iteration's rollouts are picked (`pool_sample.sql`), as the reference
//! implementation does: every pending candidate, plus `rollout.slots_per_iter` slots drawn
//! (seeded) from the slots without a pending candidate, all of them when it is 0 (the default).

use crate::determinism::canonical;
use crate::determinism::derive_seed;
use crate::env;
use crate::error::{Error, Result};
use crate::schema::rows::TableBuilder;
use crate::stage::sql::{query, render};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const POOL_NEXT: &str = include_str!("pool_next.sql");
const POOL_SAMPLE: &str = include_str!("pool_sample.sql");

pub struct Pool;

impl Stage for Pool {
    fn name(&self) -> &'static str {
        "pool"
    }
    /// The previous iteration's `tasks` and `adaptations` (empty at iteration 0).
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks", "adaptations"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "rollout"]
    }
    fn assets_in(&self, config: &crate::config::Config) -> bool {
        super::env_assets(config)
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            if ctx.iter == 0 {
                super::install_assets(ctx).await?;
            }
            let pool = if ctx.iter > 0 {
                let sql = render(POOL_NEXT, &[("iter", ctx.iter.to_string())])?;
                query(&ctx.session, &sql).await?
            } else {
                ctx.session.read_batch(seed_pool(ctx)?)?
            };
            let _ = ctx.session.deregister_table("pool_all")?;
            ctx.session.register_table("pool_all", pool.into_view())?;
            let _ = ctx.session.deregister_table("slot_draws")?;
            ctx.session.register_table(
                "slot_draws",
                slot_draws(ctx.seed, ctx.config.env.initial_tasks)?,
            )?;
            let slots = match ctx.config.rollout.slots_per_iter {
                0 => u32::MAX,
                n => n,
            };
            let sql = render(POOL_SAMPLE, &[("slots", slots.to_string())])?;
            Ok(vec![(
                "tasks",
                TableOutput::Frame(query(&ctx.session, &sql).await?),
            )])
        })
    }
}

/// A seeded random key per slot (`slot`, `draw`): the order `pool_sample.sql` draws slots in.
fn slot_draws(seed: u64, slots: u32) -> Result<std::sync::Arc<datafusion::catalog::MemTable>> {
    use arrow::array::{UInt32Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("slot", DataType::UInt32, false),
        Field::new("draw", DataType::UInt64, false),
    ]));
    let draws: Vec<u64> = (0..slots)
        .map(|s| derive_seed(seed, &["slot", &s.to_string()]))
        .collect();
    let batch = arrow::array::RecordBatch::try_new(
        schema.clone(),
        vec![
            std::sync::Arc::new(UInt32Array::from((0..slots).collect::<Vec<_>>())),
            std::sync::Arc::new(UInt64Array::from(draws)),
        ],
    )?;
    Ok(std::sync::Arc::new(datafusion::catalog::MemTable::try_new(
        schema,
        vec![vec![batch]],
    )?))
}

/// Iteration 0's pool: `env.initial_tasks` distinct seed tasks, one per slot, each its slot's
/// seed (`rolled_out` is decided by `pool_sample.sql`), drawn `env.pool_level` levels from the
/// held-out set's difficulty.
fn seed_pool(ctx: &StageContext) -> Result<arrow::array::RecordBatch> {
    let environment = env::pool_from_config(&ctx.config.env)?;
    let specs = distinct_tasks(
        environment.as_ref(),
        ctx.config.run.seed,
        ctx.config.env.initial_tasks,
    )?;
    super::emit_assets(ctx, environment.as_ref(), specs.iter().map(|(_, s)| s))?;
    let mut out = TableBuilder::new("tasks")?;
    for (slot, (id, s)) in specs.iter().enumerate() {
        let spec = canonical(s);
        out.push_str(id)
            .push_u32(slot as u32)
            .push_str("active")
            .push_str(&spec)
            .push_opt_str(None)
            .push_opt_bool(None)
            .push_str(id)
            .push_str(&spec);
    }
    out.finish_with(&ctx.run_id, ctx.iter)
}

/// `count` distinct tasks (by task id): the first distinct ones of a draw, drawing more when a
/// small difficulty distribution repeats itself.
pub(crate) fn distinct_tasks(
    environment: &dyn env::Environment,
    seed: u64,
    count: u32,
) -> Result<Vec<(String, serde_json::Value)>> {
    let mut draw = count;
    for _ in 0..4 {
        let mut seen = std::collections::BTreeSet::new();
        let picked: Vec<(String, serde_json::Value)> = environment
            .generate(derive_seed(seed, &["pool"]), draw)?
            .into_iter()
            .map(|s| (env::task_id(environment.name(), &s), s))
            .filter(|(id, _)| seen.insert(id.clone()))
            .take(count as usize)
            .collect();
        if picked.len() == count as usize {
            return Ok(picked);
        }
        draw = draw.saturating_mul(4);
    }
    Err(Error::Environment(format!(
        "the difficulty distribution of {} yields fewer than {count} distinct tasks; lower env.initial_tasks or widen the distribution",
        environment.name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GridNavConfig;
    use crate::env::gridnav::GridNav;

    #[test]
    fn pool_tasks_are_distinct() {
        // A tiny distribution: 3×3 grids without walls, distance 1.
        let cfg = GridNavConfig {
            size: 3,
            wall_density: 0.0,
            min_distance: 1,
            max_distance: 1,
            budget_factor: 1.0,
        };
        let env = GridNav::new(cfg);
        let tasks = distinct_tasks(&env, 0, 20).unwrap();
        let ids: std::collections::BTreeSet<_> = tasks.iter().map(|t| t.0.clone()).collect();
        assert_eq!(ids.len(), 20);
        assert_eq!(tasks, distinct_tasks(&env, 0, 20).unwrap(), "deterministic");
        // 9 goals × at most 4 neighbours: there are only 24 such tasks.
        let e = distinct_tasks(&env, 0, 100).unwrap_err().to_string();
        assert!(e.contains("fewer than 100 distinct tasks"), "{e}");
    }
}
