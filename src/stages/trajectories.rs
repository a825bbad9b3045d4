//! The `steps` table grouped into trajectories, in key order: what the model stages build their
//! prompts from (a step's prompt holds the trajectory's first observation and its history).

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch};

use crate::error::{Error, Result};
pub use crate::model::prompt::{StepRow, Trajectory};
use crate::schema::rows::Columns;
use crate::stage::StageContext;
use crate::stage::sql::collect;

/// Every trajectory of the stage's `steps` table, keyed by traj_id.
pub async fn load(ctx: &StageContext) -> Result<BTreeMap<String, Trajectory>> {
    let batches: Vec<RecordBatch> = collect(
        &ctx.session,
        "SELECT task_id, traj_id, step_idx, observation, action, next_observation, admissible, \
         response \
         FROM steps ORDER BY task_id, traj_id, step_idx",
    )
    .await?;
    let mut out: BTreeMap<String, Trajectory> = BTreeMap::new();
    for b in &batches {
        let c = Columns::new(b, "steps of the stage's trajectories");
        let (task, traj, obs) = (c.str("task_id")?, c.str("traj_id")?, c.str("observation")?);
        let (act, next, adm) = (
            c.str("action")?,
            c.str("next_observation")?,
            c.str("admissible")?,
        );
        let idx = c.u32("step_idx")?;
        let resp = c.str("response")?;
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
                response: (!resp.is_null(r)).then(|| resp.value(r).to_string()),
            });
        }
    }
    Ok(out)
}
