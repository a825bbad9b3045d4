//! Stage 1, `rollout`: `tasks` → `trajectories`, `steps`. Every distinct task of the pool (active
//! and pending) gets `rollout.n` rollouts, each with its own seed derived from (stage seed, task id,
//! rollout index), run in parallel on all cores and written in key order.
//!
//! Policy `uniform`: uniform over the admissible actions, `action_logprob = −ln #admissible` —
//! the floor for ablations and for calibrating difficulty. An episode ends when the environment
//! says so or after `min(task budget, env.max_steps)` steps; the outcome is +1 if it was won.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, Float64Builder, Int8Builder, RecordBatch, StringArray,
    StringBuilder, UInt32Builder,
};
use async_trait::async_trait;

use super::{query, run_iter_columns};
use crate::engine::{Stage, StageContext, TableOutput, derive_seed};
use crate::env::{self, Environment};
use crate::error::{Error, Result};
use crate::schema;
use crate::stages::synthetic::Rng;

pub struct Rollout;

/// One finished rollout.
pub(crate) struct Rolled {
    pub(crate) outcome: i8,
    pub(crate) steps: Vec<(String, String, f64, Option<i8>)>,
}

pub(crate) fn roll(
    environment: &dyn Environment,
    spec: &serde_json::Value,
    seed: u64,
    cap: u32,
    task_id: &str,
    r: u32,
) -> Result<Rolled> {
    let mut rng = Rng::new(seed);
    let mut episode = environment
        .reset(spec)
        .map_err(|e| context(e, task_id, r, None))?;
    let limit = episode.max_steps().min(cap);
    let mut steps = Vec::new();
    let mut won = false;
    for i in 0..limit {
        let obs = episode.observation();
        if obs.admissible.is_empty() {
            return Err(Error::Environment(format!(
                "task {task_id} rollout {r} step {i}: no admissible action"
            )));
        }
        let k = (rng.next_u64() % obs.admissible.len() as u64) as usize;
        let action = obs.admissible[k].clone();
        let logprob = -(obs.admissible.len() as f64).ln();
        let text = obs.text.clone();
        let step = episode
            .step(&action)
            .map_err(|e| context(e, task_id, r, Some(i)))?;
        steps.push((text, action, logprob, step.oracle_progress));
        if step.done {
            won = step.won;
            break;
        }
    }
    Ok(Rolled {
        outcome: if won { 1 } else { -1 },
        steps,
    })
}

fn context(e: Error, task_id: &str, rollout: u32, step: Option<u32>) -> Error {
    let at = step.map_or(String::from("reset"), |s| format!("step {s}"));
    Error::Environment(format!("task {task_id} rollout {rollout} {at}: {e}"))
}

#[async_trait]
impl Stage for Rollout {
    fn name(&self) -> &'static str {
        "rollout"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["trajectories", "steps"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "rollout", "policy"]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let tasks = query(
            &ctx.session,
            "SELECT DISTINCT task_id, spec FROM tasks ORDER BY task_id",
        )
        .await?
        .collect()
        .await?;
        let mut pool: Vec<(String, serde_json::Value)> = Vec::new();
        for b in &tasks {
            let ids = b
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("Utf8 task_id");
            let specs = b
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("Utf8 spec");
            for i in 0..b.num_rows() {
                let spec = serde_json::from_str(specs.value(i)).map_err(|e| {
                    Error::Environment(format!("task {}: spec is not JSON: {e}", ids.value(i)))
                })?;
                pool.push((ids.value(i).to_string(), spec));
            }
        }
        let environment: Arc<dyn Environment> = Arc::from(env::from_config(&ctx.config)?);
        let n = ctx.config.rollout.n;
        let cap = ctx.config.env.max_steps;
        // Rollouts in indexed slots, filled by all cores, read back in (task, rollout) order.
        let jobs: Vec<(usize, u32)> = (0..pool.len())
            .flat_map(|t| (0..n).map(move |r| (t, r)))
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, |p| p.get())
            .min(jobs.len().max(1));
        let mut slots: Vec<Option<Result<Rolled>>> = (0..jobs.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            for (w, chunk) in slots
                .chunks_mut(jobs.len().div_ceil(threads).max(1))
                .enumerate()
            {
                let (environment, pool, jobs) = (&environment, &pool, &jobs);
                let base = w * jobs.len().div_ceil(threads).max(1);
                scope.spawn(move || {
                    for (k, slot) in chunk.iter_mut().enumerate() {
                        let (t, r) = jobs[base + k];
                        let (task_id, spec) = &pool[t];
                        let seed = derive_seed(ctx.seed, &[task_id, &r.to_string()]);
                        *slot = Some(roll(environment.as_ref(), spec, seed, cap, task_id, r));
                    }
                });
            }
        });
        let traj_def = schema::table_def("trajectories").expect("known table");
        let steps_def = schema::table_def("steps").expect("known table");
        let (mut t_task, mut t_id, mut t_idx, mut t_out, mut t_len) = (
            StringBuilder::new(),
            StringBuilder::new(),
            UInt32Builder::new(),
            Int8Builder::new(),
            UInt32Builder::new(),
        );
        let (mut s_task, mut s_traj, mut s_idx, mut s_obs, mut s_act, mut s_lp, mut s_or) = (
            StringBuilder::new(),
            StringBuilder::new(),
            UInt32Builder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
            Float64Builder::new(),
            Int8Builder::new(),
        );
        for ((t, r), slot) in jobs.iter().zip(slots) {
            let rolled = slot.expect("every slot filled")?;
            let task_id = &pool[*t].0;
            let traj_id = schema::traj_id(task_id, *r);
            t_task.append_value(task_id);
            t_id.append_value(&traj_id);
            t_idx.append_value(*r);
            t_out.append_value(rolled.outcome);
            t_len.append_value(rolled.steps.len() as u32);
            for (i, (obs, action, lp, oracle)) in rolled.steps.into_iter().enumerate() {
                s_task.append_value(task_id);
                s_traj.append_value(&traj_id);
                s_idx.append_value(i as u32);
                s_obs.append_value(obs);
                s_act.append_value(action);
                s_lp.append_value(lp);
                s_or.append_option(oracle);
            }
        }
        let mut tcols = run_iter_columns(ctx, t_idx.len());
        tcols.extend([
            Arc::new(t_task.finish()) as ArrayRef,
            Arc::new(t_id.finish()),
            Arc::new(t_idx.finish()),
            Arc::new(t_out.finish()),
            Arc::new(t_len.finish()),
        ]);
        let mut scols = run_iter_columns(ctx, s_idx.len());
        scols.extend([
            Arc::new(s_task.finish()) as ArrayRef,
            Arc::new(s_traj.finish()),
            Arc::new(s_idx.finish()),
            Arc::new(s_obs.finish()),
            Arc::new(s_act.finish()),
            Arc::new(s_lp.finish()),
            Arc::new(s_or.finish()),
        ]);
        let trajectories = RecordBatch::try_new(traj_def.schema.clone(), tcols)?;
        let steps = RecordBatch::try_new(steps_def.schema.clone(), scols)?;
        Ok(vec![
            (
                "trajectories",
                TableOutput::Frame(ctx.session.read_batch(trajectories)?),
            ),
            ("steps", TableOutput::Frame(ctx.session.read_batch(steps)?)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GridNavConfig;
    use crate::env::gridnav::GridNav;

    /// Uniform-policy success rate on 200 tasks × 8 rollouts of a gridnav difficulty.
    fn uniform_success(size: u32, walls: f64, min_d: u32, max_d: u32, factor: f64) -> f64 {
        let cfg = GridNavConfig {
            size,
            wall_density: walls,
            min_distance: min_d,
            max_distance: max_d,
            budget_factor: factor,
        };
        let env = GridNav::new(cfg);
        let mut won = 0;
        let mut total = 0;
        for (t, spec) in env.generate(5, 200).unwrap().iter().enumerate() {
            for r in 0..8 {
                let rolled = roll(
                    &env,
                    spec,
                    derive_seed(9, &[&t.to_string(), &r.to_string()]),
                    1000,
                    "t",
                    r,
                )
                .unwrap();
                won += usize::from(rolled.outcome > 0);
                total += 1;
            }
        }
        won as f64 / total as f64
    }

    /// The difficulty knobs move the uniform policy's success across a useful range.
    #[test]
    fn uniform_success_spans_difficulties() {
        let levels = [
            (
                "easy: 4×4, no walls, distance 1–2, budget ×8",
                (4, 0.0, 1, 2, 8.0),
            ),
            (
                "default: 6×6, 20% walls, distance 2–4, budget ×4",
                (6, 0.2, 2, 4, 4.0),
            ),
            (
                "hard: 10×10, 30% walls, distance 8–14, budget ×1.5",
                (10, 0.3, 8, 14, 1.5),
            ),
        ];
        let rates: Vec<f64> = levels
            .iter()
            .map(|(name, (s, w, lo, hi, f))| {
                let rate = uniform_success(*s, *w, *lo, *hi, *f);
                println!("| {name} | {rate:.3} |");
                rate
            })
            .collect();
        let (easy, medium, hard) = (rates[0], rates[1], rates[2]);
        assert!(easy > 0.5, "easy {easy}");
        assert!(easy > medium && medium > hard, "{easy} {medium} {hard}");
        assert!(hard < 0.05, "hard {hard}");
    }

    #[test]
    fn rollouts_are_deterministic_and_consistent() {
        let env = GridNav::new(GridNavConfig::default());
        let spec = &env.generate(1, 1).unwrap()[0];
        let a = roll(&env, spec, 42, 64, "t", 0).unwrap();
        let b = roll(&env, spec, 42, 64, "t", 0).unwrap();
        assert_eq!(a.steps, b.steps);
        assert_eq!(a.outcome, b.outcome);
        assert!(a.steps.iter().all(|s| s.2 == -(4f64).ln() && s.3.is_some()));
        // The step cap ends an episode early, as a loss.
        let capped = roll(&env, spec, 42, 1, "t", 0).unwrap();
        assert_eq!(capped.steps.len(), 1);
    }
}
