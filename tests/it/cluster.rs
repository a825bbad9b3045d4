//! `rla-pipe worker` and `run.cluster`: a run whose relational stages run on two loopback
//! workers commits the bytes a single-node run commits; a killed worker is an error naming it,
//! fast, and the rerun completes; `sql --cluster` answers as `sql` does.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Fixture, GRIDNAV, Run, SMALL_GRIDNAV};

/// A worker process (`-v`: a log line per task, into `log`), killed when dropped.
struct Worker {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Worker {
    fn start(store: &str) -> Worker {
        let log = tempfile::NamedTempFile::new()
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        let mut child = Command::new(crate::rla_pipe_bin())
            .args(["-v", "worker", "--listen", "127.0.0.1:0", "--store", store])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn rla-pipe worker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("worker did not say where it listens: {line:?}"))
            .to_string();
        Worker { child, addr, log }
    }

    /// Tasks the worker has run.
    fn tasks(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .matches("a task arrived")
            .count()
    }

    /// Shards of model stage `stage` the worker has run.
    fn shards(&self, stage: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("running a shard") && l.contains(&format!("stage={stage}")))
            .count()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The run's settings: small gridnav, task ranges of ~50 input rows (so a relational stage has
/// several ranges to spread over the workers; results do not depend on it).
fn run(f: &Fixture, store: &str, iterations: u32, cluster: Option<&str>) -> Run {
    run_as(f, store, "c", iterations, cluster, &[])
}

/// [`run`] as run `run_id`, with `--set`s of its own.
fn run_as(
    f: &Fixture,
    store: &str,
    run_id: &str,
    iterations: u32,
    cluster: Option<&str>,
    sets: &[&str],
) -> Run {
    let iterations = iterations.to_string();
    let mut args = vec![
        "-q",
        "run",
        GRIDNAV,
        "--store",
        store,
        "--run-id",
        run_id,
        "--iterations",
        &iterations,
        "--set",
        "run.chunk_rows=50",
    ];
    for s in SMALL_GRIDNAV.iter().chain(sets) {
        args.extend(["--set", s]);
    }
    if let Some(c) = cluster {
        args.extend(["--cluster", c]);
    }
    f.rla(&args)
}

/// Every committed data file's bytes, by table and iteration, from the stage manifests of run
/// `c` (file names hold attempt ids; a failed attempt's files are not committed).
fn committed(store: &Path) -> Vec<(String, Vec<u8>)> {
    committed_of(store, "c")
}

/// [`committed`] of run `run_id`.
fn committed_of(store: &Path, run_id: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let commits = store.join(run_id).join("_commits");
    for iter in std::fs::read_dir(&commits).unwrap() {
        let iter = iter.unwrap().path();
        for m in std::fs::read_dir(&iter).unwrap() {
            let m = m.unwrap().path();
            if m.file_name().unwrap() == "_iteration.json" {
                continue;
            }
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
            for o in json["outputs"].as_array().unwrap() {
                let path = o["path"].as_str().unwrap();
                let name = format!(
                    "{}/{}",
                    iter.file_name().unwrap().to_string_lossy(),
                    o["table"].as_str().unwrap()
                );
                out.push((name, std::fs::read(store.join(path)).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Wait until `path` exists (at most 10 minutes).
fn wait_for(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cluster_run_equals_single_node_and_a_killed_worker_is_named_then_the_rerun_completes() {
    let f = Fixture::new();
    let store = f.store_arg();
    std::fs::create_dir_all(f.store()).unwrap();
    let alone = f.dir.path().join("alone");
    let alone_arg = alone.display().to_string();

    let a = Worker::start(&store);
    let mut b = Worker::start(&store);
    let cluster = format!("{},{}", a.addr, b.addr);
    let r = run(&f, &alone_arg, 3, None);
    assert_eq!(r.code, 0, "{}", r.stderr);

    // Kill a worker mid-run: once iteration 1's rollout is committed (its relational stages,
    // and iteration 2's, are still to come), the run stops naming the dead worker, with
    // nothing of the failed stage committed.
    let f_store = f.store();
    let rollout_1 = f_store.join("c/_commits/iter=000001/rollout.json");
    let mid_run = std::thread::scope(|s| {
        let running = s.spawn(|| run(&f, &store, 3, Some(&cluster)));
        wait_for(&rollout_1);
        b.kill();
        running.join().unwrap()
    });
    assert_eq!(mid_run.code, 1, "{}", mid_run.stderr);
    assert!(!mid_run.stderr.contains("panicked"), "{}", mid_run.stderr);
    assert!(
        mid_run
            .stderr
            .contains(&format!("worker http://{}", b.addr)),
        "the error names the dead worker: {}",
        mid_run.stderr
    );
    assert!(
        !f_store
            .join("c/_commits/iter=000002/_iteration.json")
            .exists()
    );

    // Started again with the dead worker listed: an error naming it in < 5 s.
    let t0 = Instant::now();
    let r = run(&f, &store, 3, Some(&cluster));
    let took = t0.elapsed();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("worker http://{}", b.addr)),
        "{}",
        r.stderr
    );
    assert!(took < Duration::from_secs(5), "took {took:?}: {}", r.stderr);

    // An address nothing answers at (a blackhole: the connect times out) is named too.
    let t0 = Instant::now();
    let r = run(
        &f,
        &store,
        3,
        Some(&format!("{},10.255.255.1:7001", a.addr)),
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("10.255.255.1:7001"), "{}", r.stderr);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // A worker of another store is refused by name.
    let other = f.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let stranger = Worker::start(&other.display().to_string());
    let r = run(
        &f,
        &store,
        3,
        Some(&format!("{},{}", a.addr, stranger.addr)),
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&stranger.addr) && r.stderr.contains("store"),
        "{}",
        r.stderr
    );

    // The rerun on a replacement worker completes, and every committed byte equals the
    // single-node run's.
    let c = Worker::start(&store);
    let r = run(&f, &store, 3, Some(&format!("{},{}", a.addr, c.addr)));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (dist, single) = (committed(&f.store()), committed(&alone));
    assert_eq!(
        dist.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        single.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in dist.iter().zip(&single) {
        assert!(
            x == y,
            "{name}: the cluster run's file differs from the single node's"
        );
    }
    // The model stages ran on the workers too: a shard of each per worker and iteration.
    for stage in ["rollout", "rm_score"] {
        assert!(a.shards(stage) >= 1 && c.shards(stage) >= 1, "{stage}");
    }
    // Replay (single node) verifies the cluster's iterations.
    for iter in ["0", "1", "2"] {
        let r = f.rla(&[
            "replay", "--store", &store, "--run", "c", "--iter", iter, "--verify",
        ]);
        assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    }

    // `sql --cluster`, its scans split into many tasks, answers as `sql` does.
    let workers = format!("{},{}", a.addr, c.addr);
    for q in [
        "SELECT * FROM step_rewards ORDER BY iter, task_id, traj_id, step_idx",
        "SELECT iter, task_id, count(*) AS n, min(step_idx) AS lo, max(step_idx) AS hi FROM steps \
         GROUP BY iter, task_id ORDER BY iter, task_id",
        "SELECT t.task_id, count(*) AS n FROM trajectories t JOIN steps s \
         ON t.traj_id = s.traj_id AND t.iter = s.iter GROUP BY t.task_id ORDER BY t.task_id",
    ] {
        let local = f.rla(&["sql", "--store", &store, "--format", "csv", q]);
        let before = a.tasks() + c.tasks();
        assert_eq!(local.code, 0, "{}", local.stderr);
        let dist = f.rla(&[
            "sql",
            "--store",
            &store,
            "--format",
            "csv",
            "--cluster",
            &workers,
            "--split-mib",
            "0.001",
            q,
        ]);
        assert_eq!(dist.code, 0, "{q}: {}", dist.stderr);
        assert_eq!(dist.stdout, local.stdout, "{q}");
        assert!(local.stdout.lines().count() > 2, "{q}: {}", local.stdout);
        assert!(
            a.tasks() + c.tasks() > before,
            "{q}: no task ran on the workers"
        );
    }
}

/// Without the warm start the model stages read the seeded initial checkpoints, which the
/// coordinator stores for the workers to read by digest: the bytes equal a single node's. A
/// stored copy whose bytes are not its digest's is replaced before the workers read it.
#[test]
fn shards_read_initial_checkpoints_by_digest() {
    let f = Fixture::new();
    let store = f.store_arg();
    std::fs::create_dir_all(f.store()).unwrap();
    let alone = f.dir.path().join("alone");
    let (a, b) = (Worker::start(&store), Worker::start(&store));
    let cluster = format!("{},{}", a.addr, b.addr);
    let cold = ["pretrain.enabled=false"];
    let r = run_as(&f, &alone.display().to_string(), "d", 1, None, &cold);
    assert_eq!(r.code, 0, "{}", r.stderr);

    // The initial policy's stored copy is corrupted before the run starts (its digest: from
    // the single-node run, same config and seed).
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(alone.join("d/_commits/iter=000000/rollout.json")).unwrap(),
    )
    .unwrap();
    let policy = m["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["tables"][0] == "policy")
        .unwrap();
    assert_eq!(policy["kind"], "init");
    let digest = policy["digest"].as_str().unwrap();
    let stored = f
        .store()
        .join(format!("d/artifacts/iter=000000/policy.{digest}.ckpt"));
    std::fs::create_dir_all(stored.parent().unwrap()).unwrap();
    std::fs::write(&stored, b"not a model").unwrap();

    let r = run_as(&f, &store, "d", 1, Some(&cluster), &cold);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(committed_of(&f.store(), "d"), committed_of(&alone, "d"));
    assert!(a.shards("rollout") + b.shards("rollout") >= 2);
    assert_ne!(std::fs::read(&stored).unwrap(), b"not a model");
}

/// Pretrained models on CPU are not bit-exact across batch shapes (tests/it/hf.rs): their
/// rollouts and RM scoring stay in the coordinator, and the run keeps a single node's bytes.
#[test]
fn pretrained_models_on_cpu_keep_their_model_stages_in_the_coordinator() {
    let f = Fixture::new();
    let store = f.store_arg();
    std::fs::create_dir_all(f.store()).unwrap();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    crate::hf::byte_model(&policy, "Qwen2ForCausalLM", 31);
    crate::hf::byte_model(&rm, "LlamaForCausalLM", 32);
    let sets = crate::hf::pretrained_sets(&policy, &rm, &[]);
    let (a, b) = (Worker::start(&store), Worker::start(&store));
    let alone = f.dir.path().join("alone");
    for (at, cluster) in [
        (alone.display().to_string(), None),
        (store.clone(), Some(format!("{},{}", a.addr, b.addr))),
    ] {
        let mut args = vec![
            "-q",
            "run",
            GRIDNAV,
            "--store",
            &at,
            "--run-id",
            "p",
            "--iterations",
            "1",
            "--until",
            "reward_join",
        ];
        for s in &sets {
            args.extend(["--set", s.as_str()]);
        }
        if let Some(c) = &cluster {
            args.extend(["--cluster", c.as_str()]);
        }
        let r = f.rla(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    assert_eq!(a.shards("rollout") + b.shards("rollout"), 0);
    assert_eq!(a.shards("rm_score") + b.shards("rm_score"), 0);
    assert!(a.tasks() + b.tasks() > 0, "reward_join ran on the workers");
    assert_eq!(committed_of(&f.store(), "p"), committed_of(&alone, "p"));
}

#[test]
fn bad_cluster_addresses_and_worker_flags_are_clear_errors() {
    let f = Fixture::new();
    let store = f.store_arg();
    for (bad, says) in [
        ("127.0.0.1", "host:port"),
        ("https://127.0.0.1:7001", "host:port"),
        ("127.0.0.1:7001,127.0.0.1:7001", "listed twice"),
    ] {
        // A usage error (exit 2), as the parser's own.
        let r = run(&f, &store, 1, Some(bad));
        assert_eq!(r.code, 2, "{bad}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{bad}: {}", r.stderr);
    }
    let r = f.rla(&[
        "run",
        GRIDNAV,
        "--store",
        "memory://",
        "--cluster",
        "127.0.0.1:1",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("memory"), "{}", r.stderr);
    let r = f.rla(&["worker", "--listen", "127.0.0.1:0", "--store", "memory://"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("memory"), "{}", r.stderr);
    let r = f.rla(&["worker", "--listen", "nowhere"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
}
