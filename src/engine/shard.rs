//! Model stages on a cluster. A stage with a [`Stage::shard_column`] for the run's config
//! (`rollout`, `rm_score`, where their numbers are exact in any batch) runs as one shard per
//! worker: contiguous ranges of the column's values, each a
//! [`StageShardExec`] — an execution plan of its own that the cluster's workers decode with
//! [`StageCodec`] and run whole. A shard carries what a worker needs to run the stage exactly
//! as this process would: the resolved config, the stage seed, the committed input files (read
//! by the worker from the store, only the shard's rows), and the checkpoints by content address
//! (read from the store, blake3 checked). Its rows come back as one stream whose schema holds
//! every output table's columns ([`mux_schema`]); the engine splits them by table and writes
//! them exactly as a single node does.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use super::checkpoints::read_checked;
use super::compute::{
    Range, SortBy, into_sorted_stream, range_session, run_outputs, split_ranges, to_storage,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::schema::{self, TableDef};
use crate::stage::{InputFiles, Stage, StageContext};
use crate::store::manifest::{self, InputKind, InputRef, OutputFile};
use crate::store::{Store, layout};

/// A checkpoint a shard reads: its name (`policy`, `rm`), where it lies in the store and its
/// blake3 digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardCheckpoint {
    pub name: String,
    pub path: String,
    pub digest: String,
}

impl ShardCheckpoint {
    /// Where a worker finds checkpoint input `r` of a stage (its `bytes`, digest already
    /// checked by the engine): a committed artifact where it lies; an initial checkpoint, built
    /// in this process, stored content-addressed under the run's artifacts of `iter` first —
    /// the path the iteration's own artifacts use, which `rla-pipe gc` removes once no manifest
    /// names it. A file already there that does not hold the bytes its name promises
    /// (corrupted) is replaced.
    pub async fn stored(
        store: &Store,
        run_id: &str,
        iter: u32,
        r: &InputRef,
        bytes: &bytes::Bytes,
    ) -> Result<ShardCheckpoint> {
        let name = r.tables.first().map(String::as_str).unwrap_or("?");
        let path = match r.kind {
            InputKind::Artifact => r.path.clone(),
            InputKind::Init => {
                let at = layout::artifact(run_id, iter, name, &r.digest);
                match store.put_if_absent(&at, bytes.clone()).await {
                    Ok(()) => {}
                    Err(Error::CommitConflict(_)) => {
                        let there = store.get(&at).await?;
                        if manifest::digest(&there) != r.digest {
                            tracing::warn!(path = %at, "a stored checkpoint does not hold the bytes its name promises; replacing it");
                            store.delete(&at).await?;
                            store.put_if_absent(&at, bytes.clone()).await?;
                        }
                    }
                    Err(e) => return Err(e),
                }
                at.to_string()
            }
            InputKind::Manifest => {
                return Err(Error::data(format!(
                    "checkpoint {name}: its input record names a manifest, not a checkpoint"
                )));
            }
        };
        Ok(ShardCheckpoint {
            name: name.to_string(),
            path,
            digest: r.digest.clone(),
        })
    }

    /// The checkpoint's bytes, read from `store` and checked against its digest.
    async fn read(&self, store: &Store) -> Result<bytes::Bytes> {
        let whose = "the coordinator sent";
        read_checked(store, &self.name, &self.path, &self.digest, whose).await
    }
}

/// One shard of a stage: everything a worker needs to run it (the encoded plan node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardTask {
    stage: String,
    run_id: String,
    iter: u32,
    seed: u64,
    /// The resolved config, as canonical JSON.
    config: serde_json::Value,
    memory_limit_mib: u64,
    /// The stage's committed input files, per table.
    inputs: Vec<(String, Vec<OutputFile>)>,
    column: String,
    range: Range,
    checkpoints: Vec<ShardCheckpoint>,
    /// The environment assets the run has committed (TextWorld's games), installed by the stage
    /// before it plays.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    assets: Vec<crate::stage::AssetRef>,
}

/// The stage a shard names, for a config: the pipeline registry's (the worker's) or the DAG's
/// (the coordinator's).
pub type StageResolver = Arc<dyn Fn(&Config, &str) -> Result<Arc<dyn Stage>> + Send + Sync>;

/// One shard of a model stage as an execution plan: one partition of [`mux_schema`] rows.
pub struct StageShardExec {
    task: ShardTask,
    config: Arc<Config>,
    stage: Arc<dyn Stage>,
    /// The store of the process that runs it.
    store: Store,
    properties: Arc<PlanProperties>,
}

impl StageShardExec {
    fn new(
        task: ShardTask,
        config: Arc<Config>,
        stage: Arc<dyn Stage>,
        store: Store,
    ) -> StageShardExec {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(mux_schema(&output_defs(stage.as_ref()))),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        StageShardExec {
            task,
            config,
            stage,
            store,
            properties: Arc::new(properties),
        }
    }

    fn range_text(&self) -> String {
        let (lo, hi) = (&self.task.range.lo, &self.task.range.hi);
        format!(
            "{} in [{}, {})",
            self.task.column,
            lo.as_deref().unwrap_or("-∞"),
            hi.as_deref().unwrap_or("∞")
        )
    }
}

impl fmt::Debug for StageShardExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StageShardExec({} iter {}, {})",
            self.task.stage,
            self.task.iter,
            self.range_text()
        )
    }
}

impl DisplayAs for StageShardExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "StageShardExec: stage={} iter={} {}",
            self.task.stage,
            self.task.iter,
            self.range_text()
        )
    }
}

impl ExecutionPlan for StageShardExec {
    fn name(&self) -> &'static str {
        "StageShardExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    /// Runs the stage over the shard's rows on a thread of its own (a model stage computes for
    /// long: the process's async threads keep serving, e.g. the cluster's keep-alives).
    fn execute(
        &self,
        partition: usize,
        _: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "StageShardExec has one partition, not {}",
                partition + 1
            )));
        }
        tracing::info!(stage = %self.task.stage, iter = self.task.iter, shard = %self.range_text(), "running a shard");
        let (task, config, stage, store) = (
            self.task.clone(),
            self.config.clone(),
            self.stage.clone(),
            self.store.clone(),
        );
        let shard = async move {
            let handle = tokio::runtime::Handle::current();
            let ran = tokio::task::spawn_blocking(move || {
                handle.block_on(run_shard(&task, config, stage, &store))
            })
            .await
            .map_err(|e| Error::data(format!("a shard's thread failed: {e}")));
            ran.and_then(|r| r)
                .map_err(|e| DataFusionError::External(Box::new(e)))
        };
        let rows = futures::stream::once(shard)
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), rows)))
    }
}

/// Run one shard: the stage over the rows of its range, every output sorted by key (as a single
/// node sorts it) and cast to its storage types, as [`mux_schema`] rows.
async fn run_shard(
    task: &ShardTask,
    config: Arc<Config>,
    stage: Arc<dyn Stage>,
    store: &Store,
) -> Result<Vec<RecordBatch>> {
    let tables = task
        .inputs
        .iter()
        .map(|(name, files)| {
            let def = schema::table_def(name)
                .ok_or_else(|| Error::data(format!("shard input: unknown table {name}")))?;
            Ok((def, files.clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    let inputs = InputFiles {
        store: store.clone(),
        memory_limit_mib: task.memory_limit_mib,
        tables,
    };
    let session = range_session(&inputs, &task.run_id, &task.column, &task.range).await?;
    let mut ctx =
        StageContext::detached(task.run_id.clone(), task.iter, task.seed, config, session);
    for c in &task.checkpoints {
        ctx.checkpoints.insert(
            c.name.clone(),
            crate::stage::CheckpointInput::Bytes(c.read(store).await?),
        );
    }
    if !task.assets.is_empty() {
        ctx.assets = Some(Arc::new(crate::stage::Assets {
            store: store.clone(),
            files: task
                .assets
                .iter()
                .map(|a| (a.id.clone(), a.clone()))
                .collect(),
            // A shard stores nothing: every asset counts as committed.
            before: task.assets.iter().map(|a| a.id.clone()).collect(),
        }));
    }
    let outputs = run_outputs(stage.as_ref(), &ctx).await?;
    if !ctx.artifacts.lock().expect("artifact list").is_empty() {
        return Err(Error::data(format!(
            "stage {} wrote a checkpoint in a shard; a stage that writes checkpoints cannot run \
             on a cluster",
            stage.name()
        )));
    }
    let defs: Vec<TableDef> = outputs.iter().map(|(d, _)| d.clone()).collect();
    let schema = mux_schema(&defs);
    let mut out = Vec::new();
    for (t, (def, output)) in outputs.into_iter().enumerate() {
        let stream = into_sorted_stream(stage.name(), &def, output, SortBy::Engine).await?;
        let batches: Vec<RecordBatch> = stream.try_collect().await?;
        for b in batches.iter().filter(|b| b.num_rows() > 0) {
            out.push(mux(&schema, &defs, t, b)?);
        }
    }
    Ok(out)
}

/// The declared output tables of a stage, in order.
pub(super) fn output_defs(stage: &dyn Stage) -> Vec<TableDef> {
    stage
        .outputs()
        .iter()
        .map(|t| schema::table_def(t).expect("validated by Dag::new"))
        .collect()
}

/// One schema for every output table of a stage: `table` (the table's index among the stage's
/// outputs), then each table's columns as `<table>.<column>`, nullable (a row holds one table's
/// columns; the others are null).
pub(super) fn mux_schema(defs: &[TableDef]) -> SchemaRef {
    let mut fields = vec![Field::new("table", DataType::UInt32, false)];
    for d in defs {
        for f in d.schema.fields() {
            fields.push(Field::new(
                format!("{}.{}", d.name, f.name()),
                f.data_type().clone(),
                true,
            ));
        }
    }
    Arc::new(Schema::new(fields))
}

/// Table `t`'s rows as [`mux_schema`] rows.
fn mux(
    schema: &SchemaRef,
    defs: &[TableDef],
    t: usize,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt32Array::from(vec![t as u32; n]))];
    for (i, d) in defs.iter().enumerate() {
        if i == t {
            columns.extend(to_storage(&d.schema, batch.columns())?);
        } else {
            columns.extend(
                d.schema
                    .fields()
                    .iter()
                    .map(|f| new_null_array(f.data_type(), n)),
            );
        }
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// [`mux_schema`] rows split by table: (table index, its rows with its declared schema).
pub(super) fn demux(defs: &[TableDef], batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
    let tags = batch
        .column(0)
        .as_any()
        .downcast_ref::<UInt32Array>()
        .ok_or_else(|| Error::data("a shard's rows have no `table` column"))?;
    let mut seen: Vec<u32> = Vec::new();
    for t in tags.values().iter() {
        if !seen.contains(t) {
            seen.push(*t);
        }
    }
    let mut out = Vec::new();
    for t in seen {
        let def = defs
            .get(t as usize)
            .ok_or_else(|| Error::data(format!("a shard sent rows of table #{t}")))?;
        let start = 1 + defs[..t as usize]
            .iter()
            .map(|d| d.schema.fields().len())
            .sum::<usize>();
        let columns = &batch.columns()[start..start + def.schema.fields().len()];
        let columns: Vec<ArrayRef> = if tags.values().iter().all(|x| *x == t) {
            columns.to_vec()
        } else {
            let mask = arrow::compute::kernels::cmp::eq(tags, &UInt32Array::new_scalar(t))?;
            columns
                .iter()
                .map(|c| arrow::compute::filter(c, &mask))
                .collect::<std::result::Result<_, _>>()?
        };
        let rows = RecordBatch::try_new(def.schema.clone(), columns).map_err(|e| {
            Error::data(format!(
                "a shard's rows of table {} do not fit schemas/{}.md: {e}",
                def.name, def.name
            ))
        })?;
        out.push((t as usize, rows));
    }
    Ok(out)
}

/// The shards of a stage on `workers` workers: one per worker, contiguous ranges of its
/// shard column (fewer where the column has fewer values).
pub(super) async fn plan(
    stage: &Arc<dyn Stage>,
    ctx: &StageContext,
    inputs: &InputFiles,
    column: &'static str,
    checkpoints: &[ShardCheckpoint],
    workers: usize,
) -> Result<Vec<Arc<dyn ExecutionPlan>>> {
    let config = serde_json::from_str::<serde_json::Value>(&ctx.config.canonical_json())
        .expect("canonical json parses");
    let ranges = split_ranges(ctx, inputs, column, workers as u64).await?;
    Ok(ranges
        .into_iter()
        .map(|range| {
            let task = ShardTask {
                stage: stage.name().to_string(),
                run_id: ctx.run_id.clone(),
                iter: ctx.iter,
                seed: ctx.seed,
                config: config.clone(),
                memory_limit_mib: inputs.memory_limit_mib,
                inputs: inputs
                    .tables
                    .iter()
                    .map(|(d, fs)| (d.name.to_string(), fs.clone()))
                    .collect(),
                column: column.to_string(),
                range,
                checkpoints: checkpoints.to_vec(),
                assets: ctx
                    .assets
                    .as_ref()
                    .map(|a| a.files.values().cloned().collect())
                    .unwrap_or_default(),
            };
            Arc::new(StageShardExec::new(
                task,
                ctx.config.clone(),
                stage.clone(),
                inputs.store.clone(),
            )) as Arc<dyn ExecutionPlan>
        })
        .collect())
}

/// Encodes [`StageShardExec`] for the workers and decodes it there (a JSON [`ShardTask`]).
#[derive(Clone)]
pub struct StageCodec {
    store: Store,
    stages: StageResolver,
}

impl StageCodec {
    /// A codec whose decoded shards run on `store` with the stages `stages` resolves.
    pub fn new(store: Store, stages: StageResolver) -> StageCodec {
        StageCodec { store, stages }
    }
}

impl fmt::Debug for StageCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StageCodec({})", self.store.url())
    }
}

impl PhysicalExtensionCodec for StageCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        _: &[Arc<dyn ExecutionPlan>],
        _: &TaskContext,
        _: &dyn PhysicalProtoConverterExtension,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let external = |e: Error| DataFusionError::External(Box::new(e));
        let task: ShardTask = serde_json::from_slice(buf).map_err(|e| {
            external(Error::data(format!(
                "a shard from the coordinator does not decode (is it the same build?): {e}"
            )))
        })?;
        let config: Config = serde_json::from_value(task.config.clone()).map_err(|e| {
            external(Error::config(format!(
                "the config of a shard of stage {}: {e}",
                task.stage
            )))
        })?;
        let stage = (self.stages)(&config, &task.stage).map_err(external)?;
        Ok(Arc::new(StageShardExec::new(
            task,
            Arc::new(config),
            stage,
            self.store.clone(),
        )))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _: &dyn PhysicalProtoConverterExtension,
    ) -> datafusion::error::Result<()> {
        let Some(shard) = node.downcast_ref::<StageShardExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "StageCodec encodes StageShardExec, not {}",
                node.name()
            )));
        };
        serde_json::to_writer(buf, &shard.task).map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Array, StringArray};

    /// Rows of two tables go through one stream and come out as they went in.
    #[test]
    fn mux_and_demux_round_trip() {
        let defs = vec![
            schema::table_def("trajectories").unwrap(),
            schema::table_def("steps").unwrap(),
        ];
        let schema = mux_schema(&defs);
        assert_eq!(
            schema.fields().len(),
            1 + defs.iter().map(|d| d.schema.fields().len()).sum::<usize>()
        );
        let traj = |ids: &[&str]| {
            let columns: Vec<ArrayRef> = defs[0]
                .schema
                .fields()
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Utf8 => Arc::new(StringArray::from(
                        ids.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                    )) as ArrayRef,
                    DataType::Int8 => Arc::new(Int8Array::from(vec![1i8; ids.len()])),
                    DataType::UInt32 => Arc::new(UInt32Array::from(vec![3u32; ids.len()])),
                    other => panic!("trajectories column type {other}"),
                })
                .collect();
            RecordBatch::try_new(defs[0].schema.clone(), columns).unwrap()
        };
        let a = traj(&["a", "b"]);
        let muxed = mux(&schema, &defs, 0, &a).unwrap();
        assert_eq!(demux(&defs, &muxed).unwrap(), vec![(0, a.clone())]);
        // A batch of mixed tables (the transport may cut and join) splits by table.
        let b = traj(&["c"]);
        let mixed =
            arrow::compute::concat_batches(&schema, &[muxed, mux(&schema, &defs, 0, &b).unwrap()])
                .unwrap();
        let split = demux(&defs, &mixed).unwrap();
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].1.num_rows(), 3);
        let mut bad = mixed.columns().to_vec();
        bad[0] = Arc::new(UInt32Array::from(vec![0, 7, 0]));
        let bad = RecordBatch::try_new(schema, bad).unwrap();
        assert!(demux(&defs, &bad).unwrap_err().to_string().contains("#7"));
    }

    /// An initial checkpoint is stored once, content-addressed (a corrupted copy is replaced);
    /// a worker reads it back only with the digest it was sent.
    #[tokio::test]
    async fn checkpoints_are_stored_by_digest_and_read_checked() {
        let store = Store::open("memory://").unwrap();
        let bytes = bytes::Bytes::from_static(b"weights");
        let input = |kind, name: &str, path: &str| InputRef {
            kind,
            tables: vec![name.to_string()],
            path: path.to_string(),
            digest: manifest::digest(&bytes),
            source: None,
        };
        let init = input(InputKind::Init, "policy", "");
        let c = ShardCheckpoint::stored(&store, "r", 0, &init, &bytes)
            .await
            .unwrap();
        assert_eq!(c.digest, manifest::digest(&bytes));
        assert!(
            c.path.ends_with(&format!("policy.{}.ckpt", c.digest)),
            "{}",
            c.path
        );
        assert_eq!(c.read(&store).await.unwrap(), bytes);
        let at = object_store::path::Path::from(c.path.as_str());
        store.delete(&at).await.unwrap();
        store.put_if_absent(&at, "garbage".into()).await.unwrap();
        let wrong = c.read(&store).await.unwrap_err().to_string();
        assert!(
            wrong.contains("blake3") && wrong.contains(&c.path),
            "{wrong}"
        );
        let again = ShardCheckpoint::stored(&store, "r", 0, &init, &bytes)
            .await
            .unwrap();
        assert_eq!(again, c);
        assert_eq!(c.read(&store).await.unwrap(), bytes, "replaced");
        // A committed artifact is read where it lies.
        let artifact = input(InputKind::Artifact, "rm", "elsewhere");
        let committed = ShardCheckpoint::stored(&store, "r", 0, &artifact, &bytes)
            .await
            .unwrap();
        assert_eq!(committed.path, "elsewhere");
        assert!(
            committed
                .read(&store)
                .await
                .unwrap_err()
                .to_string()
                .contains("is missing from the store")
        );
    }

    /// The encoded shard is the JSON of its task, and decodes to the same task.
    #[test]
    fn shard_tasks_round_trip_as_json() {
        let cfg = Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "t").unwrap();
        let task = ShardTask {
            stage: "rollout".into(),
            run_id: "r".into(),
            iter: 2,
            seed: u64::MAX - 3,
            config: serde_json::from_str(&cfg.canonical_json()).unwrap(),
            memory_limit_mib: 512,
            inputs: vec![("tasks".into(), vec![])],
            column: "task_id".into(),
            range: Range {
                lo: Some("t1".into()),
                hi: None,
            },
            checkpoints: vec![ShardCheckpoint {
                name: "policy".into(),
                path: "r/artifacts/iter=000002/policy.ab.ckpt".into(),
                digest: "ab".into(),
            }],
            assets: vec![crate::stage::AssetRef {
                id: "c0ffee".into(),
                path: "r/artifacts/iter=000000/asset-c0ffee.cd.asset".into(),
                digest: "cd".into(),
            }],
        };
        let back: ShardTask = serde_json::from_slice(&serde_json::to_vec(&task).unwrap()).unwrap();
        assert_eq!(back, task);
        let config: Config = serde_json::from_value(back.config).unwrap();
        assert_eq!(config, cfg);
        assert_eq!(config.hash(), cfg.hash());
    }
}
