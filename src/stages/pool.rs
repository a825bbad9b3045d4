//! Stage `pool`: this iteration's `tasks`. Iteration 0 draws `env.initial_tasks` seed tasks from
//! the environment's difficulty distribution (seeded by the run seed); later iterations carry the
//! previous iteration's active tasks over (the adaptation stage will take this job over).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, StringBuilder, UInt32Array};
use async_trait::async_trait;

use super::{query, run_iter_columns};
use crate::config::canonical;
use crate::engine::{Stage, StageContext, TableOutput, derive_seed};
use crate::env;
use crate::error::Result;
use crate::schema;

pub struct Pool;

#[async_trait]
impl Stage for Pool {
    fn name(&self) -> &'static str {
        "pool"
    }
    /// The previous iteration's `tasks` (empty at iteration 0).
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env"]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let previous = query(
            &ctx.session,
            &format!(
                "SELECT run_id, CAST({} AS INT UNSIGNED) AS iter, task_id, slot, status, spec, parent_task_id \
                 FROM tasks WHERE status = 'active'",
                ctx.iter
            ),
        )
        .await?;
        if ctx.iter > 0 {
            return Ok(vec![("tasks", TableOutput::Frame(previous))]);
        }
        let environment = env::from_config(&ctx.config)?;
        let specs = environment.generate(
            derive_seed(ctx.config.run.seed, &["pool"]),
            ctx.config.env.initial_tasks,
        )?;
        let n = specs.len();
        let mut ids = StringBuilder::new();
        let mut spec_col = StringBuilder::new();
        for s in &specs {
            ids.append_value(env::task_id(environment.name(), s));
            spec_col.append_value(canonical(s));
        }
        let def = schema::table_def("tasks").expect("known table");
        let mut columns = run_iter_columns(ctx, n);
        columns.extend([
            Arc::new(ids.finish()) as ArrayRef,
            Arc::new(UInt32Array::from((0..n as u32).collect::<Vec<_>>())),
            Arc::new(StringArray::from(vec!["active"; n])),
            Arc::new(spec_col.finish()),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
        ]);
        let batch = RecordBatch::try_new(def.schema.clone(), columns)?;
        Ok(vec![(
            "tasks",
            TableOutput::Frame(ctx.session.read_batch(batch)?),
        )])
    }
}
