//! A run's committed tables as Polars LazyFrames (cargo feature `polars`).
//!
//! [`scan`] resolves the committed files through the catalog — exactly the files `rla-pipe sql`
//! reads, never an uncommitted attempt — and lets Polars read the Parquet itself. The frame has
//! the table's columns as `sql` exposes them: `run_id` and `iter` first; columns added to the
//! schema after a file was written read as null; a branch's shared iterations (files its
//! parent wrote) read with the branch's `run_id`. Collect the frame outside a current-thread
//! async runtime (Polars blocks on its own threads), as the example below does.
//!
//! ```no_run
//! # fn f() -> anyhow::Result<()> {
//! use polars::prelude::*;
//! let store = rla_pipe::store::Store::open_existing("./runs")?;
//! let rt = tokio::runtime::Runtime::new()?;
//! let steps = rt.block_on(rla_pipe::frames::scan(&store, "gridnav", "steps"))?;
//! let per_iter = steps.group_by([col("iter")]).agg([len()]).collect()?;
//! # Ok(()) }
//! ```

use polars::prelude::*;

use crate::error::{Error, Result};
use crate::store::{Store, catalog};

/// The committed rows of `table` in run `run_id`, lazily. Local stores (a path, `file://`) and
/// `s3://` stores (and `gs://`, `az://` with the `gcp` / `azure` features); Polars reads cloud
/// files with the same `AWS_*` / `GOOGLE_*` / `AZURE_*` environment the store was opened with.
/// `memory://` stores have no URL Polars can read: an error.
pub async fn scan(store: &Store, run_id: &str, table: &str) -> Result<LazyFrame> {
    crate::store::layout::validate_run_id(run_id)?;
    let def = crate::schema::table_def(table)
        .filter(|d| d.name != "stage_runs")
        .ok_or_else(|| {
            Error::data(format!(
                "no table {table:?} (tables: {})",
                crate::schema::data_table_names().join(", ")
            ))
        })?;
    let state = catalog::load_run(store, run_id).await?;
    let files: Vec<_> = state
        .files()
        .into_iter()
        .filter(|f| f.file.table == table)
        .collect();
    if !files.is_empty() && store.url().starts_with("memory://") {
        return Err(Error::store(format!(
            "{}: Polars cannot read an in-process memory store; use a local or cloud store",
            store.url()
        )));
    }
    // Cloud URLs: Polars builds its own object store from the environment, as `Store` did.
    let cloud_options = (!store.is_local()).then(cloud::CloudOptions::default);
    let schema = Arc::new(polars_schema(&def.schema)?);
    if files.is_empty() {
        return Ok(DataFrame::empty_with_schema(&schema).lazy());
    }
    // Files written by this run, and those a branch shares with the run that wrote them.
    let (own, shared): (Vec<_>, Vec<_>) = files.iter().partition(|f| f.written_by.is_none());
    let mut frames = Vec::new();
    for (group, relabel) in [(own, false), (shared, true)] {
        if group.is_empty() {
            continue;
        }
        let paths: Vec<PlRefPath> = group
            .iter()
            .map(|f| PlRefPath::new(store.external_url(&f.file.path)))
            .collect();
        let args = ScanArgsParquet {
            schema: Some(schema.clone()),
            allow_missing_columns: true,
            glob: false,
            cloud_options: cloud_options.clone(),
            ..Default::default()
        };
        let mut lf = LazyFrame::scan_parquet_files(paths.into(), args)
            .map_err(|e| Error::data(format!("run {run_id:?}, table {table}: {e}")))?;
        if relabel {
            lf = lf.with_column(lit(run_id).alias("run_id"));
        }
        frames.push(lf);
    }
    if frames.len() == 1 {
        return Ok(frames.pop().expect("one frame"));
    }
    concat(frames, UnionArgs::default())
        .map_err(|e| Error::data(format!("run {run_id:?}, table {table}: {e}")))
}

/// The Polars schema of an Arrow table schema (the types rla-pipe's tables use).
fn polars_schema(arrow: &arrow::datatypes::Schema) -> Result<Schema> {
    use arrow::datatypes::DataType as A;
    arrow
        .fields()
        .iter()
        .map(|f| {
            let dt = match f.data_type() {
                A::Utf8 | A::LargeUtf8 | A::Utf8View => DataType::String,
                A::Boolean => DataType::Boolean,
                A::Int8 => DataType::Int8,
                A::Int32 => DataType::Int32,
                A::Int64 => DataType::Int64,
                A::UInt32 => DataType::UInt32,
                A::UInt64 => DataType::UInt64,
                A::Float32 => DataType::Float32,
                A::Float64 => DataType::Float64,
                other => {
                    return Err(Error::data(format!(
                        "column {}: no Polars type for {other}",
                        f.name()
                    )));
                }
            };
            Ok(Field::new(f.name().as_str().into(), dt))
        })
        .collect()
}
