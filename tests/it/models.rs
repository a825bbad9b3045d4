//! The models end to end: learned rollouts, RM scoring, the PPO update, checkpoints as
//! artifacts (digests verified), determinism and replay, and a small learning test.

use crate::{Fixture, Run};

const GRIDNAV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/gridnav.toml");

/// A small, fast variant of pipelines/gridnav.toml (the full model loop on 8 tasks).
const SMALL_MODELS: &[&str] = &[
    "env.initial_tasks=8",
    "rollout.n=4",
    "eval.tasks=8",
    "policy.d_model=32",
    "policy.context=48",
    "reward_model.d_model=32",
    "reward_model.context=64",
    "update.policy_steps=2",
    "update.rm_steps=2",
    "update.minibatch=64",
];

fn run_gridnav(f: &Fixture, iterations: &str, sets: &[&str], extra: &[&str]) -> Run {
    let store = f.store_arg();
    let mut args = vec![
        "run",
        GRIDNAV,
        "--store",
        &store,
        "--iterations",
        iterations,
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    args.extend_from_slice(extra);
    f.rla(&args)
}

/// (name, digest) of every artifact a stage manifest lists.
fn artifacts(f: &Fixture, run: &str, iter: u32, stage: &str) -> Vec<(String, String, String)> {
    let path = f
        .store()
        .join(format!("{run}/_commits/iter={iter:06}/{stage}.json"));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    m["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_string(),
                a["digest"].as_str().unwrap().to_string(),
                a["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn model_loop_runs_is_deterministic_and_replays() {
    let a = Fixture::new();
    let b = Fixture::new();
    for f in [&a, &b] {
        run_gridnav(f, "2", SMALL_MODELS, &[]).ok();
    }
    // Same seed, same bytes: every table and both checkpoints of every iteration.
    let q = "SELECT iter, stage, rows, bytes FROM stage_runs ORDER BY iter, stage";
    assert_eq!(a.sql(q).ok().stdout, b.sql(q).ok().stdout);
    for iter in [0, 1] {
        let ours = artifacts(&a, "gridnav", iter, "update");
        assert_eq!(ours.len(), 2);
        let theirs = artifacts(&b, "gridnav", iter, "update");
        let digests = |v: &[(String, String, String)]| {
            v.iter()
                .map(|x| (x.0.clone(), x.1.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(digests(&ours), digests(&theirs), "iteration {iter}");
        for (name, digest, path) in &ours {
            let bytes = std::fs::read(a.store().join(path)).unwrap();
            assert_eq!(blake3::hash(&bytes).to_hex().to_string(), *digest, "{name}");
            assert!(path.ends_with(&format!("{name}.{digest}.ckpt")), "{path}");
        }
    }
    // Iteration 1's rollout loaded the checkpoint iteration 0's update wrote, by digest.
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(a.store().join("gridnav/_commits/iter=000001/rollout.json")).unwrap(),
    )
    .unwrap();
    let input = m["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "artifact")
        .unwrap();
    let policy0 = artifacts(&a, "gridnav", 0, "update")
        .into_iter()
        .find(|x| x.0 == "policy")
        .unwrap();
    assert_eq!(input["digest"].as_str().unwrap(), policy0.1);
    // RM samples: m = 3 per step, scores in {−1, 0, 1}, responses end in the verdict.
    assert_eq!(
        a.sql("SELECT (SELECT count(*) FROM rm_samples) = 3 * (SELECT count(*) FROM steps)")
            .ok()
            .scalar(),
        "true"
    );
    let q = "SELECT count(*) FROM rm_samples WHERE NOT ((score = 1 AND response LIKE '%<good>') \
             OR (score = -1 AND response LIKE '%<bad>') \
             OR (score = 0 AND response NOT LIKE '%<good>' AND response NOT LIKE '%<bad>'))";
    assert_eq!(a.sql(q).ok().scalar(), "0");
    assert_eq!(
        a.sql("SELECT count(*) FROM task_accuracy WHERE rm_process_acc IS NULL")
            .ok()
            .scalar(),
        "0"
    );
    // Steps carry the policy's normalized log-probability and the admissible set.
    let q = "SELECT count(*) FROM steps WHERE action_logprob > 0 OR admissible NOT LIKE '[%'";
    assert_eq!(a.sql(q).ok().scalar(), "0");
    // Both models trained: `update.policy_steps` / `rm_steps` rows each, per iteration.
    let q = "SELECT model, count(*) FROM update_metrics GROUP BY model ORDER BY model";
    assert_eq!(a.sql(q).ok().stdout, "model,count(*)\npolicy,4\nrm,4\n");
    // Sampled evaluation (the reference's): eval.rollouts = 3 seeded rollouts per held-out task.
    let q = "SELECT min(rollouts), max(rollouts) FROM evaluations";
    assert_eq!(a.sql(q).ok().csv(), vec![vec!["3", "3"]]);
    // Replay re-executes every stage, the checkpoints included, bit for bit.
    for iter in ["0", "1"] {
        let r = a
            .rla(&["replay", "--run", "gridnav", "--iter", iter, "--verify"])
            .ok();
        for needle in [
            "ok  rollout",
            "ok  rm_score",
            "ok  update",
            "checkpoint:policy",
            "checkpoint:rm",
            "ok  evaluate",
        ] {
            assert!(r.stdout.contains(needle), "{needle}:\n{}", r.stdout);
        }
        assert!(!r.stdout.contains("integrity"), "{}", r.stdout);
    }
}

#[test]
fn tampered_checkpoints_are_refused() {
    let f = Fixture::new();
    run_gridnav(&f, "1", SMALL_MODELS, &[]).ok();
    let (_, _, path) = artifacts(&f, "gridnav", 0, "update")
        .into_iter()
        .find(|x| x.0 == "policy")
        .unwrap();
    let file = f.store().join(&path);
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();
    run_gridnav(&f, "2", SMALL_MODELS, &[])
        .fails(1, &["checkpoint policy", "does not match the digest"]);
    assert!(
        !f.store()
            .join("gridnav/_commits/iter=000001/rollout.json")
            .exists()
    );
    f.rla(&["replay", "--run", "gridnav", "--iter", "0", "--verify"])
        .fails(1, &["checkpoint policy", "no longer matches"]);
    // A checkpoint of the wrong shape (config edited under a run) is refused by resume.
    run_gridnav(
        &f,
        "2",
        &[SMALL_MODELS, &["policy.d_model=16"]].concat(),
        &[],
    )
    .fails(1, &["policy.d_model"]);
}

#[test]
fn ablations_keep_the_shape_of_a_run() {
    let f = Fixture::new();
    let mut sets = SMALL_MODELS.to_vec();
    sets.push("reward_model.enabled=false");
    run_gridnav(&f, "2", &sets, &[]).ok();
    // Outcome only: no RM samples, R = O, no RM training; the RM checkpoint is carried unchanged.
    assert_eq!(f.sql("SELECT count(*) FROM rm_samples").ok().scalar(), "0");
    assert_eq!(
        f.sql("SELECT count(*) FROM update_metrics WHERE model = 'rm'")
            .ok()
            .scalar(),
        "0"
    );
    let rm = |iter| {
        artifacts(&f, "gridnav", iter, "update")
            .into_iter()
            .find(|x| x.0 == "rm")
            .unwrap()
            .1
    };
    assert_eq!(rm(0), rm(1));
    // gc keeps every committed checkpoint and removes an orphaned one (a write whose manifest
    // never committed).
    let orphan = f
        .store()
        .join("gridnav/artifacts/iter=000001/policy.0000.ckpt");
    std::fs::write(&orphan, b"orphan").unwrap();
    let g = f.rla(&["gc", "--grace-secs", "0"]).ok();
    assert!(g.stdout.contains("policy.0000.ckpt"), "{}", g.stdout);
    assert!(!orphan.exists());
    for (_, _, path) in artifacts(&f, "gridnav", 1, "update") {
        assert!(f.store().join(path).exists());
    }
    f.rla(&["replay", "--run", "gridnav", "--iter", "1", "--verify"])
        .ok();
    // The uniform policy is never trained, and still commits every stage.
    let store = f.store_arg();
    let mut args = vec![
        "run",
        GRIDNAV,
        "--store",
        &store,
        "--run-id",
        "uniform",
        "--iterations",
        "1",
    ];
    for s in SMALL_MODELS {
        args.extend(["--set", s]);
    }
    args.extend([
        "--set",
        "policy.kind=uniform",
        "--set",
        "reward_model.enabled=false",
    ]);
    f.rla(&args).ok();
    let q = "SELECT count(*) FROM update_metrics";
    assert_eq!(
        f.rla(&["sql", "--run", "uniform", "--format", "csv", q])
            .ok()
            .scalar(),
        "0"
    );
    let q = "SELECT count(DISTINCT stage) FROM stage_runs";
    assert_eq!(
        f.rla(&["sql", "--run", "uniform", "--format", "csv", q])
            .ok()
            .scalar(),
        "10"
    );
}

/// Easy gridnav (4×4, no walls): a few iterations of PPO lift greedy held-out success by at least
/// 20 points over the untrained policy.
#[test]
fn policy_learns_easy_gridnav() {
    let f = Fixture::new();
    let sets = [
        "env.gridnav.size=4",
        "env.gridnav.wall_density=0.0",
        "env.gridnav.min_distance=1",
        "env.gridnav.max_distance=3",
        "env.gridnav.budget_factor=2.0",
        "env.initial_tasks=32",
        "eval.tasks=32",
        "reward_model.enabled=false",
        "policy.d_model=32",
        "policy.context=48",
        "update.policy_steps=16",
        "eval.mode=\"greedy\"",
    ];
    run_gridnav(&f, "5", &sets, &[]).ok();
    let success = |iter: u32| -> f64 {
        f.sql(&format!(
            "SELECT sum(successes) * 1.0 / sum(rollouts) FROM evaluations WHERE iter = {iter} AND split = 'held_out'"
        ))
        .ok()
        .scalar()
        .parse()
        .unwrap()
    };
    let (first, last) = (success(0), success(4));
    println!("greedy held-out success: iteration 0 {first:.3}, iteration 4 {last:.3}");
    assert!(last >= first + 0.2, "{first} → {last}");
}
