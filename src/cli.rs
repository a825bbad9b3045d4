//! The command line: clap definitions and thin dispatch onto the library. `anyhow` lives here only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, Config};
use crate::engine::{Engine, replay};
use crate::error::Error;
use crate::model::Device;
use crate::model::hf::{self, generate_text};
use crate::store::{Store, catalog, gc, layout};

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
        #[arg(long = "set", value_name = "KEY=VALUE")]
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
        /// Write the result as Parquet to this file instead of printing it.
        #[arg(long, value_name = "FILE.parquet")]
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
        /// Branch: share iterations before this one with --run and execute from it.
        #[arg(long, value_name = "N", requires = "into")]
        from: Option<u32>,
        /// Branch: the new run's id.
        #[arg(long, value_name = "NEW_ID", requires = "from")]
        into: Option<String>,
        /// Branch: override a key of the parent's config (repeatable), e.g. --set reward.lambda=0.5.
        #[arg(long = "set", value_name = "KEY=VALUE", requires = "into")]
        sets: Vec<String>,
        /// Branch: bring it to this many iterations (default: the parent's run.iterations, or
        /// the value --set gives).
        #[arg(long, requires = "into")]
        iterations: Option<u32>,
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
        /// Run id.
        id: String,
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
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Write one self-contained HTML report (inline SVG charts) of one or more runs: success,
    /// reward-model accuracy, adaptation (with the accepted-task growth fit), stage times, and
    /// update metrics. Several runs overlay their curves.
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
    },
    /// Pretrained Hugging Face models (Llama, Qwen2, Qwen3): inspect a model directory, or
    /// generate text with it.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Write a commented iteration.toml with every key at its default.
    Init {
        /// Directory to write iteration.toml into.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Architecture, parameters, dtypes, vocabulary and weights digest of a model directory
    /// (config.json + model.safetensors[.index.json] + tokenizer.json); every tensor is checked
    /// against config.json, none is loaded.
    Inspect {
        /// The model directory.
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
    /// Continue a prompt: greedy at --temperature 0, else sampled (top-p) with --seed. Stops at
    /// the tokenizer's EOS or --max-tokens.
    Generate {
        /// The model directory.
        dir: PathBuf,
        /// The prompt; repeat it to generate several prompts as one batch (with the KV cache:
        /// one forward per token for all of them).
        #[arg(long, required = true)]
        prompt: Vec<String>,
        /// Apply the tokenizer's chat template (the prompt is the user message).
        #[arg(long)]
        chat: bool,
        /// A system message (with --chat).
        #[arg(long, requires = "chat")]
        system: Option<String>,
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the model runs.
        #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
        device: DeviceArg,
        /// json: an object with prompt_ids, generated_ids and text (and the digest, timings);
        /// an array of them for several prompts.
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum ModelRole {
    Policy,
    Rm,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum SchemaFormat {
    Md,
    Json,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum TextOrJson {
    Text,
    Json,
}

/// `run.device`'s values, for commands without a config.
#[derive(Copy, Clone, Debug, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
    Ndarray,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Device {
        match d {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
            DeviceArg::Ndarray => Device::Ndarray,
        }
    }
}

/// The store a read command opens (declared once, flattened into each command).
#[derive(Args, Debug)]
struct StoreArgs {
    /// Store URL: a path, file://PATH, memory://, s3://bucket/prefix, gs://, az://.
    #[arg(long = "store", env = "RLA_PIPE_STORE", default_value = "./runs")]
    url: String,
}

/// The workers a command runs on (`run`: rollouts, RM scoring and the relational stages,
/// overriding `run.cluster`; `sql`: the query).
#[derive(Args, Debug)]
struct ClusterArgs {
    /// Run on these workers (`rla-pipe worker`), comma-separated host:port (`run`: the same
    /// bytes as in this process; `sql`: float sums may differ in the last bits).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "HOST:PORT,...",
        env = "RLA_PIPE_CLUSTER"
    )]
    cluster: Vec<String>,
}

impl ClusterArgs {
    /// The addresses given, blanks dropped (`RLA_PIPE_CLUSTER=` set empty is no cluster).
    fn addresses(self) -> Vec<String> {
        self.cluster
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect()
    }
}

impl StoreArgs {
    /// The store, which must exist (read commands never create one).
    fn open(&self) -> Result<Store> {
        Ok(Store::open_existing(&self.url)?)
    }
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Format {
    Table,
    Csv,
    Json,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
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
    let result = runtime.block_on(async {
        tokio::select! {
            r = dispatch(cli) => r,
            _ = tokio::signal::ctrl_c() => Err(Error::Interrupted(
                "stopped before the current stage committed; nothing partial is visible. Run the same command to resume.".into(),
            ).into()),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            let interrupted = matches!(e.downcast_ref::<Error>(), Some(Error::Interrupted(_)));
            ExitCode::from(if interrupted { 130 } else { 1 })
        }
    }
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
            run(&pipeline, run_id, &sets, overrides, until.as_deref(), quiet).await?
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
            let query = query_text(query, file)?;
            sql(&store, run.as_deref(), format, out, &query, &on, quiet).await?
        }
        Command::Worker {
            listen,
            store,
            memory_limit_mib,
        } => worker(listen, &store, memory_limit_mib).await?,
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
        } => match (iter, from, into) {
            (Some(iter), _, _) if verify => {
                replay_verify(&store, &run, iter, stage.as_deref()).await?
            }
            (_, Some(from), Some(into)) => {
                branch(&store, &run, from, &into, sets, iterations, quiet).await?
            }
            _ => bail!(
                "give --iter N --verify (audit an iteration), or --from N --into NEW_ID [--set KEY=VALUE ...] (a branch run)"
            ),
        },
        Command::Report {
            store,
            runs,
            out,
            svg_dir,
        } => report(&store, &runs, &out, svg_dir, quiet).await?,
        Command::Runs { store } => list_runs(&store).await?,
        Command::Schema { table, format } => print_schema(table.as_deref(), format)?,
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
                (None, Some(r)) => parse_iters(&r)?,
                (None, None) => 0..=u32::MAX,
            };
            files(&store, &run, table.as_deref(), range, format).await?
        }
        Command::Show { store, id, iter } => show(&store, &id, iter).await?,
        Command::Gc {
            store,
            run,
            dry_run,
            grace_secs,
        } => collect_garbage(&store, run.as_deref(), dry_run, grace_secs).await?,
        Command::BenchEnv {
            pipeline,
            steps,
            sets,
        } => bench_env(&pipeline, steps, &sets)?,
        Command::Model(command) => model(command)?,
        Command::Export {
            store,
            run,
            iter,
            model,
            out,
            merge,
        } => export(&store, &run, iter, model, &out, merge).await?,
        Command::Init { dir } => init(&dir)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `run`'s flags that override keys of the config's `[run]` section.
struct RunOverrides {
    store: Option<String>,
    iterations: Option<u32>,
    cluster: Vec<String>,
}

impl RunOverrides {
    fn apply(self, cfg: &mut Config) -> Result<()> {
        if let Some(s) = self.store {
            cfg.run.store = s;
        }
        if !self.cluster.is_empty() {
            crate::config::cluster_urls(&self.cluster)
                .map_err(|e| anyhow::anyhow!("--cluster: {e}"))?;
            cfg.run.cluster = self.cluster;
        }
        if let Some(n) = self.iterations {
            if n == 0 {
                bail!("--iterations must be at least 1");
            }
            cfg.run.iterations = n;
        }
        Ok(())
    }
}

async fn run(
    pipeline: &std::path::Path,
    run_id: Option<String>,
    sets: &[String],
    overrides: RunOverrides,
    until: Option<&str>,
    quiet: bool,
) -> Result<()> {
    let mut cfg = Config::load(pipeline, sets)?;
    overrides.apply(&mut cfg)?;
    let run_id = run_id.unwrap_or_else(|| cfg.run.name.clone());
    let store = Store::open(&cfg.run.store)?;
    let dag = crate::pipeline::dag(&cfg)?;
    let iterations = cfg.run.iterations;
    let mut engine = Engine::open(store, &run_id, cfg, dag).await?;
    engine.verbose = !quiet;
    engine.run(iterations, until).await?;
    if !quiet {
        eprintln!(
            "run {run_id}: done. Query it with: rla-pipe sql --store {} --run {run_id} \"SELECT * FROM stage_runs\"",
            engine.store().url()
        );
    }
    Ok(())
}

async fn sql(
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
                bail!("--split-mib must be a positive number of MiB");
            }
            let split = (on.split_mib * 1024.0 * 1024.0).max(1.0) as usize;
            crate::sql::cluster_session(&store, run, &cluster, split).await?
        }
    };
    let (schema, batches) = crate::sql::query(&ctx, query).await?;
    match out {
        Some(path) => {
            let rows = write_parquet(&path, schema, &batches)?;
            if !quiet {
                eprintln!("wrote {rows} rows to {}", path.display());
            }
        }
        None => print_batches(format, &batches)?,
    }
    Ok(())
}

/// `sql`'s query: the argument, or the text of `--file`.
fn query_text(query: Option<String>, file: Option<PathBuf>) -> Result<String> {
    Ok(match (query, file) {
        (Some(q), _) => q,
        (None, Some(path)) => std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read the query file {}", path.display()))?,
        (None, None) => bail!("give a query, or --file FILE.sql"),
    })
}

/// `sql --cluster` and `--split-mib`.
struct SqlCluster {
    cluster: Vec<String>,
    split_mib: f64,
}

/// `rla-pipe worker`: serve until Ctrl-C / SIGTERM.
async fn worker(listen: std::net::SocketAddr, store: &str, memory_limit_mib: u64) -> Result<()> {
    if memory_limit_mib < 64 {
        bail!("--memory-limit-mib must be at least 64");
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

async fn replay_verify(store: &StoreArgs, run: &str, iter: u32, stage: Option<&str>) -> Result<()> {
    let store = store.open()?;
    layout::validate_run_id(run)?;
    let report = replay::verify(&store, run, iter, stage, crate::pipeline::dag).await?;
    for v in &report {
        println!(
            "ok  {:<14} {:<18} {:>10} rows  blake3 {}  ({})",
            v.stage,
            v.table,
            v.rows,
            &v.digest[..16],
            v.how
        );
    }
    println!(
        "iteration {iter} of run {run}: verified ({} tables)",
        report.len()
    );
    Ok(())
}

async fn branch(
    store: &StoreArgs,
    parent: &str,
    from: u32,
    into: &str,
    overrides: Vec<String>,
    iterations: Option<u32>,
    quiet: bool,
) -> Result<()> {
    let store = store.open()?;
    let branch = crate::store::manifest::Branch {
        parent: parent.to_string(),
        from_iter: from,
        overrides,
    };
    let mut engine = crate::engine::branch::open(store, into, branch, crate::pipeline::dag).await?;
    engine.verbose = !quiet;
    let iterations = iterations.unwrap_or(engine.config().run.iterations);
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if !quiet {
        eprintln!(
            "run {into}: a branch of {parent}; iterations 0..{from} shared, executing {from}..{iterations}"
        );
    }
    engine.run(iterations, None).await?;
    if !quiet {
        eprintln!(
            "run {into}: done. Compare: rla-pipe report --store {} {parent} {into} --out compare.html",
            engine.store().url()
        );
    }
    Ok(())
}

async fn report(
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
            "wrote {} ({} charts, {} runs)",
            out.display(),
            report.charts.len(),
            runs.len()
        );
    }
    Ok(())
}

fn print_schema(table: Option<&str>, format: SchemaFormat) -> Result<()> {
    let all = crate::schema::all_tables();
    let tables: Vec<_> = match table {
        None => all,
        Some(t) => {
            let names: Vec<_> = all.iter().map(|d| d.name).collect();
            let Some(d) = all.iter().find(|d| d.name == t) else {
                bail!("no table {t:?} (tables: {})", names.join(", "));
            };
            vec![d.clone()]
        }
    };
    match format {
        SchemaFormat::Json => {
            let v: Vec<_> = tables.iter().map(crate::schema::to_json).collect();
            let v = if table.is_some() {
                v.into_iter().next().expect("one table")
            } else {
                serde_json::Value::Array(v)
            };
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        SchemaFormat::Md => {
            for (i, t) in tables.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", crate::schema::markdown(t.name).unwrap_or_default());
            }
        }
    }
    Ok(())
}

/// `A..B` (B excluded) or `A..=B`.
fn parse_iters(text: &str) -> Result<std::ops::RangeInclusive<u32>> {
    let bad =
        || anyhow::anyhow!("--iters {text:?}: expected A..B (B excluded) or A..=B, e.g. 0..3");
    let (a, b, inclusive) = if let Some((a, b)) = text.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = text.split_once("..") {
        (a, b, false)
    } else {
        return Err(bad());
    };
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive { Some(b) } else { b.checked_sub(1) };
    match end {
        Some(e) if e >= a => Ok(a..=e),
        _ => bail!("--iters {text:?} is empty"),
    }
}

async fn files(
    store: &StoreArgs,
    run: &str,
    table: Option<&str>,
    iters: std::ops::RangeInclusive<u32>,
    format: TextOrJson,
) -> Result<()> {
    let store = store.open()?;
    layout::validate_run_id(run)?;
    let tables = crate::schema::data_table_names();
    if let Some(t) = table
        && !tables.contains(&t)
    {
        bail!("--table {t}: no such table (tables: {})", tables.join(", "));
    }
    let state = catalog::load_run(&store, run).await?;
    let files: Vec<_> = state
        .files()
        .into_iter()
        .filter(|f| table.is_none_or(|t| f.file.table == t) && iters.contains(&f.iter))
        .collect();
    match format {
        TextOrJson::Text => {
            for f in &files {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    store.external_url(&f.file.path),
                    f.file.table,
                    f.iter,
                    f.file.rows,
                    f.file.bytes,
                    f.file.digest
                );
            }
        }
        TextOrJson::Json => {
            let rows: Vec<_> = files
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "url": store.external_url(&f.file.path),
                        "path": f.file.path,
                        "run": f.run,
                        "table": f.file.table,
                        "iter": f.iter,
                        "stage": f.stage,
                        "rows": f.file.rows,
                        "bytes": f.file.bytes,
                        "blake3": f.file.digest,
                        "written_by": f.written_by,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
    }
    Ok(())
}

async fn list_runs(store: &StoreArgs) -> Result<()> {
    let store = store.open()?;
    let runs = if catalog::run_ids(&store).await?.is_empty() {
        Vec::new()
    } else {
        catalog::load_runs(&store, None).await?
    };
    if runs.is_empty() {
        println!("no runs in {}", store.url());
    } else {
        println!(
            "{:<24} {:>10} {:>8}  {:<12}  {:<20}  code",
            "run", "iterations", "stages", "config", "created"
        );
    }
    for r in runs {
        let complete = r.iters.values().filter(|i| i.complete.is_some()).count();
        let stages: usize = r.iters.values().map(|i| i.stages.len()).sum();
        println!(
            "{:<24} {:>10} {:>8}  {:<12}  {:<20}  {}",
            r.run.run_id,
            complete,
            stages,
            &r.run.config_hash[..12],
            r.run.created_at,
            r.run.code_version
        );
    }
    Ok(())
}

async fn show(store: &StoreArgs, id: &str, iter: Option<u32>) -> Result<()> {
    let store = store.open()?;
    let r = catalog::load_run(&store, id).await?;
    println!("run        {}", r.run.run_id);
    println!("created    {}", r.run.created_at);
    println!("code       {}", r.run.code_version);
    println!("config     {}", r.run.config_hash);
    if let Some(b) = &r.run.branch {
        println!(
            "branch of  {} from iteration {} (iterations before it shared){}",
            b.parent,
            b.from_iter,
            if b.overrides.is_empty() {
                String::new()
            } else {
                format!(", --set {}", b.overrides.join(" --set "))
            }
        );
    }
    let status = |it: &catalog::IterState| {
        if it.complete.is_some() {
            "complete"
        } else {
            "incomplete"
        }
    };
    let Some(n) = iter else {
        println!("config:\n{}", serde_json::to_string_pretty(&r.run.config)?);
        println!(
            "\n{:>5}  {:<16} {:>12} {:>9}  status",
            "iter", "stage", "rows", "seconds"
        );
        for (i, it) in &r.iters {
            for c in it.stages.values() {
                let rows: u64 = c.manifest.outputs.iter().map(|o| o.rows).sum();
                println!(
                    "{i:>5}  {:<16} {rows:>12} {:>9.2}  {}",
                    c.manifest.stage, c.manifest.seconds, c.manifest.status
                );
            }
            println!("{i:>5}  {:<16} {}", "_iteration", status(it));
        }
        return Ok(());
    };
    let it = r
        .iters
        .get(&n)
        .with_context(|| format!("run {id:?} has no committed iteration {n}"))?;
    for c in it.stages.values() {
        println!(
            "\nstage {}  (seed {}, config {}, {:.2}s, manifest blake3 {})",
            c.manifest.stage,
            c.manifest.seed,
            &c.manifest.config_hash[..12],
            c.manifest.seconds,
            &c.digest[..16]
        );
        for input in &c.manifest.inputs {
            println!("  in   {:<30} {}", input.tables.join(","), input.path);
        }
        for o in &c.manifest.outputs {
            println!(
                "  out  {:<18} {:>10} rows {:>12} bytes  blake3 {}  {}",
                o.table,
                o.rows,
                o.bytes,
                &o.digest[..16],
                o.path
            );
        }
    }
    println!("\niteration {n}: {}", status(it));
    Ok(())
}

async fn collect_garbage(
    store: &StoreArgs,
    run: Option<&str>,
    dry_run: bool,
    grace_secs: u64,
) -> Result<()> {
    let store = store.open()?;
    let verb = if dry_run { "would remove" } else { "removed" };
    let orphans = gc::collect(&store, run, grace_secs, dry_run, |o| {
        println!("{verb} {}  ({} bytes)", o.path, o.bytes)
    })
    .await?;
    println!(
        "{verb} {} unreferenced files ({} bytes)",
        orphans.len(),
        orphans.iter().map(|o| o.bytes).sum::<u64>()
    );
    Ok(())
}

fn bench_env(pipeline: &std::path::Path, steps: u64, sets: &[String]) -> Result<()> {
    let cfg = Config::load(pipeline, sets)?;
    let env = crate::env::from_config(&cfg.env)?;
    let t0 = std::time::Instant::now();
    let tasks = env.generate(cfg.run.seed, cfg.env.initial_tasks)?;
    println!(
        "{}: {} tasks generated in {:.3} s (textworld: games made, or taken from its cache)",
        env.name(),
        tasks.len(),
        t0.elapsed().as_secs_f64()
    );
    let (n, secs) = crate::env::throughput(env.as_ref(), &tasks, steps, cfg.run.seed)?;
    println!(
        "{}: {n} steps in {secs:.3} s on one core = {:.0} steps/s ({} tasks, uniform random play)",
        env.name(),
        n as f64 / secs,
        tasks.len()
    );
    Ok(())
}

fn init(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("iteration.toml");
    if path.exists() {
        bail!("{} already exists; not overwriting it", path.display());
    }
    std::fs::write(&path, config::DEFAULT_TOML)
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote {}; run it with: rla-pipe run {}",
        path.display(),
        path.display()
    );
    Ok(())
}

fn print_batches(format: Format, batches: &[RecordBatch]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        Format::Table => {
            use std::io::Write;
            writeln!(
                out,
                "{}",
                arrow::util::pretty::pretty_format_batches(batches)?
            )?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::ArrayWriter::new(&mut out);
            w.write_batches(&batches.iter().collect::<Vec<_>>())?;
            w.finish()?;
            use std::io::Write;
            writeln!(out)?;
        }
    }
    Ok(())
}

/// Write query results to a local Parquet file atomically (temp file, then rename).
/// A temp file beside `path`, to be persisted onto it once complete (readers of `path` never
/// see a half-written file).
fn temp_beside(path: &std::path::Path) -> Result<tempfile::NamedTempFile> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    tempfile::NamedTempFile::new_in(dir).with_context(|| {
        format!(
            "cannot write {}: creating a temp file in {}",
            path.display(),
            dir.display()
        )
    })
}

/// Write a file whole or not at all.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn write_parquet(
    path: &std::path::Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<u64> {
    let tmp = temp_beside(path)?;
    let props = crate::store::parquet::writer_properties();
    let mut w = parquet::arrow::ArrowWriter::try_new(tmp.reopen()?, schema, Some(props))?;
    let mut rows = 0;
    for b in batches {
        w.write(b)?;
        rows += b.num_rows() as u64;
    }
    w.close()?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(rows)
}

fn model(command: ModelCommand) -> Result<()> {
    match command {
        ModelCommand::Inspect { dir, format } => {
            let i = hf::inspect(&dir)?;
            match format {
                TextOrJson::Json => println!("{}", serde_json::to_string_pretty(&i)?),
                TextOrJson::Text => {
                    let dtypes: Vec<String> =
                        i.dtypes.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
                    println!("model         {}", i.dir);
                    println!("architecture  {}", i.architecture);
                    println!(
                        "parameters    {} ({:.1} M)",
                        i.parameters,
                        i.parameters as f64 / 1e6
                    );
                    println!("dtype         {}", dtypes.join(", "));
                    println!(
                        "shape         {} layers, hidden {}, {} query / {} key-value heads of {}, mlp {}",
                        i.layers, i.hidden, i.heads, i.kv_heads, i.head_dim, i.intermediate
                    );
                    println!(
                        "vocabulary    {} (tokenizer {}), tied embeddings: {}",
                        i.vocab, i.tokenizer_vocab, i.tied_embeddings
                    );
                    if let Some(p) = i.max_positions {
                        println!("context       {p} positions");
                    }
                    println!(
                        "chat template {}, EOS ids {:?}",
                        if i.chat_template { "yes" } else { "no" },
                        i.eos_ids
                    );
                    println!(
                        "weights       {} ({:.1} MB)",
                        i.weight_files.join(", "),
                        i.weight_bytes as f64 / 1e6
                    );
                    println!("digest        blake3:{}", i.digest);
                }
            }
        }
        ModelCommand::Generate {
            dir,
            prompt,
            chat,
            system,
            max_tokens,
            temperature,
            top_p,
            seed,
            device,
            format,
        } => {
            if !(0.0..=1.0).contains(&top_p) || top_p == 0.0 || temperature < 0.0 {
                bail!("--top-p must be in (0, 1] and --temperature ≥ 0");
            }
            let request = hf::GenerateRequest {
                prompts: prompt,
                chat,
                system,
                sampling: hf::Sampling {
                    temperature,
                    top_p,
                    max_tokens,
                    seed,
                },
            };
            let device = Device::from(device);
            let replies = crate::on_backend!(device, infer, generate_text(&dir, &request))?;
            match format {
                TextOrJson::Json if replies.len() == 1 => {
                    println!("{}", serde_json::to_string_pretty(&replies[0])?)
                }
                TextOrJson::Json => println!("{}", serde_json::to_string_pretty(&replies)?),
                TextOrJson::Text => {
                    for (i, g) in replies.iter().enumerate() {
                        if replies.len() > 1 {
                            println!("--- prompt {}", i + 1);
                        }
                        println!("{}", g.text);
                    }
                    let g = &replies[0];
                    let prompt: usize = replies.iter().map(|g| g.prompt_ids.len()).sum();
                    let generated: usize = replies.iter().map(|g| g.generated_ids.len()).sum();
                    eprintln!(
                        "({} prompt + {} generated tokens, {:.1} tokens/s, loaded in {:.1} s)",
                        prompt, generated, g.tokens_per_second, g.load_seconds
                    );
                }
            }
        }
    }
    Ok(())
}

async fn export(
    store: &StoreArgs,
    run: &str,
    iter: u32,
    role: ModelRole,
    out: &std::path::Path,
    merge: bool,
) -> Result<()> {
    let name = match role {
        ModelRole::Policy => crate::model::POLICY,
        ModelRole::Rm => crate::model::RM,
    };
    let store = store.open()?;
    let ck = crate::engine::checkpoints::committed_checkpoint(&store, run, iter, name).await?;
    let Some(origin) = ck.run.models.get(name) else {
        bail!(
            "run {run:?} trains rla-pipe's small transformer as its {name} model; export writes \
             Hugging Face directories of runs that started from one (`{}.init = \"hf:DIR\"`)",
            if name == crate::model::POLICY {
                "policy"
            } else {
                "reward_model"
            }
        );
    };
    // `hf:DIR blake3:DIGEST`: the architecture and tokenizer come from DIR.
    let (spec, recorded) = origin
        .rsplit_once(" blake3:")
        .unwrap_or((origin.as_str(), ""));
    let dir = std::path::PathBuf::from(spec.strip_prefix("hf:").unwrap_or(spec));
    if !dir.join("config.json").exists() {
        bail!(
            "run {run:?} started its {name} model from {origin}; {} is needed for the \
             architecture and tokenizer and is not there",
            dir.display()
        );
    }
    if hf::directory_digest(&dir).ok().as_deref() != Some(recorded) {
        eprintln!(
            "warning: the weights in {} changed since run {run:?} started from them; its \
             config.json and tokenizer files are used as they are now",
            dir.display()
        );
    }
    // The run's own settings say whether it trained adapters (a run.json from before adapters
    // existed has no `lora` section: full weights).
    let section = if name == crate::model::POLICY {
        "policy"
    } else {
        "reward_model"
    };
    let lora_config: crate::model::LoraConfig = match ck.run.config[section].get("lora") {
        Some(v) => serde_json::from_value(v.clone())
            .with_context(|| format!("run {run:?}: run.json's `{section}.lora` does not parse"))?,
        None => Default::default(),
    };
    let lora = crate::model::hf::lora::LoraSpec::of(&lora_config);
    let (files, what) = match &lora {
        Some(spec) if merge => (
            hf::export_merged_dir(&dir, spec, &ck.bytes, out)?,
            "model with its adapters merged",
        ),
        Some(spec) => (
            hf::export_adapter_dir(&dir.display().to_string(), spec, &ck.bytes, out)?,
            "adapters (PEFT)",
        ),
        None => (hf::export_dir(&dir, &ck.bytes, out)?, "model"),
    };
    if merge && lora.is_none() {
        eprintln!(
            "note: run {run:?} fine-tuned the whole {name} model; --merge has nothing to merge"
        );
    }
    println!(
        "wrote {} ({}): the {name} {what} after {} of iteration {} ({})",
        out.display(),
        files.join(", "),
        ck.stage,
        ck.iter,
        ck.path
    );
    Ok(())
}
