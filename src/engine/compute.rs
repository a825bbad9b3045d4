//! Computing a stage's outputs, what a stage run here ([`super::exec`]) and a shard run on a
//! worker ([`super::shard`]) share: the stage's outputs matched to its declared tables and
//! checked against their schemas, each as a stream in key order, and the ranges of a
//! partitioned stage with the sessions that show only a range's rows.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StringArray};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionContext, col};

use crate::error::{Error, Result};
use crate::schema::{self, TableDef};
use crate::stage::{InputFiles, Stage, StageContext, TableOutput};
use crate::store::manifest::OutputFile;
use crate::store::tables::{FileOrder, new_session, register_files};

/// How many task ranges of a partitioned stage run at once.
pub(super) const CHUNK_CONCURRENCY: usize = 3;

/// Run the stage and match its outputs to its declared output tables, in declared order.
pub(super) async fn run_outputs(
    stage: &dyn Stage,
    ctx: &StageContext,
) -> Result<Vec<(TableDef, TableOutput)>> {
    let mut produced = stage.run(ctx).await?;
    let mut out = Vec::new();
    for table in stage.outputs() {
        let pos = produced
            .iter()
            .position(|(t, _)| t == table)
            .ok_or_else(|| {
                Error::data(format!(
                    "stage {} did not produce its declared output table {table}",
                    stage.name()
                ))
            })?;
        let (_, o) = produced.swap_remove(pos);
        out.push((schema::table_def(table).expect("validated by Dag::new"), o));
    }
    if let Some((t, _)) = produced.first() {
        return Err(Error::data(format!(
            "stage {} produced undeclared table {t}",
            stage.name()
        )));
    }
    Ok(out)
}

/// The physical plan of a stage's frame, checked against its table's schema and sorted by the
/// key in DataFusion's plan ([`SortBy::DataFusion`]: the engine checks the rows it yields).
pub(super) async fn sorted_plan(
    stage: &str,
    def: &TableDef,
    df: datafusion::dataframe::DataFrame,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    check_schema(stage, def, &schema)?;
    let sort = def
        .key
        .iter()
        .map(|k| col(*k).sort(true, false))
        .collect::<Vec<_>>();
    Ok(df.sort(sort)?.create_physical_plan().await?)
}

/// A half-open range `[lo, hi)` of the partition column; `None` = unbounded.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Range {
    pub(super) lo: Option<String>,
    pub(super) hi: Option<String>,
}

/// Split the partition column's values into contiguous ranges of about `run.chunk_rows` input
/// rows. Boundaries come from the distinct values of the smallest input table, so the plan depends
/// only on committed data and config (replay makes the same one).
pub(super) async fn plan_ranges(
    ctx: &StageContext,
    inputs: &InputFiles,
    column: &str,
) -> Result<Vec<Range>> {
    let total: u64 = inputs.tables.iter().map(|(_, fs)| rows(fs)).sum();
    let chunks = total.div_ceil(ctx.config.run.chunk_rows.max(1)).max(1);
    split_ranges(ctx, inputs, column, chunks).await
}

/// Rows in `files`.
fn rows(files: &[OutputFile]) -> u64 {
    files.iter().map(|f| f.rows).sum()
}

/// Split the partition column's values into `chunks` contiguous ranges of about as many values
/// each (fewer where there are fewer values), from the distinct values of the smallest input
/// table that has the column.
pub(super) async fn split_ranges(
    ctx: &StageContext,
    inputs: &InputFiles,
    column: &str,
    chunks: u64,
) -> Result<Vec<Range>> {
    let Some((smallest, _)) = inputs
        .tables
        .iter()
        .filter(|(d, _)| d.schema.field_with_name(column).is_ok())
        .min_by_key(|(_, fs)| rows(fs))
    else {
        return Ok(vec![Range { lo: None, hi: None }]);
    };
    if chunks == 1 {
        return Ok(vec![Range { lo: None, hi: None }]);
    }
    let field = smallest.schema.field_with_name(column)?;
    if field.data_type() != &DataType::Utf8 {
        return Err(Error::data(format!(
            "partition column {column} of table {} must be Utf8, not {}",
            smallest.name,
            field.data_type()
        )));
    }
    let df = ctx
        .session
        .sql(&format!(
            "SELECT DISTINCT \"{column}\" AS v FROM \"{}\" ORDER BY v",
            smallest.name
        ))
        .await?;
    let mut values = Vec::new();
    for b in df.collect().await? {
        let col = arrow::compute::cast(b.column(0), &DataType::Utf8)?;
        let col = col
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("cast to Utf8");
        values.extend(
            (0..col.len())
                .filter(|i| col.is_valid(*i))
                .map(|i| col.value(i).to_string()),
        );
    }
    let n = (chunks as usize).min(values.len()).max(1);
    let bounds: Vec<String> = (1..n)
        .map(|i| values[i * values.len() / n].clone())
        .collect();
    let mut ranges = Vec::new();
    let mut lo = None;
    for b in bounds {
        ranges.push(Range {
            lo: lo.clone(),
            hi: Some(b.clone()),
        });
        lo = Some(b);
    }
    ranges.push(Range { lo, hi: None });
    Ok(ranges)
}

/// A one-thread session whose input tables only show the rows of one range.
pub(super) async fn range_session(
    inputs: &InputFiles,
    run_id: &str,
    column: &str,
    range: &Range,
) -> Result<SessionContext> {
    let memory = (inputs.memory_limit_mib / CHUNK_CONCURRENCY as u64).max(64);
    let session = new_session(&inputs.store, memory, Some(1))?;
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut conds = Vec::new();
    if let Some(lo) = &range.lo {
        conds.push(format!("\"{column}\" >= {}", quote(lo)));
    }
    if let Some(hi) = &range.hi {
        conds.push(format!("\"{column}\" < {}", quote(hi)));
    }
    for (def, files) in &inputs.tables {
        let hidden = format!("__committed_{}", def.name);
        register_files(
            &session,
            &inputs.store,
            &hidden,
            def,
            &files
                .iter()
                .map(|f| (f.path.clone(), run_id.to_string()))
                .collect::<Vec<_>>(),
            FileOrder::Key,
        )?;
        let filter = if conds.is_empty() || def.schema.field_with_name(column).is_err() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        };
        let view = session
            .sql(&format!("SELECT * FROM \"{hidden}\"{filter}"))
            .await?
            .into_view();
        session.register_table(def.name, view)?;
    }
    Ok(session)
}

/// The declared type a computed column is stored as (`Utf8View` → `Utf8`).
fn storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8View => DataType::Utf8,
        other => other.clone(),
    }
}

/// Cast computed columns to their declared storage types.
pub(super) fn to_storage(schema: &SchemaRef, columns: &[ArrayRef]) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                Ok(arrow::compute::cast(c, f.data_type())?)
            }
        })
        .collect()
}

fn check_schema(stage: &str, def: &TableDef, got: &SchemaRef) -> Result<()> {
    let want = &def.schema;
    let names = |s: &SchemaRef| {
        s.fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
    };
    if got.fields().len() != want.fields().len()
        || got
            .fields()
            .iter()
            .zip(want.fields())
            .any(|(a, b)| a.name() != b.name() || &storage_type(a.data_type()) != b.data_type())
    {
        return Err(Error::data(format!(
            "stage {stage} produced table {} with columns [{}]; schemas/{}.md declares [{}]",
            def.name,
            names(got).join(", "),
            def.name,
            names(want).join(", ")
        )));
    }
    Ok(())
}

/// Who sorts a frame a stage computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SortBy {
    /// `ORDER BY` the key in DataFusion's plan, which DataFusion 55.2 may drop when it wrongly
    /// takes the rows for sorted (README, Key order): for ranges, whose rows the engine then
    /// checks and sorts if needed ([`super::sort::in_key_order`]).
    DataFusion,
    /// The engine's sort over DataFusion's optimized plan ([`super::sort::sorted_by_key`]),
    /// which DataFusion cannot take for done.
    Engine,
}

/// A stage's output as a stream in the table's key order (see [`SortBy`]).
pub(super) async fn into_sorted_stream(
    stage: &str,
    def: &TableDef,
    out: TableOutput,
    sort: SortBy,
) -> Result<SendableRecordBatchStream> {
    match out {
        TableOutput::Frame(df) if sort == SortBy::DataFusion => {
            let task = Arc::new(df.task_ctx());
            let plan = sorted_plan(stage, def, df).await?;
            Ok(datafusion::physical_plan::execute_stream(plan, task)?)
        }
        TableOutput::Frame(df) => {
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            check_schema(stage, def, &schema)?;
            let task = Arc::new(df.task_ctx());
            let plan = df.create_physical_plan().await?;
            Ok(datafusion::physical_plan::execute_stream(
                super::sort::sorted_by_key(def, plan)?,
                task,
            )?)
        }
        TableOutput::Sorted(stream) => {
            check_schema(stage, def, &stream.schema())?;
            Ok(stream)
        }
    }
}
