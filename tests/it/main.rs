//! Integration tests: drive the real `rla-pipe` binary on temporary stores.

mod ablation;
mod adapt;
mod branch;
mod cli;
mod cluster;
mod coding;
mod coding_parity;
mod commit;
mod concurrency;
mod docs;
mod fixtures;
#[cfg(feature = "polars")]
mod frames;
#[cfg(feature = "cuda")]
mod gpu;
mod hf;
mod lora;
mod models;
mod prefix;
mod readers;
mod report;
mod s3;
mod sandbox;
mod textworld;
mod web;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `rla-pipe` binary the integration tests run: Cargo's, or `RLA_PIPE_TEST_BIN` where
/// this test binary runs away from the build that made it (a lent GPU machine:
/// benches/gpu_lease.sh).
pub fn rla_pipe_bin() -> std::ffi::OsString {
    std::env::var_os("RLA_PIPE_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_rla-pipe").into())
}

/// The class of CPU whose f32 kernels a bit-exact reference was computed on: burn's f32 products
/// and reductions run in AVX-512 registers where the CPU has them (`x86-v4`), in AVX2 registers
/// elsewhere, and round differently. The committed references (the ablation fingerprints, the
/// README's quick-start lines, the fixture store) come from `avx512` runners (Intel Xeon with
/// AMX, AMD EPYC with AVX512-BF16); `avx2` (e.g. AMD EPYC before Zen 4) has references of its
/// own where a test can keep one, and so would another class.
pub fn numerics() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2";
        }
    }
    std::env::consts::ARCH
}

/// Where the committed references of this CPU class live: `path` itself on `avx512` (the class
/// that measured the book's tables), else `path` with `-<class>` before its extension.
pub fn reference_for_cpu(path: &Path) -> PathBuf {
    match numerics() {
        "avx512" => path.to_path_buf(),
        class => {
            let stem = path.file_stem().unwrap().to_string_lossy();
            let name = match path.extension() {
                Some(ext) => format!("{stem}-{class}.{}", ext.to_string_lossy()),
                None => format!("{stem}-{class}"),
            };
            path.with_file_name(name)
        }
    }
}

/// The main job's pipeline.
pub const GRIDNAV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/gridnav.toml");
/// The learning-signal diagnostics (one row per run and iteration).
pub const LEARNING_SIGNAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/learning_signal.sql"
);

/// What the reward model's update teaches it (one row per run and iteration).
pub const RM_SIGNAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/sql/rm_signal.sql");

/// Who sets the policy update's signs, and whether they teach progress (per run and iteration).
pub const POLICY_SIGNAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/policy_signal.sql"
);

/// The loop diagnostics (one row per run and iteration).
pub const ADAPT_SIGNAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/adapt_signal.sql"
);
/// Training success on the seed tasks and on adapted ones beside held-out success (per run and
/// iteration).
pub const GENERALISATION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/generalisation.sql"
);
pub const STEP_LOOPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/sql/step_loops.sql");
pub const EVAL_LOOPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/sql/eval_loops.sql");
pub const ACTION_KINDS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/action_kinds.sql"
);

/// A small gridnav run (8 tasks, small models, a small warm start): the settings the upgrade
/// fixture `tests/fixtures/store-2026-11-23` was written with (its README), also used by the
/// concurrency tests.
pub const SMALL_GRIDNAV: [&str; 16] = [
    "env.initial_tasks=8",
    "rollout.n=4",
    "eval.tasks=8",
    "eval.ood_tasks=8",
    "eval.rollouts=1",
    "policy.d_model=16",
    "policy.context=48",
    "reward_model.d_model=16",
    "reward_model.context=64",
    "update.policy_steps=2",
    "update.rm_steps=2",
    "update.minibatch=64",
    "pretrain.policy_episodes=8",
    "pretrain.policy_epochs=1",
    "pretrain.rm_steps=64",
    "pretrain.rm_epochs=1",
];

/// A small loop over an environment whose steps are slow (TextWorld's bridge, a browser):
/// `tasks` tasks, each rolled out twice every iteration, one evaluation task per split, the
/// uniform policy (so rollouts mostly lose), small models.
pub fn small_slow_env(tasks: u32) -> Vec<String> {
    [
        format!("env.initial_tasks={tasks}"),
        "rollout.n=2".into(),
        format!("rollout.slots_per_iter={tasks}"),
        "eval.tasks=1".into(),
        "eval.ood_tasks=1".into(),
        "eval.rollouts=1".into(),
        "policy.kind=uniform".into(),
        "policy.d_model=16".into(),
        "reward_model.d_model=16".into(),
        "update.rm_steps=2".into(),
    ]
    .into()
}

/// Every data table `sql` exposes (all but `stage_runs`).
pub const DATA_TABLES: [&str; 13] = [
    "tasks",
    "trajectories",
    "steps",
    "rm_samples",
    "step_rewards",
    "policy_advantages",
    "rm_advantages",
    "update_metrics",
    "task_accuracy",
    "judgements",
    "adaptations",
    "evaluations",
    "demonstrations",
];

/// Make `import` succeed in python3, installing `packages` with pip if it does not. Installs are
/// serialized: tests run in parallel, and two pip processes writing one site-packages at once
/// can leave a package half-written for a third test that imports it meanwhile.
pub fn python_packages(import: &str, packages: &[&str]) {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let importable = || {
        Command::new("python3")
            .args(["-c", &format!("import {import}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if importable() {
        return;
    }
    let ok = Command::new("python3")
        .args(["-m", "pip", "install", "-q"])
        .args(packages)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok && importable(),
        "this test needs python3 with: pip install {}",
        packages.join(" ")
    );
}

/// A minimal OpenAI-compatible chat-completions server for tests, a thread per connection:
/// `answer` gets each request's `Authorization` header (empty when none) and JSON body and
/// returns the reply's content. Returns the base URL (`http://127.0.0.1:PORT/v1`).
pub fn chat_server(
    answer: impl Fn(&str, &serde_json::Value) -> String + Send + Sync + 'static,
) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (mut length, mut auth) = (0usize, String::new());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if lower.starts_with("authorization:") {
                        auth = h["authorization:".len()..].trim().to_string();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let content = answer(&auth, &body);
                let reply = serde_json::json!({
                    "id": "x", "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
                })
                .to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            });
        }
    });
    url
}

/// The first file of a directory (a table's iteration directory holds one committed file).
/// Copy directory `from` into `to` (created), recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

pub fn first_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap_or_else(|| panic!("{} is empty", dir.display()))
        .unwrap()
        .path()
}

/// A small warm start (the default budgets take ~12 s on gridnav, ~60 s on household): tests
/// that are not about `pretrain` still run it, on a few demonstrations.
pub const SMALL_PRETRAIN: [&str; 4] = [
    "pretrain.policy_episodes=8",
    "pretrain.policy_epochs=1",
    "pretrain.rm_steps=64",
    "pretrain.rm_epochs=1",
];

/// A temporary store directory with a small synthetic pipeline config.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

pub const SMALL: &str = r#"
[run]
name = "small"
seed = 7
iterations = 2

[env]
name = "synthetic"
initial_tasks = 24
max_steps = 6

[rollout]
n = 4
"#;

impl Fixture {
    pub fn new() -> Fixture {
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(f.config(), SMALL).unwrap();
        f
    }
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("small.toml")
    }
    pub fn store(&self) -> PathBuf {
        self.dir.path().join("runs")
    }
    pub fn store_arg(&self) -> String {
        self.store().display().to_string()
    }
    /// `rla-pipe <args>` with `--store` pointing at this fixture's store where the command takes it.
    pub fn rla(&self, args: &[&str]) -> Run {
        self.rla_env(&[], args)
    }
    /// [`Fixture::rla`] with more environment variables (the crash hooks).
    pub fn rla_env(&self, vars: &[(&str, &str)], args: &[&str]) -> Run {
        let mut cmd = Command::new(rla_pipe_bin());
        cmd.current_dir(self.dir.path())
            .env_remove("RUST_LOG")
            .env("RLA_PIPE_STORE", self.store());
        cmd.envs(vars.iter().copied());
        cmd.args(args);
        Run::from(cmd.output().expect("spawn rla-pipe"))
    }
    pub fn run_small(&self, extra: &[&str]) -> Run {
        let config = self.config().display().to_string();
        let store = self.store_arg();
        let mut args = vec!["run", config.as_str(), "--store", store.as_str()];
        args.extend_from_slice(extra);
        self.rla(&args)
    }
    /// `rla-pipe run PIPELINE` into this fixture's store as run `run_id`, with `--set`s.
    pub fn run_pipeline(
        &self,
        pipeline: &str,
        run_id: &str,
        iterations: u32,
        sets: &[&str],
    ) -> Run {
        let args = self.pipeline_args(pipeline, run_id, iterations, sets);
        self.rla(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }
    /// The arguments of [`Fixture::run_pipeline`].
    pub fn pipeline_args(
        &self,
        pipeline: &str,
        run_id: &str,
        iterations: u32,
        sets: &[&str],
    ) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            pipeline,
            "--store",
            &self.store_arg(),
            "--run-id",
            run_id,
            "--iterations",
            &iterations.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for s in sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        args
    }
    pub fn sql(&self, query: &str) -> Run {
        self.rla(&["sql", "--format", "csv", query])
    }
    /// Every file under the store, relative, sorted.
    pub fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.store(), &self.store(), &mut out);
        out.sort();
        out
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(root, &p, out);
        } else {
            out.push(p.strip_prefix(root).unwrap().display().to_string());
        }
    }
}

/// The result of one invocation.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }
    /// Expect a clean failure with this exit code whose stderr mentions every needle.
    #[track_caller]
    pub fn fails(self, code: i32, needles: &[&str]) -> Run {
        assert_eq!(
            self.code, code,
            "exit code\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "panic:\n{}", self.stderr);
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr lacks {n:?}:\n{}",
                self.stderr
            );
        }
        self
    }
    /// CSV output → its data lines, sorted (header dropped).
    pub fn sorted_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.stdout.lines().skip(1).map(str::to_string).collect();
        lines.sort();
        lines
    }
    /// CSV output → rows of fields (header dropped).
    pub fn csv(&self) -> Vec<Vec<String>> {
        self.stdout
            .lines()
            .skip(1)
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect()
    }
    /// CSV output → rows as maps from column name to field.
    pub fn records(&self) -> Vec<std::collections::BTreeMap<String, String>> {
        let mut lines = self.stdout.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        lines
            .map(|l| {
                header
                    .iter()
                    .zip(l.split(','))
                    .map(|(h, v)| (h.to_string(), v.to_string()))
                    .collect()
            })
            .collect()
    }
    /// The single value of a one-row, one-column CSV result.
    #[track_caller]
    pub fn scalar(&self) -> String {
        let rows = self.csv();
        assert_eq!(rows.len(), 1, "{}", self.stdout);
        rows[0][0].clone()
    }
}
