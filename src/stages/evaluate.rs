//! Stage `evaluate`: `tasks` + the updated policy → `evaluations`. Success on a fixed held-out
//! set: `eval.tasks` tasks drawn from the environment with the seed `eval.seed` (the same set
//! every iteration of a run), minus any task that is also in this iteration's training pool.
//! The learned policy plays each once, greedily (its most likely action every step: a single
//! deterministic rollout); the uniform policy plays `eval.rollouts` seeded rollouts.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, StringBuilder, UInt32Builder};
use async_trait::async_trait;

use super::rollout::{Job, play_policy};
use super::{query, run_iter_columns};
use crate::engine::{Stage, StageContext, TableOutput, derive_seed};
use crate::env;
use crate::error::Result;
use crate::schema;

pub struct Evaluate;

#[async_trait]
impl Stage for Evaluate {
    fn name(&self) -> &'static str {
        "evaluate"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["evaluations"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "policy", "eval"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[crate::model::POLICY]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let mut training = BTreeSet::new();
        for b in query(&ctx.session, "SELECT task_id FROM tasks")
            .await?
            .collect()
            .await?
        {
            let ids = b
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("Utf8 task_id");
            training.extend((0..ids.len()).map(|i| ids.value(i).to_string()));
        }
        let environment = env::from_config(&ctx.config)?;
        let eval = &ctx.config.eval;
        let mut held_out: Vec<(String, serde_json::Value)> = environment
            .generate(derive_seed(eval.seed, &["held-out"]), eval.tasks)?
            .into_iter()
            .map(|spec| (env::task_id(environment.name(), &spec), spec))
            .filter(|(id, _)| !training.contains(id))
            .collect();
        held_out.sort_by(|a, b| a.0.cmp(&b.0));
        held_out.dedup_by(|a, b| a.0 == b.0);
        let (mut ids, mut rollouts, mut successes) = (
            StringBuilder::new(),
            UInt32Builder::new(),
            UInt32Builder::new(),
        );
        let per_task = if ctx.config.policy.kind == "uniform" {
            eval.rollouts
        } else {
            1
        };
        let seeds: Vec<(usize, u32, u64)> = (0..held_out.len())
            .flat_map(|t| (0..per_task).map(move |r| (t, r)))
            .map(|(t, r)| {
                (
                    t,
                    r,
                    derive_seed(ctx.seed, &[&held_out[t].0, &r.to_string()]),
                )
            })
            .collect();
        let jobs: Vec<Job<'_>> = seeds
            .iter()
            .map(|(t, r, seed)| (held_out[*t].0.as_str(), &held_out[*t].1, *r, *seed))
            .collect();
        let policy_ck = if ctx.config.policy.kind == "uniform" {
            &[][..]
        } else {
            &ctx.checkpoint(crate::model::POLICY)?[..]
        };
        let environment: Arc<dyn env::Environment> = Arc::from(environment);
        let rolled = play_policy(&ctx.config, policy_ck, &environment, &jobs, true)?;
        for (t, (task_id, _)) in held_out.iter().enumerate() {
            let won = rolled[t * per_task as usize..(t + 1) * per_task as usize]
                .iter()
                .filter(|r| r.outcome > 0)
                .count() as u32;
            ids.append_value(task_id);
            rollouts.append_value(per_task);
            successes.append_value(won);
        }
        let n = held_out.len();
        let def = schema::table_def("evaluations").expect("known table");
        let mut columns = run_iter_columns(ctx, n);
        columns.extend([
            Arc::new(ids.finish()) as ArrayRef,
            Arc::new(rollouts.finish()),
            Arc::new(successes.finish()),
        ]);
        let batch = RecordBatch::try_new(def.schema.clone(), columns)?;
        Ok(vec![(
            "evaluations",
            TableOutput::Frame(ctx.session.read_batch(batch)?),
        )])
    }
}
