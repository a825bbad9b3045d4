//! Concurrent processes on one local store: two `run`s of the same run id (one commits each
//! stage, the other stops with a commit conflict or finds it committed, and nothing of the
//! loser is visible), and eight `sql` readers during a run (never an error, never a partial
//! stage).

use std::process::{Child, Command, Stdio};

use crate::{Fixture, GRIDNAV, Run, SMALL_GRIDNAV};

fn spawn_run(store: &str, iterations: &str) -> Child {
    let mut cmd = Command::new(crate::rla_pipe_bin());
    cmd.args(["-q", "run", GRIDNAV, "--store", store, "--run-id", "race"])
        .args(["--iterations", iterations])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for s in SMALL_GRIDNAV {
        cmd.args(["--set", s]);
    }
    cmd.spawn().expect("spawn rla-pipe")
}

fn finish(child: Child) -> Run {
    Run::from(child.wait_with_output().unwrap())
}

/// Every table of run `race`, as CSV (the same bytes for the same committed rows).
fn tables(f: &Fixture, store: &str) -> Vec<String> {
    [
        "tasks",
        "trajectories",
        "steps",
        "rm_samples",
        "update_metrics",
        "evaluations",
    ]
    .iter()
    .map(|t| {
        let sql = |q: &str| {
            let r = f.rla(&[
                "sql", "--store", store, "--run", "race", "--format", "csv", q,
            ]);
            assert_eq!(r.code, 0, "{t}: {}", r.stderr);
            r.stdout
        };
        let header = sql(&format!("SELECT * FROM {t} LIMIT 1"));
        let n = header.lines().next().unwrap().split(',').count();
        let order: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
        sql(&format!("SELECT * FROM {t} ORDER BY {}", order.join(", ")))
    })
    .collect()
}

#[test]
fn two_runs_of_one_run_id_commit_each_stage_once() {
    let f = Fixture::new();
    let store = f.store_arg();
    let (a, b) = (spawn_run(&store, "2"), spawn_run(&store, "2"));
    let (a, b) = (finish(a), finish(b));
    for r in [&a, &b] {
        assert!(
            r.code == 0 || (r.code == 1 && r.stderr.contains("commit conflict")),
            "each writer either commits or stops on a conflict: {} {}",
            r.code,
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
    assert!(a.code == 0 || b.code == 0, "one of them finished the run");
    // Whatever the interleaving, the run is whole: resuming it succeeds, replay verifies it,
    // and its tables are those of a run made alone.
    let r = finish(spawn_run(&store, "2"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let alone = f.dir.path().join("alone");
    let alone = alone.to_str().unwrap();
    let r = finish(spawn_run(alone, "2"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tables(&f, &store), tables(&f, alone));
    for iter in ["0", "1"] {
        let r = f.rla(&[
            "replay", "--store", &store, "--run", "race", "--iter", iter, "--verify",
        ]);
        assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    }
}

#[test]
fn eight_sql_readers_during_a_run_never_fail_or_see_a_partial_stage() {
    let f = Fixture::new();
    let store = f.store_arg();
    std::fs::create_dir_all(f.store()).unwrap();
    let writer = spawn_run(&store, "3");
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for _ in 0..40 {
                    let o = Command::new(crate::rla_pipe_bin())
                        .args(["sql", "--store", &store, "--format", "csv"])
                        .arg("SELECT (SELECT count(*) FROM steps) AS s, (SELECT count(*) FROM trajectories) AS t")
                        .output()
                        .unwrap();
                    let out = String::from_utf8_lossy(&o.stdout).into_owned();
                    let err = String::from_utf8_lossy(&o.stderr).into_owned();
                    // Before the first run.json appears the store holds no run: that is the only
                    // error a reader may get.
                    if !o.status.success() {
                        assert!(err.contains("holds no run") || err.contains("no store there"), "{err}");
                        continue;
                    }
                    let row = out.lines().nth(1).unwrap_or("").to_string();
                    seen.push(row);
                }
                seen
            })
        })
        .collect();
    let w = finish(writer);
    assert_eq!(w.code, 0, "{}", w.stderr);
    // What the readers saw must be a state after some number of whole stage commits: the
    // (steps, trajectories) counts of 0..=3 committed rollouts.
    let mut allowed = vec!["0,0".to_string()];
    for i in 0..3 {
        let r = f.rla(&["sql", "--store", &store, "--format", "csv",
            &format!("SELECT (SELECT count(*) FROM steps WHERE iter <= {i}) AS s, (SELECT count(*) FROM trajectories WHERE iter <= {i}) AS t")]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        allowed.push(r.stdout.lines().nth(1).unwrap().to_string());
    }
    let mut reads = 0;
    for h in readers {
        for row in h.join().expect("a reader failed") {
            reads += 1;
            assert!(
                allowed.contains(&row),
                "a reader saw {row}, not one of {allowed:?}"
            );
        }
    }
    assert!(reads > 0);
}
