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
    // A fair pool: operators that can spill (sorts, aggregations) each get a fair share and spill
    // beyond it, so a large iteration finishes within the budget instead of failing.
    let pool =
        datafusion::execution::memory_pool::FairSpillPool::new((memory_limit_mib as usize) << 20);
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(pool))
        .build_arc()?;
    // DATAFUSION_* environment variables tune the engine (e.g. DATAFUSION_EXECUTION_TARGET_PARTITIONS);
    // results do not depend on them: the stages' SQL is order-independent.
    let mut config = SessionConfig::from_env()?
        .with_information_schema(true)
        .with_batch_size(8192)
        .set_bool("datafusion.execution.parquet.pushdown_filters", true);
    if let Some(n) = partitions {
        config = config.with_target_partitions(n);
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    let url = url::Url::parse(store::DATAFUSION_URL).expect("static url");
    ctx.register_object_store(&url, store.object_store());
    Ok(ctx)
}

/// Register a table over committed Parquet files (paths relative to the store root), with the
/// table's declared schema. No files → an empty table with that schema.
pub fn register_files(
    ctx: &SessionContext,
    store: &Store,
    name: &str,
    def: &TableDef,
    files: &[String],
) -> Result<()> {
    let provider: Arc<dyn datafusion::catalog::TableProvider> = if files.is_empty() {
        Arc::new(MemTable::try_new(def.schema.clone(), vec![vec![]])?)
    } else {
        let urls = files
            .iter()
            .map(|p| ListingTableUrl::parse(store.datafusion_url(p)))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        // Every committed file is sorted by the table's key: telling DataFusion lets it stream
        // ordered aggregations and skip sorts.
        let order = def
            .key
            .iter()
            .map(|k| col(*k).sort(true, false))
            .collect::<Vec<_>>();
        let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
            .with_file_extension(".parquet")
            .with_file_sort_order(vec![order]);
        let config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(options)
            .with_schema(def.schema.clone());
        Arc::new(ListingTable::try_new(config)?)
    };
    ctx.deregister_table(name)?;
    ctx.register_table(name, provider)?;
    Ok(())
}

/// Check that committed files still have the size their manifest recorded (cheap: one HEAD each),
/// so a truncated file is reported by name instead of as a Parquet decoding error.
pub async fn check_sizes(store: &Store, files: &[OutputFile]) -> Result<()> {
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
