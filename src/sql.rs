//! `rla-pipe sql`: a read-only DataFusion session over everything a store has committed.
//!
//! Every data table is registered over the files named by committed stage manifests (all runs,
//! or one with `--run`), plus `stage_runs` (one row per committed manifest). DDL, DML, COPY and
//! statements such as SET are refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Float64Builder, RecordBatch, StringBuilder, UInt32Builder, UInt64Builder};
use datafusion::catalog::MemTable;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::SessionContext;

use crate::engine::catalog::{self, RunState};
use crate::engine::exec;
use crate::error::{Error, Result};
use crate::schema;
use crate::store::Store;

/// Build the query session: one table per data table plus `stage_runs`.
pub async fn session(store: &Store, run: Option<&str>) -> Result<SessionContext> {
    session_of(store, &catalog::load_runs(store, run).await?).await
}

/// The query session over some runs only (each must exist: a missing one is named).
pub async fn session_of_runs(store: &Store, runs: &[String]) -> Result<SessionContext> {
    let mut states = Vec::new();
    for r in runs {
        crate::store::layout::validate_run_id(r)?;
        states.push(catalog::load_run(store, r).await?);
    }
    session_of(store, &states).await
}

async fn session_of(store: &Store, runs: &[RunState]) -> Result<SessionContext> {
    let ctx = session_over(
        store,
        runs.iter()
            .flat_map(|r| r.iters.values())
            .flat_map(|it| it.stages.values())
            .map(|c| &c.manifest),
    )
    .await?;
    let stage_runs = stage_runs_batch(runs)?;
    ctx.register_table(
        "stage_runs",
        Arc::new(MemTable::try_new(
            stage_runs.schema(),
            vec![vec![stage_runs]],
        )?),
    )?;
    Ok(ctx)
}

/// A session with every data table registered over the outputs of the given stage manifests
/// (tables no manifest writes are registered empty). No `stage_runs`.
pub async fn session_over<'a>(
    store: &Store,
    manifests: impl Iterator<Item = &'a crate::store::manifest::StageManifest>,
) -> Result<SessionContext> {
    let ctx = exec::new_session(store, 1024, None)?;
    let mut files: BTreeMap<&str, Vec<crate::store::manifest::OutputFile>> = BTreeMap::new();
    for m in manifests {
        for o in &m.outputs {
            if let Some(t) = schema::data_table_names()
                .into_iter()
                .find(|t| *t == o.table)
            {
                files.entry(t).or_default().push(o.clone());
            }
        }
    }
    for table in schema::data_table_names() {
        let def = schema::table_def(table).expect("known table");
        let fs = files.remove(table).unwrap_or_default();
        exec::check_sizes(store, &fs).await?;
        exec::register_files(
            &ctx,
            store,
            def.name,
            &def,
            &fs.into_iter().map(|f| f.path).collect::<Vec<_>>(),
        )?;
    }
    Ok(ctx)
}

fn stage_runs_batch(runs: &[RunState]) -> Result<RecordBatch> {
    let def = schema::table_def("stage_runs").expect("known table");
    let mut run_id = StringBuilder::new();
    let mut iter = UInt32Builder::new();
    let mut stage = StringBuilder::new();
    let mut status = StringBuilder::new();
    let mut rows = UInt64Builder::new();
    let mut bytes = UInt64Builder::new();
    let mut seconds = Float64Builder::new();
    let mut digest = StringBuilder::new();
    let mut config_hash = StringBuilder::new();
    let mut code_version = StringBuilder::new();
    let mut started_at = StringBuilder::new();
    for r in runs {
        for (i, it) in &r.iters {
            for c in it.stages.values() {
                let m = &c.manifest;
                run_id.append_value(&r.run.run_id);
                iter.append_value(*i);
                stage.append_value(&m.stage);
                status.append_value(&m.status);
                rows.append_value(m.outputs.iter().map(|o| o.rows).sum());
                bytes.append_value(m.outputs.iter().map(|o| o.bytes).sum());
                seconds.append_value(m.seconds);
                digest.append_value(&c.digest);
                config_hash.append_value(&m.config_hash);
                code_version.append_value(&m.code_version);
                started_at.append_value(&m.started_at);
            }
        }
    }
    Ok(RecordBatch::try_new(
        def.schema,
        vec![
            Arc::new(run_id.finish()),
            Arc::new(iter.finish()),
            Arc::new(stage.finish()),
            Arc::new(status.finish()),
            Arc::new(rows.finish()),
            Arc::new(bytes.finish()),
            Arc::new(seconds.finish()),
            Arc::new(digest.finish()),
            Arc::new(config_hash.finish()),
            Arc::new(code_version.finish()),
            Arc::new(started_at.finish()),
        ],
    )?)
}

/// Run a read-only query and collect its result.
pub async fn query(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let df = ctx.sql_with_options(sql, options).await.map_err(|e| {
        let msg = e.to_string();
        if msg.contains("not supported")
            || msg.contains("DDL")
            || msg.contains("DML")
            || msg.contains("Statement")
        {
            Error::Sql(format!("{msg} (`rla-pipe sql` is read-only)"))
        } else {
            Error::from(e)
        }
    })?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    Ok((schema, df.collect().await?))
}
