//! `rla-pipe report`: the HTML report (and SVG charts) of one or more runs; with `--watch`,
//! re-written while the runs are going, a page that reloads itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::StoreArgs;
use super::output::write_atomic;
use crate::store::{Store, catalog};

pub(super) async fn report(
    store: &StoreArgs,
    runs: &[String],
    out: &Path,
    svg_dir: Option<PathBuf>,
    watch: Option<f64>,
    quiet: bool,
) -> Result<()> {
    let Some(secs) = watch else {
        let store = store.open()?;
        write_report(&store, runs, out, svg_dir.as_deref(), None).await?;
        if !quiet {
            eprintln!("{}", wrote(out, runs));
        }
        return Ok(());
    };
    if !(secs >= 1.0 && secs.is_finite()) {
        return Err(crate::error::Error::usage(format!(
            "--interval {secs}: a watched report is re-written at most once a second"
        ))
        .into());
    }
    // A store the run has not created yet is waited for, as a run not started.
    let store = loop {
        match store.open() {
            Ok(s) => break s,
            Err(e) => {
                if !quiet {
                    let state: Vec<String> =
                        runs.iter().map(|r| format!("{r}: not started")).collect();
                    eprintln!(
                        "waiting · {} ({e}) · again in {secs} s (Ctrl-C stops)",
                        state.join(" · ")
                    );
                }
                if interrupted_within(secs).await {
                    return Ok(());
                }
            }
        }
    };
    loop {
        let progress = progress(&store, runs).await?;
        let done = progress.iter().all(|p| p.done);
        let shown = progress.iter().all(|p| p.started);
        // While watching, the page reloads itself; the last one written does not. A run that
        // has just started may not have the tables a report needs yet: tried again next time.
        let written = if shown {
            let refresh = (!done).then_some(secs);
            match write_report(&store, runs, out, svg_dir.as_deref(), refresh).await {
                Ok(()) => Some(Ok(())),
                Err(e) if !done => Some(Err(format!("{e:#}"))),
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        if !quiet {
            let state: Vec<String> = progress.iter().map(Progress::describe).collect();
            eprintln!(
                "{} · {}{}",
                match &written {
                    None => "waiting".to_string(),
                    Some(Ok(())) => wrote(out, runs),
                    Some(Err(e)) => format!("not written yet ({e})"),
                },
                state.join(" · "),
                if done {
                    String::new()
                } else {
                    format!(" · again in {secs} s (Ctrl-C stops)")
                }
            );
        }
        if done {
            return Ok(());
        }
        if interrupted_within(secs).await {
            if shown {
                write_report(&store, runs, out, svg_dir.as_deref(), None).await?;
            }
            if !quiet {
                eprintln!(
                    "stopped watching; {} no longer reloads itself",
                    out.display()
                );
            }
            return Ok(());
        }
    }
}

/// Wait `secs` seconds; true when Ctrl-C came first.
async fn interrupted_within(secs: f64) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => false,
        _ = tokio::signal::ctrl_c() => true,
    }
}

fn wrote(out: &Path, runs: &[String]) -> String {
    format!(
        "wrote {} ({} run{})",
        out.display(),
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    )
}

/// Build the report and write it (and its charts); `refresh` makes the page reload itself
/// every that many seconds.
async fn write_report(
    store: &Store,
    runs: &[String],
    out: &Path,
    svg_dir: Option<&Path>,
    refresh: Option<f64>,
) -> Result<()> {
    let report = crate::report::build(store, runs).await?;
    let html = match refresh {
        Some(secs) => with_refresh(&report.html, secs),
        None => report.html,
    };
    write_atomic(out, html.as_bytes())?;
    if let Some(dir) = svg_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, svg) in &report.charts {
            write_atomic(&dir.join(format!("{name}.svg")), svg.as_bytes())?;
        }
    }
    Ok(())
}

/// The page with a `<meta http-equiv="refresh">`: a browser showing it reloads it.
fn with_refresh(html: &str, secs: f64) -> String {
    html.replacen(
        "<head>",
        &format!(
            "<head><meta http-equiv=\"refresh\" content=\"{}\">",
            secs.ceil() as u64
        ),
        1,
    )
}

/// How far a watched run is: its committed iterations against the `run.iterations` it was
/// started with.
struct Progress {
    run: String,
    started: bool,
    committed: u32,
    iterations: u32,
    done: bool,
}

impl Progress {
    fn describe(&self) -> String {
        if !self.started {
            format!("{}: not started", self.run)
        } else if self.done {
            format!("{}: complete ({} iterations)", self.run, self.iterations)
        } else {
            format!(
                "{}: {} of {} iterations",
                self.run, self.committed, self.iterations
            )
        }
    }
}

async fn progress(store: &Store, runs: &[String]) -> Result<Vec<Progress>> {
    let mut out = Vec::new();
    for run in runs {
        // A store not created yet (the run has not started) is waited for like a missing run.
        if !matches!(catalog::read_run(store, run).await, Ok(Some(_))) {
            out.push(Progress {
                run: run.clone(),
                started: false,
                committed: 0,
                iterations: 0,
                done: false,
            });
            continue;
        }
        let state = catalog::load_run(store, run).await?;
        let iterations = state.run.config["run"]["iterations"]
            .as_u64()
            .unwrap_or(1)
            .max(1) as u32;
        let committed = state
            .iters
            .values()
            .filter(|i| i.complete.is_some())
            .count() as u32;
        out.push(Progress {
            run: run.clone(),
            started: true,
            committed,
            iterations,
            done: state
                .iters
                .get(&(iterations - 1))
                .is_some_and(|i| i.complete.is_some()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::with_refresh;

    #[test]
    fn a_watched_page_reloads_itself() {
        let html = "<!DOCTYPE html>\n<html><head><title>x</title></head><body></body></html>";
        assert_eq!(
            with_refresh(html, 9.5),
            "<!DOCTYPE html>\n<html><head><meta http-equiv=\"refresh\" content=\"10\"><title>x</title></head><body></body></html>"
        );
    }
}
