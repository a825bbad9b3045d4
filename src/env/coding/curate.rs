//! The environment model's side of the coding setting (the reference's
//! `sample/llm_env_rollout.py`): the prompt that asks an LLM to rewrite a problem harder or
//! easier — anchored to the slot's root problem, with the current problem's tests and the
//! policy's pass rate on each — and how its JSON answer is read into a new problem.

use serde_json::{Value, json};

/// Tests longer than this (either side) are left out of the prompt, as are empty ones
/// (`llm_env_rollout.py:234-259, 665`).
const MAX_TEST_CHARS: usize = 100;
/// Each test's input and output in the prompt's JSON are cut at this many characters (`:203`).
const MAX_JSON_CHARS: usize = 800;
/// The fewest test pairs a rewritten problem must have (the reference's `num_unit_tests`).
pub const MIN_TESTS: usize = 4;
/// The time limit of a rewritten problem, seconds (the reference hard-codes it, `:922-946`).
pub const REWRITE_TIME_LIMIT: f64 = 4.0;

/// Tests with the policy's pass rate on each (empty rates: the root's, shown as 0).
#[derive(Debug, Clone, Default)]
pub struct RatedTests<'a> {
    pub inputs: &'a [String],
    pub outputs: &'a [String],
    pub rates: &'a [f64],
}

/// What a rewrite request shows the environment model.
#[derive(Debug, Clone)]
pub struct RewriteRequest<'a> {
    /// `harder` or `easier`.
    pub goal: &'a str,
    /// The slot's root (seed) problem and its tests.
    pub root_question: &'a str,
    pub root_tests: RatedTests<'a>,
    /// The current problem, its ground-truth tests and the reward model's tests, with pass rates.
    pub question: &'a str,
    pub truth: RatedTests<'a>,
    pub written: RatedTests<'a>,
    /// The fewest tests the answer must have (the reference's `num_unit_tests`, 4).
    pub min_tests: usize,
}

/// The pairs shown: neither side empty nor longer than [`MAX_TEST_CHARS`], each with its own
/// rate. The reference slices the rates of the unfiltered list, so they shift when a pair is
/// dropped (`:687-691`); here each kept pair keeps its rate (a deliberate difference).
fn shown(t: &RatedTests<'_>) -> (Vec<String>, Vec<String>, Vec<f64>) {
    let (mut i, mut o, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for (k, (a, b)) in t.inputs.iter().zip(t.outputs).enumerate() {
        let long = |s: &str| s.chars().count() > MAX_TEST_CHARS;
        if a.is_empty() || b.is_empty() || long(a) || long(b) {
            continue;
        }
        i.push(a.clone());
        o.push(b.clone());
        r.push(t.rates.get(k).copied().unwrap_or(0.0));
    }
    (i, o, r)
}

/// `_tests_json_for_prompt`: `[{"idx", "pass_rate" (4 decimals), "test_input", "test_output"}]`,
/// indented by 2 as Python's `json.dumps(…, indent=2)` (keys in that order, which is also
/// their sorted order).
fn tests_json(inputs: &[String], outputs: &[String], rates: &[f64]) -> String {
    let cut = |s: &str| -> String {
        if s.chars().count() <= MAX_JSON_CHARS {
            s.to_string()
        } else {
            format!(
                "{}...(truncated)",
                s.chars().take(MAX_JSON_CHARS).collect::<String>()
            )
        }
    };
    let items: Vec<Value> = inputs
        .iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (a, b))| {
            let rate = rates.get(i).copied().unwrap_or(0.0);
            json!({
                "idx": i,
                "pass_rate": (rate * 1e4).round() / 1e4,
                "test_input": cut(a),
                "test_output": cut(b),
            })
        })
        .collect();
    serde_json::to_string_pretty(&items).expect("JSON values serialize")
}

/// Python's `repr` of a list of strings (how the reference's Jinja template prints the current
/// problem's test inputs and outputs).
pub fn py_list_repr(items: &[String]) -> String {
    let reprs: Vec<String> = items.iter().map(|s| py_str_repr(s)).collect();
    format!("[{}]", reprs.join(", "))
}

/// Python's `repr` of a string: single quotes unless it holds a single quote and no double
/// quote; backslash escapes for `\\`, the quote, `\n`, `\r`, `\t` and other control characters.
fn py_str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// The environment model's prompt, verbatim (`llm_env_rollout.py:742-794`).
pub fn rewrite_prompt(r: &RewriteRequest<'_>) -> String {
    let (ri, ro, _) = shown(&RatedTests {
        rates: &[],
        ..r.root_tests.clone()
    });
    let (gi, go, gr) = shown(&r.truth);
    let (si, so, sr) = shown(&r.written);
    let root_question = if r.root_question.trim().is_empty() {
        r.question.trim()
    } else {
        r.root_question.trim()
    };
    let n = r.min_tests;
    format!(
        "<|im_start|>system\nYou are a coding dataset curator. Generate ONE new coding problem and its ground-truth unit tests.\n\nReturn ONLY a JSON object with EXACT keys:\n{{\n  \"question\": \"...\",\n  \"test_method\": \"stdio\",\n  \"test_time_limit\": 4,\n  \"test_input\": [\"...\", \"...\", ...],\n  \"test_output\": [\"...\", \"...\", ...]\n}}\n\nIMPORTANT:\n- test_input and test_output must be lists of the SAME length (>= {n}).\n- Each test_input is the exact stdin content; each test_output is the exact expected stdout content.\n- Output JSON only. No extra text.\n<|im_end|>\n<|im_start|>user\nGoal: make the new problem {goal}.\n\nCRITICAL ANCHOR (do NOT drift away):\nThe new problem MUST stay close to the ORIGINAL (root) problem in topic, core skill, input/output format style, and constraints.\nYou may only adjust difficulty in a controlled way. Do NOT switch to a different domain/task type.\n\n[ORIGINAL ROOT PROBLEM]\n{root_question}\n\n[ORIGINAL ROOT UNIT TESTS (reference; truncated)]\n{root_json}\n\n[CURRENT ACTIVE PROBLEM]\n{question}\n\nReference unit tests (ground truth for current active; truncated):\n- test_input examples:\n{gi_repr}\n- test_output examples:\n{go_repr}\n\nPolicy performance on each unit test (pass_rate over current policy code samples):\nGround-truth unit tests:\n{gt_json}\n\nSynthetic unit tests (may not be accurate):\n{syn_json}\n\nConstraints:\n- Keep similar general topic/skill to the ORIGINAL ROOT problem.\n- The new problem must be self-contained and unambiguous.\n- Provide at least {n} ground-truth tests in \"test_input\"/\"test_output\".\n<|im_end|>\n<|im_start|>assistant\n",
        goal = r.goal,
        root_json = tests_json(&ri, &ro, &[]),
        question = r.question.trim(),
        gi_repr = py_list_repr(&gi),
        go_repr = py_list_repr(&go),
        gt_json = tests_json(&gi, &go, &gr),
        syn_json = tests_json(&si, &so, &sr),
    )
}

/// What the environment model is shown about a task besides its problem (built by the `adapt`
/// stage from `tasks`, `executions` and `unit_tests`): the slot's root problem and how the
/// policy's programs fared on each test.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// The slot's seed problem (its spec).
    pub root: Value,
    /// The share of the policy's programs passing each ground-truth test of the current
    /// problem, in test order.
    pub truth_rates: Vec<f64>,
    /// The reward model's readable tests of the current problem (input, output) and the share
    /// of programs passing each.
    pub written: Vec<(String, String, f64)>,
    /// The fewest tests a rewrite must have (the reference's 4).
    pub min_tests: usize,
}

/// The rewrite request as chat messages (system, user): [`rewrite_prompt`]'s two turns, for an
/// OpenAI-compatible endpoint (the reference sends the ChatML text to its own model as one
/// completion prompt; the wording is the same). `None` for a function-call problem, which has
/// no stdin/stdout tests to show (the reference rewrites stdin/stdout problems only).
pub fn rewrite_messages(current: &Value, goal: &str, ev: &Evidence) -> Option<[String; 2]> {
    let stdio = |v: &Value| match super::Problem::parse(v).ok()?.tests {
        super::Tests::Stdio { inputs, outputs } => Some((inputs, outputs)),
        super::Tests::Function { .. } => None,
    };
    let question = |v: &Value| {
        v.get("question")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (gi, go) = stdio(current)?;
    let (ri, ro) = stdio(&ev.root).unwrap_or_default();
    let (si, so, sr): (Vec<String>, Vec<String>, Vec<f64>) = ev
        .written
        .iter()
        .map(|(a, b, r)| (a.clone(), b.clone(), *r))
        .fold(Default::default(), |(mut a, mut b, mut c), (x, y, z)| {
            a.push(x);
            b.push(y);
            c.push(z);
            (a, b, c)
        });
    let text = rewrite_prompt(&RewriteRequest {
        goal,
        root_question: &question(&ev.root),
        root_tests: RatedTests {
            inputs: &ri,
            outputs: &ro,
            rates: &[],
        },
        question: &question(current),
        truth: RatedTests {
            inputs: &gi,
            outputs: &go,
            rates: &ev.truth_rates,
        },
        written: RatedTests {
            inputs: &si,
            outputs: &so,
            rates: &sr,
        },
        min_tests: ev.min_tests,
    });
    let turn = |role: &str| -> Option<String> {
        let open = format!("<|im_start|>{role}\n");
        let at = text.find(&open)? + open.len();
        let end = text[at..].find("<|im_end|>")? + at;
        Some(text[at..end].trim_end().to_string())
    };
    Some([turn("system")?, turn("user")?])
}

/// `parse_json_obj`: code fences removed, then the LAST balanced top-level `{…}` (strings and
/// escapes respected) that parses as JSON (`llm_env_rollout.py:123-159`).
pub fn last_json_object(text: &str) -> Option<Value> {
    let t = text.trim().replace("```json", "").replace("```", "");
    let t = t.trim();
    let (mut in_str, mut esc, mut depth, mut start) = (false, false, 0usize, None);
    let mut last = None;
    for (i, ch) in t.char_indices() {
        if in_str {
            if esc {
                esc = false;
            } else if ch == '\\' {
                esc = true;
            } else if ch == '"' {
                in_str = false;
            }
        } else if ch == '"' {
            in_str = true;
        } else if ch == '{' {
            if depth == 0 {
                start = Some(i);
            }
            depth += 1;
        } else if ch == '}' && depth > 0 {
            depth -= 1;
            if depth == 0
                && let Some(s) = start.take()
                && let Ok(v) = serde_json::from_str::<Value>(&t[s..=i])
            {
                last = Some(v);
            }
        }
    }
    last
}

/// The new problem in an environment model's answer (`:887-946`): a JSON object with a non-empty
/// `question` and `test_input` / `test_output` lists of the same length, at least `min_tests`;
/// tests converted with Python's `str`; the time limit [`REWRITE_TIME_LIMIT`]. `None`: no such
/// answer (the reference then tries the request's next sample, and makes no task without one).
pub fn read_rewrite(answer: &str, min_tests: usize) -> Option<Value> {
    let obj = last_json_object(answer)?;
    let q = obj.get("question")?.as_str()?.trim().to_string();
    let (tin, tout) = (
        obj.get("test_input")?.as_array()?,
        obj.get("test_output")?.as_array()?,
    );
    if q.is_empty() || tin.len() != tout.len() || tin.len() < min_tests {
        return None;
    }
    let py_str = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    };
    Some(json!({
        "question": q,
        "test_input": tin.iter().map(py_str).collect::<Vec<_>>(),
        "test_output": tout.iter().map(py_str).collect::<Vec<_>>(),
        "test_time_limit": REWRITE_TIME_LIMIT,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn answers_are_read_as_the_reference_reads_them() {
        let answer = "Sure!\n```json\n{\"question\": \"Add three numbers.\", \"test_method\": \"stdio\", \"test_input\": [\"1 2 3\\n\", \"0 0 0\", \"5 5 5\", \"-1 1 0\"], \"test_output\": [6, \"0\", \"15\", \"0\"]}\n```";
        let p = read_rewrite(answer, 4).unwrap();
        assert_eq!(p["test_output"][0], "6", "str() of a number");
        assert_eq!(p["test_time_limit"], 4.0);
        assert!(crate::env::coding::Problem::parse(&p).is_ok());
        // The last balanced object that parses wins; braces inside strings do not count.
        let two = "{\"question\": \"a\"} then {\"question\": \"b } {\", \"test_input\": [\"1\"], \"test_output\": [\"1\"]} {broken";
        assert_eq!(last_json_object(two).unwrap()["question"], "b } {");
        assert_eq!(read_rewrite(two, 1).unwrap()["question"], "b } {");
        // Refused: too few tests, unequal lists, an empty question, no JSON.
        assert!(read_rewrite(two, 4).is_none());
        assert!(
            read_rewrite(
                "{\"question\": \"q\", \"test_input\": [\"1\", \"2\"], \"test_output\": [\"1\"]}",
                1
            )
            .is_none()
        );
        assert!(
            read_rewrite(
                "{\"question\": \" \", \"test_input\": [\"1\"], \"test_output\": [\"1\"]}",
                1
            )
            .is_none()
        );
        assert!(read_rewrite("no json", 1).is_none());
    }

    #[test]
    fn the_prompt_is_the_references() {
        let (ti, to) = (
            v(&["1 2\n", "", &"9".repeat(101), "5 7\n"]),
            v(&["3", "x", "y", "12"]),
        );
        let rates = [0.5, 1.0, 1.0, 1.0 / 3.0];
        let (wi, wo) = (v(&["2 2"]), v(&["4"]));
        let r = RewriteRequest {
            goal: "harder",
            root_question: "",
            root_tests: RatedTests::default(),
            question: " Add two numbers. ",
            truth: RatedTests {
                inputs: &ti,
                outputs: &to,
                rates: &rates,
            },
            written: RatedTests {
                inputs: &wi,
                outputs: &wo,
                rates: &[0.25],
            },
            min_tests: 4,
        };
        let p = rewrite_prompt(&r);
        assert!(p.contains("Goal: make the new problem harder.\n"));
        assert!(p.contains("[ORIGINAL ROOT PROBLEM]\nAdd two numbers.\n\n[ORIGINAL ROOT UNIT TESTS (reference; truncated)]\n[]\n"));
        // The empty and the long test are left out; each kept test keeps its own rate.
        assert!(p.contains("- test_input examples:\n['1 2\\n', '5 7\\n']\n- test_output examples:\n['3', '12']\n"), "{p}");
        assert!(
            p.contains("\"idx\": 1,\n    \"pass_rate\": 0.3333,\n    \"test_input\": \"5 7\\n\","),
            "{p}"
        );
        assert!(p.contains("Synthetic unit tests (may not be accurate):\n[\n  {\n    \"idx\": 0,\n    \"pass_rate\": 0.25,"), "{p}");
        assert!(p.contains("lists of the SAME length (>= 4)"));
        assert!(p.ends_with("<|im_end|>\n<|im_start|>assistant\n"));
        assert_eq!(
            py_list_repr(&v(&["it's", "a\"b", "t\tb\\"])),
            "[\"it's\", 'a\"b', 't\\tb\\\\']"
        );
    }

    /// The chat turns are the prompt's system and user parts with the evidence in them; a
    /// function-call problem is not rewritten.
    #[test]
    fn rewrite_messages_carry_the_root_and_the_pass_rates() {
        let current = json!({"question": "Add two.", "test_input": ["1 2", "3 4"], "test_output": ["3", "7"]});
        let ev = Evidence {
            root: json!({"question": "Add.", "test_input": ["0 0"], "test_output": ["0"]}),
            truth_rates: vec![0.5, 0.25],
            written: vec![("9 9".into(), "18".into(), 1.0)],
            min_tests: MIN_TESTS,
        };
        let [system, user] = rewrite_messages(&current, "easier", &ev).unwrap();
        assert!(
            system.starts_with("You are a coding dataset curator.") && !system.contains("<|im")
        );
        assert!(
            user.starts_with("Goal: make the new problem easier."),
            "{user}"
        );
        assert!(user.contains("[ORIGINAL ROOT PROBLEM]\nAdd.\n"));
        assert!(user.contains("[CURRENT ACTIVE PROBLEM]\nAdd two.\n"));
        assert!(user.contains("\"pass_rate\": 0.25") && user.contains("\"test_input\": \"9 9\""));
        let he = json!({"prompt": "def f(x):\n", "entry_point": "f", "test": "def check(candidate):\n    assert candidate(1)\n"});
        assert!(rewrite_messages(&he, "harder", &ev).is_none());
    }
}
