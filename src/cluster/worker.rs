//! `rla-pipe worker`: a datafusion-distributed worker (an Arrow Flight / gRPC service) over one
//! store, with the query settings rla-pipe's sessions use, so that a task runs on a worker
//! exactly as it runs in a single process.

use std::net::SocketAddr;
use std::sync::Arc;

use datafusion::execution::SessionState;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::NamedChannels;
use super::channel::{KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};
use crate::error::{Error, Result};
use crate::store::{Store, tables};

/// What a worker answers to `GetWorkerInfo`: this build and the store it serves. A coordinator
/// sends work only to workers whose identity equals its own ([`super::Cluster::check`]).
pub fn identity(store: &Store) -> String {
    format!(
        "rla-pipe {} store {}",
        env!("CARGO_PKG_VERSION"),
        store.external_url("")
    )
}

/// Serve a worker on `listen` until Ctrl-C / SIGTERM. `codec` decodes the plan nodes of the
/// coordinator's own (those its [`super::Cluster::with_codec`] encodes). `ready` is called with
/// the bound address once the socket listens (`--listen 127.0.0.1:0` picks a free port).
pub async fn serve(
    listen: SocketAddr,
    store: &Store,
    memory_limit_mib: u64,
    codec: Option<Arc<dyn PhysicalExtensionCodec>>,
    ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    if !store.is_shared() {
        return Err(Error::config(format!(
            "worker: the store {} would live in this worker's memory only; give a store the \
             coordinator can read too (a path, file://, s3://, gs://, az://)",
            store.url()
        )));
    }
    let runtime = tables::runtime(store, memory_limit_mib)?;
    // One channel per peer worker, shared by every task this worker runs.
    let channels = NamedChannels::default();
    let worker = Worker::from_session_builder(move |ctx| {
        build_session(ctx, channels.clone(), codec.clone())
    })
    .with_runtime_env(runtime)
    .with_version(identity(store));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Cluster(format!("worker: cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Cluster(format!("worker: {listen}: {e}")))?;
    ready(bound);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEP_ALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEP_ALIVE_TIMEOUT))
        .add_service(worker.into_worker_server())
        .serve_with_incoming_shutdown(incoming, shutdown())
        .await
        .map_err(|e| Error::Cluster(format!("worker on {bound}: {e}")))
}

/// Each task's session: rla-pipe's query settings ([`tables::apply_session_settings`]) over the
/// settings the coordinator sent, and our channels for worker-to-worker traffic.
async fn build_session(
    ctx: WorkerQueryContext,
    channels: NamedChannels,
    codec: Option<Arc<dyn PhysicalExtensionCodec>>,
) -> std::result::Result<SessionState, datafusion::error::DataFusionError> {
    tracing::info!("worker: a task arrived; planning it");
    let mut builder = ctx.builder;
    let config = builder.config().get_or_insert_default();
    tables::apply_session_settings(config).map_err(|e| {
        datafusion::error::DataFusionError::Configuration(format!("worker session: {e}"))
    })?;
    builder = builder.with_distributed_channel_resolver(channels);
    if let Some(codec) = codec {
        builder = builder.with_distributed_user_codec_arc(codec);
    }
    Ok(builder.build())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
