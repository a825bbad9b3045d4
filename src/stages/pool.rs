//! Stage `pool`: this iteration's `tasks`. Iteration 0 draws `env.initial_tasks` seed tasks from
//! the environment's difficulty distribution (seeded by the run seed), one per slot. A later
//! iteration applies the previous iteration's `adaptations` to the previous pool
//! (`pool_next.sql`): accepted candidates take over their parent's slot, new candidates join as
//! `pending` (rolled out like every other task, judged by this iteration's `adapt`).

use async_trait::async_trait;

use crate::determinism::canonical;
use crate::determinism::derive_seed;
use crate::env;
use crate::error::{Error, Result};
use crate::schema::rows::TableBuilder;
use crate::stage::sql::{query, render};
use crate::stage::{Stage, StageContext, TableOutput};

const POOL_NEXT: &str = include_str!("pool_next.sql");

pub struct Pool;

#[async_trait]
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
        &["env"]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        if ctx.iter > 0 {
            let sql = render(POOL_NEXT, &[("iter", ctx.iter.to_string())])?;
            return Ok(vec![(
                "tasks",
                TableOutput::Frame(query(&ctx.session, &sql).await?),
            )]);
        }
        let environment = env::from_config(&ctx.config.env)?;
        let specs = distinct_tasks(
            environment.as_ref(),
            ctx.config.run.seed,
            ctx.config.env.initial_tasks,
        )?;
        let mut out = TableBuilder::new("tasks")?;
        for (slot, (id, s)) in specs.iter().enumerate() {
            out.push_str(id)
                .push_u32(slot as u32)
                .push_str("active")
                .push_str(&canonical(s))
                .push_opt_str(None);
        }
        let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
        Ok(vec![(
            "tasks",
            TableOutput::Frame(ctx.session.read_batch(batch)?),
        )])
    }
}

/// `count` distinct tasks (by task id): the first distinct ones of a draw, drawing more when a
/// small difficulty distribution repeats itself.
fn distinct_tasks(
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
