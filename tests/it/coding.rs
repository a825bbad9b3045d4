//! The coding setting end to end (`env.name = "coding"`, docs/src/coding.md), through the real
//! binary on a temporary store: programs written, run against every test in the sandbox,
//! rewarded, trained on, evaluated on held-out problems, and every iteration replayed.

use std::sync::{Arc, Mutex};

use crate::Fixture;
use crate::hf::byte_model;

const CODING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/coding-smollm2.toml");
const PROBLEMS: &str = concat!(
    "env.coding.problems=",
    env!("CARGO_MANIFEST_DIR"),
    "/pipelines/data/coding-seed.jsonl"
);
const CANDIDATES: &str = concat!(
    "env.coding.candidates=",
    env!("CARGO_MANIFEST_DIR"),
    "/tests/envs/coding/solutions.json"
);

fn rows(f: &Fixture, query: &str) -> Vec<Vec<String>> {
    let r = f.sql(query);
    assert_eq!(r.code, 0, "{query}\n{}", r.stderr);
    r.stdout
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

fn replay(f: &Fixture, run: &str, iter: u32) {
    let (store, iter) = (f.store_arg(), iter.to_string());
    let r = f.rla(&[
        "replay", "--store", &store, "--run", run, "--iter", &iter, "--verify",
    ]);
    assert_eq!(
        r.code, 0,
        "replay of {run} iteration {iter}:\n{}\n{}",
        r.stdout, r.stderr
    );
}

/// The uniform policy over the seed problems' reference programs (each rollout submits one of
/// the 12, so some pass) and a tiny pretrained reward model writing unit tests: every stage
/// commits, each program's outcome is "passes every ground-truth test" as executed, rewards
/// train where the pass share is in the band, evaluation runs the held-out problems, and both
/// iterations replay bit for bit (executions compared without their wall-clock seconds).
#[test]
fn coding_loop_runs_programs_rewards_them_and_replays() {
    let f = Fixture::new();
    let rm = f.dir.path().join("rm");
    byte_model(&rm, "LlamaForCausalLM", 7);
    let rm_init = format!("reward_model.init=hf:{}", rm.display());
    let sets = [
        PROBLEMS,
        CANDIDATES,
        "policy.kind=uniform",
        "policy.init=",
        "policy.action_mode=score",
        &rm_init,
        "reward_model.max_tokens=8",
        "env.initial_tasks=6",
        "rollout.n=4",
        "eval.tasks=12",
        "eval.rollouts=2",
    ];
    let r = f.run_pipeline(CODING, "code", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let stages = rows(
        &f,
        "SELECT iter, count(*) FROM stage_runs WHERE run_id = 'code' GROUP BY iter ORDER BY iter",
    );
    assert_eq!(stages, [["0", "10"], ["1", "10"]]);

    // 6 problems × 4 programs a iteration; the RM wrote 2 tests a problem (a tiny random model:
    // none readable, so every program "fails" them as the reference counts invalid tests).
    let counts = rows(
        &f,
        "SELECT (SELECT count(*) FROM trajectories WHERE iter = 0) AS programs, \
                (SELECT count(*) FROM rm_samples WHERE iter = 0) AS tests, \
                (SELECT count(*) FROM unit_tests WHERE iter = 0 AND NOT valid) AS unread",
    );
    assert_eq!(counts, [["24", "12", "12"]]);
    // Programs ran against every ground-truth test, and both passing and failing runs exist.
    let statuses = rows(
        &f,
        "SELECT sum(CASE WHEN status = 'ok' THEN 1 ELSE 0 END), \
                sum(CASE WHEN status = 'wrong_answer' OR status = 'crash' THEN 1 ELSE 0 END), \
                sum(CASE WHEN test_kind = 'generated' AND status <> 'invalid_test' THEN 1 ELSE 0 END) \
         FROM executions WHERE run_id = 'code'",
    );
    let n = |s: &str| s.parse::<u64>().unwrap();
    assert!(
        n(&statuses[0][0]) > 0 && n(&statuses[0][1]) > 0,
        "{statuses:?}"
    );
    assert_eq!(statuses[0][2], "0", "unreadable tests are not run");
    // A program's outcome is whether it passed every ground-truth test.
    let wrong = rows(
        &f,
        "SELECT count(*) FROM trajectories t JOIN \
           (SELECT traj_id, iter, bool_and(passed) AS all_passed FROM executions \
            WHERE test_kind = 'truth' GROUP BY traj_id, iter) e \
           ON t.traj_id = e.traj_id AND t.iter = e.iter \
         WHERE (t.outcome = 1) <> e.all_passed",
    );
    assert_eq!(wrong, [["0"]]);
    let won = rows(&f, "SELECT count(*) FROM trajectories WHERE outcome = 1");
    assert!(
        n(&won[0][0]) > 0,
        "some reference programs meet their problem"
    );
    // The pass-all share is the task's accuracy; tasks inside the band train (the uniform
    // policy itself is not trained: its checkpoint is passed on).
    let acc = rows(
        &f,
        "SELECT count(*) FROM task_accuracy a JOIN \
           (SELECT task_id, iter, avg(CASE WHEN outcome = 1 THEN 1.0 ELSE 0.0 END) AS share \
            FROM trajectories GROUP BY task_id, iter) t \
           ON a.task_id = t.task_id AND a.iter = t.iter WHERE abs(a.acc - t.share) > 1e-12",
    );
    assert_eq!(acc, [["0"]]);
    // Evaluation: the 12 problems less the 6 training ones, 2 programs each.
    let eval = rows(
        &f,
        "SELECT count(*), sum(rollouts) FROM evaluations WHERE iter = 0 AND split = 'held_out'",
    );
    assert_eq!(eval, [["6", "12"]]);
    replay(&f, "code", 0);
    replay(&f, "code", 1);
}

/// A tiny pretrained policy writes the programs (generation from the reference's prompt, the
/// n programs of a problem sharing its prompt's keys): its replies are committed with their
/// programs (none readable from a random model: the reference's "We can not extract the
/// code" text, run as no program), and the iteration replays.
#[test]
fn coding_policy_writes_programs_and_replays() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 3);
    byte_model(&rm, "LlamaForCausalLM", 4);
    let (p, r) = (
        format!("policy.init=hf:{}", policy.display()),
        format!("reward_model.init=hf:{}", rm.display()),
    );
    let sets = [
        PROBLEMS,
        &p,
        &r,
        "policy.max_tokens=12",
        "reward_model.max_tokens=6",
        "env.initial_tasks=3",
        "rollout.n=3",
        "eval.tasks=5",
        "eval.rollouts=1",
    ];
    let run = f.run_pipeline(CODING, "gen", 1, &sets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let steps = rows(
        &f,
        "SELECT count(*), count(response), \
                sum(CASE WHEN action = 'We can not extract the code in the output. ' THEN 1 ELSE 0 END) \
         FROM steps WHERE run_id = 'gen'",
    );
    assert_eq!(steps, [["9", "9", "9"]]);
    let runs = rows(
        &f,
        "SELECT count(*) FROM executions WHERE test_kind = 'truth' AND status <> 'no_program'",
    );
    assert_eq!(runs, [["0"]]);
    let tokens = rows(
        &f,
        "SELECT tokens_computed > 0 FROM stage_runs WHERE stage IN ('rollout', 'rm_score', 'evaluate') ORDER BY stage",
    );
    assert_eq!(tokens, [["true"], ["true"], ["true"]]);
    replay(&f, "gen", 0);
}

/// A minimal OpenAI-compatible server acting as the environment model: the first answer of a
/// conversation holds no problem (the adapter must ask again), the second a rewrite with 4
/// stdin/stdout tests of the sum of two integers (a program of the candidates solves it), its
/// question naming the current problem's first words so that each slot's is new. Every request
/// body is kept.
fn curator() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let url = crate::chat_server(move |_, body| {
        let messages = body["messages"].as_array().unwrap().clone();
        log.lock().unwrap().push(body.clone());
        if messages.len() == 2 {
            return "Let me think about a harder variant first.".to_string();
        }
        let user = messages[1]["content"].as_str().unwrap();
        let current = user
            .split("[CURRENT ACTIVE PROBLEM]\n")
            .nth(1)
            .unwrap()
            .chars()
            .take(24)
            .collect::<String>();
        serde_json::json!({
            "question": format!("Read two integers a and b and print a + b. (After: {current})"),
            "test_method": "stdio",
            "test_time_limit": 4,
            "test_input": ["1 2\n", "5 7\n", "0 0\n", "-3 3\n"],
            "test_output": ["3", "12", "0", "0"],
        })
        .to_string()
    });
    (url, seen)
}

/// Adaptation in the coding setting: problems outside the accuracy band are rewritten by an
/// environment model through the OpenAI-compatible adapter with the reference's curator prompt
/// (the root problem, the current one, each test with the policy's pass rate), the answer read
/// as the reference reads it, the candidate joins the pool as pending and is judged one
/// iteration later by the same rule as elsewhere.
#[test]
fn coding_problems_are_rewritten_by_an_environment_model_and_judged() {
    let f = Fixture::new();
    let (url, seen) = curator();
    let endpoint = format!("adapt.openai.endpoint=\"{url}\"");
    let sets = [
        PROBLEMS,
        CANDIDATES,
        "policy.kind=uniform",
        "policy.init=",
        "policy.action_mode=score",
        "reward_model.enabled=false",
        "reward_model.init=",
        "reward_model.max_tokens=8",
        "env.initial_tasks=6",
        "rollout.n=4",
        "eval.tasks=6",
        "eval.rollouts=1",
        "adapt.adapter=\"openai\"",
        "adapt.openai.model=\"curator\"",
        "adapt.openai.failure_summaries=false",
        "adapt.openai.api_key_env=\"\"",
        &endpoint,
    ];
    let r = f.run_pipeline(CODING, "adapt", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let pending = rows(
        &f,
        "SELECT count(*) FROM adaptations WHERE iter = 0 AND decision = 'pending' AND adapter = 'openai'",
    );
    let asked = rows(
        &f,
        "SELECT count(*) FROM task_accuracy WHERE iter = 0 AND (acc < 0.2 OR acc >= 0.8)",
    );
    assert_eq!(
        pending, asked,
        "every task outside the band got a candidate"
    );
    assert!(pending[0][0] != "0");
    // The prompt is the reference's curator prompt with the pass rates; the second answer of
    // each conversation was used.
    let bodies = seen.lock().unwrap().clone();
    let first = bodies
        .iter()
        .find(|b| b["messages"].as_array().unwrap().len() == 2)
        .unwrap();
    let user = first["messages"][1]["content"].as_str().unwrap();
    for part in [
        "[ORIGINAL ROOT PROBLEM]",
        "[CURRENT ACTIVE PROBLEM]",
        "\"pass_rate\"",
        "Provide at least 4 ground-truth tests",
    ] {
        assert!(user.contains(part), "{part} missing from:\n{user}");
    }
    assert!(
        first["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You are a coding dataset curator.")
    );
    // Iteration 1 rolled the candidates out and judged each by the acceptance rule.
    let judged = rows(
        &f,
        "SELECT count(*) FROM adaptations WHERE iter = 1 AND decision IN ('accepted', 'rejected')",
    );
    assert_eq!(judged, pending);
    let candidate = rows(
        &f,
        "SELECT count(*) FROM tasks WHERE iter = 1 AND status = 'pending' AND strpos(spec, 'print a + b') > 0",
    );
    assert_eq!(candidate, pending);
}

/// A store of `problems` (JSON records) whose uniform policy submits one of `programs`, one
/// iteration, the reward model off: the settings for [`Fixture::run_pipeline`].
fn hostile_run(f: &Fixture, run: &str, problems: &[serde_json::Value], programs: &[&str], n: u32) {
    let dir = f.dir.path();
    let (p, c) = (
        dir.join(format!("{run}.jsonl")),
        dir.join(format!("{run}.json")),
    );
    let lines: Vec<String> = problems.iter().map(|v| v.to_string()).collect();
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    std::fs::write(&c, serde_json::to_string(programs).unwrap()).unwrap();
    let (problems, candidates, tasks, rollouts) = (
        format!("env.coding.problems={}", p.display()),
        format!("env.coding.candidates={}", c.display()),
        format!("env.initial_tasks={}", problems.len()),
        format!("rollout.n={n}"),
    );
    let sets = [
        problems.as_str(),
        &candidates,
        &tasks,
        &rollouts,
        "policy.kind=uniform",
        "policy.init=",
        "policy.action_mode=score",
        "reward_model.enabled=false",
        "reward_model.init=",
        "reward_model.max_tokens=8",
        "eval.tasks=1",
        "eval.rollouts=1",
    ];
    let r = f.run_pipeline(CODING, run, 1, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
}

/// Issue 47, case 3: HumanEval programs that leave before `check()` has run to its end
/// (`sys.exit(0)`, `raise SystemExit`, `os._exit(0)` after a wrong function, or inside it) or
/// patch the builtins the test relies on are recorded as failing, through the real binary; the
/// right function passes. Every program is drawn at least once (checked), and the iteration
/// replays (the runs' tokens stay out of the digests).
#[test]
fn coding_fake_passes_fail() {
    let f = Fixture::new();
    let he = serde_json::json!({
        "task_id": "HumanEval/x",
        "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
        "entry_point": "inc",
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert abs(candidate(1) - 2) < 1e-9\n    assert candidate(41) == 42\n",
    });
    let right = "def inc(x):\n    return x + 1\n";
    let programs = [
        right,
        "def inc(x):\n    return x\nimport sys\nsys.exit(0)\n",
        "def inc(x):\n    return x\nraise SystemExit(0)\n",
        "def inc(x):\n    return x\nimport os\nos._exit(0)\n",
        "def inc(x):\n    import os\n    os._exit(0)\n",
        "def inc(x):\n    return x\nimport builtins\nbuiltins.abs = lambda x: 0\n",
    ];
    hostile_run(&f, "fake", &[he], &programs, 24);
    let drawn = rows(
        &f,
        "SELECT count(DISTINCT action) FROM steps WHERE run_id = 'fake'",
    );
    assert_eq!(drawn, [["6"]], "every program was submitted");
    // A run passes exactly when its program is the right one.
    let wrong = rows(
        &f,
        "SELECT count(*) FROM executions e \
         JOIN steps s ON s.traj_id = e.traj_id AND s.iter = e.iter \
         WHERE e.passed <> (strpos(s.action, 'return x + 1') > 0)",
    );
    assert_eq!(wrong, [["0"]]);
    let passed = rows(
        &f,
        "SELECT count(*) FROM executions WHERE passed AND test_kind = 'truth'",
    );
    assert!(passed[0][0] != "0", "the right function passes");
    let statuses = rows(
        &f,
        "SELECT DISTINCT e.status FROM executions e \
         JOIN steps s ON s.traj_id = e.traj_id AND s.iter = e.iter \
         WHERE strpos(s.action, 'return x + 1') = 0",
    );
    assert_eq!(statuses, [["crash"]]);
    replay(&f, "fake", 0);
}

/// Issue 47, case 5 (golden): an a+b task and an a×b task share the stdin `2 3`; both
/// programs are submitted to both tasks, and each run is judged against its own task's test
/// (before, a run shared by the two tasks was judged by whichever test added it first).
#[test]
fn coding_tasks_sharing_a_stdin_are_judged_by_their_own_tests() {
    let f = Fixture::new();
    let add = serde_json::json!({"question": "Read a and b, print a + b.", "test_input": ["2 3\n"], "test_output": ["5"]});
    let mul = serde_json::json!({"question": "Read a and b, print a * b.", "test_input": ["2 3\n"], "test_output": ["6"]});
    let programs = [
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a * b)\n",
    ];
    hostile_run(&f, "share", &[add, mul], &programs, 8);
    let pairs = rows(
        &f,
        "SELECT count(DISTINCT s.task_id || s.action) FROM steps s WHERE s.run_id = 'share'",
    );
    assert_eq!(pairs, [["4"]], "both programs were submitted to both tasks");
    let judged = rows(
        &f,
        "SELECT count(*), sum(CASE WHEN e.passed THEN 1 ELSE 0 END), \
                sum(CASE WHEN e.passed <> ((strpos(t.spec, 'a + b') > 0) = (strpos(s.action, 'a + b') > 0)) THEN 1 ELSE 0 END) \
         FROM executions e \
         JOIN steps s ON s.traj_id = e.traj_id AND s.iter = e.iter \
         JOIN tasks t ON t.task_id = e.task_id AND t.iter = e.iter",
    );
    assert_eq!(judged[0][0], "16");
    assert_eq!(
        judged[0][2], "0",
        "every run judged by its own task's test: {judged:?}"
    );
    assert!(judged[0][1] != "0" && judged[0][1] != "16");
}

/// Issue 47, cases 1, 2 and 4 through the normal path (the uniform policy's candidates, run by
/// `execute` and `evaluate`): a program whose child leaves its process group, both waiting for a
/// signal, is recorded `timeout` and the iteration goes on; one that kills its own process group is a
/// `crash`; one that tries the chroot escape and then answers right passes, having written
/// nothing outside its sandbox.
#[test]
fn coding_hostile_programs_are_recorded_as_what_they_are() {
    let f = Fixture::new();
    let marker = f.dir.path().join("escaped");
    let add = serde_json::json!({"question": "Read a and b, print a + b.", "test_input": ["2 3\n"], "test_output": ["5"]});
    let escape = format!(
        "import os\n\
         try:\n    os.makedirs('/tmp/j', exist_ok=True)\n    os.chroot('/tmp/j')\n    for _ in range(64):\n        os.chdir('..')\n    os.chroot('.')\n    open({marker:?}, 'w').write('x')\n\
         except OSError:\n    pass\n\
         a, b = map(int, input().split())\nprint(a + b)\n",
        marker = marker.display().to_string()
    );
    let programs = [
        "import os, signal\nif os.fork() == 0:\n    os.setsid()\nsignal.pause()\n",
        "import os, signal\nos.kill(0, signal.SIGKILL)\n",
        escape.as_str(),
    ];
    hostile_run(&f, "hostile", &[add], &programs, 12);
    let drawn = rows(
        &f,
        "SELECT count(DISTINCT action) FROM steps WHERE run_id = 'hostile'",
    );
    assert_eq!(drawn, [["3"]], "every program was submitted");
    let statuses = rows(
        &f,
        "SELECT DISTINCT CASE WHEN strpos(s.action, 'pause') > 0 THEN 'pause' \
                              WHEN strpos(s.action, 'kill') > 0 THEN 'kill' ELSE 'escape' END, \
                         e.status, e.passed \
         FROM executions e JOIN steps s ON s.traj_id = e.traj_id AND s.iter = e.iter \
         ORDER BY 1",
    );
    assert_eq!(
        statuses,
        [
            ["escape", "ok", "true"],
            ["kill", "crash", "false"],
            ["pause", "timeout", "false"]
        ]
    );
    assert!(
        !marker.exists(),
        "the chroot escape wrote {}",
        marker.display()
    );
}
