//! The command line: clap definitions and thin dispatch onto the library. `anyhow` lives here only.
//!
//! One file per command (`run.rs`, `sql.rs`, ...), holding the function that does it; the flags
//! several commands share, and the value types of flags, in `args.rs`; printing and writing
//! results in `output.rs`. This file: the clap definitions, `main` and the dispatch.

mod args;
mod bench_env;
mod branch;
mod export;
mod files;
mod gc;
mod init;
mod model;
mod output;
mod replay;
mod report;
mod run;
mod runs;
mod sandbox;
mod schema;
mod show;
mod sql;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use crate::error::Error;
use args::{ClusterArgs, Format, ModelRole, SchemaFormat, StoreArgs, TextOrJson};
use model::ModelCommand;
use run::RunOverrides;
use sql::SqlCluster;

#[derive(Parser, Debug)]
#[command(
    name = "rla-pipe",
    version,
    about = "RLAnything-style RL as a staged dataflow: every stage committed as Parquet, queryable with SQL, replayable.",
    after_help = "Exit codes: 0 success, 1 failure, 2 usage error, 130 interrupted.\nLogs: -v, or RUST_LOG=rla_pipe=debug."
)]
pub struct Cli {
    /// Log stage events (tracing) to stderr.
    #[arg(short, long, global = true)]
    verbose: bool,
    /// Print nothing but results and errors.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run (or resume) a pipeline: every committed stage is skipped, the first missing one runs.
    Run {
        /// The iteration config (TOML), e.g. pipelines/synthetic.toml.
        pipeline: PathBuf,
        /// Store URL (a path, file://, memory://, s3://, gs://, az://); defaults to the
        /// config's run.store.
        #[arg(long)]
        store: Option<String>,
        /// Run id; defaults to the config's run.name.
        #[arg(long)]
        run_id: Option<String>,
        /// Bring the run to this many iterations (overrides run.iterations).
        #[arg(long)]
        iterations: Option<u32>,
        /// Override a config key, validated like the file: --set reward.lambda=0.5 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = args::key_value)]
        sets: Vec<String>,
        /// Stop after this stage (of the last iteration reached).
        #[arg(long, value_name = "STAGE")]
        until: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Query every committed table of a store with SQL (read-only).
    #[command(
        after_help = "Tables: tasks, trajectories, steps, rm_samples, step_rewards, policy_advantages, \
rm_advantages, update_metrics, task_accuracy, judgements, adaptations, evaluations (every committed iteration \
of every run; columns in schemas/*.md), and stage_runs (one row per committed stage manifest).\n\
Example: rla-pipe sql \"SELECT iter, avg(acc) FROM task_accuracy GROUP BY iter ORDER BY iter\""
    )]
    Sql {
        #[command(flatten)]
        store: StoreArgs,
        /// Only this run's tables (default: all runs of the store).
        #[arg(long)]
        run: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// Write the result to this file instead of printing it, in the format its extension
        /// names: .parquet, .csv or .json (an array of objects).
        #[arg(long, value_name = "FILE.parquet|.csv|.json")]
        out: Option<PathBuf>,
        /// Read the query from this file (e.g. pipelines/sql/accepted_growth.sql) instead.
        #[arg(long, short = 'f', value_name = "FILE.sql", conflicts_with = "query")]
        file: Option<PathBuf>,
        /// The query, e.g. "SELECT iter, avg(acc) FROM task_accuracy GROUP BY iter ORDER BY iter".
        #[arg(required_unless_present = "file")]
        query: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// With --cluster: MiB of Parquet each distributed scan task reads (smaller: more tasks;
        /// a query over less than one task's worth runs in this process).
        #[arg(long, value_name = "MIB", default_value_t = 16.0, requires = "cluster")]
        split_mib: f64,
    },
    /// Serve a worker of a cluster: shards of the rollouts and RM scoring and the relational
    /// stages' task ranges of `rla-pipe run --cluster`, and the queries of `rla-pipe sql
    /// --cluster`, run here, reading the store directly (give it the same store URL and
    /// credentials as the coordinator).
    #[command(after_help = "A 3-worker cluster on one machine:\n  \
rla-pipe worker --listen 127.0.0.1:7001 --store ./runs &\n  \
rla-pipe worker --listen 127.0.0.1:7002 --store ./runs &\n  \
rla-pipe worker --listen 127.0.0.1:7003 --store ./runs &\n  \
rla-pipe run pipelines/gridnav.toml --cluster 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")]
    Worker {
        /// Address to listen on (host:port; port 0 picks a free one, printed on stdout).
        #[arg(long, value_name = "HOST:PORT")]
        listen: std::net::SocketAddr,
        /// Store URL the worker reads: the coordinator's store (a path, file://, s3://, gs://, az://).
        #[arg(long = "store", env = "RLA_PIPE_STORE", default_value = "./runs")]
        store: String,
        /// Memory budget of the worker's queries in MiB (operators spill to disk beyond it).
        #[arg(long, value_name = "MIB", default_value_t = 1024)]
        memory_limit_mib: u64,
    },
    /// Audit a committed iteration (`--iter N --verify`: re-execute it from its committed inputs
    /// and compare digests), or ask a counterfactual (`--from N --set k=v --into NEW`: a branch
    /// run that shares iterations < N with this one and re-executes from N with the changed config).
    #[command(
        after_help = "Examples:\n  rla-pipe replay --run gridnav --iter 1 --verify\n  \
rla-pipe replay --run gridnav --from 2 --set reward.lambda=0.5 --into gridnav-lambda05\n  \
rla-pipe report gridnav gridnav-lambda05 --out compare.html"
    )]
    Replay {
        #[command(flatten)]
        store: StoreArgs,
        /// The run to audit, or the parent of the branch.
        #[arg(long)]
        run: String,
        /// The iteration to verify.
        #[arg(long, requires = "verify", conflicts_with_all = ["from", "into"])]
        iter: Option<u32>,
        /// Only this stage (with --verify).
        #[arg(long, requires = "verify")]
        stage: Option<String>,
        /// Verify: exit 1 naming the stage and table that differ.
        #[arg(long, requires = "iter")]
        verify: bool,
        /// Branch: share iterations before this one with --run and execute from it; from it on,
        /// a stage whose settings, seed and inputs are the parent's is shared too (its
        /// committed outputs are what it would compute).
        #[arg(long, value_name = "N", requires = "into")]
        from: Option<u32>,
        /// Branch: the new run's id.
        #[arg(long, value_name = "NEW_ID", requires = "from")]
        into: Option<String>,
        /// Branch: override a key of the parent's config (repeatable), e.g. --set reward.lambda=0.5.
        #[arg(long = "set", value_name = "KEY=VALUE", requires = "into", value_parser = args::key_value)]
        sets: Vec<String>,
        /// Branch: bring it to this many iterations (default: the parent's run.iterations, or
        /// the value --set gives).
        #[arg(long, requires = "into")]
        iterations: Option<u32>,
        /// Branch: execute every stage from N, also those the parent's committed outputs would
        /// answer (a check that this build reproduces the parent, e.g. with no --set).
        #[arg(long, requires = "into")]
        recompute: bool,
    },
    /// List a run's committed data files (URL, table, iteration, rows, bytes, blake3): exactly
    /// the files `sql` reads, for Polars, DuckDB or pyarrow. Uncommitted attempts never appear.
    #[command(
        after_help = "Text: one file per line, tab-separated: url table iter rows bytes blake3 \
(`cut -f1` gives the URLs). JSON: [{url, path, run, table, iter, stage, rows, bytes, blake3, written_by}].\n\
Python: files = [f[\"url\"] for f in json.loads(subprocess.check_output([\"rla-pipe\", \"files\", \"--run\", \"gridnav\", \"--table\", \"steps\", \"--format\", \"json\"]))]\n\
        polars.scan_parquet(files) / duckdb.read_parquet(files) / pyarrow.dataset.dataset(files)"
    )]
    Files {
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        run: String,
        /// Only this table (default: every table).
        #[arg(long)]
        table: Option<String>,
        /// Only this iteration.
        #[arg(long, conflicts_with = "iters")]
        iter: Option<u32>,
        /// Only these iterations: A..B (B excluded) or A..=B.
        #[arg(long, value_name = "A..B")]
        iters: Option<String>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
    /// Print the schema of every table (or one) from this build's code: columns, Arrow types,
    /// nullability, meanings, row order (the key) and the schema fingerprint manifests record.
    Schema {
        /// Only this table.
        table: Option<String>,
        #[arg(long, value_enum, default_value_t = SchemaFormat::Md)]
        format: SchemaFormat,
    },
    /// List the runs of a store.
    Runs {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show a run: config, iterations and stages (or one iteration's files with --iter).
    Show {
        #[command(flatten)]
        store: StoreArgs,
        /// Run id (or `--run ID`, as `replay`, `files` and `sql` take it).
        #[arg(required_unless_present = "run", conflicts_with = "run")]
        id: Option<String>,
        /// Run id, as the other commands take it.
        #[arg(long, value_name = "ID")]
        run: Option<String>,
        #[arg(long)]
        iter: Option<u32>,
    },
    /// Delete data files no committed manifest names (interrupted attempts, lost races).
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
        /// List what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Keep unreferenced files younger than this many seconds (a writer may still commit them).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
    },
    /// Measure an environment alone: uniform random play on one core, steps per second.
    BenchEnv {
        /// A pipeline whose [env] section names the environment and its difficulty.
        pipeline: PathBuf,
        /// Steps to take.
        #[arg(long, default_value_t = 1_000_000)]
        steps: u64,
        /// Override a config key (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = args::key_value)]
        sets: Vec<String>,
    },
    /// Write one self-contained HTML report (inline SVG charts) of one or more runs: success,
    /// training games against held-out games, reward-model accuracy, the training signal
    /// (reward, advantage spread, the learning signal's shares, policy entropy, episode length),
    /// adaptation (with the accepted-task growth fit), stage times, and update metrics (loss,
    /// KL, clip fraction, gradient norm, learning rate). Several runs overlay their curves, one
    /// colour per run.
    Report {
        #[command(flatten)]
        store: StoreArgs,
        /// Run ids (at least one).
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<String>,
        /// The HTML file to write.
        #[arg(long, value_name = "FILE.html", default_value = "report.html")]
        out: PathBuf,
        /// Also write every chart as a standalone SVG file into this directory.
        #[arg(long, value_name = "DIR")]
        svg_dir: Option<PathBuf>,
        /// Keep the report current while the runs are going: re-write it every `--interval`
        /// seconds (the page reloads itself in a browser) until every run has committed its
        /// last iteration, or Ctrl-C. A run that has not started yet is waited for.
        #[arg(long)]
        watch: bool,
        /// Seconds between two writes of a watched report.
        #[arg(long, value_name = "SECS", default_value_t = 10.0, requires = "watch")]
        interval: f64,
    },
    /// Write a trained model of a run as a Hugging Face directory (config.json, tokenizer files,
    /// model.safetensors) that `transformers` loads as it is; the run must have started from a
    /// pretrained model (`policy.init` / `reward_model.init = "hf:DIR"`). A run that trained
    /// low-rank adapters (`*.lora`) exports a PEFT adapter directory (adapter_config.json,
    /// adapter_model.safetensors), or with `--merge` the model with the adapters folded in.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        run: String,
        /// The model as it stood at the end of this iteration.
        #[arg(long)]
        iter: u32,
        #[arg(long, value_enum, default_value_t = ModelRole::Policy)]
        model: ModelRole,
        /// The directory to write (must not exist or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Adapters: write the base model with them merged into its weights (a Hugging Face
        /// model directory) instead of the PEFT adapter directory.
        #[arg(long)]
        merge: bool,
        /// Export even though the base model directory's weights changed since the run
        /// started from them (by default a refusal naming both digests).
        #[arg(long)]
        force: bool,
        /// The base model's name to record in the adapter directory
        /// (`base_model_name_or_path`, e.g. a Hugging Face Hub id); by default the base
        /// directory's absolute path.
        #[arg(long, value_name = "NAME")]
        base_name: Option<String>,
    },
    /// Pretrained Hugging Face models (Llama, Qwen2, Qwen3): inspect a model directory, or
    /// generate text with it.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Run a Python program in the coding setting's sandbox exactly as `execute` runs the
    /// policy's programs, and print its output and how it ended (ok, crash, timeout, memory,
    /// output_limit); without a program, probe and describe the isolation in force.
    #[command(after_help = "Examples:\n  rla-pipe sandbox\n  \
rla-pipe sandbox solution.py --stdin input.txt --timeout 2\n  \
rla-pipe sandbox solution.py --pipeline pipelines/coding.toml --set env.coding.sandbox.memory_mib=256 --format json\n  \
rla-pipe sandbox empty.py --repeat 50   (the sandbox's own cost per run)\n\
The exit status is 0 whenever the program ran, whatever it did; 1 when the sandbox could not run it.")]
    Sandbox(sandbox::SandboxArgs),
    /// Write a commented iteration.toml with every key at its default.
    Init {
        /// Directory to write iteration.toml into.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // `report --watch` stops on Ctrl-C itself (a normal end: the last report is written).
    let stops_itself = matches!(cli.command, Command::Report { watch: true, .. });
    let result = runtime.block_on(async {
        if stops_itself {
            return dispatch(cli).await;
        }
        tokio::select! {
            r = dispatch(cli) => r,
            _ = tokio::signal::ctrl_c() => Err(Error::Interrupted(
                "stopped before the current stage committed; nothing partial is visible. Run the same command to resume.".into(),
            ).into()),
        }
    });
    match result {
        Ok(code) => code,
        // The reader of stdout went away (`rla-pipe sql ... | head`): a normal end.
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::from(match e.downcast_ref::<Error>() {
                Some(Error::Interrupted(_)) => 130,
                Some(Error::Usage(_)) => 2,
                _ => 1,
            })
        }
    }
}

/// `print!` panics when stdout's reader has gone (Rust ignores SIGPIPE, so a write to a closed
/// pipe fails instead of ending the process, as it must: the sandbox and the environments write
/// to their children's pipes). A panic of that kind ends the command quietly with exit 0, as
/// `| head` expects of any Unix tool; every other panic is reported as before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(0);
        }
        report(info)
    }));
}

/// A command's write to stdout found its reader gone ([`output::StdoutClosed`]). Only stdout's
/// writes are marked so: a broken pipe to an environment or a sandboxed program stays an error.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<output::StdoutClosed>())
}

fn init_tracing(verbose: bool) {
    let default = if verbose { "rla_pipe=info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours on a terminal only: a log redirected to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// The error's message: the CLI's own context, then the library error, whose message already
/// includes the text of its sources (so they are not repeated).
fn message(e: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in e.chain() {
        parts.push(cause.to_string());
        if cause.is::<Error>() {
            break;
        }
    }
    parts.join(": ")
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let quiet = cli.quiet;
    match cli.command {
        Command::Run {
            pipeline,
            store,
            run_id,
            iterations,
            sets,
            until,
            cluster,
        } => {
            let overrides = RunOverrides {
                store,
                iterations,
                cluster: cluster.addresses(),
            };
            run::run(&pipeline, run_id, &sets, overrides, until.as_deref(), quiet).await?
        }
        Command::Sql {
            store,
            run,
            format,
            out,
            file,
            query,
            cluster,
            split_mib,
        } => {
            let on = SqlCluster {
                cluster: cluster.addresses(),
                split_mib,
            };
            let query = sql::query_text(query, file)?;
            sql::sql(&store, run.as_deref(), format, out, &query, &on, quiet).await?
        }
        Command::Worker {
            listen,
            store,
            memory_limit_mib,
        } => worker::worker(listen, &store, memory_limit_mib).await?,
        Command::Replay {
            store,
            run,
            iter,
            stage,
            verify,
            from,
            into,
            sets,
            iterations,
            recompute,
        } => match (iter, from, into) {
            (Some(iter), _, _) if verify => {
                replay::replay_verify(&store, &run, iter, stage.as_deref()).await?
            }
            (_, Some(from), Some(into)) => {
                let how = branch::How {
                    iterations,
                    recompute,
                    quiet,
                };
                branch::branch(&store, &run, from, &into, sets, how).await?
            }
            _ => {
                return Err(Error::usage(
                    "give --iter N --verify (audit an iteration), or --from N --into NEW_ID [--set KEY=VALUE ...] (a branch run)",
                )
                .into());
            }
        },
        Command::Report {
            store,
            runs,
            out,
            svg_dir,
            watch,
            interval,
        } => {
            let watch = watch.then_some(interval);
            report::report(&store, &runs, &out, svg_dir, watch, quiet).await?
        }
        Command::Runs { store } => runs::list_runs(&store).await?,
        Command::Schema { table, format } => schema::print_schema(table.as_deref(), format)?,
        Command::Files {
            store,
            run,
            table,
            iter,
            iters,
            format,
        } => {
            let range = match (iter, iters) {
                (Some(i), _) => i..=i,
                (None, Some(r)) => files::parse_iters(&r)?,
                (None, None) => 0..=u32::MAX,
            };
            files::files(&store, &run, table.as_deref(), range, format).await?
        }
        Command::Show {
            store,
            id,
            run,
            iter,
        } => {
            let id = id.or(run).context("name the run: ID or --run ID")?;
            show::show(&store, &id, iter).await?
        }
        Command::Gc {
            store,
            run,
            dry_run,
            grace_secs,
        } => gc::collect_garbage(&store, run.as_deref(), dry_run, grace_secs).await?,
        Command::BenchEnv {
            pipeline,
            steps,
            sets,
        } => bench_env::bench_env(&pipeline, steps, &sets)?,
        Command::Model(command) => model::model(command)?,
        Command::Export {
            store,
            run,
            iter,
            model,
            out,
            merge,
            force,
            base_name,
        } => {
            export::export(
                &store,
                &run,
                iter,
                model,
                &out,
                merge,
                force,
                base_name.as_deref(),
            )
            .await?
        }
        Command::Sandbox(args) => sandbox::sandbox(args)?,
        Command::Init { dir } => init::init(&dir)?,
    }
    Ok(ExitCode::SUCCESS)
}
