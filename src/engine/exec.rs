//! Executing a stage: a DataFusion session over committed files in, hashed Parquet out.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::BatchCoalescer;
use arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use super::compute::{
    CHUNK_CONCURRENCY, Range, SortBy, into_sorted_stream, plan_ranges, range_session, run_outputs,
    sorted_plan, to_storage,
};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::schema::{self, TableDef};
use crate::stage::{InputFiles, Stage, StageContext, TableOutput};
use crate::store::manifest::OutputFile;
use crate::store::{self, Store, layout};

/// Where a stage's outputs go.
#[derive(Clone)]
pub enum Sink {
    /// Write `<run>/data/<table>/iter=<N>/<attempt>.parquet` to the store.
    Store {
        store: Store,
        run_id: String,
        iter: u32,
        attempt: String,
    },
    /// Only hash (replay). A table named in `as_written` is encoded with that schema — the one
    /// its committed file was written with by an earlier build: columns added since are left
    /// out, so the replayed bytes compare with the committed ones.
    HashOnly {
        as_written: std::collections::BTreeMap<String, arrow::datatypes::SchemaRef>,
    },
}

/// Rows per batch handed to the Parquet writer. Batches are re-cut to exactly this size so the
/// bytes of a file depend only on its rows, not on how execution happened to batch them.
pub const WRITE_BATCH_ROWS: usize = 8192;

/// A stage's cluster: its workers, and the checkpoints the stage's shards read
/// ([`Stage::shard_column`]).
pub struct OnCluster<'a> {
    pub cluster: &'a Cluster,
    pub checkpoints: Vec<super::shard::ShardCheckpoint>,
}

/// Run a stage and write every output table through the sink. Returns the output files in the
/// order the stage declares its outputs, and the seconds the writers spent encoding, hashing
/// and uploading them (summed over the tables).
///
/// A stage with a [`Stage::partition_column`] whose inputs are committed files runs range by
/// range over that column (contiguous ranges of ~`run.chunk_rows` input rows, two at a time, one
/// thread each), and its ranges' outputs are concatenated in order. Memory is bounded by the range
/// size, not the iteration size, and no global sort is needed since every file is sorted by key.
/// Other stages run as one query per output, all outputs at once.
///
/// With a `cluster`, such a stage's ranges run on its workers instead (each range whole on one
/// worker, [`Cluster::run_tasks`]), and so does a stage with a [`Stage::shard_column`] (one
/// shard per worker, [`super::shard`]), with the same outputs byte for byte.
pub async fn execute(
    stage: Arc<dyn Stage>,
    ctx: &StageContext,
    sink: &Sink,
    cluster: Option<&OnCluster<'_>>,
    on_rows: &(dyn Fn(&str, u64) + Sync),
) -> Result<(Vec<OutputFile>, f64)> {
    // One writer task per output table: tables are encoded in parallel, and encoding overlaps
    // with computing the next batches.
    let mut senders = Vec::new();
    let mut writers = Vec::new();
    for table in stage.outputs() {
        let mut writer = TableWriter::new(stage.name(), table, sink)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(8);
        senders.push((*table, tx));
        writers.push(tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                writer.push(batch).await?;
            }
            writer.finish().await
        }));
    }
    let fed = feed(stage.clone(), ctx, &senders, cluster, on_rows).await;
    drop(senders);
    if let Err(e) = fed {
        // A writer that failed (e.g. a null in a non-nullable column) closed its channel: its
        // error is the one to report. Other uploads of partial files are not completed.
        let (done, running): (Vec<_>, Vec<_>) = writers.into_iter().partition(|w| w.is_finished());
        running.iter().for_each(|w| w.abort());
        for w in done {
            if let Ok(Err(writer_error)) = w.await {
                return Err(writer_error);
            }
        }
        return Err(e);
    }
    let mut files = Vec::new();
    let mut busy = 0.0;
    for w in writers {
        let (file, seconds) = w.await.map_err(|e| {
            Error::data(format!("stage {}: writer task failed: {e}", stage.name()))
        })??;
        files.push(file);
        busy += seconds;
    }
    Ok((files, busy))
}

/// Compute the stage's outputs and send each table's batches, in key order, to its writer.
async fn feed(
    stage: Arc<dyn Stage>,
    ctx: &StageContext,
    senders: &[(&'static str, tokio::sync::mpsc::Sender<RecordBatch>)],
    on: Option<&OnCluster<'_>>,
    on_rows: &(dyn Fn(&str, u64) + Sync),
) -> Result<()> {
    let closed = || Error::data(format!("stage {}: a writer stopped early", stage.name()));
    let mut rows = vec![0u64; senders.len()];
    match (stage.partition_column(), &ctx.inputs) {
        (None, Some(inputs)) if on.is_some() && stage.shard_column(&ctx.config).is_some() => {
            let on = on.expect("matched");
            let column = stage.shard_column(&ctx.config).expect("matched");
            let workers = on.cluster.urls().len();
            let shards =
                super::shard::plan(&stage, ctx, inputs, column, &on.checkpoints, workers).await?;
            let state = ctx.session.state();
            let mut stream = on.cluster.run_tasks(
                shards,
                state.config().clone(),
                state.runtime_env().clone(),
                workers,
                Arc::new(|_, batches| Ok(batches)),
            )?;
            let defs = super::shard::output_defs(stage.as_ref());
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| on_cluster(stage.name(), e.into()))?;
                for (t, part) in super::shard::demux(&defs, &batch)? {
                    rows[t] += part.num_rows() as u64;
                    senders[t].1.send(part).await.map_err(|_| closed())?;
                    on_rows(senders[t].0, rows[t]);
                }
            }
        }
        (Some(column), Some(inputs)) if on.is_some() => {
            let cluster = on.expect("matched").cluster;
            let ranges = plan_ranges(ctx, inputs, column).await?;
            let runner = RangeRunner::new(ctx, inputs, column);
            // Every range's plan, per output table, planned here as a single node plans it.
            let mut plans: Vec<(TableDef, Vec<Arc<dyn ExecutionPlan>>)> = Vec::new();
            for range in &ranges {
                for (i, (def, out)) in runner
                    .outputs(stage.as_ref(), range)
                    .await?
                    .into_iter()
                    .enumerate()
                {
                    let TableOutput::Frame(df) = out else {
                        return Err(Error::data(format!(
                            "stage {}: table {} is computed in this process (a stream, not a \
                             plan) and cannot run on a cluster",
                            stage.name(),
                            def.name
                        )));
                    };
                    let plan = sorted_plan(stage.name(), &def, df).await?;
                    match plans.get_mut(i) {
                        Some((_, ps)) => ps.push(plan),
                        None => plans.push((def, vec![plan])),
                    }
                }
            }
            let state = ctx.session.state();
            let lookahead = CHUNK_CONCURRENCY * cluster.urls().len();
            let mut forwards = Vec::new();
            for (i, (def, table_plans)) in plans.into_iter().enumerate() {
                let finish: crate::cluster::Finish =
                    Arc::new(move |_, batches| super::sort::in_key_order(&def, batches));
                let stream = cluster.run_tasks(
                    table_plans,
                    state.config().clone(),
                    state.runtime_env().clone(),
                    lookahead,
                    finish,
                )?;
                let name = stage.name();
                forwards.push(forward(stream, &senders[i], on_rows, &closed, move |e| {
                    on_cluster(name, e)
                }));
            }
            futures::future::try_join_all(forwards).await?;
        }
        (Some(column), Some(inputs)) => {
            let ranges = plan_ranges(ctx, inputs, column).await?;
            let runner = RangeRunner::new(ctx, inputs, column);
            let chunks = futures::stream::iter(ranges.into_iter().map(|range| {
                let (stage, runner) = (stage.clone(), runner.clone());
                tokio::spawn(async move {
                    let mut collected = Vec::new();
                    for (def, out) in runner.outputs(stage.as_ref(), &range).await? {
                        // DataFusion sorts the range's rows (or takes them for sorted), and
                        // the engine sorts them again only if they are not in key order: a
                        // check is cheaper than a sort of rows that already are.
                        let stream =
                            into_sorted_stream(stage.name(), &def, out, SortBy::DataFusion).await?;
                        use futures::TryStreamExt;
                        let batches = stream.try_collect::<Vec<_>>().await?;
                        collected.push(super::sort::in_key_order(&def, batches)?);
                    }
                    Ok::<_, Error>(collected)
                })
            }))
            .buffered(CHUNK_CONCURRENCY);
            futures::pin_mut!(chunks);
            while let Some(joined) = chunks.next().await {
                let tables = joined.map_err(|e| {
                    Error::data(format!("stage {} task failed: {e}", stage.name()))
                })??;
                for (i, batches) in tables.into_iter().enumerate() {
                    for batch in batches {
                        rows[i] += batch.num_rows() as u64;
                        senders[i].1.send(batch).await.map_err(|_| closed())?;
                    }
                    on_rows(senders[i].0, rows[i]);
                }
            }
        }
        _ => {
            let mut forwards = Vec::new();
            for (i, (def, out)) in run_outputs(stage.as_ref(), ctx)
                .await?
                .into_iter()
                .enumerate()
            {
                let stream = into_sorted_stream(stage.name(), &def, out, SortBy::Engine).await?;
                forwards.push(forward(stream, &senders[i], on_rows, &closed, |e| e));
            }
            futures::future::try_join_all(forwards).await?;
        }
    }
    Ok(())
}

/// Send a table's batches to its writer (`closed`: the error when the writer stopped), reporting
/// the rows sent so far; `on_error` shapes a failed batch's error.
async fn forward(
    mut stream: SendableRecordBatchStream,
    (table, tx): &(&'static str, tokio::sync::mpsc::Sender<RecordBatch>),
    on_rows: &(dyn Fn(&str, u64) + Sync),
    closed: &(dyn Fn() -> Error + Sync),
    on_error: impl Fn(Error) -> Error,
) -> Result<()> {
    let mut n = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| on_error(e.into()))?;
        n += batch.num_rows() as u64;
        tx.send(batch).await.map_err(|_| closed())?;
        on_rows(table, n);
    }
    Ok(())
}

/// An error of a stage running on a cluster: one that came from a worker is a cluster error
/// naming the stage, and saying what to do.
fn on_cluster(stage: &str, e: Error) -> Error {
    let text = match e {
        Error::Cluster(text) => text,
        other if other.to_string().contains("worker http://") => other.to_string(),
        other => return other,
    };
    Error::Cluster(format!(
        "stage {stage}: {text}; nothing of the stage is committed: run the same command again \
         (with the worker back, or another in its place) to resume"
    ))
}

/// What running a partitioned stage over one range of its partition column needs (cloned into
/// each range's task).
#[derive(Clone)]
struct RangeRunner {
    inputs: Arc<InputFiles>,
    run_id: String,
    iter: u32,
    seed: u64,
    config: Arc<crate::config::Config>,
    column: &'static str,
}

impl RangeRunner {
    fn new(ctx: &StageContext, inputs: &Arc<InputFiles>, column: &'static str) -> RangeRunner {
        RangeRunner {
            inputs: inputs.clone(),
            run_id: ctx.run_id.clone(),
            iter: ctx.iter,
            seed: ctx.seed,
            config: ctx.config.clone(),
            column,
        }
    }

    /// The stage's outputs over the rows of `range` (a one-thread session of their own), in
    /// declared order.
    async fn outputs(
        &self,
        stage: &dyn Stage,
        range: &Range,
    ) -> Result<Vec<(TableDef, TableOutput)>> {
        let session = range_session(&self.inputs, &self.run_id, self.column, range).await?;
        let chunk = StageContext::detached(
            self.run_id.clone(),
            self.iter,
            self.seed,
            self.config.clone(),
            session,
        );
        run_outputs(stage, &chunk).await
    }
}

/// The rows and blake3 digest of a committed data file re-encoded with its rows in key order,
/// as this build's writer would write them (same schema, batches, writer settings). For
/// replaying a file an earlier build wrote before key order was checked: equal to the replayed
/// digest when the file holds exactly the replayed rows.
pub async fn digest_in_key_order(def: &TableDef, file: bytes::Bytes) -> Result<(u64, String)> {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
        .with_batch_size(WRITE_BATCH_ROWS)
        .build()?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    let written = TableDef {
        schema: schema.clone(),
        ..def.clone()
    };
    let mut encoder = Encoder::new(None, schema)?;
    let mut rows = 0;
    for b in super::sort::in_key_order(&written, batches)? {
        rows += b.num_rows() as u64;
        encoder.push(b).await?;
    }
    Ok((rows, encoder.finish().await?.1))
}

/// Rows and blake3 of a committed file without the columns `drop`, encoded as this build's
/// writer encodes them: what a replay that leaves those (wall-clock) columns out produces when
/// the other columns are equal.
pub async fn digest_without(file: bytes::Bytes, drop: &[&str]) -> Result<(u64, String)> {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
        .with_batch_size(WRITE_BATCH_ROWS)
        .build()?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|i| !drop.contains(&schema.field(*i).name().as_str()))
        .collect();
    let mut encoder = Encoder::new(None, Arc::new(schema.project(&keep)?))?;
    let mut rows = 0;
    for b in reader {
        let b = b?.project(&keep)?;
        rows += b.num_rows() as u64;
        encoder.push(b).await?;
    }
    Ok((rows, encoder.finish().await?.1))
}

/// Batches re-cut to exactly [`WRITE_BATCH_ROWS`] rows into the deterministic Parquet writer,
/// which hashes (and uploads, given a sink) every byte: the bytes depend only on the rows.
struct Encoder {
    writer: parquet::arrow::AsyncArrowWriter<store::parquet::HashingWriter>,
    coalescer: BatchCoalescer,
    /// Time spent in the Parquet writer: encoding, hashing, uploading.
    busy: std::time::Duration,
}

impl Encoder {
    fn new(sink: Option<object_store::buffered::BufWriter>, schema: SchemaRef) -> Result<Encoder> {
        Ok(Encoder {
            writer: store::parquet::writer(sink, schema.clone())?,
            coalescer: BatchCoalescer::new(schema, WRITE_BATCH_ROWS),
            busy: std::time::Duration::ZERO,
        })
    }

    async fn push(&mut self, batch: RecordBatch) -> Result<()> {
        self.coalescer.push_batch(batch)?;
        self.write_completed().await
    }

    /// Hand the coalescer's full batches to the Parquet writer.
    async fn write_completed(&mut self) -> Result<()> {
        let t0 = std::time::Instant::now();
        while let Some(b) = self.coalescer.next_completed_batch() {
            self.writer.write(&b).await?;
        }
        self.busy += t0.elapsed();
        Ok(())
    }

    /// Flush and close: (bytes written, blake3 hex digest, busy seconds).
    async fn finish(mut self) -> Result<(u64, String, f64)> {
        self.coalescer.finish_buffered_batch()?;
        self.write_completed().await?;
        let t0 = std::time::Instant::now();
        self.writer.finish().await?;
        self.busy += t0.elapsed();
        let (bytes, digest) = self.writer.into_inner().finish();
        Ok((bytes, digest, self.busy.as_secs_f64()))
    }
}

/// One output table being written: schema conformance, key order, then the [`Encoder`].
struct TableWriter {
    stage: String,
    def: TableDef,
    path: String,
    encoder: Encoder,
    rows: u64,
    /// Replay of a file written by an earlier build: its schema and this build's column
    /// indices that make it up.
    written: Option<(arrow::datatypes::SchemaRef, Vec<usize>)>,
    /// Checks that rows come in key order.
    order: super::sort::KeyOrderCheck,
}

impl TableWriter {
    fn new(stage: &str, table: &str, sink: &Sink) -> Result<TableWriter> {
        let def = schema::table_def(table).expect("validated by Dag::new");
        let (path, object_writer) = match sink {
            Sink::Store {
                store,
                run_id,
                iter,
                attempt,
            } => {
                let path = layout::data_file(run_id, def.name, *iter, attempt);
                let w = object_store::buffered::BufWriter::new(
                    store.object_store(),
                    store.location(&path),
                );
                (path.to_string(), Some(w))
            }
            Sink::HashOnly { .. } => (String::new(), None),
        };
        // The schema the file is encoded with, and which of this build's columns go into it.
        let (schema, keep) = match sink {
            Sink::HashOnly { as_written } => match as_written.get(table) {
                Some(old)
                    if old.fields().len() != def.schema.fields().len()
                        || old.fields().iter().zip(def.schema.fields()).any(|(a, b)| {
                            a.name() != b.name() || a.data_type() != b.data_type()
                        }) =>
                {
                    let keep = old
                        .fields()
                        .iter()
                        .map(|f| match def.schema.index_of(f.name()) {
                            Ok(i) if def.schema.field(i).data_type() == f.data_type() => Ok(i),
                            Ok(i) => Err(Error::Mismatch(format!(
                                "table {table}: column `{}` was written as {} and is {} in this build",
                                f.name(),
                                f.data_type(),
                                def.schema.field(i).data_type()
                            ))),
                            Err(_) => Err(Error::Mismatch(format!(
                                "table {table}: column `{}` of the committed file is not in this build's schema",
                                f.name()
                            ))),
                        })
                        .collect::<Result<Vec<usize>>>()?;
                    (Arc::new(def.schema.project(&keep)?), Some(keep))
                }
                _ => (def.schema.clone(), None),
            },
            Sink::Store { .. } => (def.schema.clone(), None),
        };
        Ok(TableWriter {
            order: super::sort::KeyOrderCheck::new(&def)?,
            encoder: Encoder::new(object_writer, schema.clone())?,
            stage: stage.to_string(),
            def,
            path,
            rows: 0,
            written: keep.map(|k| (schema, k)),
        })
    }

    async fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        // Re-label with the declared schema (field nullability included): a null in a column the
        // schema declares non-nullable fails here, naming the table.
        let batch = RecordBatch::try_new(
            self.def.schema.clone(),
            to_storage(&self.def.schema, batch.columns())?,
        )
        .map_err(|e| {
            Error::data(format!(
                "stage {}: table {} does not fit schemas/{}.md: {e}",
                self.stage, self.def.name, self.def.name
            ))
        })?;
        if let Err(i) = self.order.check(&batch)? {
            let key = self
                .def
                .key
                .iter()
                .map(|k| {
                    let c = batch.column_by_name(k).expect("key column");
                    let v = arrow::util::display::array_value_to_string(c, i)
                        .unwrap_or_else(|_| "?".into());
                    format!("{k}={v}")
                })
                .collect::<Vec<_>>();
            return Err(Error::data(format!(
                "stage {}: table {}: row {} ({}) is not in key order ({}): it sorts before the \
                 row written before it; nothing is committed (a bug: please report it)",
                self.stage,
                self.def.name,
                self.order.rows + i as u64,
                key.join(", "),
                self.def.key.join(", ")
            )));
        }
        let batch = match &self.written {
            Some((schema, keep)) => RecordBatch::try_new(
                schema.clone(),
                keep.iter().map(|i| batch.column(*i).clone()).collect(),
            )?,
            None => batch,
        };
        self.rows += batch.num_rows() as u64;
        self.encoder.push(batch).await
    }

    /// Flush and close the file: its manifest entry and the writer's busy seconds.
    async fn finish(self) -> Result<(OutputFile, f64)> {
        let (bytes, digest, busy) = self.encoder.finish().await?;
        let written = match &self.written {
            Some((schema, _)) => schema.clone(),
            None => self.def.schema.clone(),
        };
        let file = OutputFile {
            table: self.def.name.to_string(),
            path: self.path,
            bytes,
            rows: self.rows,
            digest,
            schema: schema::fingerprint(&written),
            sorted: true,
        };
        Ok((file, busy))
    }
}
