//! Stage 2, `rm_score`: `steps` → `rm_samples`. With `reward_model.enabled = false` (the paper's
//! outcome-only ablation: R = O, no RM training) it commits an empty `rm_samples`, so every run
//! has the same tables and the same SQL works on all of them. The generative reward model that
//! samples m verdicts per step is not in this build; config validation refuses
//! `reward_model.enabled = true` with a real environment until it is.

use async_trait::async_trait;

use crate::engine::{Stage, StageContext, TableOutput};
use crate::error::{Error, Result};
use crate::schema;

pub struct RmScore;

#[async_trait]
impl Stage for RmScore {
    fn name(&self) -> &'static str {
        "rm_score"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["steps"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["rm_samples"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["reward_model"]
    }
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        if ctx.config.reward_model.enabled {
            return Err(Error::Model("reward_model.enabled = true needs the generative reward model, which this build does not have".into()));
        }
        let def = schema::table_def("rm_samples").expect("known table");
        let empty = arrow::array::RecordBatch::new_empty(def.schema.clone());
        Ok(vec![(
            "rm_samples",
            TableOutput::Frame(ctx.session.read_batch(empty)?),
        )])
    }
}
