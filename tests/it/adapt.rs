//! Environment adaptation and the full loop: pool bookkeeping over real runs, the ablation
//! switches, the OpenAI-compatible adapter against a local server, and kill / resume.

use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::{Fixture, GRIDNAV};

const HOUSEHOLD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/household.toml");

/// The accepted-task growth query of the README.
const GROWTH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/sql/accepted_growth.sql"
);

/// A small, quick gridnav loop (learned policy and RM, few optimizer steps).
const SMALL_GRIDNAV: [&str; 7] = [
    "env.initial_tasks=16",
    "update.policy_steps=4",
    "update.rm_steps=4",
    "pretrain.policy_episodes=8",
    "pretrain.policy_epochs=1",
    "pretrain.rm_steps=64",
    "pretrain.rm_epochs=1",
];

#[test]
fn gridnav_loop_rewrites_and_judges_tasks() {
    let f = Fixture::new();
    let r = f.run_pipeline(GRIDNAV, "gridnav", 3, &SMALL_GRIDNAV).ok();
    // One summary line per iteration.
    for i in 0..3 {
        let line = r
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("iter {i:>3}  committed in")))
            .unwrap_or_else(|| panic!("no summary for iteration {i}:\n{}", r.stderr));
        for part in [
            "train ",
            "held-out ",
            "RM process ",
            " accepted, ",
            " pending",
        ] {
            assert!(line.contains(part), "{line}");
        }
    }
    // Iteration 0 writes candidates for out-of-band tasks; each joins iteration 1's pool as
    // pending in its parent's slot...
    let pending0: u64 = f
        .sql("SELECT count(*) FROM adaptations WHERE iter = 0 AND decision = 'pending'")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert!(
        pending0 > 0,
        "an untrained policy leaves tasks outside the band"
    );
    let q = "SELECT count(*) FROM adaptations a JOIN tasks t ON t.iter = a.iter + 1 \
             AND t.task_id = a.candidate_task_id AND t.slot = a.slot AND t.status = 'pending' \
             AND t.parent_task_id = a.task_id WHERE a.decision = 'pending'";
    let pending_all = f
        .sql("SELECT count(*) FROM adaptations WHERE decision = 'pending' AND iter < 2")
        .ok()
        .scalar();
    assert_eq!(f.sql(q).ok().scalar(), pending_all);
    // ... gets the same n = 8 rollouts as every active task rolled out, INSTEAD of its parent
    // (a slot with a pending candidate rolls out only the candidate) ...
    let q = "SELECT count(*) FROM tasks t LEFT JOIN \
             (SELECT iter, task_id, count(*) AS n FROM trajectories GROUP BY iter, task_id) r \
             ON r.iter = t.iter AND r.task_id = t.task_id \
             WHERE COALESCE(r.n, 0) <> CASE WHEN t.rolled_out THEN 8 ELSE 0 END";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    let q = "SELECT count(*) FROM tasks p JOIN tasks a ON a.iter = p.iter AND a.slot = p.slot \
             AND a.status = 'active' WHERE p.status = 'pending' AND (a.rolled_out OR NOT p.rolled_out)";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    // ... is judged BEFORE training (`judgements`, the same decisions `adaptations` records),
    // and a rejected candidate's samples are in neither advantage table's training set.
    let q = "SELECT count(*) FROM judgements j JOIN adaptations a ON a.iter = j.iter \
             AND a.candidate_task_id = j.task_id AND a.decision = j.decision";
    let judged = f.sql(q).ok().scalar();
    let q = "SELECT count(*) FROM adaptations WHERE decision IN ('accepted', 'rejected')";
    assert_eq!(judged, f.sql(q).ok().scalar());
    assert_eq!(
        judged,
        f.sql("SELECT count(*) FROM judgements").ok().scalar()
    );
    for table in ["policy_advantages", "rm_advantages"] {
        let q = format!(
            "SELECT count(*) FROM {table} p JOIN judgements j ON j.iter = p.iter \
             AND j.task_id = p.task_id WHERE j.decision = 'rejected' AND p.included"
        );
        assert_eq!(f.sql(&q).ok().scalar(), "0", "{table}");
    }
    // ... and is judged in the next iteration with the accuracy it reached there.
    let q = "SELECT count(*) FROM adaptations p JOIN adaptations j \
             ON j.iter = p.iter + 1 AND j.candidate_task_id = p.candidate_task_id \
             JOIN task_accuracy ta ON ta.iter = j.iter AND ta.task_id = j.candidate_task_id \
             WHERE p.decision = 'pending' AND j.decision IN ('accepted', 'rejected') \
             AND j.candidate_acc = ta.acc AND j.prev_acc = p.prev_acc AND j.direction = p.direction";
    assert_eq!(f.sql(q).ok().scalar(), pending_all);
    // The rule holds on every judged row (inclusive bounds, α = 0.2 / 0.8).
    let q = "SELECT count(*) FROM adaptations WHERE decision IN ('accepted', 'rejected') AND \
             (decision = 'accepted') <> (candidate_acc > 0 AND CASE WHEN direction = 'harder' \
             THEN candidate_acc >= 0.2 AND candidate_acc < prev_acc \
             ELSE candidate_acc > prev_acc AND candidate_acc <= 0.8 END)";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    // An accepted candidate holds its parent's slot as an active task one iteration later.
    let q = "SELECT count(*) FROM adaptations a LEFT JOIN tasks t ON t.iter = a.iter + 1 \
             AND t.task_id = a.candidate_task_id AND t.slot = a.slot AND t.status = 'active' \
             WHERE a.decision = 'accepted' AND a.iter < 2 AND t.task_id IS NULL";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    // Every slot has exactly one active task, every iteration.
    let q = "SELECT count(*) FROM (SELECT iter, slot FROM tasks WHERE status = 'active' \
             GROUP BY iter, slot HAVING count(*) <> 1)";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    assert_eq!(
        f.sql("SELECT count(*) FROM tasks WHERE status = 'active'")
            .ok()
            .scalar(),
        "48"
    );
    // The critic the adapter saw is recorded on each new candidate; judged rows have none.
    let q = "SELECT count(*) FROM adaptations WHERE (decision = 'pending') <> (critic IS NOT NULL)";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    let critic = f
        .rla(&[
            "sql",
            "--format",
            "json",
            "SELECT critic FROM adaptations WHERE decision = 'pending' ORDER BY iter, slot LIMIT 1",
        ])
        .ok()
        .stdout;
    for key in [
        "accuracy",
        "high_risk_steps",
        "step_verdicts",
        "critique_words",
        "failed_rollouts",
    ] {
        assert!(critic.contains(key), "{critic}");
    }
    // The growth query: one row per iteration.
    let growth = f
        .rla(&["sql", "--format", "csv", "--file", GROWTH])
        .ok()
        .csv();
    assert_eq!(growth.len(), 3);
    // run_id, iter, accepted, cumulative: the running total adds up.
    let mut total = 0;
    for (i, row) in growth.iter().enumerate() {
        assert_eq!(row[1], i.to_string());
        total += row[2].parse::<u64>().unwrap();
        assert_eq!(row[3], total.to_string());
    }
    // A diagnostics file's rows, and one figure of iteration `i` computed another way.
    let diagnostics = |file: &str| {
        f.rla(&["sql", "--format", "csv", "--file", file])
            .ok()
            .records()
    };
    let at = |q: &str, i: usize| f.sql(&q.replace("{i}", &i.to_string())).ok().scalar();
    // The learning-signal diagnostics: one row per iteration, each figure equal to the same
    // figure computed another way from the rows it summarises.
    let rows = diagnostics(crate::LEARNING_SIGNAL);
    assert_eq!(rows.len(), 3, "{rows:?}");
    // The adaptation diagnostics: one row for the run, whose verdict counts are the judge's.
    let adapt_signal = diagnostics(crate::ADAPT_SIGNAL);
    assert_eq!(adapt_signal.len(), 1, "{adapt_signal:?}");
    assert_ne!(adapt_signal[0]["judged"], "0", "{adapt_signal:?}");
    for (column, q) in [
        ("judged", "SELECT count(*) FROM judgements"),
        (
            "accepted",
            "SELECT count(*) FROM judgements WHERE decision = 'accepted'",
        ),
    ] {
        assert_eq!(adapt_signal[0][column], f.sql(q).ok().scalar(), "{column}");
    }
    // Generalisation: per iteration, the seed tasks' and the adapted tasks' rollouts are all of
    // its training rollouts, the seed tasks' success is theirs, and the held-out figure is the
    // evaluation of the iteration before (none at iteration 0).
    let general = diagnostics(crate::GENERALISATION);
    assert_eq!(general.len(), 3, "{general:?}");
    let rolled = "FROM task_accuracy a JOIN tasks t ON t.iter = a.iter AND t.task_id = a.task_id \
                  WHERE a.iter = {i} AND COALESCE(t.rolled_out, true)";
    for (i, row) in general.iter().enumerate() {
        assert_eq!(row["iter"], i.to_string());
        let n = |c: &str| row[c].parse::<u64>().unwrap();
        assert_eq!(
            (n("seed_rollouts") + n("adapted_rollouts")).to_string(),
            at(&format!("SELECT sum(a.rollouts) {rolled}"), i)
        );
        assert_eq!(
            row["seed_tasks"],
            at(
                &format!(
                    "SELECT round(CAST(sum(a.successes) AS DOUBLE) / CAST(sum(a.rollouts) AS \
                     DOUBLE), 3) {rolled} AND t.parent_task_id IS NULL"
                ),
                i
            )
        );
        let before = if i == 0 {
            String::new()
        } else {
            at(
                "SELECT round(CAST(sum(successes) AS DOUBLE) / CAST(sum(rollouts) AS DOUBLE), 3) \
                 FROM evaluations WHERE split = 'held_out' AND iter = {i} - 1",
                i,
            )
        };
        assert_eq!(row["held_out_before"], before, "{general:?}");
    }
    let policy_signal = diagnostics(crate::POLICY_SIGNAL);
    assert_eq!(policy_signal.len(), 3, "{policy_signal:?}");
    assert!(
        policy_signal.iter().any(|r| r["rm_signs"] != "0"),
        "the reward model sets some signs: {policy_signal:?}"
    );
    for (i, row) in rows.iter().enumerate() {
        let one = |q: &str| at(q, i);
        assert_eq!(row["iter"], i.to_string());
        assert_eq!(
            row["tasks_used"],
            one(
                "SELECT count(*) FROM (SELECT DISTINCT task_id FROM policy_advantages \
                 WHERE iter = {i} AND included)"
            )
        );
        let count = |q: &str| -> f64 { one(q).parse().unwrap() };
        let num = |name: &str| -> f64 { row[name].parse().unwrap() };
        let used = count("SELECT count(*) FROM policy_advantages WHERE iter = {i} AND included");
        let all = count("SELECT count(*) FROM policy_advantages WHERE iter = {i}");
        let share = num("steps_used");
        assert!(
            (share - used / all).abs() <= 5e-4,
            "{share} vs {used}/{all}"
        );
        let verdicts = count("SELECT count(*) FROM rm_samples WHERE iter = {i} AND score <> 0");
        let samples = count("SELECT count(*) FROM rm_samples WHERE iter = {i}");
        let rate = num("rm_verdict_rate");
        assert!((rate - verdicts / samples).abs() <= 5e-4, "{rate}");
        let kl = num("policy_kl");
        assert!(kl >= 0.0, "the k3 estimate is never negative: {kl}");
        // The signs the RM decides, counted with a grouped join instead of window functions,
        // and those that agree with the step oracle (pipelines/sql/policy_signal.sql).
        let rm_signs = "FROM policy_advantages p \
             JOIN trajectories t ON p.iter = t.iter AND p.traj_id = t.traj_id \
             JOIN steps s ON s.iter = p.iter AND s.traj_id = p.traj_id AND s.step_idx = p.step_idx \
             JOIN (SELECT p2.task_id, p2.step_idx, count(*) AS n, \
                          sum(CASE WHEN t2.outcome > 0 THEN 1 ELSE 0 END) AS won \
                   FROM policy_advantages p2 \
                   JOIN trajectories t2 ON p2.iter = t2.iter AND p2.traj_id = t2.traj_id \
                   WHERE p2.iter = {i} GROUP BY p2.task_id, p2.step_idx) g \
               ON g.task_id = p.task_id AND g.step_idx = p.step_idx \
             WHERE p.iter = {i} AND p.included AND p.advantage <> 0 \
               AND ((g.n > 1 AND (g.won = 0 OR g.won = g.n)) \
                    OR ((p.advantage > 0) <> (t.outcome > 0)))";
        let decided = count(&format!("SELECT count(*) {rm_signs}"));
        let moved = count(
            "SELECT count(*) FROM policy_advantages WHERE iter = {i} AND included AND advantage <> 0",
        );
        let policy = &policy_signal[i];
        assert_eq!(policy["samples"], moved.to_string(), "{policy:?}");
        assert_eq!(policy["rm_signs"], decided.to_string(), "{policy:?}");
        if decided > 0.0 {
            let agree = count(&format!(
                "SELECT count(*) {rm_signs} AND (p.advantage > 0) = (s.oracle_progress > 0)"
            ));
            let share: f64 = policy["rm_signs_agree_oracle"].parse().unwrap();
            assert!(
                (share - agree / decided).abs() <= 5e-4,
                "{share} vs {agree}/{decided}"
            );
        }
        let entropy = num("policy_entropy");
        let sampled = count("SELECT avg(-action_logprob) FROM steps WHERE iter = {i}");
        assert!(
            entropy > 0.0 && (entropy - sampled).abs() <= 5e-4,
            "{entropy} vs {sampled}"
        );
    }
    // What the RM's update teaches it: the included samples by outcome add up, and the share
    // pushing "good" equals the same count made from the samples' scores and advantages.
    let signal = diagnostics(crate::RM_SIGNAL);
    assert_eq!(signal.len(), 3, "{signal:?}");
    for (i, row) in signal.iter().enumerate() {
        let one = |q: &str| -> f64 { at(q, i).parse().unwrap() };
        let num = |name: &str| -> f64 { row[name].parse().unwrap() };
        let included = one("SELECT count(*) FROM rm_advantages WHERE iter = {i} AND included");
        assert_eq!(num("samples"), included, "{row:?}");
        assert_eq!(num("from_won") + num("from_lost"), included, "{row:?}");
        let good = one(
            "SELECT count(*) FROM rm_advantages WHERE iter = {i} AND included AND score <> 0 \
             AND ((advantage > 0 AND score = 1) OR (advantage < 0 AND score = -1))",
        );
        let verdicts =
            one("SELECT count(*) FROM rm_advantages WHERE iter = {i} AND included AND score <> 0");
        assert!(
            (num("push_good") - good / verdicts).abs() <= 5e-4,
            "{row:?}: {good}/{verdicts}"
        );
        let weighted = one(
            "SELECT sum(CASE WHEN (advantage > 0 AND score = 1) OR (advantage < 0 AND score = -1) \
             THEN abs(advantage) ELSE 0.0 END) / sum(abs(advantage)) FROM rm_advantages \
             WHERE iter = {i} AND included AND score <> 0",
        );
        assert!(
            (num("push_good_weighted") - weighted).abs() <= 5e-4,
            "{row:?}: {weighted}"
        );
        let agrees: f64 = num("push_agrees_oracle");
        assert!((0.0..=1.0).contains(&agrees), "{row:?}");
    }
    // The loop diagnostics: one row per iteration; the repeat share (A, B, A) equals the same
    // count made with a self-join instead of window functions.
    let loops = diagnostics(crate::STEP_LOOPS);
    assert_eq!(loops.len(), 3, "{loops:?}");
    for (i, row) in loops.iter().enumerate() {
        let one = |q: &str| -> f64 { at(q, i).parse().unwrap() };
        let steps = one("SELECT count(*) FROM steps WHERE iter = {i}");
        let repeats = one(
            "SELECT count(*) FROM steps a JOIN steps b ON a.iter = b.iter AND a.traj_id = b.traj_id \
             AND b.step_idx = a.step_idx - 1 JOIN steps c ON c.iter = a.iter \
             AND c.traj_id = a.traj_id AND c.step_idx = a.step_idx - 2 \
             WHERE a.iter = {i} AND a.action = c.action AND a.action <> b.action",
        );
        assert_eq!(row["steps"], steps.to_string());
        let share: f64 = row["repeat_share"].parse().unwrap();
        assert!(
            (share - repeats / steps).abs() <= 5e-4,
            "{share} vs {repeats}/{steps}"
        );
        let verdicts: f64 = row["rm_verdict_others"].parse().unwrap();
        assert!((-1.0..=1.0).contains(&verdicts), "{verdicts}");
    }
    // The evaluation episodes: per iteration and split, the episodes and wins `evaluations`
    // counts, and each split's repeat shares as the self-join counts them.
    let episodes = diagnostics(crate::EVAL_LOOPS);
    let splits = f
        .sql("SELECT iter, split, sum(rollouts), sum(successes) FROM evaluations GROUP BY iter, split ORDER BY iter, split")
        .ok()
        .csv();
    assert!(!splits.is_empty());
    assert_eq!(episodes.len(), splits.len(), "{episodes:?}");
    for (row, split) in episodes.iter().zip(&splits) {
        assert_eq!(
            [&row["iter"], &row["split"], &row["episodes"], &row["won"]],
            [&split[0], &split[1], &split[2], &split[3]],
            "{episodes:?}"
        );
        let lost = f
            .sql(&format!(
                "SELECT count(*) FROM (SELECT a.task_id, a.rollout_idx, \
                   sum(CASE WHEN a.action = c.action AND a.action <> b.action THEN 1.0 ELSE 0.0 END) AS r, \
                   max(a.step_idx) + 1 AS n \
                 FROM eval_steps a \
                 JOIN eval_steps b ON a.iter = b.iter AND a.split = b.split \
                   AND a.task_id = b.task_id AND a.rollout_idx = b.rollout_idx \
                   AND b.step_idx + 1 = a.step_idx \
                 JOIN eval_steps c ON a.iter = c.iter AND a.split = c.split \
                   AND a.task_id = c.task_id AND a.rollout_idx = c.rollout_idx \
                   AND c.step_idx + 2 = a.step_idx \
                 WHERE a.iter = {} AND a.split = '{}' AND a.outcome < 0 \
                 GROUP BY a.task_id, a.rollout_idx) WHERE 3 * r >= n",
                split[0], split[1]
            ))
            .ok()
            .scalar();
        assert_eq!(row["lost_in_loop"], lost, "{row:?}");
    }
    // Actions by kind: per iteration, the rows add up to the rollout's steps, the trained rows
    // and their advantages to the update's.
    let kinds = diagnostics(crate::ACTION_KINDS);
    for i in 0..3 {
        let rows: Vec<_> = kinds
            .iter()
            .filter(|r| r["iter"] == i.to_string())
            .collect();
        assert!(!rows.is_empty(), "{kinds:?}");
        let total =
            |col: &str| -> f64 { rows.iter().map(|r| r[col].parse::<f64>().unwrap()).sum() };
        let count = |q: &str| -> f64 { at(q, i).parse().unwrap() };
        assert_eq!(
            total("steps"),
            count("SELECT count(*) FROM steps WHERE iter = {i}")
        );
        assert_eq!(
            total("trained"),
            count("SELECT count(*) FROM policy_advantages WHERE iter = {i} AND included")
        );
        let advantages = count(
            "SELECT coalesce(sum(advantage), 0) FROM policy_advantages WHERE iter = {i} AND included",
        );
        assert!(
            (total("advantage_sum") - advantages).abs() <= 5e-4 * rows.len() as f64,
            "{} vs {advantages}",
            total("advantage_sum")
        );
        assert!((total("share") - 1.0).abs() <= 5e-4 * rows.len() as f64);
    }
    // The procedural adapter is deterministic: replay re-executes adapt and the next pool.
    let r = f
        .rla(&["replay", "--run", "gridnav", "--iter", "1", "--verify"])
        .ok();
    assert!(
        r.stdout.contains("ok  adapt") && r.stdout.contains("ok  pool"),
        "{}",
        r.stdout
    );
}

/// `env.pool_level = -1`: iteration 0's pool is drawn one level easier than the held-out set
/// (exactly the tasks the environment one level down draws from the pool's seed), the warm
/// start one level below that, and evaluation stays at the config's level.
#[test]
fn an_easier_pool_is_drawn_below_the_held_out_level() {
    use rla_pipe::determinism::derive_seed;
    use rla_pipe::env::{at_level, task_id};
    let f = Fixture::new();
    let mut sets: Vec<String> = SMALL_GRIDNAV.iter().map(|s| s.to_string()).collect();
    sets.push("env.pool_level=-1".into());
    let set_refs: Vec<&str> = sets.iter().map(String::as_str).collect();
    f.run_pipeline(GRIDNAV, "easy", 1, &set_refs).ok();
    f.run_pipeline(GRIDNAV, "same", 1, &SMALL_GRIDNAV).ok();
    let cfg = rla_pipe::config::Config::load(std::path::Path::new(GRIDNAV), &sets).unwrap();
    let draw = |level: i32, seed: u64, n: u32| -> Vec<String> {
        let e = at_level(&cfg.env, level).unwrap().unwrap();
        let mut ids: Vec<String> = e
            .generate(seed, n)
            .unwrap()
            .iter()
            .map(|s| task_id(e.name(), s))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let ids = |q: &str| -> Vec<String> { f.sql(q).ok().sorted_lines() };
    let pool = |run: &str| {
        ids(&format!(
            "SELECT task_id FROM tasks WHERE run_id = '{run}' AND iter = 0"
        ))
    };
    let n = cfg.env.initial_tasks;
    let want = draw(-1, derive_seed(cfg.run.seed, &["pool"]), n);
    assert_eq!(want.len(), n as usize, "the easier level repeats tasks");
    assert_eq!(pool("easy"), want);
    assert_eq!(
        pool("same"),
        draw(0, derive_seed(cfg.run.seed, &["pool"]), n)
    );
    assert_ne!(pool("easy"), pool("same"));
    // The demonstrations: one level below the pool, none of them a pool task.
    let p = &cfg.pretrain;
    let below = draw(
        -2,
        derive_seed(p.seed, &["pretrain"]),
        p.policy_episodes.max(p.tasks),
    );
    let demos = ids(
        "SELECT DISTINCT task_id FROM demonstrations WHERE run_id = 'easy' AND purpose = 'policy'",
    );
    assert!(!demos.is_empty());
    for d in &demos {
        assert!(
            below.contains(d),
            "{d} is not a task of the level below the pool"
        );
        assert!(!want.contains(d), "{d} is a pool task");
    }
    // Evaluation is the same in both runs: the held-out and OOD sets keep the config's levels.
    let eval = |run: &str| {
        ids(&format!(
            "SELECT DISTINCT split || ' ' || task_id FROM evaluations WHERE run_id = '{run}'"
        ))
    };
    assert_eq!(eval("easy"), eval("same"));
}

/// The paper's ablations: every run has the same stages and tables, disabled ones empty.
#[test]
fn ablation_switches_keep_the_run_shape() {
    let f = Fixture::new();
    for (run, extra) in [
        ("full", vec![]),
        (
            "policy-only",
            vec!["reward_model.enabled=false", "adapt.enabled=false"],
        ),
    ] {
        let sets: Vec<&str> = SMALL_GRIDNAV.iter().copied().chain(extra).collect();
        f.run_pipeline(GRIDNAV, run, 2, &sets).ok();
    }
    let stages = |run: &str| {
        f.sql(&format!(
            "SELECT iter, stage FROM stage_runs WHERE run_id = '{run}' ORDER BY iter, stage"
        ))
        .ok()
        .stdout
    };
    assert_eq!(stages("full"), stages("policy-only"));
    let count = |table: &str, run: &str| {
        f.sql(&format!(
            "SELECT count(*) FROM {table} WHERE run_id = '{run}'"
        ))
        .ok()
        .scalar()
    };
    for table in ["rm_samples", "rm_advantages", "adaptations"] {
        assert_eq!(count(table, "policy-only"), "0", "{table}");
        assert_ne!(count(table, "full"), "0", "{table}");
    }
    // Outcome-only: R = O; static tasks: the same pool every iteration.
    let q = "SELECT count(*) FROM step_rewards WHERE run_id = 'policy-only' AND reward <> CAST(outcome AS DOUBLE)";
    assert_eq!(f.sql(q).ok().scalar(), "0");
    let q = "SELECT count(DISTINCT task_id) FROM tasks WHERE run_id = 'policy-only'";
    assert_eq!(f.sql(q).ok().scalar(), "16");
    // The same SQL works on both: the growth query gives one row per iteration each.
    for run in ["full", "policy-only"] {
        let g = f
            .rla(&["sql", "--run", run, "--format", "csv", "--file", GROWTH])
            .ok();
        assert_eq!(g.csv().len(), 2, "{run}: {}", g.stdout);
    }
}

/// What the test server saw.
#[derive(Default)]
struct Seen {
    authorization: Vec<String>,
    bodies: Vec<serde_json::Value>,
    in_flight: usize,
    max_in_flight: usize,
}

/// The gridnav environment model for the tests (`crate::chat_server`). The first reply of a
/// conversation is not a task (the adapter must ask again); the second is a valid rewrite in a
/// fenced block: easier adds budget, harder widens the grid. Each reply waits 50 ms so that
/// concurrent requests overlap.
fn chat_server() -> (String, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let url = crate::chat_server(move |auth, body| {
        let messages = body["messages"].as_array().unwrap().clone();
        let user = messages[1]["content"].as_str().unwrap().to_string();
        {
            let mut s = log.lock().unwrap();
            s.authorization.push(auth.to_string());
            s.bodies.push(body.clone());
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        log.lock().unwrap().in_flight -= 1;
        let system = messages[0]["content"].as_str().unwrap();
        if system.contains("failed rollout") {
            "The policy looped. \\boxed{It walked into the same wall again and again.}".to_string()
        } else if messages.len() == 2 {
            "I would make the task more interesting.".to_string()
        } else {
            let spec_line = user.lines().nth(1).unwrap();
            let mut spec: serde_json::Value = serde_json::from_str(spec_line).unwrap();
            if user.contains("Direction: easier") {
                spec["budget"] = (spec["budget"].as_u64().unwrap() + 5).into();
            } else {
                spec["width"] = (spec["width"].as_u64().unwrap() + 1).into();
            }
            format!("Here it is:\n```json\n{spec}\n```")
        }
    });
    (url, seen)
}

#[test]
fn openai_adapter_against_a_local_server() {
    let f = Fixture::new();
    let store = f.store_arg();
    let (url, seen) = chat_server();
    let endpoint = format!("adapt.openai.endpoint=\"{url}\"");
    let base = |run: &str| -> Vec<String> {
        [
            "run",
            GRIDNAV,
            "--store",
            &store,
            "--run-id",
            run,
            "--iterations",
            "2",
            "--set",
            "env.initial_tasks=12",
            "--set",
            "policy.kind=uniform",
            "--set",
            "update.rm_steps=2",
            "--set",
            "pretrain.rm_steps=64",
            "--set",
            "adapt.adapter=\"openai\"",
            "--set",
            "adapt.openai.model=\"test-model\"",
            "--set",
            "adapt.openai.api_key_env=\"RLA_TEST_API_KEY\"",
            "--set",
            &endpoint,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let secret = "sk-test-5ecret-do-not-log";
    let run = |args: Vec<String>, key: Option<&str>| {
        let mut cmd = std::process::Command::new(crate::rla_pipe_bin());
        cmd.current_dir(f.dir.path())
            .env_remove("RUST_LOG")
            .args(&args);
        match key {
            Some(k) => cmd.env("RLA_TEST_API_KEY", k),
            None => cmd.env_remove("RLA_TEST_API_KEY"),
        };
        crate::Run::from(cmd.output().unwrap())
    };
    let mut args = base("llm");
    args.push("--verbose".into());
    let r = run(args, Some(secret)).ok();
    assert!(
        !r.stderr.contains(secret) && !r.stdout.contains(secret),
        "the key leaked into the output"
    );
    for file in f.files() {
        let bytes = std::fs::read(f.store().join(&file)).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(secret),
            "the key leaked into {file}"
        );
    }
    // Parquet is compressed: read every table back decoded, and the report.
    for table in [
        "tasks",
        "adaptations",
        "judgements",
        "task_accuracy",
        "steps",
        "rm_samples",
        "stage_runs",
    ] {
        let r = f
            .rla(&["sql", "--format", "json", &format!("SELECT * FROM {table}")])
            .ok();
        assert!(!r.stdout.contains(secret), "the key leaked into {table}");
    }
    let report = f.dir.path().join("r.html");
    f.rla(&["report", "llm", "--out", report.to_str().unwrap()])
        .ok();
    assert!(!std::fs::read_to_string(&report).unwrap().contains(secret));
    // Every out-of-band task got a candidate on the second request (the first reply was not
    // a task), with the key in the Authorization header and the model's name in the body.
    let written: u64 = f
        .sql("SELECT count(*) FROM adaptations WHERE decision = 'pending' AND adapter = 'openai'")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert!(written > 0);
    {
        let s = seen.lock().unwrap();
        // A conversation starts with 2 messages; each retry adds the reply and a correction.
        let conversations = s
            .bodies
            .iter()
            .filter(|b| b["messages"].as_array().unwrap().len() == 2)
            .count() as u64;
        assert!(conversations >= written, "{conversations} < {written}");
        assert!(
            s.bodies.len() as u64 >= 2 * written,
            "the first reply never validates"
        );
        assert!(
            s.max_in_flight >= 2,
            "adapt.openai.concurrency: requests overlap ({} at most)",
            s.max_in_flight
        );
        assert!(
            s.authorization
                .iter()
                .all(|a| *a == format!("Bearer {secret}"))
        );
        // The reference's two calls: failure summaries of the failed rollouts first, then the
        // rewrite request quoting them.
        let summaries = s
            .bodies
            .iter()
            .filter(|b| {
                b["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .contains("failed rollout")
            })
            .count();
        assert!(summaries > 0, "no failure summary was asked for");
        let mut quoted = false;
        for b in &s.bodies {
            assert_eq!(b["model"], "test-model");
            assert_eq!(b["temperature"], 0.8);
            let user = b["messages"][1]["content"].as_str().unwrap();
            assert!(user.contains("high_risk_steps"), "{user}");
            if b["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains("You rewrite")
            {
                assert!(user.contains("accuracy"), "{user}");
                quoted |= user.contains("- Rollout ")
                    && user.contains("It walked into the same wall again and again.");
            }
        }
        assert!(quoted, "a rewrite request quotes the failure summaries");
        let retry = s
            .bodies
            .iter()
            .find(|b| b["messages"].as_array().unwrap().len() == 4);
        let retry = retry.expect("an invalid reply is answered and retried");
        let why = retry["messages"][3]["content"].as_str().unwrap();
        assert!(why.contains("no JSON object"), "{why}");
    }
    // The summaries the rewrites used are recorded with the candidates.
    let q = "SELECT count(*) FROM adaptations WHERE decision = 'pending' AND critic LIKE '%It walked into the same wall%'";
    assert_ne!(f.sql(q).ok().scalar(), "0");
    // The candidates are the server's rewrites, judged in iteration 1.
    let q =
        "SELECT count(*) FROM adaptations WHERE iter = 1 AND decision IN ('accepted', 'rejected')";
    let judged = f.sql(q).ok().scalar();
    let q = "SELECT count(*) FROM adaptations WHERE iter = 0 AND decision = 'pending'";
    assert_eq!(judged, f.sql(q).ok().scalar());
    // An LLM is not deterministic: replay checks the committed files instead of re-asking.
    let r = f
        .rla(&["replay", "--run", "llm", "--iter", "0", "--verify"])
        .ok();
    assert!(r.stdout.contains("adapt"), "{}", r.stdout);

    // A missing key and an unreachable endpoint are clear errors; adapt commits nothing.
    run(base("nokey"), None).fails(1, &["RLA_TEST_API_KEY", "not set"]);
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let mut args = base("dead");
    let last = args.len() - 1;
    args[last] = format!("adapt.openai.endpoint=\"{dead}\"");
    let r = run(args, Some(secret)).fails(1, &["adapt.openai", &dead, "cannot connect"]);
    assert!(!r.stderr.contains(secret));
    assert!(
        !f.store()
            .join("dead/_commits/iter=000000/adapt.json")
            .exists()
    );
    assert!(
        f.store()
            .join("dead/_commits/iter=000000/task_accuracy.json")
            .exists(),
        "the stages before adapt are committed: fixing the endpoint resumes from adapt"
    );
}

/// Household's full loop, small: 2 iterations uninterrupted (its tables are what household
/// plays, and iteration 0 replays), then the same run interrupted with Ctrl-C in the middle of
/// iteration 1 and resumed with the same command: the same tables, byte for byte. The
/// interrupted run starts from a copy of the first one's iteration 0 (it would compute the same
/// bytes: the fingerprint and replay tests hold that), so only iteration 1 runs twice.
#[test]
fn household_runs_replays_and_resumes_after_ctrl_c_to_the_same_tables() {
    let f = Fixture::new();
    // The same run id in two stores (`run_id` is a column of every table).
    let store = |run: &str| f.dir.path().join(run).display().to_string();
    let args = |run: &str| -> Vec<String> {
        [
            "run",
            HOUSEHOLD,
            "--store",
            &store(run),
            "--iterations",
            "2",
            "--set",
            "env.initial_tasks=8",
            "--set",
            "update.policy_steps=2",
            "--set",
            "update.rm_steps=2",
            "--set",
            "update.minibatch=32",
            "--set",
            "pretrain.policy_episodes=8",
            "--set",
            "pretrain.rm_steps=64",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    f.rla(
        &args("straight")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .ok();
    let sql = |q: &str| {
        f.rla(&["sql", "--store", &store("straight"), "--format", "csv", q])
            .ok()
            .scalar()
    };
    assert_eq!(
        sql("SELECT count(*) FROM trajectories WHERE iter = 0"),
        (8 * 8).to_string()
    );
    assert_eq!(
        sql(
            "SELECT count(*) FROM steps WHERE step_idx = 0 AND observation NOT LIKE '%Your task is to:%'"
        ),
        "0",
        "the first observation states the goal"
    );
    assert_eq!(
        sql("SELECT count(*) FROM steps WHERE oracle_progress IS NULL"),
        "0"
    );
    let r = f
        .rla(&[
            "replay",
            "--store",
            &store("straight"),
            "--run",
            "household",
            "--iter",
            "0",
            "--verify",
        ])
        .ok();
    assert!(r.stdout.contains("ok  rollout"), "{}", r.stdout);
    f.rla(&[
        "run",
        HOUSEHOLD,
        "--store",
        &store("straight"),
        "--run-id",
        "hh2",
        "--set",
        "env.household.goal_types=[\"fly\"]",
    ])
    .fails(1, &["env.household"]);

    // The store as it was when iteration 0 ended.
    let resumed = f.dir.path().join("resumed");
    crate::copy_dir(&f.dir.path().join("straight"), &resumed);
    let later = |dir: &std::path::Path| dir.join("iter=000001");
    let run = resumed.join("household");
    std::fs::remove_dir_all(later(&run.join("_commits"))).unwrap();
    std::fs::remove_dir_all(later(&run.join("artifacts"))).unwrap();
    for table in std::fs::read_dir(run.join("data")).unwrap() {
        let dir = later(&table.unwrap().path());
        if dir.exists() {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
    let mut child = std::process::Command::new(crate::rla_pipe_bin())
        .current_dir(f.dir.path())
        .env_remove("RUST_LOG")
        .args(args("resumed"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let marker = f
        .dir
        .path()
        .join("resumed/household/_commits/iter=000001/rollout.json");
    let started = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed().as_secs() < 600,
            "iteration 1's rollout never committed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let code = child.wait().unwrap().code();
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("Run the same command to resume"),
        "{stderr}"
    );
    assert!(
        !f.dir
            .path()
            .join("resumed/household/_commits/iter=000001/_iteration.json")
            .exists()
    );
    let r = f
        .rla(
            &args("resumed")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .ok();
    assert!(
        r.stderr.contains("committed earlier, skipped"),
        "{}",
        r.stderr
    );
    f.rla(&["gc", "--store", &store("resumed"), "--grace-secs", "0"])
        .ok();
    // Same bytes in every committed file of both runs (attempt names differ).
    let digests = |run: &str| {
        let root = f.dir.path().join(run);
        let mut files = Vec::new();
        crate::walk(&root, &root, &mut files);
        let mut out: Vec<(String, String)> = files
            .into_iter()
            .filter(|p| p.starts_with("household/data/") || p.starts_with("household/artifacts/"))
            .map(|p| {
                let dir = p.rsplit_once('/').unwrap().0.to_string();
                let bytes = std::fs::read(root.join(&p)).unwrap();
                (dir, blake3::hash(&bytes).to_hex().to_string())
            })
            .collect();
        out.sort();
        out
    };
    let (a, b) = (digests("straight"), digests("resumed"));
    assert!(a.len() > 30, "{a:?}");
    assert_eq!(a, b);
    let adapted = f
        .rla(&[
            "sql",
            "--store",
            &store("straight"),
            "--format",
            "csv",
            "SELECT count(*) FROM adaptations",
        ])
        .ok()
        .scalar();
    assert_ne!(adapted, "0", "the run adapted tasks");
}

/// `eval.mode = "both"`: the sampled evaluation exactly as `"sampled"` makes it (the splits the
/// summary and the report read), plus one greedy rollout per task under `held_out_greedy` and
/// `ood_greedy`.
#[test]
fn evaluation_both_ways_adds_greedy_rows_beside_the_sampled_ones() {
    let f = Fixture::new();
    let small = [
        "env.initial_tasks=4",
        "pretrain.enabled=false",
        "update.policy_steps=1",
        "update.rm_steps=1",
        "eval.tasks=6",
        "eval.ood_tasks=6",
        "eval.rollouts=2",
    ];
    for mode in ["sampled", "both"] {
        let set = format!("eval.mode=\"{mode}\"");
        let sets: Vec<&str> = small.iter().copied().chain([set.as_str()]).collect();
        f.run_pipeline(GRIDNAV, mode, 1, &sets).ok();
    }
    let rows = |run: &str, splits: &str| {
        f.sql(&format!(
            "SELECT split, task_id, rollouts, successes FROM evaluations \
             WHERE run_id = '{run}' AND split IN ({splits}) ORDER BY split, task_id"
        ))
        .ok()
        .csv()
    };
    let sampled = rows("sampled", "'held_out', 'ood'");
    assert_eq!(sampled.len(), 12, "{sampled:?}");
    assert_eq!(rows("both", "'held_out', 'ood'"), sampled);
    let greedy = rows("both", "'held_out_greedy', 'ood_greedy'");
    assert_eq!(greedy.len(), 12, "{greedy:?}");
    for (g, s) in greedy.iter().zip(&sampled) {
        // The same tasks, one rollout each.
        assert_eq!(
            (g[0].as_str(), &g[1], g[2].as_str()),
            (format!("{}_greedy", s[0]).as_str(), &s[1], "1")
        );
        assert_eq!(s[2], "2");
    }
    // The held-out figure the summary line and the report read is the sampled one in both.
    let held = |run: &str| {
        f.sql(&format!(
            "SELECT sum(successes) * 1.0 / sum(rollouts) FROM evaluations \
             WHERE run_id = '{run}' AND split = 'held_out'"
        ))
        .ok()
        .scalar()
    };
    assert_eq!(held("both"), held("sampled"));
}
