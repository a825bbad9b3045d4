//! `rla-pipe sql`: query a store's committed tables.

use std::path::PathBuf;

use crate::error::Error;
use anyhow::{Context, Result};

use super::args::{Format, StoreArgs};
use super::output::{print_batches, write_results};
use crate::store::layout;

pub(super) async fn sql(
    store: &StoreArgs,
    run: Option<&str>,
    format: Format,
    out: Option<PathBuf>,
    query: &str,
    on: &SqlCluster,
    quiet: bool,
) -> Result<()> {
    let store = store.open()?;
    if let Some(r) = run {
        layout::validate_run_id(r)?;
    }
    let ctx = match crate::cluster::Cluster::parse(&on.cluster)? {
        None => crate::sql::session(&store, run).await?,
        Some(cluster) => {
            if !(on.split_mib > 0.0 && on.split_mib.is_finite()) {
                return Err(Error::usage("--split-mib must be a positive number of MiB").into());
            }
            let split = (on.split_mib * 1024.0 * 1024.0).max(1.0) as usize;
            crate::sql::cluster_session(&store, run, &cluster, split).await?
        }
    };
    if run.is_none() && !quiet {
        let runs = crate::store::catalog::run_ids(&store).await?;
        if runs.len() > 1 {
            eprintln!(
                "note: the store holds {} runs ({}); the tables hold rows of all of them: \
                 --run ID for one (or group by run_id)",
                runs.len(),
                runs.join(", ")
            );
        }
    }
    let (schema, batches) = crate::sql::query(&ctx, query).await?;
    match out {
        Some(path) => {
            let rows = write_results(&path, schema, &batches)?;
            if !quiet {
                eprintln!("wrote {rows} rows to {}", path.display());
            }
        }
        None => print_batches(format, &schema, &batches)?,
    }
    Ok(())
}

/// `sql`'s query: the argument, or the text of `--file`.
pub(super) fn query_text(query: Option<String>, file: Option<PathBuf>) -> Result<String> {
    Ok(match (query, file) {
        (Some(q), _) => q,
        (None, Some(path)) => std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read the query file {}", path.display()))?,
        (None, None) => return Err(Error::usage("give a query, or --file FILE.sql").into()),
    })
}

/// `sql --cluster` and `--split-mib`.
pub(super) struct SqlCluster {
    pub(super) cluster: Vec<String>,
    pub(super) split_mib: f64,
}
