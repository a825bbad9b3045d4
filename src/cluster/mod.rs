//! Past one machine: rla-pipe on datafusion-distributed (docs/src/distributed.md says why this
//! engine). Workers are `rla-pipe worker` processes ([`worker::serve`]); a coordinator is any
//! rla-pipe process whose `run.cluster` (or `--cluster`) lists them.
//!
//! - [`Cluster::check`]: every worker answers, runs this rla-pipe version and serves the same
//!   store (a clear error naming the worker in < 5 s otherwise).
//! - [`Cluster::run_tasks`]: plans the coordinator built, one per task, each run whole on one
//!   worker as a query of its own (the engine's task ranges: a range's rows never meet
//!   another's, and each range's floating-point aggregates see their rows in the order a single
//!   node does), their outputs concatenated in task order: byte-identical to running them here.
//! - [`Cluster::sql_session`]: the `sql` command's session, planned by the distributed planner
//!   (scans split across workers, shuffles between them).
//!
//! Failure handling is the engine's: no retries. Every gRPC channel goes through
//! [`channel::NamedChannels`] (2 s connect timeout, HTTP/2 keep-alive, the worker's URL in every
//! error), so a worker that dies mid-stage fails the stage naming it; nothing is committed and a
//! rerun resumes at that stage.

mod channel;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;

use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExec, DistributedExt, NetworkBoundary, NetworkCoalesceExec, SessionStateBuilderExt,
    Stage, WorkerResolver,
};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use futures::{StreamExt, TryStreamExt};
use url::Url;

use crate::error::{Error, Result};
use crate::store::Store;

pub use channel::{NamedChannels, show};

/// How long [`Cluster::check`] waits for each worker (connecting included).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(4);

/// The worker list of `run.cluster` / `--cluster`.
#[derive(Clone)]
pub struct Cluster {
    urls: Vec<Url>,
    /// One channel per worker, shared by every query of this cluster.
    channels: NamedChannels,
    /// Encodes the plan nodes of the caller's own (e.g. the engine's model stages).
    codec: Option<Arc<dyn PhysicalExtensionCodec>>,
}

impl Cluster {
    /// The cluster of `run.cluster` / `--cluster` addresses ([`crate::config::cluster_urls`]);
    /// an empty list is no cluster.
    pub fn parse(addrs: &[String]) -> Result<Option<Cluster>> {
        let urls = crate::config::cluster_urls(addrs)
            .map_err(|e| Error::config(format!("run.cluster: {e}")))?;
        Ok((!urls.is_empty()).then(|| Cluster {
            urls,
            channels: NamedChannels::default(),
            codec: None,
        }))
    }

    /// This cluster with `codec` encoding the plan nodes DataFusion cannot (the workers decode
    /// them with the same codec: [`worker::serve`]).
    pub fn with_codec(mut self, codec: Arc<dyn PhysicalExtensionCodec>) -> Cluster {
        self.codec = Some(codec);
        self
    }

    pub fn urls(&self) -> &[Url] {
        &self.urls
    }

    /// Check every worker before work is sent: it answers within [`CHECK_TIMEOUT`], runs this
    /// build's version and serves `store`. All workers are asked at once.
    pub async fn check(&self, store: &Store) -> Result<()> {
        if !store.is_shared() {
            return Err(Error::config(format!(
                "run.cluster: the store {} lives in this process's memory; workers need a store \
                 they can read (a path, file://, s3://, gs://, az://)",
                store.url()
            )));
        }
        let want = worker::identity(store);
        let want = &want;
        let asks = self.urls.iter().map(|url| {
            let channels = self.channels.clone();
            async move {
                let info = tokio::time::timeout(CHECK_TIMEOUT, channels.worker_info(url)).await;
                match info {
                    Err(_) => Err(Error::Cluster(format!(
                        "worker {} did not answer within {} s",
                        show(url),
                        CHECK_TIMEOUT.as_secs()
                    ))),
                    Ok(Err(e)) => Err(Error::from(e)),
                    Ok(Ok(got)) if got != *want => Err(Error::Cluster(format!(
                        "worker {} is `{got}`; this run needs `{want}` (start it with this \
                         build and --store pointing at the same store)",
                        show(url)
                    ))),
                    Ok(Ok(_)) => Ok(()),
                }
            }
        });
        futures::future::try_join_all(asks).await?;
        Ok(())
    }

    /// A coordinator session over `workers` (of this cluster): our channels, the distributed
    /// planner (and its task routing), scans split into tasks of `split_bytes`.
    fn coordinator(
        &self,
        workers: &[Url],
        config: SessionConfig,
        runtime: Arc<RuntimeEnv>,
        split_bytes: Option<usize>,
    ) -> Result<SessionContext> {
        let mut builder = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_distributed_planner()
            .with_distributed_worker_resolver(Workers(workers.to_vec()))
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_metrics_collection(false)?;
        if let Some(codec) = &self.codec {
            builder = builder.with_distributed_user_codec_arc(codec.clone());
        }
        if let Some(bytes) = split_bytes {
            builder =
                builder.with_distributed_file_scan_config_bytes_per_partition(bytes.max(1))?;
        }
        Ok(SessionContext::from(builder.build()))
    }

    /// The `sql` command's session over `local` (its tables, options and runtime): queries are
    /// distributed by datafusion-distributed's planner, each scan split into tasks of about
    /// `split_bytes` of Parquet (a query smaller than one task runs here).
    pub fn sql_session(
        &self,
        local: &SessionContext,
        split_bytes: usize,
    ) -> Result<SessionContext> {
        let state = local.state();
        let ctx = self.coordinator(
            &self.urls,
            state.config().clone(),
            state.runtime_env().clone(),
            Some(split_bytes),
        )?;
        let catalog = local
            .catalog("datafusion")
            .ok_or_else(|| Error::sql("the local session has no default catalog"))?;
        ctx.register_catalog("datafusion", catalog);
        Ok(ctx)
    }

    /// Run each plan whole on one worker, as a query of its own (task `i` on worker
    /// `(i + k) mod workers`, `k` chosen at random), and stream their rows back in task order.
    /// `finish` sees each task's batches before they are passed on (the engine checks and
    /// restores key order there); up to `lookahead` tasks run at once. Every plan must have one
    /// output partition and the same schema.
    ///
    /// One query per task, not one query of many tasks: a worker keeps a task's plan (and the
    /// memory its operators hold, e.g. a hash join's build side) until its query ends.
    pub fn run_tasks(
        &self,
        plans: Vec<Arc<dyn ExecutionPlan>>,
        config: SessionConfig,
        runtime: Arc<RuntimeEnv>,
        lookahead: usize,
        finish: Finish,
    ) -> Result<SendableRecordBatchStream> {
        let schema = plans
            .first()
            .ok_or_else(|| Error::data("no tasks to run on the cluster"))?
            .schema();
        if let Some(p) = plans
            .iter()
            .find(|p| p.properties().partitioning.partition_count() != 1)
        {
            return Err(Error::data(format!(
                "a cluster task must have one output partition, not {} ({})",
                p.properties().partitioning.partition_count(),
                p.name()
            )));
        }
        // One coordinator session per worker: its worker list is that worker alone.
        let sessions = self
            .urls
            .iter()
            .map(|url| {
                let one = std::slice::from_ref(url);
                Ok(self
                    .coordinator(one, config.clone(), runtime.clone(), None)?
                    .task_ctx())
            })
            .collect::<Result<Vec<_>>>()?;
        let first = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize);
        let tasks = futures::stream::iter(plans.into_iter().enumerate())
            .map(move |(i, plan)| {
                let task_ctx = sessions[(first + i) % sessions.len()].clone();
                let finish = finish.clone();
                async move {
                    let batches: Vec<RecordBatch> =
                        datafusion::physical_plan::execute_stream(one_task(plan)?, task_ctx)?
                            .try_collect()
                            .await?;
                    finish(i, batches)
                }
            })
            .buffered(lookahead.max(1))
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten()
            .map_err(|e: Error| DataFusionError::External(Box::new(e)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, tasks)))
    }
}

/// What the caller does with a task's batches (by task index) before they are passed on.
pub type Finish = Arc<dyn Fn(usize, Vec<RecordBatch>) -> Result<Vec<RecordBatch>> + Send + Sync>;

/// `plan` as a distributed query of one task: `DistributedExec` over a network boundary whose
/// input stage is `plan`. The boundary is numbered by hand (a fresh query id: workers key their
/// task state by it; stage 1): datafusion-distributed's planner would elide a one-task boundary
/// and run the plan here.
fn one_task(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let boundary = NetworkCoalesceExec::try_new(plan, 1, 1)?;
    let Stage::Local(mut stage) = boundary.input_stage().clone() else {
        return Err(Error::data("a new network boundary has a remote stage"));
    };
    stage.query_id = uuid::Uuid::now_v7();
    stage.num = 1;
    let boundary: Arc<dyn ExecutionPlan> = boundary.with_input_stage(Stage::Local(stage))?;
    Ok(Arc::new(
        DistributedExec::new(boundary).with_metrics_collection(false),
    ))
}

/// The fixed worker list.
#[derive(Clone)]
struct Workers(Vec<Url>);

impl WorkerResolver for Workers {
    fn get_urls(&self) -> std::result::Result<Vec<Url>, datafusion::error::DataFusionError> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let c = Cluster::parse(&["127.0.0.1:7001".into(), "http://node-2:7002".into()])
            .unwrap()
            .unwrap();
        assert_eq!(
            c.urls().iter().map(|u| u.to_string()).collect::<Vec<_>>(),
            ["http://127.0.0.1:7001/", "http://node-2:7002/"]
        );
        assert!(Cluster::parse(&[]).unwrap().is_none());
        for bad in ["127.0.0.1", "https://x:1", "http://x:1/a b", ""] {
            assert!(Cluster::parse(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(Cluster::parse(&["a:1".into(), "http://a:1".into()]).is_err());
    }
}
