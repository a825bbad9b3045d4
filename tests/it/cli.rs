//! The CLI contract: run/resume, sql, replay --verify, runs, show, gc, bad input.

use crate::Fixture;

#[test]
fn run_then_query_every_table() {
    let f = Fixture::new();
    let r = f.run_small(&[]).ok();
    assert!(r.stderr.contains("iter   1  committed"), "{}", r.stderr);
    // 2 iterations × 4 stages.
    assert_eq!(f.sql("SELECT count(*) FROM stage_runs").ok().scalar(), "8");
    // Every manifest records the time its outputs took to store: some for every stage (each
    // writes bytes), and never more than the stage's wall time per table (one writer per
    // table, running within the stage; these stages write at most 4 tables).
    assert_eq!(
        f.sql(
            "SELECT count(*) FROM stage_runs WHERE store_seconds IS NULL OR store_seconds <= 0 \
             OR store_seconds > 4 * seconds"
        )
        .ok()
        .scalar(),
        "0"
    );
    assert_eq!(
        f.sql("SELECT count(*) FROM trajectories").ok().scalar(),
        (2 * 24 * 4).to_string()
    );
    // Every step gets a reward and a policy advantage; every sample an RM advantage.
    let steps = f.sql("SELECT count(*) FROM steps").ok().scalar();
    assert_eq!(
        f.sql("SELECT count(*) FROM step_rewards").ok().scalar(),
        steps
    );
    assert_eq!(
        f.sql("SELECT count(*) FROM policy_advantages")
            .ok()
            .scalar(),
        steps
    );
    let samples = f.sql("SELECT count(*) FROM rm_samples").ok().scalar();
    assert_eq!(
        samples.parse::<u64>().unwrap(),
        3 * steps.parse::<u64>().unwrap()
    );
    assert_eq!(
        f.sql("SELECT count(*) FROM rm_advantages").ok().scalar(),
        samples
    );
    assert_eq!(
        f.sql("SELECT count(DISTINCT iter) FROM task_accuracy")
            .ok()
            .scalar(),
        "2"
    );
    // Tables of later stages exist (empty) so the same SQL works on every run.
    assert_eq!(
        f.sql("SELECT count(*) FROM update_metrics").ok().scalar(),
        "0"
    );
    assert_eq!(f.sql("SELECT count(*) FROM evaluations").ok().scalar(), "0");
    // Cross-table SQL: task accuracy agrees with trajectories.
    let q = "SELECT count(*) FROM task_accuracy a JOIN (SELECT iter, task_id, avg(CASE WHEN outcome > 0 THEN 1.0 ELSE 0.0 END) AS acc FROM trajectories GROUP BY iter, task_id) t ON a.iter = t.iter AND a.task_id = t.task_id WHERE abs(a.acc - t.acc) > 1e-12";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    // The synthetic RM agrees with the oracle about as often as configured (0.75, a few unparsable).
    let p: f64 = f
        .sql("SELECT sum(rm_process_acc * judged_steps) / sum(judged_steps) FROM task_accuracy")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert!((0.7..0.95).contains(&p), "process accuracy {p}");
}

#[test]
fn resume_is_idempotent_and_extends() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let before = f.files();
    let r = f.run_small(&["--iterations", "1"]).ok();
    assert!(r.stderr.contains("already committed"), "{}", r.stderr);
    assert_eq!(f.files(), before, "a resumed complete run writes nothing");
    // Extending the run (iterations are not part of the config hash) runs only iteration 1.
    f.run_small(&["--iterations", "2"]).ok();
    assert_eq!(
        f.sql("SELECT count(*) FROM stage_runs WHERE iter = 0")
            .ok()
            .scalar(),
        "4"
    );
    assert_eq!(
        f.sql("SELECT count(*) FROM stage_runs WHERE iter = 1")
            .ok()
            .scalar(),
        "4"
    );
}

#[test]
fn uncommitted_data_is_invisible_and_redone() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1", "--until", "reward_join"])
        .ok();
    assert_eq!(f.sql("SELECT count(*) FROM stage_runs").ok().scalar(), "2");
    // Simulate a crashed attempt of `advantage`: its data is there, its manifest is not. Use a
    // copy of a real committed Parquet file so the data would be readable if it were visible.
    let src = f
        .files()
        .into_iter()
        .find(|p| p.contains("data/step_rewards/"))
        .unwrap();
    let stray = f
        .store()
        .join("small/data/policy_advantages/iter=000000/crashed.parquet");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::copy(f.store().join(&src), &stray).unwrap();
    assert_eq!(
        f.sql("SELECT count(*) FROM policy_advantages")
            .ok()
            .scalar(),
        "0"
    );
    // The run redoes the stage; readers see exactly one copy of each row.
    let r = f.run_small(&["--iterations", "1"]).ok();
    assert!(
        r.stderr
            .contains("reward_join      committed earlier, skipped"),
        "{}",
        r.stderr
    );
    let steps = f.sql("SELECT count(*) FROM steps").ok().scalar();
    assert_eq!(
        f.sql("SELECT count(*) FROM policy_advantages")
            .ok()
            .scalar(),
        steps
    );
    // gc removes the stray file (grace 0), and only it.
    let g = f.rla(&["gc", "--grace-secs", "0"]).ok();
    assert!(
        g.stdout.contains("crashed.parquet") && g.stdout.contains("removed 1 unreferenced"),
        "{}",
        g.stdout
    );
    assert!(!stray.exists());
    f.rla(&["replay", "--run", "small", "--iter", "0", "--verify"])
        .ok();
}

#[test]
fn replay_verifies_and_detects_tampering() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let r = f
        .rla(&["replay", "--run", "small", "--iter", "0", "--verify"])
        .ok();
    for t in [
        "tasks",
        "trajectories",
        "steps",
        "rm_samples",
        "step_rewards",
        "policy_advantages",
        "rm_advantages",
        "task_accuracy",
    ] {
        assert!(r.stdout.contains(t), "{t} not verified:\n{}", r.stdout);
    }
    assert!(r.stdout.contains("verified (8 tables)"), "{}", r.stdout);
    f.rla(&[
        "replay",
        "--run",
        "small",
        "--iter",
        "0",
        "--stage",
        "advantage",
        "--verify",
    ])
    .ok();
    // Alter one byte of a committed file (same size): replay names the stage and the table.
    let file = f
        .files()
        .into_iter()
        .find(|p| p.contains("data/step_rewards/"))
        .unwrap();
    let path = f.store().join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    f.rla(&["replay", "--run", "small", "--iter", "0", "--verify"])
        .fails(1, &["stage reward_join", "table step_rewards"]);
}

#[test]
fn replay_detects_recomputation_differences() {
    // Re-commit a stage's manifest pointing at different (but intact) data: integrity passes,
    // re-execution must catch it.
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let other = Fixture::new();
    std::fs::write(other.config(), crate::SMALL.replace("seed = 7", "seed = 8")).unwrap();
    other.run_small(&["--iterations", "1"]).ok();
    // Swap task_accuracy's output for the other run's (rewriting the manifest consistently).
    let m_path = f
        .store()
        .join("small/_commits/iter=000000/task_accuracy.json");
    let theirs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            other
                .store()
                .join("small/_commits/iter=000000/task_accuracy.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut ours: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&m_path).unwrap()).unwrap();
    let their_out = theirs["outputs"][0].clone();
    let dest = f.store().join(their_out["path"].as_str().unwrap());
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(
        other.store().join(their_out["path"].as_str().unwrap()),
        dest,
    )
    .unwrap();
    ours["outputs"][0] = their_out;
    std::fs::write(&m_path, serde_json::to_vec_pretty(&ours).unwrap()).unwrap();
    f.rla(&[
        "replay",
        "--run",
        "small",
        "--iter",
        "0",
        "--stage",
        "task_accuracy",
        "--verify",
    ])
    .fails(1, &["stage task_accuracy: table task_accuracy differs"]);
}

#[test]
fn same_inputs_give_byte_identical_files() {
    let a = Fixture::new();
    let b = Fixture::new();
    a.run_small(&["--iterations", "1"]).ok();
    // b runs the relational stages over many small task ranges (chunk_rows is an execution
    // setting): the committed bytes must not change.
    b.run_small(&["--iterations", "1", "--set", "run.chunk_rows=300"])
        .ok();
    let digests = |f: &Fixture| {
        f.sql("SELECT stage, rows, bytes FROM stage_runs ORDER BY stage")
            .ok()
            .stdout
    };
    assert_eq!(digests(&a), digests(&b));
    let q = "SELECT * FROM policy_advantages ORDER BY task_id, traj_id, step_idx";
    assert_eq!(a.sql(q).ok().stdout, b.sql(q).ok().stdout);
    for stage in ["synthetic", "reward_join", "advantage", "task_accuracy"] {
        let m = |f: &Fixture| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_slice(
                &std::fs::read(
                    f.store()
                        .join(format!("small/_commits/iter=000000/{stage}.json")),
                )
                .unwrap(),
            )
            .unwrap();
            v["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["digest"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(m(&a), m(&b), "{stage}");
    }
}

#[test]
fn changed_config_is_refused_on_resume() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    f.run_small(&[
        "--iterations",
        "1",
        "--set",
        "reward.lambda=0.5",
        "--set",
        "rollout.n=3",
    ])
    .fails(
        1,
        &[
            "different config",
            "reward.lambda: 1.0 → 0.5",
            "rollout.n: 4 → 3",
        ],
    );
    // A new run id is fine.
    f.run_small(&[
        "--iterations",
        "1",
        "--set",
        "reward.lambda=0.5",
        "--run-id",
        "lambda-half",
    ])
    .ok();
    let runs = f.rla(&["runs"]).ok();
    assert!(
        runs.stdout.contains("lambda-half") && runs.stdout.contains("small"),
        "{}",
        runs.stdout
    );
    // λ = 0.5 changes rewards: R = O + 0.5 · mean S.
    let q = "SELECT count(*) FROM step_rewards WHERE run_id = 'lambda-half' AND abs(reward - (outcome + 0.5 * coalesce(rm_mean, 0))) > 1e-12";
    assert_eq!(f.sql(q).ok().scalar(), "0");
}

#[test]
fn sql_formats_out_and_read_only() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let json = f
        .rla(&[
            "sql",
            "--format",
            "json",
            "SELECT stage, rows FROM stage_runs ORDER BY stage",
        ])
        .ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 4);
    assert_eq!(v[0]["stage"], "advantage");
    let table = f.rla(&["sql", "SELECT count(*) AS n FROM tasks"]).ok();
    assert!(
        table.stdout.contains("| n ") && table.stdout.contains("| 24"),
        "{}",
        table.stdout
    );
    let out = f.dir.path().join("acc.parquet");
    f.rla(&[
        "sql",
        "--out",
        out.to_str().unwrap(),
        "SELECT task_id, acc FROM task_accuracy",
    ])
    .ok();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&out).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap();
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 24);
    for q in [
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO tasks SELECT * FROM tasks",
        "COPY (SELECT 1) TO '/tmp/rla-pipe-copy-test.csv'",
        "DROP TABLE tasks",
        "SET datafusion.execution.batch_size = 1",
    ] {
        f.sql(q).fails(1, &["error:"]);
    }
    assert!(!std::path::Path::new("/tmp/rla-pipe-copy-test.csv").exists());
    f.sql("SELECT nope FROM tasks").fails(1, &["nope"]);

    // Hostile `--out` paths are clear errors naming them, and never leave a partial file: a
    // missing directory, a name longer than the file system allows, a directory, the store.
    let long = f.dir.path().join(format!("{}.csv", "a".repeat(300)));
    let store = f.store_arg();
    for out in [
        "/nonexistent-rla-pipe/dir/x.parquet".to_string(),
        long.display().to_string(),
        f.dir.path().display().to_string(),
        store.clone(),
    ] {
        let before = f.files();
        // A path without a format's extension is refused before anything is written.
        // (a usage error: exit 2)
        let (code, why) = if out.ends_with(".parquet") || out.ends_with(".csv") {
            (1, "cannot write")
        } else {
            (2, "error: usage error: --out")
        };
        f.rla(&["sql", "--out", &out, "SELECT 1"])
            .fails(code, &[why, &out[..out.len().min(20)]]);
        f.rla(&["report", "small", "--out", &out])
            .fails(1, &["cannot write", &out[..out.len().min(20)]]);
        assert_eq!(f.files(), before, "{out}: the store changed");
    }
    let leftovers: Vec<_> = std::fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

/// The files a user asks for (`sql --out`, `report --out`, `report --svg-dir`) get the mode any
/// new file gets, 0666 less the umask (0644 under umask 022), not a temp file's 0600; the
/// directory `--svg-dir` creates, 0777 less the umask.
#[cfg(unix)]
#[test]
fn written_files_get_the_usual_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    // rla-pipe under umask 022, whatever the test runner's umask is.
    let under_umask_022 = |args: &[&str]| {
        let output = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"umask 022 && exec "$0" "$@""#)
            .arg(crate::rla_pipe_bin())
            .args(args)
            .current_dir(f.dir.path())
            .env_remove("RUST_LOG")
            .env("RLA_PIPE_STORE", f.store())
            .output()
            .expect("spawn sh");
        crate::Run::from(output).ok()
    };
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let parquet = f.dir.path().join("acc.parquet");
    let html = f.dir.path().join("report.html");
    let svg = f.dir.path().join("charts");
    for _ in 0..2 {
        // The second time over the files of the first: replaced ones get the same mode.
        under_umask_022(&[
            "sql",
            "--out",
            parquet.to_str().unwrap(),
            "SELECT task_id, acc FROM task_accuracy",
        ]);
        under_umask_022(&[
            "report",
            "small",
            "--out",
            html.to_str().unwrap(),
            "--svg-dir",
            svg.to_str().unwrap(),
        ]);
        assert_eq!(mode(&parquet), 0o644, "sql --out: {:o}", mode(&parquet));
        assert_eq!(mode(&html), 0o644, "report --out: {:o}", mode(&html));
        assert_eq!(mode(&svg), 0o755, "report --svg-dir: {:o}", mode(&svg));
        let charts: Vec<_> = std::fs::read_dir(&svg)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!charts.is_empty());
        for c in &charts {
            assert_eq!(mode(c), 0o644, "{}: {:o}", c.display(), mode(c));
        }
    }
}

#[test]
fn runs_and_show() {
    let f = Fixture::new();
    // A store that does not exist is an error naming it, never an empty answer.
    f.rla(&["runs"]).fails(1, &["is not a directory", "runs"]);
    f.rla(&[
        "sql",
        "--store",
        "file:///no/such/dir",
        "SELECT count(*) FROM steps",
    ])
    .fails(1, &["/no/such/dir", "no store there"]);
    assert!(!std::path::Path::new("/no/such/dir").exists());
    std::fs::create_dir_all(f.store()).unwrap();
    assert!(f.rla(&["runs"]).ok().stdout.contains("no runs"));
    f.run_small(&["--iterations", "1"]).ok();
    let s = f.rla(&["show", "small"]).ok();
    assert!(
        s.stdout.contains("advantage")
            && s.stdout.contains("complete")
            && s.stdout.contains("\"lambda\""),
        "{}",
        s.stdout
    );
    let s = f.rla(&["show", "small", "--iter", "0"]).ok();
    assert!(
        s.stdout.contains("data/policy_advantages/iter=000000/"),
        "{}",
        s.stdout
    );
    // `--run ID`, as `replay`, `files` and `sql` take it, names the same run.
    let by_flag = f.rla(&["show", "--run", "small", "--iter", "0"]).ok();
    assert_eq!(by_flag.stdout, s.stdout);
    f.rla(&["show"]).fails(2, &["<ID>"]);
    f.rla(&["show", "small", "--iter", "5"])
        .fails(1, &["no committed iteration 5"]);
}

#[test]
fn init_writes_a_runnable_config() {
    let f = Fixture::new();
    let dir = f.dir.path().join("proj");
    f.rla(&["init", dir.to_str().unwrap()]).ok();
    let cfg = dir.join("iteration.toml");
    let store = f.store_arg();
    f.rla(&[
        "run",
        cfg.to_str().unwrap(),
        "--store",
        &store,
        "--iterations",
        "1",
        "-q",
    ])
    .ok();
    f.rla(&["init", dir.to_str().unwrap()])
        .fails(1, &["already exists"]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let f = Fixture::new();
    let w = |name: &str, text: &str| {
        let p = f.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let store = f.store_arg();
    let bad = w("bad.toml", "[run\nname = 'x'\n");
    f.rla(&["run", &bad, "--store", &store])
        .fails(1, &["bad.toml:1:"]);
    let unknown = w(
        "unknown.toml",
        "[run]\nname = 'x'\n\n[reward]\nlamda = 1.0\n",
    );
    f.rla(&["run", &unknown, "--store", &store])
        .fails(1, &["unknown.toml:5:", "lamda"]);
    let wrong = w("wrong.toml", "[run]\nname = 'x'\n[rollout]\nn = 'eight'\n");
    f.rla(&["run", &wrong, "--store", &store])
        .fails(1, &["wrong.toml:4:", "rollout.n"]);
    f.rla(&["run", "/nonexistent/x.toml"])
        .fails(1, &["/nonexistent/x.toml"]);
    let cfg = f.config().display().to_string();
    f.rla(&["run", &cfg, "--set", "reward.nope=1", "--store", &store])
        .fails(1, &["nope", "--set"]);
    // A --set without `=` is a usage error (issue 50).
    f.rla(&["run", &cfg, "--set", "novalue", "--store", &store])
        .fails(2, &["KEY=VALUE"]);
    f.rla(&["run", &cfg, "--store", "ftp://host/x"])
        .fails(1, &["unknown store scheme"]);
    f.rla(&["run", &cfg, "--store", &store, "--run-id", "a/b"])
        .fails(1, &["invalid run id"]);
    f.rla(&["run", &cfg, "--store", &store, "--run-id", ".."])
        .fails(1, &["invalid run id"]);
    f.rla(&["sql", "--run", "../x", "SELECT 1"])
        .fails(1, &["invalid run id"]);
    f.rla(&["run", &cfg, "--store", &store, "--until", "nope"])
        .fails(1, &["no such stage"]);
    // Missing runs and iterations.
    f.rla(&["show", "ghost"])
        .fails(1, &["run \"ghost\" not found"]);
    f.rla(&["sql", "--run", "ghost", "SELECT 1"])
        .fails(1, &["not found"]);
    f.rla(&["replay", "--run", "ghost", "--iter", "0", "--verify"])
        .fails(1, &["not found"]);
    f.run_small(&["--iterations", "1"]).ok();
    f.rla(&["replay", "--run", "small", "--iter", "3", "--verify"])
        .fails(1, &["no committed iteration 3"]);
    f.rla(&[
        "replay", "--run", "small", "--iter", "0", "--stage", "nope", "--verify",
    ])
    .fails(1, &["no committed stage"]);
    // Usage errors exit 2.
    f.rla(&["replay", "--run", "small", "--iter", "0"])
        .fails(2, &["--verify"]);
    f.rla(&["frobnicate"]).fails(2, &[]);
    f.rla(&["sql", "--format", "xml", "SELECT 1"]).fails(2, &[]);
}

#[test]
fn corrupt_files_are_named() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    // Truncated Parquet: sql and a resumed run name the file.
    let file = f
        .files()
        .into_iter()
        .find(|p| p.contains("data/steps/"))
        .unwrap();
    let path = f.store().join(&file);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    f.sql("SELECT count(*) FROM steps")
        .fails(1, &[&file, "truncated"]);
    f.rla(&["replay", "--run", "small", "--iter", "0", "--verify"])
        .fails(1, &["table steps", &file]);
    std::fs::write(&path, &bytes).unwrap();
    // Truncated manifest: every reader reports it by path.
    let m = f.store().join("small/_commits/iter=000000/advantage.json");
    let mb = std::fs::read(&m).unwrap();
    std::fs::write(&m, &mb[..mb.len() / 3]).unwrap();
    f.sql("SELECT 1").fails(
        1,
        &["corrupt manifest small/_commits/iter=000000/advantage.json"],
    );
    f.rla(&["show", "small"]).fails(1, &["corrupt manifest"]);
    // A complete iteration is skipped on its _iteration.json; an incomplete one reads its stage
    // manifests and reports the corrupt one.
    std::fs::remove_file(f.store().join("small/_commits/iter=000000/_iteration.json")).unwrap();
    f.run_small(&["--iterations", "1"]).fails(
        1,
        &["corrupt manifest small/_commits/iter=000000/advantage.json"],
    );
    // Corrupt run.json.
    std::fs::write(&m, &mb).unwrap();
    std::fs::write(f.store().join("small/run.json"), b"{").unwrap();
    f.run_small(&["--iterations", "1"])
        .fails(1, &["corrupt manifest small/run.json"]);
}

#[test]
fn unreachable_store_is_a_clear_error() {
    let f = Fixture::new();
    let cfg = f.config().display().to_string();
    let mut cmd = std::process::Command::new(crate::rla_pipe_bin());
    cmd.args(["run", &cfg, "--store", "s3://bucket/prefix"])
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y")
        .env("AWS_REGION", "us-east-1");
    let started = std::time::Instant::now();
    crate::Run::from(cmd.output().unwrap()).fails(1, &["store error", "s3://bucket/prefix"]);
    assert!(
        started.elapsed().as_secs() < 60,
        "gave up after {:?}",
        started.elapsed()
    );
}

#[test]
fn gridnav_pipeline_runs_replays_and_is_deterministic() {
    let a = Fixture::new();
    let b = Fixture::new();
    let pipeline = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/gridnav.toml");
    for f in [&a, &b] {
        let store = f.store_arg();
        f.rla(&[
            "run",
            pipeline,
            "--store",
            &store,
            "--iterations",
            "2",
            "--set",
            "env.initial_tasks=16",
            // The uniform, outcome-only floor (the models are tested in models.rs).
            "--set",
            "policy.kind=uniform",
            "--set",
            "reward_model.enabled=false",
            // Static tasks (adaptation is tested in adapt.rs).
            "--set",
            "adapt.enabled=false",
            // 8 evaluation rollouts per task: the OOD comparison below needs the resolution.
            "--set",
            "eval.rollouts=8",
        ])
        .ok();
    }
    let q = "SELECT stage, rows, bytes FROM stage_runs ORDER BY iter, stage";
    assert_eq!(
        a.sql(q).ok().stdout,
        b.sql(q).ok().stdout,
        "same seed, same bytes"
    );
    // The pool is fixed per run; every task gets n = 8 rollouts; every step has an oracle label.
    assert_eq!(
        a.sql("SELECT count(DISTINCT task_id) FROM tasks")
            .ok()
            .scalar(),
        "16"
    );
    assert_eq!(
        a.sql("SELECT count(*) FROM trajectories").ok().scalar(),
        (2 * 16 * 8).to_string()
    );
    assert_eq!(
        a.sql("SELECT count(*) FROM steps WHERE oracle_progress IS NULL")
            .ok()
            .scalar(),
        "0"
    );
    let q = "SELECT count(*) FROM trajectories t JOIN (SELECT iter, traj_id, count(*) AS n FROM steps GROUP BY iter, traj_id) s \
             ON t.iter = s.iter AND t.traj_id = s.traj_id WHERE t.num_steps <> s.n";
    assert_eq!(a.sql(q).ok().scalar(), "0");
    // Outcome-only reward: R = O on every step, no RM samples, no RM accuracy.
    assert_eq!(a.sql("SELECT count(*) FROM rm_samples").ok().scalar(), "0");
    assert_eq!(
        a.sql("SELECT count(*) FROM step_rewards WHERE reward <> CAST(outcome AS DOUBLE)")
            .ok()
            .scalar(),
        "0"
    );
    assert_eq!(
        a.sql("SELECT count(*) FROM task_accuracy WHERE rm_process_acc IS NOT NULL")
            .ok()
            .scalar(),
        "0"
    );
    // Held-out evaluation: a fixed set, disjoint from the training pool, the same every iteration.
    let per_iter = a
        .sql("SELECT count(*) FROM evaluations WHERE iter = 0 AND split = 'held_out'")
        .ok()
        .scalar();
    let n: u64 = per_iter.parse().unwrap();
    assert!(n > 20 && n <= 32, "{n} held-out tasks");
    let q = "SELECT count(*) FROM evaluations e JOIN tasks t ON e.task_id = t.task_id";
    assert_eq!(
        a.sql(q).ok().scalar(),
        "0",
        "held-out tasks are never trained on"
    );
    let q = "SELECT count(*) FROM (SELECT task_id FROM evaluations WHERE iter = 0 AND split = 'held_out' \
             INTERSECT SELECT task_id FROM evaluations WHERE iter = 1 AND split = 'held_out')";
    assert_eq!(a.sql(q).ok().scalar(), per_iter);
    let q = "SELECT min(rollouts) = 8 AND max(successes) <= 8 FROM evaluations";
    assert_eq!(a.sql(q).ok().scalar(), "true");
    // The out-of-distribution set: as many tasks, one difficulty level harder, so the uniform
    // policy wins less often there.
    let q = "SELECT split, count(*), sum(successes) * 1.0 / sum(rollouts) FROM evaluations \
             WHERE iter = 0 GROUP BY split ORDER BY split";
    let rows = a.sql(q).ok().csv();
    assert_eq!(
        (rows[0][0].as_str(), rows[1][0].as_str()),
        ("held_out", "ood")
    );
    let n_ood: u64 = rows[1][1].parse().unwrap();
    assert!(n_ood > 20 && n_ood <= 32, "{n_ood} OOD tasks");
    let (held, ood): (f64, f64) = (rows[0][2].parse().unwrap(), rows[1][2].parse().unwrap());
    assert!(
        ood < held,
        "OOD {ood} should be harder than held-out {held}"
    );
    for iter in ["0", "1"] {
        let r = a
            .rla(&["replay", "--run", "gridnav", "--iter", iter, "--verify"])
            .ok();
        assert!(
            r.stdout.contains("ok  rollout") && r.stdout.contains("ok  evaluate"),
            "{}",
            r.stdout
        );
    }
}

/// The external protocol with the small Python environment in tests/envs/line_env.py.
fn external_config(f: &Fixture, timeout: f64) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envs/line_env.py");
    let text = format!(
        "[run]\nname = \"ext\"\niterations = 2\n[env]\nname = \"external\"\ninitial_tasks = 6\nmax_steps = 20\n\
         [env.external]\nname = \"line\"\ncommand = [\"python3\", \"{script}\"]\ntimeout_secs = {timeout}\n\
         [rollout]\nn = 4\n[reward_model]\nenabled = false\n"
    );
    let path = f.dir.path().join("ext.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn external_environment_runs_over_json_lines() {
    let f = Fixture::new();
    let cfg = external_config(&f, 10.0);
    let store = f.store_arg();
    f.rla(&["run", &cfg, "--store", &store]).ok();
    // n = 4 rollouts of every pool task rolled out, active or pending (adaptation goes
    // through the process's `mutate`).
    let pool: u64 = f
        .sql("SELECT count(*) FROM tasks")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert!(pool > 2 * 6, "candidates joined the pool: {pool}");
    let pool: u64 = f
        .sql("SELECT count(*) FROM tasks WHERE rolled_out")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert_eq!(
        f.sql("SELECT count(*) FROM trajectories").ok().scalar(),
        (4 * pool).to_string()
    );
    assert_eq!(
        f.sql("SELECT count(*) FROM steps WHERE oracle_progress IS NULL")
            .ok()
            .scalar(),
        "0"
    );
    assert_eq!(
        f.sql("SELECT count(DISTINCT observation) > 1 FROM steps")
            .ok()
            .scalar(),
        "true"
    );
    f.rla(&["replay", "--run", "ext", "--iter", "1", "--verify"])
        .ok();
}

#[test]
fn external_environment_failures_are_clear_and_commit_nothing() {
    for (fault, needles) in [
        ("crash", vec!["exited", "simulated crash"]),
        ("hang", vec!["did not reply within 1.0 s"]),
        ("garbage", vec!["not JSON", "this is not json"]),
        ("error", vec!["simulated failure"]),
    ] {
        let f = Fixture::new();
        let cfg = external_config(&f, 1.0);
        let store = f.store_arg();
        // The pool stage commits the tasks; then one task is made faulty before the rollout.
        f.rla(&[
            "run",
            &cfg,
            "--store",
            &store,
            "--until",
            "pool",
            "--iterations",
            "1",
        ])
        .ok();
        let manifest = f.store().join("ext/_commits/iter=000000/pool.json");
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        // Rewrite the committed tasks file with a faulty task, keeping the manifest consistent.
        let path = f.store().join(m["outputs"][0]["path"].as_str().unwrap());
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&path).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        let batch = reader.map(|b| b.unwrap()).next().unwrap();
        let specs = batch
            .column_by_name("spec")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap();
        let mut new_specs: Vec<String> = specs.iter().map(|s| s.unwrap().to_string()).collect();
        new_specs[2] =
            format!("{{\"budget\":6,\"fault\":\"{fault}\",\"fault_step\":2,\"target\":2}}");
        let mut cols = batch.columns().to_vec();
        let idx = batch.schema().index_of("spec").unwrap();
        cols[idx] = std::sync::Arc::new(arrow::array::StringArray::from(new_specs));
        let batch = arrow::array::RecordBatch::try_new(batch.schema(), cols).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut m = m;
        m["outputs"][0]["bytes"] = serde_json::json!(bytes.len());
        m["outputs"][0]["digest"] = serde_json::json!(blake3::hash(&bytes).to_hex().to_string());
        std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
        let started = std::time::Instant::now();
        let mut all = vec!["task ", "rollout ", "step 1"];
        all.extend(needles);
        f.rla(&["run", &cfg, "--store", &store, "--iterations", "1"])
            .fails(1, &all);
        assert!(
            started.elapsed().as_secs() < 30,
            "{fault}: took {:?}",
            started.elapsed()
        );
        assert!(
            !f.store()
                .join("ext/_commits/iter=000000/rollout.json")
                .exists(),
            "{fault}: rollout committed"
        );
    }
}

#[test]
fn runs_survive_config_upgrades_but_not_changed_values() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let path = f.store().join("small/run.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // A run.json written before `eval.rollouts` existed (and so with another hash).
    let mut old = original.clone();
    old["config"]["eval"]
        .as_object_mut()
        .unwrap()
        .remove("rollouts");
    old["config_hash"] = serde_json::json!("0".repeat(64));
    std::fs::write(&path, serde_json::to_vec_pretty(&old).unwrap()).unwrap();
    f.run_small(&["--iterations", "2"]).ok();
    f.rla(&["replay", "--run", "small", "--iter", "0", "--verify"])
        .ok();
    // A changed value is refused by run and reported by replay, both naming the key.
    let mut changed = original;
    changed["config"]["reward"]["lambda"] = serde_json::json!(0.5);
    std::fs::write(&path, serde_json::to_vec_pretty(&changed).unwrap()).unwrap();
    f.run_small(&["--iterations", "3"])
        .fails(1, &["reward.lambda: 0.5 → 1.0"]);
    f.rla(&["replay", "--run", "small", "--iter", "1", "--verify"])
        .fails(
            1,
            &[
                "stage reward_join",
                "reward.lambda: recorded 1.0, run.json 0.5",
            ],
        );
}

/// A mistyped store or run is an error naming the URL and the runs that exist, never an empty
/// answer.
#[test]
fn mistyped_stores_and_runs_are_errors_not_empty_answers() {
    let f = Fixture::new();
    let missing = f.dir.path().join("no-such-dir");
    let m = missing.to_str().unwrap();
    let url = format!("file://{m}");
    let r = f.rla(&["sql", "--store", &url, "SELECT count(*) FROM steps"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains(m) && r.stdout.is_empty(), "{}", r.stderr);
    // An existing directory that holds no run.
    let empty = f.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = empty.to_str().unwrap();
    for args in [
        vec!["sql", "--store", e, "SELECT count(*) FROM steps"],
        vec!["show", "--store", e, "small"],
        vec!["report", "--store", e, "small", "--out", "r.html"],
        vec![
            "replay", "--store", e, "--run", "small", "--iter", "0", "--verify",
        ],
        vec!["gc", "--store", e],
    ] {
        let r = f.rla(&args);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stdout);
        assert!(
            r.stderr.contains(e) && r.stderr.contains("no run"),
            "{args:?}: {}",
            r.stderr
        );
    }
    // A run that is not there: the ones that are are named.
    assert_eq!(f.run_small(&[]).code, 0);
    let store = f.store_arg();
    for args in [
        vec![
            "sql",
            "--store",
            &store,
            "--run",
            "smal",
            "SELECT count(*) FROM steps",
        ],
        vec!["show", "--store", &store, "smal"],
        vec!["report", "--store", &store, "smal", "--out", "r.html"],
        vec![
            "replay", "--store", &store, "--run", "smal", "--iter", "0", "--verify",
        ],
    ] {
        let r = f.rla(&args);
        assert_eq!(r.code, 1, "{args:?}");
        assert!(
            r.stderr.contains("\"smal\"") && r.stderr.contains("runs there: small"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = f.rla(&["runs", "--store", e]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("no runs"));
}

/// Issue 50, the command line's rough edges: every command whose reader has gone (`| head -1`)
/// ends quietly with exit 0; `sql --out` writes the format its extension names; an empty result
/// prints its header; a missing table lists the tables there are, with one `SQL error:` prefix;
/// `--set` without `=` is a usage error (exit 2); `sql` without `--run` on a store of several
/// runs says so.
#[test]
fn the_command_line_has_no_rough_edges() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let store = f.store_arg();
    let config = f.config().display().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["sql", "--help"],
        vec!["schema"],
        vec!["schema", "--format", "json"],
        vec!["runs"],
        vec!["show", "small"],
        vec!["show", "small", "--iter", "0"],
        vec!["files", "--run", "small"],
        vec!["files", "--run", "small", "--format", "json"],
        vec!["sql", "SELECT * FROM steps"],
        vec!["sql", "--format", "csv", "SELECT * FROM steps"],
        vec!["sql", "--format", "json", "SELECT * FROM steps"],
        vec!["replay", "--run", "small", "--iter", "0", "--verify"],
        vec!["run", &config, "--store", &store],
        vec!["sandbox"],
    ];
    for args in &commands {
        // The reader closes its end before the command writes anything: every write fails.
        let mut child = std::process::Command::new(crate::rla_pipe_bin())
            .args(args)
            .current_dir(f.dir.path())
            .env_remove("RUST_LOG")
            .env("RLA_PIPE_STORE", f.store())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "rla-pipe {}: {stderr}",
            args.join(" ")
        );
        assert!(
            !stderr.contains("panicked"),
            "rla-pipe {}: {stderr}",
            args.join(" ")
        );
    }

    // --out by extension.
    let csv = f.dir.path().join("tasks.csv");
    f.rla(&[
        "sql",
        "--out",
        csv.to_str().unwrap(),
        "SELECT task_id FROM tasks ORDER BY task_id LIMIT 2",
    ])
    .ok();
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(
        text.starts_with("task_id\n") && text.lines().count() == 3,
        "{text}"
    );
    let json = f.dir.path().join("tasks.json");
    f.rla(&["sql", "--out", json.to_str().unwrap(), "SELECT 1 AS one"])
        .ok();
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "[{\"one\":1}]\n");
    f.rla(&["sql", "--out", "tasks.xlsx", "SELECT 1"])
        .fails(2, &["usage error", ".parquet, .csv or .json", "tasks.xlsx"]);
    assert!(!f.dir.path().join("tasks.xlsx").exists());

    // Empty results keep their header.
    let empty = f
        .rla(&[
            "sql",
            "--format",
            "csv",
            "SELECT task_id, iter FROM tasks WHERE false",
        ])
        .ok();
    assert_eq!(empty.stdout, "task_id,iter\n");
    let empty = f
        .rla(&["sql", "SELECT task_id FROM tasks WHERE false"])
        .ok();
    assert!(empty.stdout.contains("| task_id |"), "{}", empty.stdout);

    // A missing table names the tables; one prefix.
    let missing = f
        .rla(&["sql", "SELECT * FROM stepz"])
        .fails(1, &["stepz", "steps", "task_accuracy"]);
    assert_eq!(
        missing.stderr.matches("SQL error").count(),
        1,
        "{}",
        missing.stderr
    );
    let parse = f.rla(&["sql", "SELEC 1"]).fails(1, &["SQL error"]);
    assert_eq!(
        parse.stderr.matches("SQL error").count(),
        1,
        "{}",
        parse.stderr
    );

    // Usage errors exit 2.
    f.rla(&["run", &config, "--set", "reward.lambda"])
        .fails(2, &["KEY=VALUE"]);

    // Several runs and no --run: a note.
    f.rla(&[
        "replay",
        "--run",
        "small",
        "--from",
        "1",
        "--into",
        "other",
        "--iterations",
        "2",
    ])
    .ok();
    let both = f.sql("SELECT count(DISTINCT run_id) FROM tasks").ok();
    assert_eq!(both.scalar(), "2");
    assert!(
        both.stderr.contains("2 runs (") && both.stderr.contains("--run"),
        "{}",
        both.stderr
    );
    let one = f.rla(&["sql", "--run", "small", "SELECT 1"]).ok();
    assert!(!one.stderr.contains("runs ("), "{}", one.stderr);
}

/// Issue 50: an S3 store without credentials names what to set (not just the instance metadata
/// service's failure).
#[test]
fn missing_s3_credentials_are_named() {
    let f = Fixture::new();
    let mut cmd = std::process::Command::new(crate::rla_pipe_bin());
    cmd.args(["runs", "--store", "s3://bucket/prefix"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env_remove("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        .env_remove("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        // The metadata service, where a cloud VM has one: nothing answers here.
        .env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
        .current_dir(f.dir.path());
    let started = std::time::Instant::now();
    crate::Run::from(cmd.output().unwrap()).fails(
        1,
        &[
            "store error",
            "s3://bucket/prefix",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ],
    );
    assert!(started.elapsed().as_secs() < 90, "{:?}", started.elapsed());
}
