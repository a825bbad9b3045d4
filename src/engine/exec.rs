//! Executing a stage: a DataFusion session over committed files in, hashed Parquet out.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext, col};
use futures::StreamExt;
use object_store::path::Path;

use super::{Stage, StageContext, TableOutput};
use crate::error::{Error, Result};
use crate::schema::{self, TableDef};
use crate::store::manifest::OutputFile;
use crate::store::{self, Store, layout};

/// A DataFusion session with the store registered under [`store::DATAFUSION_URL`] and a memory
/// budget (operators spill to a temp dir beyond it).
pub fn new_session(store: &Store, memory_limit_mib: u64) -> Result<SessionContext> {
    // A fair pool: operators that can spill (sorts, aggregations) each get a fair share and spill
    // beyond it, so a large iteration finishes within the budget instead of failing.
    let pool =
        datafusion::execution::memory_pool::FairSpillPool::new((memory_limit_mib as usize) << 20);
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(pool))
        .build_arc()?;
    // DATAFUSION_* environment variables tune the engine (e.g. DATAFUSION_EXECUTION_TARGET_PARTITIONS);
    // results do not depend on them: the stages' SQL is order-independent.
    let config = SessionConfig::from_env()?
        .with_information_schema(true)
        .with_batch_size(8192)
        .set_bool("datafusion.execution.parquet.pushdown_filters", true);
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    let url = url::Url::parse(store::DATAFUSION_URL).expect("static url");
    ctx.register_object_store(&url, store.object_store());
    Ok(ctx)
}

/// Register a table over committed Parquet files (paths relative to the store root), with the
/// table's declared schema. No files → an empty table with that schema.
pub fn register_files(ctx: &SessionContext, def: &TableDef, files: &[String]) -> Result<()> {
    let provider: Arc<dyn datafusion::catalog::TableProvider> = if files.is_empty() {
        Arc::new(MemTable::try_new(def.schema.clone(), vec![vec![]])?)
    } else {
        let urls = files
            .iter()
            .map(|p| ListingTableUrl::parse(format!("{}{p}", store::DATAFUSION_URL)))
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
    ctx.deregister_table(def.name)?;
    ctx.register_table(def.name, provider)?;
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

/// Where a stage's outputs go.
pub enum Sink<'a> {
    /// Write `<run>/data/<table>/iter=<N>/<attempt>.parquet` to the store.
    Store {
        store: &'a Store,
        run_id: &'a str,
        iter: u32,
        attempt: &'a str,
    },
    /// Only hash (replay).
    HashOnly,
}

/// Run a stage and write every output table through the sink. Returns the output files in the
/// order the stage declares its outputs.
pub async fn execute(
    stage: &dyn Stage,
    ctx: &StageContext,
    sink: &Sink<'_>,
    on_rows: &(dyn Fn(&str, u64) + Sync),
) -> Result<Vec<OutputFile>> {
    let mut produced = stage.run(ctx).await?;
    let mut writes = Vec::new();
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
        let (_, out) = produced.swap_remove(pos);
        let def = schema::table_def(table).expect("validated by Dag::new");
        let stream = into_sorted_stream(stage.name(), &def, out).await?;
        writes.push(async move { write_table(stage.name(), &def, stream, sink, on_rows).await });
    }
    if let Some((t, _)) = produced.first() {
        return Err(Error::data(format!(
            "stage {} produced undeclared table {t}",
            stage.name()
        )));
    }
    // All output tables of a stage are computed and written concurrently.
    futures::future::try_join_all(writes).await
}

/// Drive a stream on its own task and hand its batches over a small channel, so that producing
/// batches (e.g. the final merge of a sort) and encoding Parquet overlap.
fn drain_in_background(
    stream: SendableRecordBatchStream,
) -> tokio::sync::mpsc::Receiver<datafusion::error::Result<RecordBatch>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut stream = stream;
        while let Some(batch) = stream.next().await {
            if tx.send(batch).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// The declared type a computed column is stored as (`Utf8View` → `Utf8`).
fn storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8View => DataType::Utf8,
        other => other.clone(),
    }
}

/// Cast computed columns to their declared storage types.
fn to_storage(schema: &SchemaRef, columns: &[ArrayRef]) -> Result<Vec<ArrayRef>> {
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

async fn into_sorted_stream(
    stage: &str,
    def: &TableDef,
    out: TableOutput,
) -> Result<SendableRecordBatchStream> {
    match out {
        TableOutput::Frame(df) => {
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            check_schema(stage, def, &schema)?;
            let sort = def
                .key
                .iter()
                .map(|k| col(*k).sort(true, false))
                .collect::<Vec<_>>();
            Ok(df.sort(sort)?.execute_stream().await?)
        }
        TableOutput::Sorted(stream) => {
            check_schema(stage, def, &stream.schema())?;
            Ok(stream)
        }
    }
}

async fn write_table(
    stage: &str,
    def: &TableDef,
    stream: SendableRecordBatchStream,
    sink: &Sink<'_>,
    on_rows: &(dyn Fn(&str, u64) + Sync),
) -> Result<OutputFile> {
    let path = match sink {
        Sink::Store {
            run_id,
            iter,
            attempt,
            ..
        } => layout::data_file(run_id, def.name, *iter, attempt).to_string(),
        Sink::HashOnly => String::new(),
    };
    let object_writer = match sink {
        Sink::Store { store, .. } => Some(object_store::buffered::BufWriter::new(
            store.object_store(),
            Path::from(path.as_str()),
        )),
        Sink::HashOnly => None,
    };
    let mut writer = store::parquet::writer(object_writer, def.schema.clone())?;
    let mut rows = 0u64;
    let mut batches = drain_in_background(stream);
    while let Some(batch) = batches.recv().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        // Re-label with the declared schema (field nullability included): a null in a column the
        // schema declares non-nullable fails here, naming the table.
        let batch = RecordBatch::try_new(
            def.schema.clone(),
            to_storage(&def.schema, batch.columns())?,
        )
        .map_err(|e| {
            Error::data(format!(
                "stage {stage}: table {} does not fit schemas/{}.md: {e}",
                def.name, def.name
            ))
        })?;
        rows += batch.num_rows() as u64;
        writer.write(&batch).await?;
        on_rows(def.name, rows);
    }
    writer.finish().await?;
    let (bytes, digest) = writer.into_inner().finish();
    Ok(OutputFile {
        table: def.name.to_string(),
        path,
        bytes,
        rows,
        digest,
    })
}
