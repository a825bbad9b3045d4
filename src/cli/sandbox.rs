//! `rla-pipe sandbox`: run a program in the coding setting's sandbox, exactly as `execute` runs
//! the policy's programs (what isolation is in force, a program's status and output, the
//! sandbox's own cost per run).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::Error;
use anyhow::{Context, Result};

use super::args::TextOrJson;
use crate::config::Config;
use crate::sandbox::Sandbox;

/// What to run and how (the command's flags).
#[derive(clap::Args, Debug)]
pub(super) struct SandboxArgs {
    /// The program (a Python source file; - reads it from standard input).
    program: Option<PathBuf>,
    /// The program's standard input, from this file (default: empty).
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// Wall-clock limit of the run, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    timeout: f64,
    /// Take the sandbox's settings ([env.coding.sandbox]) from this pipeline (default: the
    /// defaults).
    #[arg(long, value_name = "PIPELINE.toml")]
    pipeline: Option<PathBuf>,
    /// Override a config key (repeatable): --set env.coding.sandbox.isolation=none.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = super::args::key_value)]
    sets: Vec<String>,
    /// Run the program this many times (the last run is printed, with the median time).
    #[arg(long, value_name = "N", default_value_t = 1)]
    repeat: u32,
    /// The worker slot to run as (as root, each slot has a uid of its own: 61000 + SLOT).
    #[arg(long, value_name = "SLOT", default_value_t = 0)]
    slot: usize,
    #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
    format: TextOrJson,
}

fn read(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub(super) fn sandbox(a: SandboxArgs) -> Result<()> {
    let cfg = match &a.pipeline {
        Some(p) => Config::load(p, &a.sets)?,
        None => Config::from_toml_with_sets(crate::config::DEFAULT_TOML, "the defaults", &a.sets)?,
    };
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        return Err(Error::usage(format!(
            "--timeout must be a positive number of seconds, not {}",
            a.timeout
        ))
        .into());
    }
    if a.repeat == 0 {
        return Err(Error::usage("--repeat must be at least 1").into());
    }
    let started = Instant::now();
    // The isolation is probed here: an error says what is missing and which key turns it off.
    let sandbox = Sandbox::new(cfg.env.coding.sandbox.clone())?;
    let Some(path) = &a.program else {
        let probe = started.elapsed().as_secs_f64();
        match a.format {
            TextOrJson::Text => println!(
                "isolation: {}\nprobe: no network, none of this machine's files ({probe:.3} s)",
                sandbox.describe()
            ),
            TextOrJson::Json => println!(
                "{}",
                serde_json::json!({"isolation": sandbox.describe(), "probe_seconds": probe})
            ),
        }
        return Ok(());
    };
    let program = read(path)?;
    let stdin = match &a.stdin {
        Some(p) => read(p)?,
        None => String::new(),
    };
    let limit = Duration::from_secs_f64(a.timeout);
    let mut walls = Vec::with_capacity(a.repeat as usize);
    let mut outcome = None;
    for _ in 0..a.repeat {
        let t = Instant::now();
        outcome = Some(sandbox.run(a.slot, &program, &stdin, limit)?);
        walls.push(t.elapsed().as_secs_f64());
    }
    let o = outcome.expect("at least one run");
    walls.sort_by(f64::total_cmp);
    let median = walls[walls.len() / 2];
    match a.format {
        TextOrJson::Text => {
            let mut text = o.stdout.clone();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            out(&text)?;
            if !o.stderr.is_empty() {
                eprint!("{}", o.stderr);
            }
            eprintln!(
                "status: {}; the program ran {:.3} s; a run took {median:.3} s end to end{} ({})",
                o.status.as_str(),
                o.seconds,
                if a.repeat > 1 {
                    format!(" (median of {})", a.repeat)
                } else {
                    String::new()
                },
                sandbox.describe()
            );
        }
        TextOrJson::Json => out(&format!(
            "{}\n",
            serde_json::json!({
                "status": o.status.as_str(),
                "stdout": o.stdout,
                "stderr": o.stderr,
                "seconds": o.seconds,
                "wall_seconds_median": median,
                "runs": a.repeat,
                "isolation": sandbox.describe(),
            })
        ))?,
    }
    Ok(())
}

/// Write to stdout; a reader that went away (`| head`) is not an error.
fn out(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing to standard output")
        }
        _ => Ok(()),
    }
}
