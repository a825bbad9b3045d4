//! Source stage `synthetic`: a seeded generator of the tables the rollout and reward-model stages
//! produce (`tasks`, `trajectories`, `steps`, `rm_samples`), with known statistics.
//!
//! It exists so the relational stages, the store and the CLI can be exercised and benchmarked at
//! any size without an environment or a model: each task has a success probability; a
//! trajectory's steps carry an oracle label (progress more likely on winning trajectories), and
//! each of the m RM verdicts agrees with the oracle with probability `env.synthetic.rm_accuracy`
//! (or is unparsable with probability `env.synthetic.unparsable_rate`). Rows are generated
//! lazily, already in key order, so 10M-step runs stream in constant memory.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Builder, Int8Builder, RecordBatch, StringBuilder, UInt32Builder,
};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use crate::determinism::derive_seed;
use crate::stage::{Stage, StageContext, TableOutput};
use crate::error::Result;
use crate::schema;

pub struct Synthetic;

/// Tasks per generated batch.
const TASKS_PER_BATCH: usize = 256;
const ACTIONS: [&str; 4] = ["go north", "go south", "go east", "go west"];
const CRITIQUES: [&str; 3] = [
    "the agent moved closer to the goal",
    "the agent made no progress",
    "unclear",
];

#[derive(Debug, Clone)]
struct Task {
    task_id: String,
    slot: u32,
    spec: String,
    p_success: f64,
}

struct Trajectory {
    outcome: i8,
    oracle: Vec<i8>,
    actions: Vec<u8>,
    /// steps × m verdicts.
    verdicts: Vec<i8>,
}

#[derive(Clone)]
struct Generator {
    run_id: String,
    iter: u32,
    root: u64,
    tasks: Arc<Vec<Task>>,
    n: u32,
    m: u32,
    rm_enabled: bool,
    min_steps: u32,
    max_steps: u32,
    rm_accuracy: f64,
    unparsable: f64,
}

impl Generator {
    fn new(ctx: &StageContext) -> Generator {
        let c = &ctx.config;
        // The pool is fixed per run (seeded by the run seed), like a real task pool.
        let mut tasks: Vec<Task> = (0..c.env.initial_tasks)
            .map(|slot| {
                let mut rng = Rng::new(derive_seed(
                    c.run.seed,
                    &["synthetic-task", &slot.to_string()],
                ));
                let p_success = (rng.unit() * 1000.0).round() / 1000.0;
                let spec = format!(r#"{{"p_success":{p_success},"variant":{slot}}}"#);
                let task_id = blake3::hash(format!("synthetic\n{spec}").as_bytes()).to_hex()[..16]
                    .to_string();
                Task {
                    task_id,
                    slot,
                    spec,
                    p_success,
                }
            })
            .collect();
        tasks.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        Generator {
            run_id: ctx.run_id.clone(),
            iter: ctx.iter,
            root: ctx.seed,
            tasks: Arc::new(tasks),
            n: c.rollout.n,
            m: c.reward_model.samples,
            rm_enabled: c.reward_model.enabled,
            min_steps: c.env.synthetic.min_steps,
            max_steps: c.env.max_steps,
            rm_accuracy: c.env.synthetic.rm_accuracy,
            unparsable: c.env.synthetic.unparsable_rate,
        }
    }

    fn trajectory(&self, task: &Task, rollout: u32) -> Trajectory {
        let mut rng = Rng::new(derive_seed(
            self.root,
            &[&task.task_id, &rollout.to_string()],
        ));
        let outcome = if rng.unit() < task.p_success { 1 } else { -1 };
        let steps = rng.range(self.min_steps, self.max_steps) as usize;
        let p_progress = if outcome > 0 { 0.7 } else { 0.35 };
        let mut t = Trajectory {
            outcome,
            oracle: Vec::with_capacity(steps),
            actions: Vec::with_capacity(steps),
            verdicts: Vec::new(),
        };
        for _ in 0..steps {
            let oracle = if rng.unit() < p_progress { 1 } else { -1 };
            t.oracle.push(oracle);
            t.actions.push((rng.next_u64() % 4) as u8);
            if self.rm_enabled {
                for _ in 0..self.m {
                    let v = if rng.unit() < self.unparsable {
                        0
                    } else if rng.unit() < self.rm_accuracy {
                        oracle
                    } else {
                        -oracle
                    };
                    t.verdicts.push(v);
                }
            }
        }
        t
    }

    fn batch(&self, table: &str, chunk: usize) -> Result<RecordBatch> {
        let def = schema::table_def(table).expect("known table");
        let tasks = &self.tasks
            [chunk * TASKS_PER_BATCH..((chunk + 1) * TASKS_PER_BATCH).min(self.tasks.len())];
        let mut run_id = StringBuilder::new();
        let mut iter = UInt32Builder::new();
        let mut task_id = StringBuilder::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        let mut push_key = |t: &Task, run_id: &mut StringBuilder, iter: &mut UInt32Builder| {
            run_id.append_value(&self.run_id);
            iter.append_value(self.iter);
            task_id.append_value(&t.task_id);
        };
        match table {
            "tasks" => {
                let (mut slot, mut status, mut spec, mut parent) = (
                    UInt32Builder::new(),
                    StringBuilder::new(),
                    StringBuilder::new(),
                    StringBuilder::new(),
                );
                let mut by_slot: Vec<&Task> = tasks.iter().collect();
                by_slot.sort_by_key(|t| t.slot);
                for t in by_slot {
                    push_key(t, &mut run_id, &mut iter);
                    slot.append_value(t.slot);
                    status.append_value("active");
                    spec.append_value(&t.spec);
                    parent.append_null();
                }
                cols.extend([
                    Arc::new(slot.finish()) as ArrayRef,
                    Arc::new(status.finish()),
                    Arc::new(spec.finish()),
                    Arc::new(parent.finish()),
                ]);
            }
            "trajectories" => {
                let (mut traj, mut idx, mut outcome, mut steps) = (
                    StringBuilder::new(),
                    UInt32Builder::new(),
                    Int8Builder::new(),
                    UInt32Builder::new(),
                );
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        push_key(t, &mut run_id, &mut iter);
                        traj.append_value(schema::traj_id(&t.task_id, r));
                        idx.append_value(r);
                        outcome.append_value(tr.outcome);
                        steps.append_value(tr.oracle.len() as u32);
                    }
                }
                cols.extend([
                    Arc::new(traj.finish()) as ArrayRef,
                    Arc::new(idx.finish()),
                    Arc::new(outcome.finish()),
                    Arc::new(steps.finish()),
                ]);
            }
            "steps" => {
                let (mut traj, mut step, mut obs, mut action, mut logp, mut oracle) = (
                    StringBuilder::new(),
                    UInt32Builder::new(),
                    StringBuilder::new(),
                    StringBuilder::new(),
                    Float64Builder::new(),
                    Int8Builder::new(),
                );
                let (mut next, mut admissible) = (StringBuilder::new(), StringBuilder::new());
                let all_actions = serde_json::to_string(&ACTIONS).expect("strings serialize");
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        let id = schema::traj_id(&t.task_id, r);
                        for (i, o) in tr.oracle.iter().enumerate() {
                            push_key(t, &mut run_id, &mut iter);
                            traj.append_value(&id);
                            step.append_value(i as u32);
                            obs.append_value(format!("synthetic task {} step {i}", t.slot));
                            action.append_value(ACTIONS[tr.actions[i] as usize]);
                            logp.append_value(-(ACTIONS.len() as f64).ln());
                            oracle.append_value(*o);
                            next.append_value(format!("synthetic task {} step {}", t.slot, i + 1));
                            admissible.append_value(&all_actions);
                        }
                    }
                }
                cols.extend([
                    Arc::new(traj.finish()) as ArrayRef,
                    Arc::new(step.finish()),
                    Arc::new(obs.finish()),
                    Arc::new(action.finish()),
                    Arc::new(logp.finish()),
                    Arc::new(oracle.finish()),
                    Arc::new(next.finish()),
                    Arc::new(admissible.finish()),
                ]);
            }
            "rm_samples" => {
                let (mut traj, mut step, mut sample, mut reasoning, mut score) = (
                    StringBuilder::new(),
                    UInt32Builder::new(),
                    UInt32Builder::new(),
                    StringBuilder::new(),
                    Int8Builder::new(),
                );
                let (mut response, mut logprob) = (StringBuilder::new(), Float64Builder::new());
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        let id = schema::traj_id(&t.task_id, r);
                        for (k, v) in tr.verdicts.iter().enumerate() {
                            push_key(t, &mut run_id, &mut iter);
                            traj.append_value(&id);
                            step.append_value(k as u32 / self.m);
                            sample.append_value(k as u32 % self.m);
                            reasoning.append_value(CRITIQUES[(1 - *v) as usize]);
                            score.append_value(*v);
                            let verdict = match v {
                                1 => " <good>",
                                -1 => " <bad>",
                                _ => "",
                            };
                            response
                                .append_value(format!("{}{verdict}", CRITIQUES[(1 - *v) as usize]));
                            logprob.append_value(0.0);
                        }
                    }
                }
                cols.extend([
                    Arc::new(traj.finish()) as ArrayRef,
                    Arc::new(step.finish()),
                    Arc::new(sample.finish()),
                    Arc::new(reasoning.finish()),
                    Arc::new(score.finish()),
                    Arc::new(response.finish()),
                    Arc::new(logprob.finish()),
                ]);
            }
            other => unreachable!("synthetic does not produce {other}"),
        }
        let mut all: Vec<ArrayRef> = vec![
            Arc::new(run_id.finish()),
            Arc::new(iter.finish()),
            Arc::new(task_id.finish()),
        ];
        all.extend(cols);
        Ok(RecordBatch::try_new(def.schema.clone(), all)?)
    }

    fn stream(&self, table: &'static str) -> TableOutput {
        let schema: SchemaRef = schema::table_def(table).expect("known table").schema;
        let chunks = self.tasks.len().div_ceil(TASKS_PER_BATCH);
        let g = self.clone();
        let s = futures::stream::iter(0..chunks).map(move |c| {
            g.batch(table, c)
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
        });
        TableOutput::Sorted(Box::pin(RecordBatchStreamAdapter::new(schema, s)))
    }
}

use futures::StreamExt;

#[async_trait]
impl Stage for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["tasks", "trajectories", "steps", "rm_samples"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "rollout", "reward_model"]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let g = Generator::new(ctx);
        Ok(self.outputs().iter().map(|t| (*t, g.stream(t))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, output};

    #[tokio::test]
    async fn generates_consistent_sorted_tables() {
        let cfg = Config::from_toml("[run]\nname='t'\n[env]\ninitial_tasks = 300\n", "t").unwrap();
        let c = ctx(cfg);
        let traj = output(&Synthetic, &c, "trajectories").await;
        let steps = output(&Synthetic, &c, "steps").await;
        let rm = output(&Synthetic, &c, "rm_samples").await;
        assert_eq!(traj.num_rows(), 300 * 8);
        let total_steps: u64 = traj
            .column_by_name("num_steps")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::UInt32Array>()
            .unwrap()
            .values()
            .iter()
            .map(|&n| u64::from(n))
            .sum();
        assert_eq!(steps.num_rows() as u64, total_steps);
        assert_eq!(rm.num_rows() as u64, total_steps * 3);
        // Key order holds across batch boundaries.
        let ids = traj.column_by_name("traj_id").unwrap();
        let ids = ids
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap();
        assert!(
            ids.iter()
                .flatten()
                .collect::<Vec<_>>()
                .windows(2)
                .all(|w| w[0] < w[1])
        );
    }
}
