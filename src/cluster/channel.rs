//! The gRPC channels to workers: a connect timeout, HTTP/2 keep-alive (a worker that stops
//! answering mid-stream is noticed in seconds, not at the OS's TCP timeout), one channel per
//! worker reused by every request, and the worker's URL in every error it returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_distributed::grpc::{BoxCloneSyncChannel, create_worker_client};
use datafusion_distributed::{
    ChannelResolver, CoordinatorToWorkerMsg, ExecuteTaskRequest, GetWorkerInfoRequest,
    GetWorkerInfoResponse, SetPlanRequest, WorkerChannel, WorkerToCoordinatorMsg,
};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use http::HeaderMap;
use url::Url;

/// A worker's URL as users write it (no trailing `/`).
pub fn show(url: &Url) -> &str {
    url.as_str().trim_end_matches('/')
}

/// Connecting to a worker gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on every channel, idle or not (both ways: the worker's server too) ...
pub(super) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// ... and a channel whose ping is not answered within this long is dead.
pub(super) const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`ChannelResolver`] whose clients name their worker in every error.
#[derive(Clone, Default)]
pub struct NamedChannels {
    channels: Arc<Mutex<HashMap<Url, BoxCloneSyncChannel>>>,
}

impl NamedChannels {
    async fn channel(&self, url: &Url) -> Result<BoxCloneSyncChannel> {
        if let Some(c) = self.channels.lock().expect("channel cache").get(url) {
            return Ok(c.clone());
        }
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| named(url, DataFusionError::External(Box::new(e))))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let channel = endpoint.connect().await.map_err(|e| {
            named(
                url,
                DataFusionError::Execution(format!(
                    "cannot connect (within {} s): {}",
                    CONNECT_TIMEOUT.as_secs(),
                    source_chain(&e)
                )),
            )
        })?;
        let channel = BoxCloneSyncChannel::new(channel);
        self.channels
            .lock()
            .expect("channel cache")
            .insert(url.clone(), channel.clone());
        Ok(channel)
    }

    /// The worker's version string ([`super::worker::identity`]).
    pub async fn worker_info(&self, url: &Url) -> Result<String> {
        let mut client = self.get_worker_client_for_url(url).await?;
        Ok(client
            .get_worker_info(GetWorkerInfoRequest {})
            .await?
            .version)
    }
}

#[async_trait]
impl ChannelResolver for NamedChannels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>> {
        let channel = self.channel(url).await?;
        Ok(Box::new(Named {
            url: url.clone(),
            inner: create_worker_client(channel),
        }))
    }
}

/// `error` with the worker it came from: one of our cluster errors (which survives the trip
/// through DataFusion, [`crate::error::Error`]'s `From`), on one line, the worker first.
fn named(url: &Url, error: DataFusionError) -> DataFusionError {
    let worker = format!("worker {}", show(url));
    let mut text = error.to_string();
    if text.contains(&worker) {
        return error;
    }
    // DataFusion's kind prefixes say nothing here.
    while let Some(rest) = ["Execution error: ", "External error: "]
        .iter()
        .find_map(|p| text.strip_prefix(p))
    {
        text = rest.to_string();
    }
    DataFusionError::External(Box::new(crate::error::Error::Cluster(format!(
        "{worker}: {text}"
    ))))
}

/// An error and its sources on one line (tonic's transport errors say little at the top),
/// each message once.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.retain(|p| p != "transport error");
    parts.join(": ")
}

/// A worker client whose errors, and its streams' errors, name the worker.
struct Named {
    url: Url,
    inner: Box<dyn WorkerChannel>,
}

#[async_trait]
impl WorkerChannel for Named {
    async fn coordinator_channel(
        &mut self,
        headers: HeaderMap,
        set_plan_request: SetPlanRequest,
        c2w_stream: BoxStream<'static, CoordinatorToWorkerMsg>,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> Result<BoxStream<'static, Result<WorkerToCoordinatorMsg>>> {
        let url = self.url.clone();
        let stream = self
            .inner
            .coordinator_channel(headers, set_plan_request, c2w_stream, metrics, task_ctx)
            .await
            .map_err(|e| named(&url, e))?;
        Ok(stream.map_err(move |e| named(&url, e)).boxed())
    }

    async fn execute_task(
        &mut self,
        headers: HeaderMap,
        request: ExecuteTaskRequest,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> Result<Vec<BoxStream<'static, Result<RecordBatch>>>> {
        let url = self.url.clone();
        let streams = self
            .inner
            .execute_task(headers, request, metrics, task_ctx)
            .await
            .map_err(|e| named(&url, e))?;
        Ok(streams
            .into_iter()
            .map(|s| {
                let url = url.clone();
                s.map_err(move |e| named(&url, e)).boxed()
            })
            .collect())
    }

    async fn get_worker_info(
        &mut self,
        request: GetWorkerInfoRequest,
    ) -> Result<GetWorkerInfoResponse> {
        self.inner
            .get_worker_info(request)
            .await
            .map_err(|e| named(&self.url, e))
    }
}
