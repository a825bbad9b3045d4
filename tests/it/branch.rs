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

/// Branch `into` of run `p` at iteration 0 with one override, for that one iteration: the
/// stages it executed (the rest it shared), after checking that `replay --verify` passes.
fn iteration_0_branch(f: &Fixture, set: &str, into: &str) -> String {
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "0",
        "--set",
        set,
        "--into",
        into,
        "--iterations",
        "1",
    ])
    .ok();
    f.rla(&["replay", "--run", into, "--iter", "0", "--verify"])
        .ok();
    f.sql(&format!(
        "SELECT string_agg(stage, '+' ORDER BY stage) FROM stage_runs \
         WHERE run_id = '{into}' AND iter = 0 AND status = 'committed'"
    ))
    .ok()
    .scalar()
}

#[test]
fn a_branch_shares_the_parents_iterations_and_reexecutes_from_n() {
    let f = Fixture::new();
    f.run_pipeline(GRIDNAV, "p", 3, &SMALL_GRIDNAV).ok();
    let parent_files = f.files();

    // A branch without overrides told to recompute re-executes iteration 2 exactly as the
    // parent did.
    let same = f
        .rla(&[
            "replay",
            "--run",
            "p",
            "--from",
            "2",
            "--into",
            "same",
            "--recompute",
        ])
        .ok();
    assert!(
        same.stderr.contains("iterations 0..2 shared"),
        "{}",
        same.stderr
    );
    // Without --recompute, every stage of it would compute what the parent committed: all
    // shared, nothing executed or written.
    let twin = f
        .rla(&["replay", "--run", "p", "--from", "2", "--into", "twin"])
        .ok();
    let shared = |l: &&str| l.starts_with("iter   2") && l.ends_with("as run \"p\": shared");
    assert_eq!(
        twin.stderr.lines().filter(shared).count(),
        10,
        "every stage of iteration 2 (all but the warm start) shared: {}",
        twin.stderr
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
            // λ reaches neither the rollout nor the RM's verdicts of iteration 1: shared.
            for table in ["tasks", "trajectories", "steps", "rm_samples"] {
                assert!(
                    !rest.starts_with(&format!("{table}/iter=000001")),
                    "lam wrote {file}"
                );
            }
        }
        assert!(
            !file.starts_with("twin/data/") && !file.starts_with("twin/artifacts/"),
            "twin wrote {file}"
        );
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
        assert_eq!(differing(&f, table, "twin", "p", "0, 1, 2"), 0, "{table}");
        assert_eq!(differing(&f, table, "p", "twin", "0, 1, 2"), 0, "{table}");
        assert_eq!(differing(&f, table, "lam", "p", "0"), 0, "{table}");
    }
    // λ weighs the RM's process reward: the re-executed iterations differ.
    assert!(differing(&f, "step_rewards", "lam", "p", "1") > 0);
    // Iteration 0 is the parent's; of iteration 1, the stages λ does not reach (the pool, the
    // rollout, the RM's verdicts; the judge and the adaptation, which read the task accuracies
    // that come out the same) are shared, the rest executed; iteration 2 follows another
    // policy: executed, but for its pool (the same adaptations applied to the same pool).
    let status = f
        .sql(
            "SELECT iter, status, string_agg(stage, '+' ORDER BY stage) FROM stage_runs \
             WHERE run_id = 'lam' GROUP BY iter, status ORDER BY iter, status",
        )
        .ok()
        .csv();
    let status: Vec<String> = status.iter().map(|r| r.join(" ")).collect();
    assert_eq!(status.len(), 5, "{status:?}");
    assert!(status[0].starts_with("0 shared "), "{status:?}");
    assert!(status[1].starts_with("1 committed ") && status[1].contains("reward_join"));
    assert_eq!(
        status[2], "1 shared adapt+judge+pool+rm_score+rollout",
        "{status:?}"
    );
    assert!(status[3].starts_with("2 committed ") && status[3].contains("rollout"));
    assert_eq!(status[4], "2 shared pool", "{status:?}");

    // A stage executed again that committed the same bytes is the same input: without
    // adaptation from iteration 0, only the judge and the adaptation execute (the update reads
    // the judge's rows, which are the parent's; the evaluation reads the same checkpoint).
    assert_eq!(
        iteration_0_branch(&f, "adapt.enabled=false", "noadapt"),
        "adapt+judge"
    );

    // A stage executed again that committed the parent's rows under its own run id is the
    // same input too: without the candidates' samples from iteration 0 (where there are no
    // candidates yet) the stages of `[reward]` execute and write the parent's rows, and
    // everything downstream of them — the update included, which reads only the clip and KL
    // keys of that section — is shared.
    assert_eq!(
        iteration_0_branch(&f, "reward.train_candidates=false", "nocand"),
        "advantage+reward_join"
    );
    for table in crate::DATA_TABLES {
        assert_eq!(differing(&f, table, "nocand", "p", "0"), 0, "{table}");
    }

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
    let v = f
        .rla(&["replay", "--run", "lam", "--iter", "1", "--verify"])
        .ok();
    // Its shared stages verify in the parent, the executed ones here.
    for (stage, how) in [
        ("rollout", "shared, replayed"),
        ("reward_join", "(replayed)"),
    ] {
        assert!(
            v.stdout
                .lines()
                .any(|l| l.contains(&format!(" {stage} ")) && l.contains(how)),
            "{stage}: {}",
            v.stdout
        );
    }
    f.rla(&["replay", "--run", "twin", "--iter", "2", "--verify"])
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
