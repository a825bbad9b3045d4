//! The `steps` table grouped into trajectories, in key order: what the model stages build their
//! prompts from (a step's prompt holds the trajectory's first observation and its history).

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::UInt32Type;

use super::query;
use crate::engine::StageContext;
use crate::error::{Error, Result};

/// One step, as the models need it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step_idx: u32,
    pub observation: String,
    pub action: String,
    pub next_observation: String,
    pub admissible: Vec<String>,
}

/// One trajectory's steps, in step order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    pub task_id: String,
    pub traj_id: String,
    pub steps: Vec<StepRow>,
}

impl Trajectory {
    /// The task text of the prompts: the first observation.
    pub fn task(&self) -> &str {
        self.steps.first().map_or("", |s| s.observation.as_str())
    }

    /// The (observation, action) pairs before step `i`.
    pub fn past(&self, i: usize) -> Vec<(&str, &str)> {
        self.steps[..i]
            .iter()
            .map(|s| (s.observation.as_str(), s.action.as_str()))
            .collect()
    }
}

/// Every trajectory of the stage's `steps` table, keyed by traj_id.
pub async fn load(ctx: &StageContext) -> Result<BTreeMap<String, Trajectory>> {
    let batches: Vec<RecordBatch> = query(
        &ctx.session,
        "SELECT task_id, traj_id, step_idx, observation, action, next_observation, admissible \
         FROM steps ORDER BY task_id, traj_id, step_idx",
    )
    .await?
    .collect()
    .await?;
    let mut out: BTreeMap<String, Trajectory> = BTreeMap::new();
    for b in &batches {
        let s = |i: usize| b.column(i).as_string::<i32>();
        let (task, traj, obs, act, next, adm) = (s(0), s(1), s(3), s(4), s(5), s(6));
        let idx = b.column(2).as_primitive::<UInt32Type>();
        for r in 0..b.num_rows() {
            let admissible: Vec<String> = serde_json::from_str(adm.value(r)).map_err(|e| {
                Error::data(format!(
                    "steps: trajectory {} step {}: column admissible is not a JSON array of strings: {e}",
                    traj.value(r),
                    idx.value(r)
                ))
            })?;
            let t = out
                .entry(traj.value(r).to_string())
                .or_insert_with(|| Trajectory {
                    task_id: task.value(r).to_string(),
                    traj_id: traj.value(r).to_string(),
                    steps: Vec::new(),
                });
            if idx.value(r) as usize != t.steps.len() || idx.is_null(r) {
                return Err(Error::data(format!(
                    "steps: trajectory {} has step {} where step {} was expected",
                    t.traj_id,
                    idx.value(r),
                    t.steps.len()
                )));
            }
            t.steps.push(StepRow {
                step_idx: idx.value(r),
                observation: obs.value(r).to_string(),
                action: act.value(r).to_string(),
                next_observation: next.value(r).to_string(),
                admissible,
            });
        }
    }
    Ok(out)
}
