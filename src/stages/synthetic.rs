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

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};
use crate::schema::{self, rows::TableBuilder};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

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
    /// Indices into `tasks` in the `tasks` table's key order (slot; one task per slot).
    by_slot: Arc<Vec<usize>>,
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
        let mut by_slot: Vec<usize> = (0..tasks.len()).collect();
        by_slot.sort_by_key(|&i| tasks[i].slot);
        Generator {
            run_id: ctx.run_id.clone(),
            iter: ctx.iter,
            root: ctx.seed,
            tasks: Arc::new(tasks),
            by_slot: Arc::new(by_slot),
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

    fn batch(&self, table: &'static str, chunk: usize) -> Result<RecordBatch> {
        let range = chunk * TASKS_PER_BATCH..((chunk + 1) * TASKS_PER_BATCH).min(self.tasks.len());
        let tasks = &self.tasks[range.clone()];
        let mut out = TableBuilder::new(table)?;
        match table {
            // The pool in slot order, cut into the same chunks: the stream is handed to the
            // engine as sorted by the table's key across chunks, not only within each.
            "tasks" => {
                for t in self.by_slot[range].iter().map(|&i| &self.tasks[i]) {
                    out.push_str(&t.task_id)
                        .push_u32(t.slot)
                        .push_str("active")
                        .push_str(&t.spec)
                        .push_opt_str(None)
                        .push_bool(true)
                        .push_str(&t.task_id)
                        .push_str(&t.spec);
                }
            }
            "trajectories" => {
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        out.push_str(&t.task_id)
                            .push_str(&schema::traj_id(&t.task_id, r))
                            .push_u32(r)
                            .push_i8(tr.outcome)
                            .push_u32(tr.oracle.len() as u32);
                    }
                }
            }
            "steps" => {
                let all_actions = serde_json::to_string(&ACTIONS).expect("strings serialize");
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        let id = schema::traj_id(&t.task_id, r);
                        for (i, o) in tr.oracle.iter().enumerate() {
                            out.push_str(&t.task_id)
                                .push_str(&id)
                                .push_u32(i as u32)
                                .push_str(&format!("synthetic task {} step {i}", t.slot))
                                .push_str(ACTIONS[tr.actions[i] as usize])
                                .push_f64(-(ACTIONS.len() as f64).ln())
                                .push_i8(*o)
                                .push_str(&format!("synthetic task {} step {}", t.slot, i + 1))
                                .push_str(&all_actions)
                                .push_opt_str(None);
                        }
                    }
                }
            }
            "rm_samples" => {
                for t in tasks {
                    for r in 0..self.n {
                        let tr = self.trajectory(t, r);
                        let id = schema::traj_id(&t.task_id, r);
                        for (k, v) in tr.verdicts.iter().enumerate() {
                            let critique = CRITIQUES[(1 - *v) as usize];
                            let verdict = match v {
                                1 => " <good>",
                                -1 => " <bad>",
                                _ => "",
                            };
                            out.push_str(&t.task_id)
                                .push_str(&id)
                                .push_u32(k as u32 / self.m)
                                .push_u32(k as u32 % self.m)
                                .push_str(critique)
                                .push_i8(*v)
                                .push_str(&format!("{critique}{verdict}"))
                                .push_f64(0.0);
                        }
                    }
                }
            }
            other => {
                return Err(Error::config(format!(
                    "the synthetic stage does not produce table {other}"
                )));
            }
        }
        out.finish_with(&self.run_id, self.iter)
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
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let g = Generator::new(ctx);
            Ok(self.outputs().iter().map(|t| (*t, g.stream(t))).collect())
        })
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
        // `tasks` is in key (slot) order across its two batches too.
        let tasks = output(&Synthetic, &c, "tasks").await;
        let slots = tasks
            .column_by_name("slot")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::UInt32Array>()
            .unwrap()
            .values()
            .to_vec();
        assert_eq!(slots, (0..300).collect::<Vec<u32>>());
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
