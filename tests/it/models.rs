//! The models end to end: learned rollouts, RM scoring, the PPO update, checkpoints as
//! artifacts (digests verified), determinism and replay, and a small learning test.

use crate::{Fixture, GRIDNAV, Run};

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
    "pretrain.policy_episodes=8",
    "pretrain.policy_epochs=1",
    "pretrain.rm_steps=64",
    "pretrain.rm_epochs=1",
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
    // Every stage, pretrain included (it plays its demonstrations; neither model is trained).
    let q = "SELECT count(DISTINCT stage) FROM stage_runs";
    assert_eq!(
        f.rla(&["sql", "--run", "uniform", "--format", "csv", q])
            .ok()
            .scalar(),
        "11"
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

/// The warm start: `pretrain` commits at iteration 0 only, its `demonstrations` come from a
/// distribution disjoint from the training pool, the held-out and the OOD sets, its checkpoints
/// are content-addressed artifacts that iteration 0's rollout and update load (iteration 1's
/// come from iteration 0's update), and replay re-executes it bit for bit. With
/// `pretrain.enabled = false` the run starts cold from the seeded initial checkpoints.
#[test]
fn pretrain_is_a_committed_replayable_warm_start() {
    let f = Fixture::new();
    let mut sets: Vec<&str> = SMALL_MODELS
        .iter()
        .copied()
        .filter(|s| !s.starts_with("pretrain."))
        .collect();
    sets.extend(crate::SMALL_PRETRAIN);
    run_gridnav(&f, "2", &sets, &[]).ok();
    let q = "SELECT iter FROM stage_runs WHERE stage = 'pretrain'";
    assert_eq!(f.sql(q).ok().csv(), vec![vec!["0"]]);
    let q = "SELECT purpose, count(*) > 0, count(DISTINCT task_id) > 1 FROM demonstrations GROUP BY purpose ORDER BY purpose";
    assert_eq!(
        f.sql(q).ok().csv(),
        vec![vec!["policy", "true", "true"], vec!["rm", "true", "true"]]
    );
    // The policy imitates the planner; the RM sees both verdicts, labelled by the oracle.
    let q = "SELECT bool_and(planner) FROM demonstrations WHERE purpose = 'policy'";
    assert_eq!(f.sql(q).ok().scalar(), "true");
    let q = "SELECT count(DISTINCT oracle_progress) FROM demonstrations WHERE purpose = 'rm'";
    assert_eq!(f.sql(q).ok().scalar(), "2");
    // Disjoint from the training pool (every iteration) and from both evaluation sets.
    for other in ["tasks", "evaluations"] {
        let q = format!(
            "SELECT count(*) FROM demonstrations d JOIN {other} o ON o.task_id = d.task_id"
        );
        assert_eq!(f.sql(&q).ok().scalar(), "0", "{other}");
    }
    // Who loaded which checkpoint, by digest.
    let pretrained = artifacts(&f, "gridnav", 0, "pretrain");
    assert_eq!(pretrained.len(), 2);
    for (name, digest, path) in &pretrained {
        let bytes = std::fs::read(f.store().join(path)).unwrap();
        assert_eq!(blake3::hash(&bytes).to_hex().to_string(), *digest, "{name}");
    }
    let input = |iter: u32, stage: &str, name: &str| -> (String, String) {
        let path = f
            .store()
            .join(format!("gridnav/_commits/iter={iter:06}/{stage}.json"));
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let i = m["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["tables"][0] == name && i["kind"] != "manifest")
            .unwrap()
            .clone();
        (
            i["kind"].as_str().unwrap().to_string(),
            i["digest"].as_str().unwrap().to_string(),
        )
    };
    let digest_of = |arts: &[(String, String, String)], name: &str| {
        arts.iter().find(|a| a.0 == name).unwrap().1.clone()
    };
    for (stage, name) in [
        ("rollout", "policy"),
        ("update", "policy"),
        ("update", "rm"),
    ] {
        assert_eq!(
            input(0, stage, name),
            ("artifact".to_string(), digest_of(&pretrained, name)),
            "{stage} {name}"
        );
    }
    assert_eq!(input(0, "pretrain", "policy").0, "init");
    let updated0 = artifacts(&f, "gridnav", 0, "update");
    assert_eq!(
        input(1, "rollout", "policy"),
        ("artifact".to_string(), digest_of(&updated0, "policy"))
    );
    let r = f
        .rla(&["replay", "--run", "gridnav", "--iter", "0", "--verify"])
        .ok();
    for t in [
        "pretrain       checkpoint:policy",
        "pretrain       checkpoint:rm",
        "pretrain       demonstrations",
    ] {
        assert!(
            r.stdout.contains(&format!("ok  {t}")) && r.stdout.contains("(replayed)"),
            "{t}: {}",
            r.stdout
        );
    }
    // Cold start: no pretrain stage, iteration 0 loads the seeded initial checkpoint.
    let cold = Fixture::new();
    let mut sets = sets.clone();
    sets.push("pretrain.enabled=false");
    run_gridnav(&cold, "1", &sets, &[]).ok();
    let q = "SELECT count(*) FROM stage_runs WHERE stage = 'pretrain'";
    assert_eq!(cold.sql(q).ok().scalar(), "0");
    assert_eq!(
        cold.sql("SELECT count(*) FROM demonstrations")
            .ok()
            .scalar(),
        "0"
    );
    let path = cold
        .store()
        .join("gridnav/_commits/iter=000000/rollout.json");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert!(
        m["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["kind"] == "init" && i["tables"][0] == "policy"),
        "{m}"
    );
}
