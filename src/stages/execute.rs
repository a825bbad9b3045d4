//! `execute` (the coding setting, the reference's `reward/execute.py`): every program the policy
//! wrote for a task (one per trajectory: the last ```` ```python ```` block of its reply) runs
//! against every ground-truth test of the task and every test the reward model wrote for it
//! (task-level RM samples: `traj_id` ''), each run in its own sandboxed process
//! ([`crate::sandbox`]), `env.coding.workers` at once. Writes the written tests as read
//! (`unit_tests`) and one row per (program, test) (`executions`). A written test is read from
//! the reply's text without special tokens (`rm_samples.reasoning`, what `rm_score` read it
//! from; `response` keeps them for the update). Runs of the same source, stdin and limit are
//! made once and judged by every test that shares them (two tasks, or two written tests, with
//! the same input but different expected outputs each get their own verdict). A function-call
//! test passes only when rla-pipe's harness proves it ran to its end (a fresh random token per
//! run, [`TestCase::takes_token`]). `seconds` is wall-clock time: `replay --verify` re-runs every
//! program and compares every other column (a status included, so a program near its time
//! limit can make a replay differ; the README says so).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::env::coding::format::{NO_CODE, extract_program, extract_test};
use crate::env::coding::{Problem, TestCase, Verdict};
use crate::error::{Error, Result};
use crate::sandbox::{Sandbox, Status};
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

pub struct Execute;

/// A test of a task: its kind (`generated` or `truth`, the key's order), index and case
/// (`None`: an invalid written test).
type Test = (&'static str, u32, Option<TestCase>);

/// One row of `executions`, before it is written.
struct Run {
    passed: bool,
    status: &'static str,
    seconds: f64,
    digest: Option<String>,
}

impl Stage for Execute {
    fn name(&self) -> &'static str {
        "execute"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks", "steps", "rm_samples"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["unit_tests", "executions", "trajectories"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env"]
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let problems: BTreeMap<String, Problem> = problems(ctx).await?.into_iter().collect();
            // Written tests, per task, in sample order, read from the replies' text without special
            // tokens (`reasoning`; `response` keeps them, e.g. a final `<|im_end|>`).
            let mut written: BTreeMap<
                String,
                Vec<(u32, Option<crate::env::coding::format::WrittenTest>)>,
            > = BTreeMap::new();
            for b in collect(
            &ctx.session,
            "SELECT task_id, sample_idx, reasoning FROM rm_samples WHERE traj_id = '' ORDER BY task_id, sample_idx",
        )
        .await?
        {
            let c = Columns::new(&b, "the execute stage's rm_samples");
            let (id, k, reply) = (c.str("task_id")?, c.u32("sample_idx")?, c.str("reasoning")?);
            for i in 0..b.num_rows() {
                written
                    .entry(id.value(i).to_string())
                    .or_default()
                    .push((k.value(i), extract_test(reply.value(i))));
            }
        }
            let mut tests_out = TableBuilder::new("unit_tests")?;
            for (task, ts) in &written {
                for (k, t) in ts {
                    tests_out
                        .push_str(task)
                        .push_u32(*k)
                        .push_bool(t.is_some())
                        .push_str(t.as_ref().map_or("", |t| t.input.as_str()))
                        .push_str(t.as_ref().map_or("", |t| t.output.as_str()));
                }
            }
            // Programs, in key order.
            let mut programs: Vec<(String, String, String)> = Vec::new();
            for b in collect(
            &ctx.session,
            "SELECT task_id, traj_id, COALESCE(response, action) AS reply FROM steps WHERE step_idx = 0 ORDER BY task_id, traj_id",
        )
        .await?
        {
            let c = Columns::new(&b, "the execute stage's steps");
            let (id, traj, reply) = (c.str("task_id")?, c.str("traj_id")?, c.str("reply")?);
            for i in 0..b.num_rows() {
                programs.push((
                    id.value(i).to_string(),
                    traj.value(i).to_string(),
                    extract_program(reply.value(i)),
                ));
            }
        }
            // Every (program, test) in key order, and the runs to make: each distinct one once.
            let mut rows: Vec<(usize, &'static str, u32, Result<JobRef, &'static str>)> =
                Vec::new();
            let mut jobs = Jobs::default();
            for (p, (task, _, program)) in programs.iter().enumerate() {
                let problem = problems.get(task).ok_or_else(|| {
                    Error::data(format!(
                        "steps: task {task} is not among this iteration's tasks"
                    ))
                })?;
                let mut tests: Vec<Test> = written
                    .get(task)
                    .map(|ts| {
                        ts.iter()
                            .map(|(k, t)| {
                                let case = t
                                    .as_ref()
                                    .map(|t| problem.written_test(&t.input, &t.output));
                                ("generated", *k, case)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                tests.extend(
                    problem
                        .ground_truth()
                        .into_iter()
                        .enumerate()
                        .map(|(i, t)| ("truth", i as u32, Some(t))),
                );
                for (kind, idx, case) in tests {
                    let job = match case.filter(TestCase::is_valid) {
                        None => Err("invalid_test"),
                        Some(_) if program == NO_CODE => Err("no_program"),
                        Some(case) => Ok(jobs.add(problem, program, case)),
                    };
                    rows.push((p, kind, idx, job));
                }
            }
            let coding = &ctx.config.env.coding;
            let results = if jobs.list.is_empty() {
                Vec::new()
            } else {
                let sandbox = Sandbox::new(coding.sandbox.clone())?;
                tracing::info!(
                    runs = jobs.list.len(),
                    isolation = %sandbox.describe(),
                    "execute: running programs"
                );
                run_all(&sandbox, &jobs.list, coding.workers())?
            };
            let mut out = TableBuilder::new("executions")?;
            // A program's outcome: +1 when it passes every ground-truth test.
            let mut wins = vec![true; programs.len()];
            for (p, kind, idx, job) in rows {
                let (task, traj, _) = &programs[p];
                let not_run = |status| Run {
                    passed: false,
                    status,
                    seconds: 0.0,
                    digest: None,
                };
                let r = match job {
                    Ok((j, c)) => &results[j][c],
                    Err(status) => &not_run(status),
                };
                if kind == "truth" && !r.passed {
                    wins[p] = false;
                }
                out.push_str(task)
                    .push_str(traj)
                    .push_str(kind)
                    .push_u32(idx)
                    .push_bool(r.passed)
                    .push_str(r.status)
                    .push_f64(r.seconds)
                    .push_opt_str(r.digest.as_deref());
            }
            let mut trajs = TableBuilder::new("trajectories")?;
            // Programs are in (task, traj) order and traj ids end in the zero-padded rollout index
            // (`schema::traj_id`): a program's rollout is its rank within its task.
            let mut rank: BTreeMap<&str, u32> = BTreeMap::new();
            for ((task, traj, _), won) in programs.iter().zip(wins) {
                let r = rank.entry(task.as_str()).or_default();
                let rollout = *r;
                *r += 1;
                trajs
                    .push_str(task)
                    .push_str(traj)
                    .push_u32(rollout)
                    .push_i8(if won { 1 } else { -1 })
                    .push_u32(1);
            }
            let tests_batch = tests_out.finish_with(&ctx.run_id, ctx.iter)?;
            let runs_batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            let trajs_batch = trajs.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![
                (
                    "trajectories",
                    TableOutput::Frame(ctx.session.read_batch(trajs_batch)?),
                ),
                (
                    "unit_tests",
                    TableOutput::Frame(ctx.session.read_batch(tests_batch)?),
                ),
                (
                    "executions",
                    TableOutput::Frame(ctx.session.read_batch(runs_batch)?),
                ),
            ])
        })
    }
}

/// The distinct runs to make, each (source, stdin, time limit) once, and the distinct tests
/// that judge each: a run shared by tests that expect different outputs (two tasks, or two
/// written tests, with the same input) is judged by each of them.
#[derive(Default)]
struct Jobs {
    list: Vec<Job>,
    index: BTreeMap<(String, String, u64), usize>,
}

/// Where a (program, test) pair's verdict is: its run and the test's place among the run's.
type JobRef = (usize, usize);

impl Jobs {
    /// The run of `program` against `case` (a new one unless the same source, stdin and
    /// limit was added before) and the case's place among those judging it.
    fn add(&mut self, problem: &Problem, program: &str, case: TestCase) -> JobRef {
        let (source, stdin) = case.harness(program);
        let key = (source, stdin, problem.time_limit.to_bits());
        let next = self.list.len();
        let j = *self.index.entry(key.clone()).or_insert(next);
        if j == next {
            self.list.push(Job {
                source: key.0,
                stdin: key.1,
                limit: Duration::from_secs_f64(problem.time_limit),
                token: case.takes_token(),
                cases: Vec::new(),
            });
        }
        let cases = &mut self.list[j].cases;
        let c = match cases.iter().position(|c| *c == case) {
            Some(c) => c,
            None => {
                cases.push(case);
                cases.len() - 1
            }
        };
        (j, c)
    }
}

/// A distinct run: the source, its stdin, its limit, whether it is handed a token, and the
/// tests that judge its output.
struct Job {
    source: String,
    stdin: String,
    limit: Duration,
    token: bool,
    cases: Vec<TestCase>,
}

/// The problems of this iteration's rolled-out tasks, by task id (sorted).
pub(crate) async fn problems(ctx: &StageContext) -> Result<Vec<(String, Problem)>> {
    let mut out: Vec<(String, Problem)> = Vec::new();
    for b in collect(
        &ctx.session,
        "SELECT DISTINCT task_id, spec FROM tasks WHERE COALESCE(rolled_out, true) ORDER BY task_id",
    )
    .await?
    {
        let c = Columns::new(&b, "the coding stage's tasks");
        let (id, spec) = (c.str("task_id")?, c.str("spec")?);
        for i in 0..b.num_rows() {
            let v: serde_json::Value = serde_json::from_str(spec.value(i)).map_err(|e| {
                Error::data(format!(
                    "tasks: the spec of {} is not JSON: {e}",
                    id.value(i)
                ))
            })?;
            let p = Problem::parse(&v).map_err(|m| {
                Error::data(format!(
                    "tasks: the spec of {} is not a coding problem: {m}",
                    id.value(i)
                ))
            })?;
            out.push((id.value(i).to_string(), p));
        }
    }
    Ok(out)
}

/// Whether each program passes every ground-truth test of its problem (a program that is
/// [`NO_CODE`] passes none), run as `execute` runs them: `evaluate`'s judgement.
pub(crate) fn passes_all(
    coding: &crate::env::coding::CodingConfig,
    items: &[(&Problem, &str)],
) -> Result<Vec<bool>> {
    let mut jobs = Jobs::default();
    let mut needs: Vec<Vec<Option<JobRef>>> = Vec::with_capacity(items.len());
    for (problem, program) in items {
        let mut mine = Vec::new();
        if *program != NO_CODE {
            for case in problem.ground_truth() {
                if !case.is_valid() {
                    mine.push(None); // an invalid test fails every program
                    continue;
                }
                mine.push(Some(jobs.add(problem, program, case)));
            }
        }
        needs.push(mine);
    }
    let results = if jobs.list.is_empty() {
        Vec::new()
    } else {
        let sandbox = Sandbox::new(coding.sandbox.clone())?;
        run_all(&sandbox, &jobs.list, coding.workers())?
    };
    Ok(needs
        .iter()
        .map(|js| {
            !js.is_empty()
                && js
                    .iter()
                    .all(|j| j.is_some_and(|(j, c)| results[j][c].passed))
        })
        .collect())
}

/// A fresh random token for a run (`TestCase::takes_token`): read from the kernel's random
/// source, never derived from anything a program could know.
fn fresh_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::Environment(format!("execute: a run's token: /dev/urandom: {e}")))?;
    Ok(format!(
        "rla-pipe-token-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// A run judged by each of its tests (in the job's order).
fn judge(job: &Job, o: &crate::sandbox::Outcome, token: &str) -> Vec<Run> {
    // The token differs from run to run: the digest is of the output without it.
    let stdout = if token.is_empty() {
        std::borrow::Cow::Borrowed(o.stdout.as_str())
    } else {
        std::borrow::Cow::Owned(o.stdout.replace(token, ""))
    };
    let digest = blake3::hash(stdout.as_bytes()).to_hex()[..16].to_string();
    job.cases
        .iter()
        .map(|case| {
            let (passed, status) = match o.status {
                Status::Ok => match case.verdict(&o.stdout, token) {
                    Verdict::Passed => (true, "ok"),
                    Verdict::Failed => (false, "wrong_answer"),
                    // Exited 0 before its test ran to the end.
                    Verdict::Unfinished => (false, Status::Crash.as_str()),
                },
                other => (false, other.as_str()),
            };
            Run {
                passed,
                status,
                seconds: o.seconds,
                digest: Some(digest.clone()),
            }
        })
        .collect()
}

/// Every job, `workers` at a time (worker w runs in sandbox slot w), its verdicts in job
/// order (each job's in the order of its tests).
fn run_all(sandbox: &Sandbox, jobs: &[Job], workers: usize) -> Result<Vec<Vec<Run>>> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Vec<Run>>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for w in 0..workers.clamp(1, jobs.len()) {
            let (next, slots) = (&next, &slots);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = (|| -> Result<Vec<Run>> {
                        let token = if job.token {
                            fresh_token()?
                        } else {
                            String::new()
                        };
                        let stdin = if job.token {
                            format!("{token}\n")
                        } else {
                            job.stdin.clone()
                        };
                        let o = sandbox.run(w, &job.source, &stdin, job.limit)?;
                        Ok(judge(job, &o, &token))
                    })();
                    *slots[i].lock().expect("slot") = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().expect("slot").expect("every job ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, BooleanArray, StringArray, UInt32Array};

    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, output, register, s, u};

    fn col<'a, T: 'static>(b: &'a arrow::array::RecordBatch, name: &str) -> &'a T {
        b.column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<T>()
            .unwrap()
    }

    /// Programs of two tasks (a stdin/stdout problem, a HumanEval one) against their
    /// ground-truth tests and the tests a reward model wrote, in real sandboxes.
    #[tokio::test]
    async fn programs_run_against_every_test() {
        let c = ctx(Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "t").unwrap());
        let add = serde_json::json!({"question": "Add.", "test_input": ["1 2\n", "5 7\n"], "test_output": ["3", "12"], "test_time_limit": 2});
        let he = serde_json::json!({"prompt": "def inc(x):\n", "entry_point": "inc", "test": "def check(candidate):\n    assert candidate(1) == 2\n"});
        register(
            &c,
            "tasks",
            vec![
                s(&["A", "H"]),
                u(&[0, 1]),
                s(&["active", "active"]),
                s(&[&add.to_string(), &he.to_string()]),
                s(&["", ""]),
                std::sync::Arc::new(BooleanArray::from(vec![true, true])),
            ],
        );
        let fence = |p: &str| format!("thinking\n```python\n{p}\n```");
        let replies = [
            fence("a, b = map(int, input().split())\nprint(a + b)"),
            fence("a, b = map(int, input().split())\nprint(a - b)"),
            "no code at all".to_string(),
            fence("while True:\n    pass"),
            fence("a, b = map(int, input().split())\nprint(a + b)"),
            fence("def inc(x):\n    return x + 1"),
            fence("def inc(x):\n    return x"),
        ];
        let n = replies.len();
        register(
            &c,
            "steps",
            vec![
                s(&["A", "A", "A", "A", "A", "H", "H"]),
                s(&["a0", "a1", "a2", "a3", "a4", "h0", "h1"]),
                u(&vec![0; n]),
                s(&vec!["obs"; n]),
                s(&replies.iter().map(String::as_str).collect::<Vec<_>>()),
                crate::stages::testutil::f(&vec![0.0; n]),
                crate::stages::testutil::i8s(&vec![0; n]),
                s(&vec![""; n]),
                s(&vec!["[]"; n]),
                s(&replies.iter().map(String::as_str).collect::<Vec<_>>()),
            ],
        );
        let written = [
            "**Test Input:**\n```\n10 20\n```\n**Test Output:**\n```\n30\n```",
            "I am not sure.",
            // Function-call problems: a call and the value it returns.
            "**Test Input:**\n```\ninc(41)\n```\n**Test Output:**\n```\n42\n```",
            "**Test Input:**\n```\ninc(\n```\n**Test Output:**\n```\n1\n```",
        ];
        register(
            &c,
            "rm_samples",
            vec![
                s(&["A", "A", "H", "H"]),
                s(&["", "", "", ""]),
                u(&[0, 0, 0, 0]),
                u(&[0, 1, 0, 1]),
                s(&written),
                crate::stages::testutil::i8s(&[0, 0, 0, 0]),
                s(&written
                    .map(|w| format!("{w}<|im_end|>"))
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()),
            ],
        );
        let tests = output(&Execute, &c, "unit_tests").await;
        assert_eq!(tests.num_rows(), 4);
        let valid = col::<BooleanArray>(&tests, "valid");
        assert!(valid.value(0) && !valid.value(1));
        assert_eq!(col::<StringArray>(&tests, "input").value(0), "10 20");

        let runs = output(&Execute, &c, "executions").await;
        let got = verdict_lines(&runs);
        let want = [
            "a0 generated 0 ok true",
            "a0 generated 1 invalid_test false",
            "a0 truth 0 ok true",
            "a0 truth 1 ok true",
            "a1 generated 0 wrong_answer false",
            "a1 generated 1 invalid_test false",
            "a1 truth 0 wrong_answer false",
            "a1 truth 1 wrong_answer false",
            "a2 generated 0 no_program false",
            "a2 generated 1 invalid_test false",
            "a2 truth 0 no_program false",
            "a2 truth 1 no_program false",
            "a3 generated 0 timeout false",
            "a3 generated 1 invalid_test false",
            "a3 truth 0 timeout false",
            "a3 truth 1 timeout false",
            "a4 generated 0 ok true",
            "a4 generated 1 invalid_test false",
            "a4 truth 0 ok true",
            "a4 truth 1 ok true",
            "h0 generated 0 ok true",
            "h0 generated 1 crash false",
            "h0 truth 0 ok true",
            "h1 generated 0 wrong_answer false",
            "h1 generated 1 crash false",
            "h1 truth 0 crash false",
        ];
        assert_eq!(got, want);
        // Not run: no digest, no time; a run: both.
        let digest = col::<StringArray>(&runs, "output_digest");
        assert!(digest.is_null(1) && !digest.is_null(0));
    }

    /// A context with these tasks (id, spec), one program per (task, traj, reply) and the
    /// reward model's replies (task, text without special tokens, text with them).
    fn store(
        tasks: &[(&str, serde_json::Value)],
        programs: &[(&str, &str, &str)],
        written: &[(&str, &str, &str)],
    ) -> StageContext {
        let c = ctx(Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "t").unwrap());
        let specs: Vec<String> = tasks.iter().map(|(_, v)| v.to_string()).collect();
        let n = tasks.len();
        register(
            &c,
            "tasks",
            vec![
                s(&tasks.iter().map(|t| t.0).collect::<Vec<_>>()),
                u(&(0..n as u32).collect::<Vec<_>>()),
                s(&vec!["active"; n]),
                s(&specs.iter().map(String::as_str).collect::<Vec<_>>()),
                s(&vec![""; n]),
                std::sync::Arc::new(BooleanArray::from(vec![true; n])),
            ],
        );
        let replies: Vec<String> = programs
            .iter()
            .map(|p| format!("```python\n{}\n```", p.2))
            .collect();
        let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
        let n = programs.len();
        register(
            &c,
            "steps",
            vec![
                s(&programs.iter().map(|p| p.0).collect::<Vec<_>>()),
                s(&programs.iter().map(|p| p.1).collect::<Vec<_>>()),
                u(&vec![0; n]),
                s(&vec!["obs"; n]),
                s(&replies),
                crate::stages::testutil::f(&vec![0.0; n]),
                crate::stages::testutil::i8s(&vec![0; n]),
                s(&vec![""; n]),
                s(&vec!["[]"; n]),
                s(&replies),
            ],
        );
        let mut next: BTreeMap<&str, u32> = BTreeMap::new();
        let idx: Vec<u32> = written
            .iter()
            .map(|w| {
                let k = next.entry(w.0).or_default();
                *k += 1;
                *k - 1
            })
            .collect();
        let n = written.len();
        register(
            &c,
            "rm_samples",
            vec![
                s(&written.iter().map(|w| w.0).collect::<Vec<_>>()),
                s(&vec![""; n]),
                u(&vec![0; n]),
                u(&idx),
                s(&written.iter().map(|w| w.1).collect::<Vec<_>>()),
                crate::stages::testutil::i8s(&vec![0; n]),
                s(&written.iter().map(|w| w.2).collect::<Vec<_>>()),
            ],
        );
        c
    }

    /// `executions` as "traj kind idx status passed" lines, in key order.
    async fn verdicts(c: &StageContext) -> Vec<String> {
        verdict_lines(&output(&Execute, c, "executions").await)
    }

    /// The rows of an `executions` batch as "traj kind idx status passed" lines.
    fn verdict_lines(runs: &arrow::array::RecordBatch) -> Vec<String> {
        let (traj, kind, idx, status, passed) = (
            col::<StringArray>(runs, "traj_id"),
            col::<StringArray>(runs, "test_kind"),
            col::<UInt32Array>(runs, "test_idx"),
            col::<StringArray>(runs, "status"),
            col::<BooleanArray>(runs, "passed"),
        );
        (0..runs.num_rows())
            .map(|i| {
                format!(
                    "{} {} {} {} {}",
                    traj.value(i),
                    kind.value(i),
                    idx.value(i),
                    status.value(i),
                    passed.value(i)
                )
            })
            .collect()
    }

    /// Issue 47, case 5: an a+b task and an a×b task share the stdin `2 3` (and a task has two
    /// written tests with the same input, one of them wrong): each (program, test) is judged
    /// against its own expected output, though each distinct run is made once.
    #[tokio::test]
    async fn a_run_shared_by_tests_is_judged_by_each() {
        let add =
            serde_json::json!({"question": "Add.", "test_input": ["2 3\n"], "test_output": ["5"]});
        let mul = serde_json::json!({"question": "Multiply.", "test_input": ["2 3\n"], "test_output": ["6"]});
        let plus = "a, b = map(int, input().split())\nprint(a + b)";
        let times = "a, b = map(int, input().split())\nprint(a * b)";
        let test =
            |o: &str| format!("**Test Input:**\n```\n2 3\n```\n**Test Output:**\n```\n{o}\n```");
        let (t5, t6) = (test("5"), test("6"));
        let c = store(
            &[("ADD", add), ("MUL", mul)],
            &[
                ("ADD", "a0", plus),
                ("ADD", "a1", times),
                ("MUL", "m0", plus),
                ("MUL", "m1", times),
            ],
            &[
                ("ADD", t5.as_str(), t5.as_str()),
                ("ADD", t6.as_str(), t6.as_str()),
                ("MUL", t6.as_str(), t6.as_str()),
            ],
        );
        assert_eq!(
            verdicts(&c).await,
            [
                "a0 generated 0 ok true",
                "a0 generated 1 wrong_answer false",
                "a0 truth 0 ok true",
                "a1 generated 0 wrong_answer false",
                "a1 generated 1 ok true",
                "a1 truth 0 wrong_answer false",
                "m0 generated 0 wrong_answer false",
                "m0 truth 0 wrong_answer false",
                "m1 generated 0 ok true",
                "m1 truth 0 ok true",
            ]
        );
        let runs = output(&Execute, &c, "executions").await;
        let digest = col::<StringArray>(&runs, "output_digest");
        assert_eq!(
            digest.value(0),
            digest.value(1),
            "one run of a0, judged twice"
        );
        assert_ne!(digest.value(0), digest.value(3));
    }

    /// Issue 47, case 6: a test written as plain text at the end of a reply, whose response
    /// keeps the end-of-turn token: read from the text without it, it expects `7`.
    #[tokio::test]
    async fn written_tests_are_read_without_special_tokens() {
        let add =
            serde_json::json!({"question": "Add.", "test_input": ["1 2\n"], "test_output": ["3"]});
        let text = "Let me think.\n**Test Input:**\n3 4\n**Test Output:**\n7";
        let response = format!("{text}<|im_end|>");
        let c = store(
            &[("A", add)],
            &[("A", "a0", "a, b = map(int, input().split())\nprint(a + b)")],
            &[("A", text, response.as_str())],
        );
        let tests = output(&Execute, &c, "unit_tests").await;
        assert_eq!(col::<StringArray>(&tests, "output").value(0), "7");
        assert_eq!(
            verdicts(&c).await,
            ["a0 generated 0 ok true", "a0 truth 0 ok true"]
        );
    }

    /// Issue 47, case 3: programs of a HumanEval problem that leave before `check()` has run to
    /// its end, or bend what it relies on, do not pass; nor does a program printing a written
    /// test's `True` itself. The honest programs still pass and fail as they should.
    #[tokio::test]
    async fn a_function_call_test_passes_only_when_it_ran_to_its_end() {
        let he = serde_json::json!({
            "prompt": "def inc(x):\n",
            "entry_point": "inc",
            "test": "def check(candidate):\n    assert abs(candidate(1) - 2) < 1e-9\n    assert candidate(41) == 42\n",
        });
        let wrong = "def inc(x):\n    return x\n";
        let sources = [
            "def inc(x):\n    return x + 1".to_string(),
            wrong.to_string(),
            format!("{wrong}import sys\nsys.exit(0)"),
            format!("{wrong}raise SystemExit(0)"),
            format!("{wrong}import os\nos._exit(0)"),
            format!("{wrong}import builtins\nbuiltins.abs = lambda x: 0\nprint(True)"),
            format!("{wrong}import os, sys\nsys.excepthook = lambda *a: os._exit(0)"),
            format!("{wrong}def check(candidate):\n    pass"),
            "def inc(x):\n    import os\n    os._exit(0)".to_string(),
            "def inc(x):\n    raise SystemExit(0)".to_string(),
        ];
        let ids: Vec<String> = (0..sources.len()).map(|i| format!("h{i}")).collect();
        let programs: Vec<(&str, &str, &str)> = ids
            .iter()
            .zip(&sources)
            .map(|(id, p)| ("H", id.as_str(), p.as_str()))
            .collect();
        let call = "**Test Input:**\n```\ninc(41)\n```\n**Test Output:**\n```\n42\n```";
        let c = store(&[("H", he)], &programs, &[("H", call, call)]);
        let got = verdicts(&c).await;
        let want = [
            "h0 generated 0 ok true",
            "h0 truth 0 ok true",
            "h1 generated 0 wrong_answer false",
            "h1 truth 0 crash false",
            "h2 generated 0 crash false",
            "h2 truth 0 crash false",
            "h3 generated 0 crash false",
            "h3 truth 0 crash false",
            "h4 generated 0 crash false",
            "h4 truth 0 crash false",
            // Its own `True` is not the harness's line; its patched abs is undone.
            "h5 generated 0 wrong_answer false",
            "h5 truth 0 crash false",
            "h6 generated 0 wrong_answer false",
            "h6 truth 0 crash false",
            "h7 generated 0 wrong_answer false",
            "h7 truth 0 crash false",
            "h8 generated 0 crash false",
            "h8 truth 0 crash false",
            "h9 generated 0 crash false",
            "h9 truth 0 crash false",
        ];
        assert_eq!(got, want);
        // The digest leaves the run's token out: the same on every run.
        let a = output(&Execute, &c, "executions").await;
        let b = output(&Execute, &c, "executions").await;
        assert_eq!(
            col::<StringArray>(&a, "output_digest").value(0),
            col::<StringArray>(&b, "output_digest").value(0)
        );
    }

    /// The harness hands the program an empty stdin and keeps its token out of the source: a
    /// program reading either finds no token.
    #[test]
    fn the_token_is_out_of_the_programs_reach() {
        let case = TestCase::Check {
            test: "def check(candidate):\n    assert False\n".into(),
            entry_point: "f".into(),
        };
        let program = "import os, sys\nprint(repr(sys.stdin.read()), repr(os.read(0, 100)))\ndef f():\n    pass";
        let (source, stdin) = case.harness(program);
        assert!(stdin.is_empty() && !source.contains("rla-pipe-token-"));
        let sandbox = Sandbox::new(Default::default()).unwrap();
        let token = fresh_token().unwrap();
        assert!(token.len() > 40 && token != fresh_token().unwrap());
        let o = sandbox
            .run(0, &source, &format!("{token}\n"), Duration::from_secs(10))
            .unwrap();
        assert_eq!(o.stdout, "'' b''\n", "{o:?}");
        assert!(!o.stdout.contains(&token));
        assert_eq!(case.verdict(&o.stdout, &token), Verdict::Unfinished);
    }
}
