//! `rla-pipe worker`: serve a worker of a cluster.

use crate::error::Error;
use anyhow::Result;

use crate::store::Store;

/// `rla-pipe worker`: serve until Ctrl-C / SIGTERM.
pub(super) async fn worker(
    listen: std::net::SocketAddr,
    store: &str,
    memory_limit_mib: u64,
) -> Result<()> {
    if memory_limit_mib < 64 {
        return Err(Error::usage("--memory-limit-mib must be at least 64").into());
    }
    let store = Store::open(store)?;
    let codec = crate::engine::shard::StageCodec::new(
        store.clone(),
        std::sync::Arc::new(crate::pipeline::stage),
    );
    crate::cluster::worker::serve(
        listen,
        &store,
        memory_limit_mib,
        Some(std::sync::Arc::new(codec)),
        |bound| {
            // The one line on stdout: scripts (and tests) read the address from it.
            println!(
                "rla-pipe worker listening on http://{bound} (store {})",
                store.url()
            );
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        },
    )
    .await?;
    Ok(())
}
