//! `env.name = "textworld"`: TextWorld's games through the bridge, checked against TextWorld
//! itself. The test installs `textworld==1.7.0` with pip if it is missing.

use super::{Fixture, python_packages, small_slow_env};

const TEXTWORLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/textworld.toml");
const CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envs/textworld_check.py");

/// A small TextWorld run: uniform policy (so rollouts mostly lose), a small warm start (the
/// planner's episodes), small models.
fn small(cache: &str, family: &str) -> Vec<String> {
    let warm_start = [
        "pretrain.tasks=6",
        "pretrain.policy_episodes=3",
        "pretrain.policy_epochs=1",
        "pretrain.rm_steps=24",
        "pretrain.rm_epochs=1",
    ];
    small_slow_env(3)
        .into_iter()
        .chain(warm_start.iter().map(|s| s.to_string()))
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

#[test]
fn textworld_custom_games_match_textworld_itself() {
    games_match_textworld_itself("custom");
}

#[test]
fn textworld_cooking_games_match_textworld_itself() {
    games_match_textworld_itself("cooking");
}

/// One family (two tests, so they run side by side): games are made, the planner's episodes
/// win, the uniform policy mostly loses, and every committed step's admissible actions and
/// oracle equal TextWorld's own `EnvInfos` at that state (the checker makes each game again from
/// its spec and replays the actions). The run then replays bit for bit.
fn games_match_textworld_itself(family: &str) {
    python_packages("textworld", &["textworld==1.7.0"]);
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
        .args([
            CHECK,
            steps.to_str().unwrap(),
            demos.to_str().unwrap(),
            &cache,
        ])
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
    assert!(n("games") >= 3, "{family}: {c}");
    assert_eq!(n("planner_won"), n("planner_episodes"), "{family}: {c}");
    assert!(
        n("won") * 2 < n("trajectories"),
        "{family}: the uniform policy mostly loses: {c}"
    );
    let games = std::fs::read_dir(std::path::Path::new(&cache).join("games"))
        .unwrap()
        .count();
    assert!(games >= 3, "{family}: {games} games in the cache");
    let verify = || {
        f.rla(&[
            "replay",
            "--store",
            &f.store_arg(),
            "--run",
            "tw",
            "--iter",
            "0",
            "--verify",
        ])
    };
    // The games are kept in the store: one asset per game played (training pool, held-out,
    // OOD, demonstrations), and a machine without the cache replays the run bit for bit from
    // them (a cooking game made again is not the same bytes, so this fails if they are made
    // again).
    let mut assets = Vec::new();
    let artifacts = f.store().join("tw").join("artifacts");
    for it in std::fs::read_dir(&artifacts).unwrap() {
        for a in std::fs::read_dir(it.unwrap().path()).unwrap() {
            let name = a.unwrap().file_name().to_string_lossy().to_string();
            if name.starts_with("asset-") && name.ends_with(".asset") {
                assets.push(name);
            }
        }
    }
    assert!(assets.len() > 3 + 2, "{family}: assets {assets:?}");
    std::fs::remove_dir_all(&cache).unwrap();
    let r = verify();
    assert_eq!(
        r.code, 0,
        "{family}: replay --verify without the game cache\n{}{}",
        r.stdout, r.stderr
    );
    let remade = std::fs::read_dir(std::path::Path::new(&cache).join("games"))
        .unwrap()
        .count();
    assert!(remade >= assets.len(), "{family}: {remade} games installed");
    if family == "custom" {
        crashed_then_resumed_without_the_cache(&f, &cache, &sets);
    }
    // A corrupt asset is refused with its path, never played.
    let victim = std::fs::read_dir(artifacts.join("iter=000000"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "asset"))
        .unwrap();
    std::fs::write(&victim, b"not a game").unwrap();
    std::fs::remove_dir_all(&cache).unwrap();
    let r = verify();
    assert_eq!(r.code, 1, "{family}: {}{}", r.stdout, r.stderr);
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        (r.stderr.contains("does not match the digest") || r.stderr.contains("no longer matches"))
            && r.stderr.contains(&name),
        "{family}: {}",
        r.stderr
    );
}

/// The same run, killed right after its rollout wrote its files (bridges running, nothing of the
/// rollout committed), then resumed with the same command on a machine without the game cache:
/// the resumed stages play the games kept in the store, and every committed file equals the
/// uninterrupted run's (`tw` in the fixture's store).
fn crashed_then_resumed_without_the_cache(f: &Fixture, cache: &str, sets: &[&str]) {
    let other = f.dir.path().join("crashed");
    let other_arg = other.display().to_string();
    let mut args = vec![
        "run",
        TEXTWORLD,
        "--store",
        &other_arg,
        "--run-id",
        "tw",
        "--iterations",
        "1",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let r = f.rla_env(&[("RLA_PIPE_CRASH_AT", "after-data:3")], &args);
    assert!(r.code != 0, "{}", r.stderr);
    assert!(r.stderr.contains("aborting at after-data"), "{}", r.stderr);
    let commits = other.join("tw/_commits/iter=000000");
    assert!(commits.join("pool.json").exists() && !commits.join("rollout.json").exists());
    std::fs::remove_dir_all(cache).unwrap();
    let r = f.rla(&args).ok();
    assert!(
        r.stderr.contains("committed earlier, skipped"),
        "{}",
        r.stderr
    );
    for store in [f.store_arg(), other_arg.clone()] {
        f.rla(&["gc", "--store", &store, "--grace-secs", "0"]).ok();
    }
    let digests = |root: &std::path::Path| {
        let mut files = Vec::new();
        crate::walk(root, root, &mut files);
        let mut out: Vec<(String, String)> = files
            .into_iter()
            .filter(|p| p.starts_with("tw/data/") || p.starts_with("tw/artifacts/"))
            .map(|p| {
                // Data files are named by attempt: compare by directory.
                let key = if p.starts_with("tw/data/") {
                    p.rsplit_once('/').unwrap().0.to_string()
                } else {
                    p.clone()
                };
                let bytes = std::fs::read(root.join(&p)).unwrap();
                (key, blake3::hash(&bytes).to_hex().to_string())
            })
            .collect();
        out.sort();
        out
    };
    let (a, b) = (digests(&f.store()), digests(&other));
    assert!(
        a.iter().filter(|(p, _)| p.ends_with(".asset")).count() >= 6,
        "{a:?}"
    );
    assert_eq!(a, b);
}

/// Without TextWorld for `env.textworld.python` (here a Python that sees no installed
/// packages), the run stops with one `environment error:` that names the fix, the bridge's
/// exception in a line and its whole traceback only under `-v` (issue 50).
#[test]
fn a_missing_textworld_is_one_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    let py = f.dir.path().join("python-without-packages");
    std::fs::write(&py, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = f.dir.path().join("tw-cache").display().to_string();
    let python = format!("env.textworld.python={:?}", py.display().to_string());
    let cache = format!("env.textworld.cache_dir={cache:?}");
    let r = f
        .run_pipeline(TEXTWORLD, "tw", 1, &[&python, &cache])
        .fails(
            1,
            &[
                "error: environment error: textworld: making the game of",
                "pip install textworld==1.7.0",
            ],
        );
    assert_eq!(
        r.stderr.matches("environment error").count(),
        1,
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("Traceback"), "{}", r.stderr);
    assert!(r.stderr.contains("No module named"), "{}", r.stderr);
}
