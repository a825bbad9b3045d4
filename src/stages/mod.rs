//! The stages of the iteration DAG, one file each; relational stages keep their SQL beside them.
//!
//! | stage | reads | writes |
//! |---|---|---|
//! | `synthetic` | — | `tasks`, `trajectories`, `steps`, `rm_samples` |
//! | `pretrain` (iteration 0) | — (planner demonstrations it plays) | `demonstrations`, initial `policy` / `rm` checkpoints |
//! | `pool` | `tasks`, `adaptations` (previous iteration) | `tasks` (+ which are rolled out) |
//! | `rollout` | `tasks`, policy checkpoint | `trajectories`, `steps` |
//! | `rm_score` | `steps`, RM checkpoint | `rm_samples` |
//! | `reward_join` | `steps`, `trajectories`, `rm_samples` | `step_rewards` |
//! | `task_accuracy` | `trajectories`, `step_rewards`, `steps` | `task_accuracy` |
//! | `judge` | `tasks`, `task_accuracy`, `adaptations` (previous iteration) | `judgements` |
//! | `advantage` | `step_rewards`, `rm_samples`, `trajectories`, `tasks`, `judgements` | `policy_advantages`, `rm_advantages` |
//! | `update` | `steps`, `rm_samples`, both advantage tables, both checkpoints | `update_metrics`, new checkpoints |
//! | `adapt` | `tasks`, `task_accuracy`, `judgements`, `trajectories`, `rm_samples`, `steps` | `adaptations` |
//! | `evaluate` | `tasks`, the new policy checkpoint | `evaluations`, `eval_steps` |
//!
//! Stages that run a model share [`trajectories`] (steps grouped into trajectories, for prompts)
//! and `bench` (their benchmark dumps for `benches/torch_*.py`, off unless `RLA_PIPE_BENCH_*` is set).

pub mod adapt;
pub mod advantage;
mod bench;
pub mod coding;
pub mod coding_loop;
pub mod evaluate;
pub mod execute;
pub mod judge;
pub mod pool;
pub mod pretrain;
pub mod reward_join;
pub mod rm_score;
pub mod rollout;
pub mod synthetic;
pub mod task_accuracy;
pub mod trajectories;
pub mod update;

use crate::config::Config;
use crate::error::Result;
use crate::model::ModelSpec;

/// The model spec of a role (`policy` or `rm`) under a config: its section's shape over the
/// configured environment's vocabulary.
pub fn model_spec(cfg: &Config, role: &str) -> Result<ModelSpec> {
    let words = crate::env::from_config(&cfg.env)?.vocabulary();
    let mut spec = ModelSpec::for_role(role, &cfg.policy, &cfg.reward_model, &words)?;
    spec.checkpoint_dtype = cfg.update.checkpoint_dtype;
    spec.recompute_attention = cfg.update.recomputes_attention(cfg.run.device);
    if spec.lora.is_some() {
        spec.train_dtype = cfg.update.base_dtype;
    }
    Ok(spec)
}

/// Whether a stage that plays or makes tasks under `cfg` reads the run's environment assets
/// ([`crate::stage::Stage::assets_in`]).
pub(crate) fn env_assets(cfg: &Config) -> bool {
    cfg.env.name.has_assets()
}

/// Make every environment asset the run has committed local before the stage plays or makes a
/// task (TextWorld: the games, into its cache), so that a resumed run, a replay, a branch or a
/// cluster worker plays — and `generate` finds — exactly the committed games instead of making
/// them again.
pub(crate) async fn install_assets(ctx: &crate::stage::StageContext) -> Result<()> {
    let Some(assets) = ctx.assets.as_ref().filter(|a| !a.files.is_empty()) else {
        return Ok(());
    };
    let environment = crate::env::from_config(&ctx.config.env)?;
    let ids: Vec<&str> = assets.files.keys().map(String::as_str).collect();
    let missing = environment.missing_assets(&ids);
    if !missing.is_empty() {
        tracing::info!(
            count = missing.len(),
            "installing the run's committed environment assets"
        );
    }
    for id in missing {
        let bytes = assets.read(&id).await?;
        environment.install_asset(&id, &bytes)?;
    }
    Ok(())
}

/// Hand the engine the asset of every task in `specs` that the run has not committed yet.
pub(crate) fn emit_assets<'a>(
    ctx: &crate::stage::StageContext,
    environment: &dyn crate::env::Environment,
    specs: impl IntoIterator<Item = &'a serde_json::Value>,
) -> Result<()> {
    for spec in specs {
        if let Some(id) = environment.asset_id(spec)
            && ctx.asset_is_new(&id)
        {
            ctx.emit_asset(&id, environment.asset(spec)?.into());
        }
    }
    Ok(())
}

/// Run a stage's synchronous model work and report the tokens its models computed and reused
/// (`stage_runs.tokens_computed`, `tokens_reused`; nothing when no model ran) and, on a GPU,
/// the device memory it reserved at its peak (`stage_runs.peak_device_bytes`).
pub(crate) fn counted<R>(ctx: &crate::stage::StageContext, work: impl FnOnce() -> R) -> R {
    crate::model::device_memory::take_device_peak();
    let (r, t) = crate::model::count::counting(work);
    if t.computed > 0 {
        ctx.add_tokens(t.computed, t.reused);
    }
    if let Some(bytes) = crate::model::device_memory::take_device_peak() {
        ctx.note_device_peak(bytes);
    }
    r
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Helpers for stage unit tests: register hand-built batches as input tables.
    use std::sync::Arc;

    use arrow::array::{ArrayRef, RecordBatch};
    use datafusion::catalog::MemTable;
    use datafusion::prelude::SessionContext;

    use crate::config::Config;
    use crate::schema;
    use crate::stage::{Stage, StageContext, TableOutput};

    pub fn ctx(config: Config) -> StageContext {
        StageContext::detached("r".into(), 0, 7, Arc::new(config), SessionContext::new())
    }

    pub fn s(v: &[&str]) -> Arc<arrow::array::StringArray> {
        Arc::new(arrow::array::StringArray::from(v.to_vec()))
    }
    pub fn u(v: &[u32]) -> Arc<arrow::array::UInt32Array> {
        Arc::new(arrow::array::UInt32Array::from(v.to_vec()))
    }
    pub fn f(v: &[f64]) -> Arc<arrow::array::Float64Array> {
        Arc::new(arrow::array::Float64Array::from(v.to_vec()))
    }
    pub fn i8s(v: &[i8]) -> Arc<arrow::array::Int8Array> {
        Arc::new(arrow::array::Int8Array::from(v.to_vec()))
    }

    /// Register `table` from columns given without `run_id` / `iter` (filled with "r" / 0).
    /// Trailing columns the test does not give (ones its stage does not read) get defaults.
    pub fn register(ctx: &StageContext, table: &str, columns: Vec<ArrayRef>) {
        let def = schema::table_def(table).unwrap();
        let n = columns.first().map_or(0, |c| c.len());
        let mut all: Vec<ArrayRef> = vec![
            Arc::new(arrow::array::StringArray::from(vec!["r"; n])),
            Arc::new(arrow::array::UInt32Array::from(vec![0u32; n])),
        ];
        all.extend(columns);
        for field in def.schema.fields().iter().skip(all.len()) {
            let zero = arrow::array::new_null_array(field.data_type(), 1);
            let zero = arrow::compute::kernels::cast::cast(
                &arrow::array::StringArray::from(vec!["0"]),
                field.data_type(),
            )
            .unwrap_or(zero);
            let idx = arrow::array::UInt32Array::from(vec![0u32; n]);
            all.push(arrow::compute::take(&zero, &idx, None).unwrap());
        }
        let batch = RecordBatch::try_new(def.schema.clone(), all).unwrap();
        let _ = ctx.session.deregister_table(table);
        ctx.session
            .register_table(
                table,
                Arc::new(MemTable::try_new(def.schema.clone(), vec![vec![batch]]).unwrap()),
            )
            .unwrap();
    }

    /// Run a stage and collect one output table, sorted by its key.
    pub async fn output(stage: &dyn Stage, ctx: &StageContext, table: &str) -> RecordBatch {
        let outs = stage.run(ctx).await.unwrap();
        let def = schema::table_def(table).unwrap();
        let (_, out) = outs.into_iter().find(|(t, _)| *t == table).unwrap();
        let batches = match out {
            TableOutput::Frame(df) => {
                let sort = def
                    .key
                    .iter()
                    .map(|k| datafusion::prelude::col(*k).sort(true, false))
                    .collect();
                df.sort(sort).unwrap().collect().await.unwrap()
            }
            TableOutput::Sorted(s) => {
                use futures::TryStreamExt;
                s.try_collect::<Vec<_>>().await.unwrap()
            }
        };
        arrow::compute::concat_batches(&def.schema, &batches).unwrap()
    }
}
