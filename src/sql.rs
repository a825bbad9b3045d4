//! `rla-pipe sql`: a read-only DataFusion session over everything a store has committed.
//!
//! Every data table is registered over the files named by committed stage manifests (all runs,
//! or one with `--run`), plus `stage_runs` (one row per committed manifest). DDL, DML, COPY and
//! statements such as SET are refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::catalog::MemTable;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::SessionContext;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::schema;
use crate::schema::rows::TableBuilder;
use crate::store::Store;
use crate::store::catalog::{self, RunState};
use crate::store::tables;

/// Build the query session: one table per data table plus `stage_runs`.
pub async fn session(store: &Store, run: Option<&str>) -> Result<SessionContext> {
    session_of(store, &catalog::load_runs(store, run).await?, true).await
}

/// [`session`] whose queries run on a cluster's workers (datafusion-distributed's planner:
/// scans split into tasks of about `split_bytes` of Parquet, shuffles between workers). The
/// files' key order is not declared to the planner: datafusion-distributed 4.0.0 can merge a
/// shuffle's streams unordered while keeping a declared order (upstream PR #735), so sorts and
/// ordered aggregations are always planned in full.
pub async fn cluster_session(
    store: &Store,
    run: Option<&str>,
    cluster: &Cluster,
    split_bytes: usize,
) -> Result<SessionContext> {
    cluster.check(store).await?;
    let local = session_of(store, &catalog::load_runs(store, run).await?, false).await?;
    cluster.sql_session(&local, split_bytes)
}

/// The query session over some runs only (each must exist: a missing one is named).
pub async fn session_of_runs(store: &Store, runs: &[String]) -> Result<SessionContext> {
    let mut states = Vec::new();
    for r in runs {
        crate::store::layout::validate_run_id(r)?;
        states.push(catalog::load_run(store, r).await?);
    }
    session_of(store, &states, true).await
}

/// The session over some runs; `declare_order`: tell DataFusion which files are in key order.
async fn session_of(
    store: &Store,
    runs: &[RunState],
    declare_order: bool,
) -> Result<SessionContext> {
    let ctx = register_over(
        store,
        runs.iter()
            .flat_map(|r| r.iters.values())
            .flat_map(|it| it.stages.values())
            .map(|c| &c.manifest),
        declare_order,
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
    register_over(store, manifests, true).await
}

async fn register_over<'a>(
    store: &Store,
    manifests: impl Iterator<Item = &'a crate::store::manifest::StageManifest>,
    declare_order: bool,
) -> Result<SessionContext> {
    let ctx = tables::new_session(store, 1024, None)?;
    // Each file with the run whose rows it holds (a branch's shared files are its parent's).
    let mut files: BTreeMap<&str, Vec<(crate::store::manifest::OutputFile, String)>> =
        BTreeMap::new();
    for m in manifests {
        for o in &m.outputs {
            if let Some(t) = schema::data_table_names()
                .into_iter()
                .find(|t| *t == o.table)
            {
                files
                    .entry(t)
                    .or_default()
                    .push((o.clone(), m.run_id.clone()));
            }
        }
    }
    for table in schema::data_table_names() {
        let def = schema::table_def(table).expect("known table");
        let (fs, runs): (Vec<_>, Vec<_>) =
            files.remove(table).unwrap_or_default().into_iter().unzip();
        tables::check_files(store, &def, &fs).await?;
        let order = match declare_order {
            true => tables::FileOrder::of(&fs),
            false => tables::FileOrder::Unknown,
        };
        tables::register_files(
            &ctx,
            store,
            def.name,
            &def,
            &fs.into_iter().map(|f| f.path).zip(runs).collect::<Vec<_>>(),
            order,
        )?;
    }
    Ok(ctx)
}

fn stage_runs_batch(runs: &[RunState]) -> Result<RecordBatch> {
    let mut b = TableBuilder::all_columns("stage_runs")?;
    for r in runs {
        for (i, it) in &r.iters {
            for c in it.stages.values() {
                let m = &c.manifest;
                b.push_str(&r.run.run_id)
                    .push_u32(*i)
                    .push_str(&m.stage)
                    .push_str(&m.status)
                    .push_u64(m.outputs.iter().map(|o| o.rows).sum())
                    .push_u64(m.outputs.iter().map(|o| o.bytes).sum())
                    .push_f64(m.seconds)
                    .push_opt_f64(m.store_seconds)
                    .push_opt_f64(m.cpu_seconds)
                    .push_opt_u64(m.peak_rss_bytes)
                    .push_opt_u64(m.peak_device_bytes)
                    .push_opt_u64(m.tokens.map(|t| t.computed))
                    .push_opt_u64(m.tokens.map(|t| t.reused))
                    .push_str(&c.digest)
                    .push_str(&m.config_hash)
                    .push_str(&m.code_version)
                    .push_str(&m.started_at);
            }
        }
    }
    b.finish()
}

/// Refuse anything but queries (and EXPLAIN of a query): decided on the parsed statements.
fn check_read_only(sql: &str) -> Result<()> {
    use datafusion::sql::parser::{DFParser, Statement};
    use datafusion::sql::sqlparser::ast;
    fn is_query(s: &Statement) -> bool {
        match s {
            Statement::Statement(s) => match s.as_ref() {
                ast::Statement::Query(_) => true,
                ast::Statement::Explain { statement, .. } => {
                    matches!(statement.as_ref(), ast::Statement::Query(_))
                }
                _ => false,
            },
            Statement::Explain(e) => is_query(&e.statement),
            Statement::CreateExternalTable(_) | Statement::CopyTo(_) | Statement::Reset(_) => false,
        }
    }
    for statement in DFParser::parse_sql(sql)? {
        if !is_query(&statement) {
            let text = statement.to_string();
            let kind: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            return Err(Error::Sql(format!(
                "`{kind} ...` is refused: `rla-pipe sql` is read-only (queries only)"
            )));
        }
    }
    Ok(())
}

/// Run a read-only query and collect its result.
pub async fn query(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
    check_read_only(sql)?;
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let df = match ctx.sql_with_options(sql, options).await {
        Ok(df) => df,
        // A table that is not there: say which are.
        Err(e) if e.to_string().contains("table '") && e.to_string().contains("not found") => {
            return Err(Error::Sql(format!(
                "{}; the tables are: {}",
                crate::error::datafusion_message(&e),
                table_names(ctx).join(", ")
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let schema = Arc::new(df.schema().as_arrow().clone());
    Ok((schema, df.collect().await?))
}

/// The tables a session exposes (`information_schema` aside), sorted.
fn table_names(ctx: &SessionContext) -> Vec<String> {
    let mut names = Vec::new();
    for c in ctx.catalog_names() {
        let Some(catalog) = ctx.catalog(&c) else {
            continue;
        };
        for s in catalog.schema_names() {
            if s == "information_schema" {
                continue;
            }
            if let Some(schema) = catalog.schema(&s) {
                names.extend(schema.table_names());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_queries_pass() {
        for q in [
            "SELECT 1",
            "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
            "EXPLAIN SELECT 1",
        ] {
            check_read_only(q).unwrap();
        }
        for q in [
            "CREATE TABLE x AS SELECT 1",
            "INSERT INTO tasks SELECT * FROM tasks",
            "COPY (SELECT 1) TO '/tmp/x.csv'",
            "DROP TABLE tasks",
            "SET datafusion.execution.batch_size = 1",
            "SELECT 1; DROP TABLE tasks",
            "EXPLAIN COPY (SELECT 1) TO '/tmp/x.csv'",
        ] {
            let e = check_read_only(q).unwrap_err().to_string();
            assert!(e.contains("read-only"), "{q}: {e}");
        }
    }
}
