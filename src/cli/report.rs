//! `rla-pipe report`: the HTML report (and SVG charts) of one or more runs.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::args::StoreArgs;
use super::output::write_atomic;

pub(super) async fn report(
    store: &StoreArgs,
    runs: &[String],
    out: &std::path::Path,
    svg_dir: Option<PathBuf>,
    quiet: bool,
) -> Result<()> {
    let store = store.open()?;
    let report = crate::report::build(&store, runs).await?;
    write_atomic(out, report.html.as_bytes())?;
    if let Some(dir) = svg_dir {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, svg) in &report.charts {
            let path = dir.join(format!("{name}.svg"));
            write_atomic(&path, svg.as_bytes())?;
        }
    }
    if !quiet {
        eprintln!(
            "wrote {} ({} charts, {} run{})",
            out.display(),
            report.charts.len(),
            runs.len(),
            if runs.len() == 1 { "" } else { "s" }
        );
    }
    Ok(())
}
