//! Counterfactual branches: `replay --run P --from N --set k=v --into B` shares iterations < N
//! with P by reference and re-executes from N with the changed config.

use crate::{Fixture, GRIDNAV, SMALL_GRIDNAV};

/// Rows of `table` in run `a` and not in run `b` (all columns but run_id), for iterations `iters`.
fn differing(f: &Fixture, table: &str, a: &str, b: &str, iters: &str) -> u64 {
    f.sql(&format!(
        "SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = '{a}' AND iter IN ({iters}) \
         EXCEPT ALL SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = '{b}' AND iter IN ({iters}))"
    ))
    .ok()
    .scalar()
    .parse()
    .unwrap()
}

#[test]
fn a_branch_shares_the_parents_iterations_and_reexecutes_from_n() {
    let f = Fixture::new();
    f.run_pipeline(GRIDNAV, "p", 3, &SMALL_GRIDNAV).ok();
    let parent_files = f.files();

    // A branch without overrides re-executes iteration 2 exactly as the parent did.
    let same = f
        .rla(&["replay", "--run", "p", "--from", "2", "--into", "same"])
        .ok();
    assert!(
        same.stderr.contains("iterations 0..2 shared"),
        "{}",
        same.stderr
    );
    // λ changed from iteration 1 on.
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "1",
        "--set",
        "reward.lambda=0.25",
        "--into",
        "lam",
    ])
    .ok();

    // Nothing of the parent was copied or changed: the branches wrote data only for the
    // iterations they executed.
    let files = f.files();
    for pf in &parent_files {
        assert!(files.contains(pf), "{pf} disappeared");
    }
    for file in &files {
        if let Some(rest) = file
            .strip_prefix("same/data/")
            .or(file.strip_prefix("same/artifacts/"))
        {
            assert!(rest.contains("iter=000002"), "same wrote {file}");
        }
        if let Some(rest) = file
            .strip_prefix("lam/data/")
            .or(file.strip_prefix("lam/artifacts/"))
        {
            assert!(!rest.contains("iter=000000"), "lam wrote {file}");
        }
    }

    // sql shows every run with all its iterations, under its own run_id.
    let counts = f
        .sql("SELECT run_id, iter, count(*) FROM steps GROUP BY run_id, iter ORDER BY run_id, iter")
        .ok()
        .csv();
    let runs: Vec<(String, String)> = counts
        .iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    for run in ["lam", "p", "same"] {
        for iter in 0..3 {
            assert!(runs.contains(&(run.into(), iter.to_string())), "{counts:?}");
        }
    }
    for table in crate::DATA_TABLES {
        // The no-override branch equals its parent row for row, the shared iterations and the
        // re-executed one (seeds come from the config, not the run id).
        assert_eq!(differing(&f, table, "same", "p", "0, 1, 2"), 0, "{table}");
        assert_eq!(differing(&f, table, "p", "same", "0, 1, 2"), 0, "{table}");
        assert_eq!(differing(&f, table, "lam", "p", "0"), 0, "{table}");
    }
    // λ weighs the RM's process reward: the re-executed iterations differ.
    assert!(differing(&f, "step_rewards", "lam", "p", "1") > 0);
    let status = f
        .sql("SELECT iter, status, count(*) FROM stage_runs WHERE run_id = 'lam' GROUP BY iter, status ORDER BY iter")
        .ok()
        .csv();
    assert_eq!(status[0][1], "shared", "{status:?}");
    assert!(
        status[1..].iter().all(|r| r[1] == "committed"),
        "{status:?}"
    );

    // run.json records the parent and the overrides; show says so.
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.store().join("lam/run.json")).unwrap()).unwrap();
    assert_eq!(
        run_json["branch"],
        serde_json::json!({"parent": "p", "from_iter": 1, "overrides": ["reward.lambda=0.25"]})
    );
    let show = f.rla(&["show", "lam"]).ok();
    assert!(
        show.stdout.contains("branch of  p from iteration 1"),
        "{}",
        show.stdout
    );

    // Audit: a shared iteration verifies in the parent, the executed ones in the branch.
    let v = f
        .rla(&["replay", "--run", "lam", "--iter", "0", "--verify"])
        .ok();
    assert!(v.stdout.contains("shared, replayed"), "{}", v.stdout);
    f.rla(&["replay", "--run", "lam", "--iter", "1", "--verify"])
        .ok();
    f.rla(&["replay", "--run", "same", "--iter", "2", "--verify"])
        .ok();

    // The report overlays parent and branch.
    let out = f.dir.path().join("compare.html");
    f.rla(&["report", "p", "lam", "--out", out.to_str().unwrap()])
        .ok();
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(
        html.contains(">lam<") || html.contains("lam"),
        "report lacks the branch"
    );

    // gc never removes what a branch references (everything here is referenced).
    let gc = f.rla(&["gc", "--grace-secs", "0"]).ok();
    assert!(
        gc.stdout.contains("removed 0 unreferenced files"),
        "{}",
        gc.stdout
    );
    f.rla(&["replay", "--run", "lam", "--iter", "0", "--verify"])
        .ok();

    // Re-running the same command continues (nothing to do); a different one is refused.
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "1",
        "--set",
        "reward.lambda=0.25",
        "--into",
        "lam",
    ])
    .ok();
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "1",
        "--set",
        "reward.lambda=0.5",
        "--into",
        "lam",
    ])
    .fails(1, &["lam", "already exists"]);
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "2",
        "--set",
        "reward.lambda=0.25",
        "--into",
        "lam",
    ])
    .fails(1, &["lam", "already exists", "from iteration 1"]);
    f.rla(&["replay", "--run", "p", "--from", "4", "--into", "x"])
        .fails(1, &["--from 4", "3 complete iterations"]);
    f.rla(&["replay", "--run", "p", "--from", "1", "--into", "p"])
        .fails(1, &["new run id"]);
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "1",
        "--set",
        "reward.nope=1",
        "--into",
        "x",
    ])
    .fails(1, &["nope"]);
    f.rla(&["replay", "--run", "nosuch", "--from", "1", "--into", "x"])
        .fails(1, &["nosuch", "not found"]);
    f.rla(&["replay", "--run", "p"])
        .fails(2, &["usage error", "--verify", "--into"]);

    // A branch of a branch refers to the run that executed each stage.
    f.rla(&["replay", "--run", "lam", "--from", "2", "--into", "lam2"])
        .ok();
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.store().join("lam2/_commits/iter=000000/rollout.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["shared"]["run"], "p");
    assert_eq!(differing(&f, "step_rewards", "lam2", "lam", "0, 1, 2"), 0);
    f.rla(&["replay", "--run", "lam2", "--iter", "1", "--verify"])
        .ok();
}
