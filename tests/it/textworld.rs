//! `env.name = "textworld"`: TextWorld's games through the bridge, checked against TextWorld
//! itself. The test installs `textworld==1.7.0` with pip if it is missing.

use super::{Fixture, python_packages};

const TEXTWORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/textworld.toml");
const CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envs/textworld_check.py");

/// A small TextWorld run: uniform policy (so rollouts mostly lose), a small warm start (the
/// planner's episodes), small models.
fn small(cache: &str, family: &str) -> Vec<String> {
    [
        "env.initial_tasks=3",
        "rollout.n=2",
        "rollout.slots_per_iter=3",
        "eval.tasks=1",
        "eval.ood_tasks=1",
        "eval.rollouts=1",
        "policy.kind=uniform",
        "policy.d_model=16",
        "reward_model.d_model=16",
        "update.rm_steps=2",
        "pretrain.policy_episodes=3",
        "pretrain.policy_epochs=1",
        "pretrain.rm_steps=24",
        "pretrain.rm_epochs=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("env.textworld.cache_dir={cache}"),
        format!("env.textworld.family={family:?}"),
    ])
    .collect()
}

fn csv(f: &Fixture, query: &str, to: &std::path::Path) {
    let r = f.sql(query).ok();
    std::fs::write(to, r.stdout).unwrap();
}

/// Both families: games are made, the planner's episodes win, the uniform policy mostly loses,
/// and every committed step's admissible actions and oracle equal TextWorld's own `EnvInfos`
/// at that state (the checker makes each game again from its spec and replays the actions).
/// The run then replays bit for bit.
#[test]
fn textworld_games_match_textworld_itself() {
    python_packages("textworld", &["textworld==1.7.0"]);
    for family in ["custom", "cooking"] {
        let f = Fixture::new();
        let cache = f.store().join("..").join(format!("tw-cache-{family}"));
        let cache = cache.display().to_string();
        let sets = small(&cache, family);
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        f.run_pipeline(TEXTWORLD, "tw", 1, &sets).ok();
        let dir = f.store().join("..");
        let steps = dir.join(format!("steps-{family}.csv"));
        let demos = dir.join(format!("demos-{family}.csv"));
        csv(
            &f,
            "SELECT t.spec, s.traj_id, s.step_idx, s.action, s.admissible, s.oracle_progress \
             FROM steps s JOIN tasks t ON s.task_id = t.task_id AND s.iter = t.iter",
            &steps,
        );
        csv(
            &f,
            "SELECT spec, purpose, episode, step_idx, action, planner, admissible, oracle_progress \
             FROM demonstrations",
            &demos,
        );
        let out = std::process::Command::new("python3")
            .args([CHECK, steps.to_str().unwrap(), demos.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{family}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let n = |k: &str| c[k].as_u64().unwrap();
        assert!(n("trajectories") >= 6 && n("steps") > 0, "{family}: {c}");
        assert!(n("planner_episodes") >= 3, "{family}: {c}");
        assert_eq!(n("planner_won"), n("planner_episodes"), "{family}: {c}");
        assert!(
            n("won") * 2 < n("trajectories"),
            "{family}: the uniform policy mostly loses: {c}"
        );
        let games = std::fs::read_dir(std::path::Path::new(&cache).join("games"))
            .unwrap()
            .count();
        assert!(games >= 3, "{family}: {games} games in the cache");
        let r = f.rla(&[
            "replay",
            "--store",
            &f.store_arg(),
            "--run",
            "tw",
            "--iter",
            "0",
            "--verify",
        ]);
        assert_eq!(
            r.code, 0,
            "{family}: replay --verify\n{}{}",
            r.stdout, r.stderr
        );
    }
}
