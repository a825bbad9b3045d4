//! `execute` (the coding setting, the reference's `reward/execute.py`): every program the policy
//! wrote for a task (one per trajectory: the last ```` ```python ```` block of its reply) runs
//! against every ground-truth test of the task and every test the reward model wrote for it
//! (task-level RM samples: `traj_id` ''), each run in its own sandboxed process
//! ([`crate::sandbox`]), `env.coding.workers` at once. Writes the written tests as read
//! (`unit_tests`) and one row per (program, test) (`executions`). Identical (program, test)
//! pairs of a task run once. `seconds` is wall-clock time: `replay --verify` re-runs every
//! program and compares every other column (a status included, so a program near its time
//! limit can make a replay differ; the README says so).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::env::coding::format::{NO_CODE, extract_program, extract_test};
use crate::env::coding::{Problem, TestCase};
use crate::error::{Error, Result};
use crate::sandbox::{Sandbox, Status};
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, TableOutput};

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

#[async_trait]
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
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let problems: BTreeMap<String, Problem> = problems(ctx).await?.into_iter().collect();
        // Written tests, per task, in sample order.
        let mut written: BTreeMap<
            String,
            Vec<(u32, Option<crate::env::coding::format::WrittenTest>)>,
        > = BTreeMap::new();
        for b in collect(
            &ctx.session,
            "SELECT task_id, sample_idx, response FROM rm_samples WHERE traj_id = '' ORDER BY task_id, sample_idx",
        )
        .await?
        {
            let c = Columns::new(&b, "the execute stage's rm_samples");
            let (id, k, reply) = (c.str("task_id")?, c.u32("sample_idx")?, c.str("response")?);
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
        let mut rows: Vec<(usize, &'static str, u32, Result<usize, &'static str>)> = Vec::new();
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
                Ok(j) => &results[j],
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
    }
}

/// The distinct runs to make, each (source, stdin, time limit) once.
#[derive(Default)]
struct Jobs {
    list: Vec<Job>,
    index: BTreeMap<(String, String, u64), usize>,
}

impl Jobs {
    /// The index of the run of `program` against `case` (a new one unless the same source,
    /// stdin and limit was added before).
    fn add(&mut self, problem: &Problem, program: &str, case: TestCase) -> usize {
        let (source, stdin) = case.harness(program);
        let key = (source, stdin, problem.time_limit.to_bits());
        let next = self.list.len();
        let j = *self.index.entry(key.clone()).or_insert(next);
        if j == next {
            self.list.push(Job {
                source: key.0,
                stdin: key.1,
                limit: Duration::from_secs_f64(problem.time_limit),
                case,
            });
        }
        j
    }
}

/// A distinct run: the source, its stdin, its limit and the test that judges its output.
struct Job {
    source: String,
    stdin: String,
    limit: Duration,
    case: TestCase,
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
    let mut needs: Vec<Vec<usize>> = Vec::with_capacity(items.len());
    for (problem, program) in items {
        let mut mine = Vec::new();
        if *program != NO_CODE {
            for case in problem.ground_truth() {
                if !case.is_valid() {
                    mine.push(usize::MAX); // an invalid test fails every program
                    continue;
                }
                mine.push(jobs.add(problem, program, case));
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
        .map(|js| !js.is_empty() && js.iter().all(|&j| results.get(j).is_some_and(|r| r.passed)))
        .collect())
}

/// Every job, `workers` at a time (worker w runs in sandbox slot w), results in job order.
fn run_all(sandbox: &Sandbox, jobs: &[Job], workers: usize) -> Result<Vec<Run>> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Run>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for w in 0..workers.clamp(1, jobs.len()) {
            let (next, slots) = (&next, &slots);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = sandbox.run(w, &job.source, &job.stdin, job.limit).map(|o| {
                        let passed = o.status == Status::Ok && job.case.passed_by(&o.stdout);
                        Run {
                            passed,
                            status: match o.status {
                                Status::Ok if passed => "ok",
                                Status::Ok => "wrong_answer",
                                other => other.as_str(),
                            },
                            seconds: o.seconds,
                            digest: Some(
                                blake3::hash(o.stdout.as_bytes()).to_hex()[..16].to_string(),
                            ),
                        }
                    });
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
                s(&["", "", "", ""]),
                crate::stages::testutil::i8s(&[0, 0, 0, 0]),
                s(&written),
            ],
        );
        let tests = output(&Execute, &c, "unit_tests").await;
        assert_eq!(tests.num_rows(), 4);
        let valid = col::<BooleanArray>(&tests, "valid");
        assert!(valid.value(0) && !valid.value(1));
        assert_eq!(col::<StringArray>(&tests, "input").value(0), "10 20");

        let runs = output(&Execute, &c, "executions").await;
        let (traj, kind, idx, status, passed) = (
            col::<StringArray>(&runs, "traj_id"),
            col::<StringArray>(&runs, "test_kind"),
            col::<UInt32Array>(&runs, "test_idx"),
            col::<StringArray>(&runs, "status"),
            col::<BooleanArray>(&runs, "passed"),
        );
        let got: Vec<String> = (0..runs.num_rows())
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
            .collect();
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
}
