//! Committed files as DataFusion tables: the session every reader and stage queries through
//! (the store registered as an object store, a memory budget), tables over committed Parquet
//! files with their declared schema and sort order, and a cheap size check against manifests.

use std::sync::Arc;

use datafusion::catalog::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext, col};
use object_store::path::Path;

use crate::error::{Error, Result};
use crate::schema::TableDef;
use crate::store::manifest::OutputFile;
use crate::store::{self, Store};

/// A DataFusion session with the store registered under [`store::DATAFUSION_URL`] and a memory
/// budget (operators spill to a temp dir beyond it).
pub fn new_session(
    store: &Store,
    memory_limit_mib: u64,
    partitions: Option<usize>,
) -> Result<SessionContext> {
    // DATAFUSION_* environment variables tune the engine (e.g. DATAFUSION_EXECUTION_TARGET_PARTITIONS);
    // results do not depend on them: the stages' SQL is order-independent.
    let mut config = SessionConfig::from_env()?;
    apply_session_settings(&mut config)?;
    if let Some(n) = partitions {
        config = config.with_target_partitions(n);
    }
    Ok(SessionContext::new_with_config_rt(
        config,
        runtime(store, memory_limit_mib)?,
    ))
}

/// The settings every rla-pipe session has (a worker's too, `crate::cluster::worker`).
pub fn apply_session_settings(config: &mut SessionConfig) -> Result<()> {
    let options = config.options_mut();
    options.catalog.information_schema = true;
    options.execution.parquet.pushdown_filters = true;
    options.set("datafusion.execution.batch_size", "8192")?;
    Ok(())
}

/// The runtime of a session: a memory budget and the store registered under
/// [`store::DATAFUSION_URL`].
pub fn runtime(
    store: &Store,
    memory_limit_mib: u64,
) -> Result<Arc<datafusion::execution::runtime_env::RuntimeEnv>> {
    // A fair pool: operators that can spill (sorts, aggregations) each get a fair share and spill
    // beyond it, so a large iteration finishes within the budget instead of failing.
    let pool =
        datafusion::execution::memory_pool::FairSpillPool::new((memory_limit_mib as usize) << 20);
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(pool))
        .build_arc()?;
    let url = url::Url::parse(store::DATAFUSION_URL).expect("static url");
    runtime.register_object_store(&url, store.object_store());
    Ok(runtime)
}

/// Whether DataFusion is told that a table's files are sorted by the table's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOrder {
    /// Declared: ordered aggregations stream and sorts by the key are skipped.
    Key,
    /// Not declared: DataFusion sorts and groups as over any files. Files written before the
    /// writer checked key order may not be in it (DataFusion 55.2 could drop a stage's final
    /// sort; README, Known problem), and a query must not then return wrong groups or unsorted
    /// `ORDER BY` results.
    Unknown,
}

impl FileOrder {
    /// [`FileOrder::Key`] when the writer checked every one of the files for key order
    /// ([`OutputFile::sorted`]), else [`FileOrder::Unknown`].
    pub fn of<'a>(files: impl IntoIterator<Item = &'a OutputFile>) -> FileOrder {
        if files.into_iter().all(|f| f.sorted) {
            FileOrder::Key
        } else {
            FileOrder::Unknown
        }
    }
}

/// Register a table over committed Parquet files (paths relative to the store root), with the
/// table's declared schema. No files → an empty table with that schema.
///
/// Each file comes with the run whose rows it holds: a branch run's shared iterations are its
/// parent's files, whose `run_id` column says the parent; they are read with `run_id` replaced.
pub fn register_files(
    ctx: &SessionContext,
    store: &Store,
    name: &str,
    def: &TableDef,
    files: &[(String, String)],
    order: FileOrder,
) -> Result<()> {
    // Files whose run_id column is already right (`None`) and those to relabel, per run.
    let mut groups: std::collections::BTreeMap<Option<&str>, Vec<&str>> = Default::default();
    for (path, run) in files {
        let written_by = path.split('/').next().unwrap_or("");
        let relabel = (written_by != run).then_some(run.as_str());
        groups.entry(relabel).or_default().push(path.as_str());
    }
    let provider: Arc<dyn datafusion::catalog::TableProvider> = if files.is_empty() {
        Arc::new(MemTable::try_new(def.schema.clone(), vec![vec![]])?)
    } else if groups.len() == 1 && groups.contains_key(&None) {
        listing(store, def, &groups[&None], order)?
    } else {
        let mut union: Option<datafusion::prelude::DataFrame> = None;
        for (relabel, paths) in &groups {
            let mut df = ctx.read_table(listing(store, def, paths, order)?)?;
            if let Some(run) = relabel {
                let columns = def.schema.fields().iter().map(|f| {
                    if f.name() == "run_id" {
                        datafusion::prelude::lit(*run).alias("run_id")
                    } else {
                        datafusion::prelude::ident(f.name())
                    }
                });
                df = df.select(columns.collect::<Vec<_>>())?;
            }
            union = Some(match union {
                None => df,
                Some(u) => u.union(df)?,
            });
        }
        union.expect("files is not empty").into_view()
    };
    ctx.deregister_table(name)?;
    ctx.register_table(name, provider)?;
    Ok(())
}

/// A listing table over some committed files, with the table's schema and, for
/// [`FileOrder::Key`], its sort order.
fn listing(
    store: &Store,
    def: &TableDef,
    paths: &[&str],
    order: FileOrder,
) -> Result<Arc<dyn datafusion::catalog::TableProvider>> {
    let urls = paths
        .iter()
        .map(|p| ListingTableUrl::parse(store.datafusion_url(p)))
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    // Committed files are meant to be sorted by the table's key: telling DataFusion lets it
    // stream ordered aggregations and skip sorts.
    let key_order = def
        .key
        .iter()
        .map(|k| col(*k).sort(true, false))
        .collect::<Vec<_>>();
    let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
        .with_file_extension(".parquet")
        .with_file_sort_order(match order {
            FileOrder::Key => vec![key_order],
            FileOrder::Unknown => vec![],
        });
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .with_schema(def.schema.clone());
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// The footer of a committed Parquet file (two range reads).
async fn read_footer(
    store: &Store,
    f: &OutputFile,
) -> Result<parquet::file::metadata::ParquetMetaData> {
    use object_store::ObjectStoreExt as _;
    let bad = |e: String| Error::data(format!("committed file {}: {e}", f.path));
    if f.bytes < 12 {
        return Err(bad("too short for Parquet".into()));
    }
    let location = store.location(&Path::from(f.path.as_str()));
    let os = store.object_store();
    let tail = os
        .get_range(&location, f.bytes - 8..f.bytes)
        .await
        .map_err(|e| bad(e.to_string()))?;
    let len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as u64;
    if &tail[4..8] != b"PAR1" || len + 8 > f.bytes {
        return Err(bad("not a Parquet file (footer)".into()));
    }
    let meta = os
        .get_range(&location, f.bytes - 8 - len..f.bytes - 8)
        .await
        .map_err(|e| bad(e.to_string()))?;
    parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&meta)
        .map_err(|e| bad(e.to_string()))
}

/// Check committed files before anything reads them: each still has the size its manifest
/// recorded (one HEAD each: a truncated file is named instead of failing as a Parquet decoding
/// error), and its footer is consistent — the row count its manifest recorded, row groups and
/// column chunks that agree (a forged count would otherwise be answered from the footer, or
/// size an allocation) — and, for files written with another version of `def`'s schema, of
/// readable types ([`check_schema`]).
pub async fn check_files(store: &Store, def: &TableDef, files: &[OutputFile]) -> Result<()> {
    check_sizes(store, files).await?;
    let now = crate::schema::fingerprint(&def.schema);
    // 16 footers at a time (on an object store each is two range requests).
    for chunk in files.chunks(16) {
        futures::future::try_join_all(chunk.iter().map(|f| check_file(store, def, f, &now)))
            .await?;
    }
    Ok(())
}

async fn check_file(store: &Store, def: &TableDef, f: &OutputFile, now: &str) -> Result<()> {
    let md = read_footer(store, f).await?;
    check_row_counts(f, &md)?;
    if f.schema != now && f.rows > 0 {
        let fm = md.file_metadata();
        let schema =
            parquet::arrow::parquet_to_arrow_schema(fm.schema_descr(), fm.key_value_metadata())
                .map_err(|e| Error::data(format!("committed file {}: {e}", f.path)))?;
        check_schema(def, f, &schema)?;
    }
    Ok(())
}

/// A file's footer must agree with its manifest and with itself on how many rows it holds.
pub fn check_row_counts(
    f: &OutputFile,
    md: &parquet::file::metadata::ParquetMetaData,
) -> Result<()> {
    let bad = |why: String| {
        Err(Error::data(format!(
            "committed file {} (table {}): {why}; the file is forged or corrupt",
            f.path, f.table
        )))
    };
    let total = md.file_metadata().num_rows();
    let groups: i64 = md.row_groups().iter().map(|rg| rg.num_rows()).sum();
    if total != groups || u64::try_from(total).ok() != Some(f.rows) {
        return bad(format!(
            "its footer says {total} rows (row groups: {groups}), its manifest {}",
            f.rows
        ));
    }
    for (i, rg) in md.row_groups().iter().enumerate() {
        // rla-pipe's writer caps row groups (a forged count could otherwise make a filtered
        // scan walk 10^12 rows of nothing).
        if rg.num_rows() > crate::store::parquet::ROW_GROUP_ROWS as i64 || rg.num_rows() < 0 {
            return bad(format!(
                "row group {i} says {} rows; rla-pipe writes at most {} rows per row group",
                rg.num_rows(),
                crate::store::parquet::ROW_GROUP_ROWS
            ));
        }
        for c in rg.columns() {
            // A flat column holds one value (or null) per row.
            if c.column_descr().max_rep_level() == 0 && c.num_values() != rg.num_rows() {
                return bad(format!(
                    "row group {i} says {} rows, column `{}` holds {} values",
                    rg.num_rows(),
                    c.column_path(),
                    c.num_values()
                ));
            }
        }
    }
    Ok(())
}

/// A file written with another version of `def`'s schema must be readable as `def`: every
/// column of the file in `def` with the same type (columns `def` added since read as NULL). A
/// changed type is an error naming the table, the column, both types and the run.
fn check_schema(def: &TableDef, f: &OutputFile, schema: &arrow::datatypes::Schema) -> Result<()> {
    let run = f.path.split('/').next().unwrap_or("");
    for field in schema.fields() {
        match def.schema.field_with_name(field.name()) {
            Ok(now) if now.data_type() == field.data_type() => {}
            Ok(now) => {
                return Err(Error::data(format!(
                    "run {run:?}, table {}: column `{}` was written as {} ({}) and is {} in this build; \
                     this build cannot read it",
                    def.name,
                    field.name(),
                    field.data_type(),
                    f.path,
                    now.data_type()
                )));
            }
            Err(_) => {
                return Err(Error::data(format!(
                    "run {run:?}, table {}: column `{}` ({}, in {}) is not in this build's schema",
                    def.name,
                    field.name(),
                    field.data_type(),
                    f.path
                )));
            }
        }
    }
    Ok(())
}

async fn check_sizes(store: &Store, files: &[OutputFile]) -> Result<()> {
    for f in files {
        match store.size(&Path::from(f.path.as_str())).await? {
            None => {
                return Err(Error::data(format!(
                    "committed file {} (table {}) is missing",
                    f.path, f.table
                )));
            }
            Some(n) if n != f.bytes => {
                return Err(Error::data(format!(
                    "committed file {} (table {}) is {n} bytes, its manifest says {}: the file was truncated or altered",
                    f.path, f.table, f.bytes
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}
