//! Stage `evaluate`: `tasks` + the updated policy → `evaluations` (counts) and `eval_steps`
//! (every evaluation episode's steps, as `steps` holds the rollout's). Success on a fixed held-out
//! set: `eval.tasks` tasks drawn from the environment with the seed `eval.seed` (the same set
//! every iteration of a run), minus any task that is also in this iteration's training pool.
//! With `eval.mode = "sampled"` (the default, as the reference: 3 rollouts at T = 0.8) each task
//! gets `eval.rollouts` seeded rollouts sampled at `eval.temperature`; with `"greedy"` the
//! learned policy plays each once, taking its most likely action every step; with `"both"` it
//! does both, the greedy rows under the splits `held_out_greedy` and `ood_greedy` (the sampled
//! ones keep `held_out` and `ood`, which the summary and the report read). The uniform policy
//! always plays `eval.rollouts` seeded rollouts.
//!
//! A second, out-of-distribution set (`split = 'ood'`, `eval.ood_tasks` tasks) is drawn the same
//! way from the environment one difficulty level harder than training
//! ([`env::harder_from_config`]: gridnav and household); the paper's OOD check.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::Array;

use super::rollout::{Job, play_policy};
use crate::determinism::derive_seed;
use crate::env;
use crate::error::Result;
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

pub struct Evaluate;

/// An evaluation split: its name, its environment and its tasks (id, spec), sorted by id.
pub(crate) type EvalSet = (
    &'static str,
    Arc<dyn env::Environment>,
    Vec<(String, serde_json::Value)>,
);

/// The held-out set and (where the environment has a harder level and `eval.ood_tasks` > 0)
/// the OOD set a config evaluates on, before removing tasks of the training pool: fixed per
/// run (drawn with `eval.seed`).
pub(crate) fn eval_sets(cfg: &crate::config::Config) -> Result<Vec<EvalSet>> {
    let eval = &cfg.eval;
    // Evaluation commits its steps but no screens: its episodes keep no screenshots.
    let env_cfg = cfg.env.without_screenshots();
    let mut sets: Vec<(&'static str, Box<dyn env::Environment>, u32)> =
        vec![("held_out", env::from_config(&env_cfg)?, eval.tasks)];
    if eval.ood_tasks > 0
        && let Some(harder) = env::harder_from_config(&env_cfg)?
    {
        sets.push(("ood", harder, eval.ood_tasks));
    }
    let mut out = Vec::new();
    for (split, environment, count) in sets {
        // The held-out set keeps its historical seed label; the OOD set has its own.
        let label = if split == "held_out" {
            "held-out"
        } else {
            split
        };
        let mut tasks: Vec<(String, serde_json::Value)> = environment
            .generate(derive_seed(eval.seed, &[label]), count)?
            .into_iter()
            .map(|spec| (env::task_id(environment.name(), &spec), spec))
            .collect();
        tasks.sort_by(|a, b| a.0.cmp(&b.0));
        tasks.dedup_by(|a, b| a.0 == b.0);
        out.push((split, Arc::from(environment), tasks));
    }
    Ok(out)
}

impl Stage for Evaluate {
    fn name(&self) -> &'static str {
        "evaluate"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["evaluations", "eval_steps"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "policy", "eval"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[crate::model::POLICY]
    }
    fn assets_in(&self, config: &crate::config::Config) -> bool {
        super::env_assets(config)
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            super::install_assets(ctx).await?;
            let mut training = BTreeSet::new();
            for b in collect(&ctx.session, "SELECT task_id FROM tasks").await? {
                let ids = Columns::new(&b, "the evaluate stage's tasks").str("task_id")?;
                training.extend((0..ids.len()).map(|i| ids.value(i).to_string()));
            }
            let eval = &ctx.config.eval;
            let uniform = ctx.config.policy.kind == crate::config::PolicyKind::Uniform;
            // The passes over every split: (rollouts per task, temperature, the split's suffix).
            let sampled = (eval.rollouts, Some(eval.temperature), "");
            let passes = match eval.mode {
                _ if uniform => vec![sampled],
                crate::config::EvalMode::Sampled => vec![sampled],
                crate::config::EvalMode::Greedy => vec![(1, None, "")],
                crate::config::EvalMode::Both => vec![sampled, (1, None, "_greedy")],
            };
            let policy_ck = if uniform {
                bytes::Bytes::new()
            } else {
                ctx.checkpoint(crate::model::POLICY).await?
            };
            let policy_ck = &policy_ck;
            let mut out = TableBuilder::new("evaluations")?;
            let mut steps = TableBuilder::new("eval_steps")?;
            for (split, environment, mut tasks) in eval_sets(&ctx.config)? {
                tasks.retain(|(id, _)| !training.contains(id));
                super::emit_assets(ctx, environment.as_ref(), tasks.iter().map(|(_, s)| s))?;
                for &(per_task, temperature, suffix) in &passes {
                    let name = format!("{split}{suffix}");
                    let seeds: Vec<(usize, u32, u64)> = (0..tasks.len())
                        .flat_map(|t| (0..per_task).map(move |r| (t, r)))
                        .map(|(t, r)| {
                            let (id, r_s) = (tasks[t].0.as_str(), r.to_string());
                            let seed = match name.as_str() {
                                "held_out" => derive_seed(ctx.seed, &[id, &r_s]),
                                _ => derive_seed(ctx.seed, &[id, &r_s, &name]),
                            };
                            (t, r, seed)
                        })
                        .collect();
                    let jobs: Vec<Job<'_>> = seeds
                        .iter()
                        .map(|(t, r, seed)| (tasks[*t].0.as_str(), &tasks[*t].1, *r, *seed))
                        .collect();
                    let rolled = super::counted(ctx, || {
                        play_policy(
                            &ctx.config,
                            policy_ck,
                            &environment,
                            &jobs,
                            temperature,
                            None,
                        )
                    })?;
                    for ((t, r, _), episode) in seeds.iter().zip(&rolled) {
                        for (i, st) in episode.steps.iter().enumerate() {
                            steps
                                .push_str(&name)
                                .push_str(&tasks[*t].0)
                                .push_u32(*r)
                                .push_i8(episode.outcome)
                                .push_u32(i as u32);
                            st.push_columns(&mut steps);
                        }
                    }
                    for (t, (task_id, _)) in tasks.iter().enumerate() {
                        let won = rolled[t * per_task as usize..(t + 1) * per_task as usize]
                            .iter()
                            .filter(|r| r.outcome > 0)
                            .count() as u32;
                        out.push_str(task_id)
                            .push_u32(per_task)
                            .push_u32(won)
                            .push_str(&name);
                    }
                }
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            let steps = steps.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![
                (
                    "evaluations",
                    TableOutput::Frame(ctx.session.read_batch(batch)?),
                ),
                (
                    "eval_steps",
                    TableOutput::Frame(ctx.session.read_batch(steps)?),
                ),
            ])
        })
    }
}
