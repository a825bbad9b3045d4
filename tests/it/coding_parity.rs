//! Parity with the reference (issue 47): the reference implementation's own coding reward code,
//! `reward/llm_rl_reward.py` of Gen-Verse/Open-AgentRL, vendored unmodified in
//! `tests/reference/open-agentrl/`, run on an iteration rla-pipe committed to a temporary store
//! (`tests/reference/coding_reward.py` writes the store's programs, tests and runs in the
//! reference's `outputs-*.json` format and reads back what the script computed), and compared
//! row for row with what rla-pipe committed: every program's reward and advantage
//! (`policy_advantages`), every written test's reward and advantage the reference trains the
//! reward model on (`rm_advantages`), which tasks train, each task's pass-all share and the
//! logged unit-test metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use rla_pipe::model::hf::HfArch;
use serde_json::{Value, json};

use crate::Fixture;

const CODING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/coding-smollm2.toml");
const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/reference/coding_reward.py"
);

/// Largest difference allowed between a reward or advantage of rla-pipe and the reference's.
/// rla-pipe sums the pass fractions exactly on a 1e-9 grid (`coding_policy_advantages.sql`), the
/// reference in binary floating point: a third is 0.333333333 there, so rewards differ by up to
/// 5e-10 and advantages by that over the group's std.
const TOLERANCE: f64 = 1e-8;

/// Stdin/stdout problems over two integers; the last two differ only by a suffix that picks
/// their programs' draws (the draw of rollout r is seeded by the task id, a hash of the spec):
/// one task where every program passes (N empty) and one where 7 of 8 do, besides the three
/// where a few pass.
const PROBLEMS: &str = r#"{"question": "Read two integers a and b, print a + b.", "test_input": ["1 2\n", "5 7\n", "0 0\n"], "test_output": ["3", "12", "0"]}
{"question": "Read two integers a and b, print a * b.", "test_input": ["2 3\n", "4 5\n", "1 1\n"], "test_output": ["6", "20", "1"]}
{"question": "Read two integers a and b, print the larger.", "test_input": ["1 2\n", "7 3\n", "4 4\n"], "test_output": ["2", "7", "4"]}
{"question": "Read two integers a and b, print a * b + a + b. (4)", "test_input": ["0 0\n"], "test_output": ["0"]}
{"question": "Read two integers a and b, print a * b + a + b. (1)", "test_input": ["0 0\n"], "test_output": ["0"]}
"#;

/// The uniform policy's programs: right for one problem each, right on some tests of several
/// (fractional rewards), and one that crashes.
const PROGRAMS: [&str; 6] = [
    "a, b = map(int, input().split())\nprint(a + b)\n",
    "a, b = map(int, input().split())\nprint(a * b)\n",
    "a, b = map(int, input().split())\nprint(max(a, b))\n",
    "a, b = map(int, input().split())\nprint(a + b if a < 3 else a * b)\n",
    "a, b = map(int, input().split())\nprint(b)\n",
    "raise ValueError('no')\n",
];

/// The tests the scripted reward model writes (stdin, stdout): each some programs pass and others
/// fail, one without input (invalid: it fails every program).
const WRITTEN: [(&str, &str); 5] = [
    ("1 2", "3"),
    ("2 2", "4"),
    ("2 3", "6"),
    ("", "5"),
    ("3 1", "3"),
];

/// A Llama checkpoint over bytes that writes one of `tests` per reply, in the reference's
/// `**Test Input:**` / `**Test Output:**` format, drawn uniformly: each whole reply is one
/// token of the tokenizer (ids 258..), the layers add nothing to the residual (zero output
/// projections), so the next token depends on the current one alone — after the prompt's last
/// `\n` one of the replies (equal logits), after a reply the end of the turn.
fn scripted_rm(dir: &Path, tests: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    let (hidden, first) = (32usize, 258usize);
    let vocab = first + tests.len();
    assert!(tests.len() < hidden);
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 48,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "hidden_act": "silu", "bos_token_id": 256, "eos_token_id": 257,
        "tie_word_embeddings": false, "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    crate::hf::write_byte_tokenizer(dir);
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (k, (input, output)) in tests.iter().enumerate() {
        let reply = format!("**Test Input:**\n```{input}```\n\n**Test Output:**\n```{output}```");
        tokenizer["added_tokens"]
            .as_array_mut()
            .unwrap()
            .push(json!({
                "id": first + k, "content": reply, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": false,
            }));
    }
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    // One-hot embeddings: `\n` (byte 10) on dimension 0, reply k on dimension 1 + k; the head
    // maps dimension 0 to every reply and every reply's dimension to <|im_end|> (257).
    let arch = HfArch::from_json(&config.to_string()).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = arch
        .expected_tensors()
        .into_iter()
        .map(|(name, shape)| {
            let mut v = vec![0f32; shape.iter().product()];
            if name.ends_with("norm.weight") {
                v.fill(1.0);
            } else if name == "model.embed_tokens.weight" {
                v[10 * hidden] = 1.0;
                for k in 0..tests.len() {
                    v[(first + k) * hidden + 1 + k] = 1.0;
                }
            } else if name == "lm_head.weight" {
                for k in 0..tests.len() {
                    v[(first + k) * hidden] = 10.0;
                    v[257 * hidden + 1 + k] = 10.0;
                }
            }
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b);
            (n.clone(), view.unwrap())
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

/// A query's rows through the real binary, as JSON objects.
fn table(f: &Fixture, query: &str) -> Vec<Value> {
    let r = f.rla(&["sql", "--quiet", "--format", "json", query]);
    assert_eq!(r.code, 0, "{query}\n{}", r.stderr);
    let text = r.stdout.trim();
    if text.is_empty() {
        return Vec::new();
    }
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{query}: {e}\n{text}"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn key2(v: &Value, a: &str, b: &str) -> (String, String) {
    (v[a].as_str().unwrap().into(), v[b].to_string())
}

/// Issue 47: the reference's `reward/llm_rl_reward.py` (unmodified, Open-AgentRL 1fe5dbd) on an
/// iteration of the coding loop rla-pipe committed — the uniform policy over 6 programs, 8
/// rollouts of each of 5 problems, a scripted reward model writing 6 tests a problem — gives
/// the same rewards row for row: every program's pass fraction and advantage (`reward`,
/// `advantage` of `policy_advantages`), every written test's discrimination reward and
/// advantage the reference trains the reward model on (`consistency_reward`, `advantage` of
/// `rm_advantages`), within [`TOLERANCE`]; the same tasks train (a row rla-pipe includes is in
/// the reference's data; one the reference trains with a nonzero advantage is included); the
/// same pass-all shares, `syn_ut_acc` and `perfect_ut_rate`.
#[test]
fn coding_rewards_match_the_reference() {
    crate::python_packages("omegaconf, termcolor", &["omegaconf", "termcolor"]);
    let f = Fixture::new();
    let dir = f.dir.path();
    let rm = dir.join("rm");
    scripted_rm(&rm, &WRITTEN);
    let (problems, programs) = (dir.join("problems.jsonl"), dir.join("programs.json"));
    std::fs::write(&problems, PROBLEMS).unwrap();
    std::fs::write(&programs, serde_json::to_string(&PROGRAMS).unwrap()).unwrap();
    let (p, c, r) = (
        format!("env.coding.problems={}", problems.display()),
        format!("env.coding.candidates={}", programs.display()),
        format!("reward_model.init=hf:{}", rm.display()),
    );
    let sets = [
        p.as_str(),
        &c,
        &r,
        "env.initial_tasks=5",
        "rollout.n=8",
        "policy.kind=uniform",
        "policy.init=",
        "policy.action_mode=score",
        "reward_model.samples=6",
        "reward_model.max_tokens=4",
        "reward_model.temperature=1.0",
        "eval.tasks=1",
        "eval.rollouts=1",
    ];
    let run = f.run_pipeline(CODING, "par", 1, &sets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    let work = dir.join("reference");
    let out = Command::new("python3")
        .arg(DRIVER)
        .arg(crate::rla_pipe_bin())
        .arg(f.store())
        .args(["par", "0"])
        .arg(&work)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut worst: f64 = 0.0;
    let mut close = |what: &str, ours: f64, theirs: f64| {
        let d = (ours - theirs).abs();
        worst = worst.max(d);
        assert!(
            d <= TOLERANCE,
            "{what}: rla-pipe {ours}, the reference {theirs}"
        );
    };

    // The policy: every program of every task.
    let ours: BTreeMap<(String, String), Value> = table(
        &f,
        "SELECT task_id, traj_id, reward, advantage, included FROM policy_advantages WHERE run_id = 'par' AND iter = 0",
    )
    .into_iter()
    .map(|v| (key2(&v, "task_id", "traj_id"), v))
    .collect();
    let theirs = reference["policy"].as_array().unwrap();
    assert_eq!(ours.len(), 40, "5 problems × 8 programs");
    assert_eq!(theirs.len(), ours.len());
    let (mut trained, mut fractional) = (BTreeSet::new(), 0);
    for t in theirs {
        let k = key2(t, "task_id", "traj_id");
        let o = ours
            .get(&k)
            .unwrap_or_else(|| panic!("no rla-pipe row for {k:?}"));
        close(
            &format!("{k:?} reward"),
            num(o, "reward"),
            num(t, "raw_reward"),
        );
        close(
            &format!("{k:?} advantage"),
            num(o, "advantage"),
            num(t, "reward"),
        );
        let (included, in_data) = (o["included"] == true, t["trained"] == true);
        assert!(
            !included || in_data,
            "{k:?} trains here, not in the reference"
        );
        assert!(
            included || !in_data || num(t, "reward").abs() <= TOLERANCE,
            "{k:?} trains in the reference with advantage {}, not here",
            t["reward"]
        );
        if in_data {
            trained.insert(k.0.clone());
        }
        let raw = num(t, "raw_reward");
        fractional += usize::from(raw > 0.0 && raw < 1.0);
    }
    assert!(
        !trained.is_empty() && trained.len() < 5 && fractional > 0,
        "the run has tasks in and out of the band and fractional rewards: {trained:?}"
    );

    // The reward model: every written test of the tasks the reference trains it on.
    let ours: BTreeMap<(String, String), Value> = table(
        &f,
        "SELECT task_id, sample_idx, consistency_reward, advantage, included FROM rm_advantages WHERE run_id = 'par' AND iter = 0",
    )
    .into_iter()
    .map(|v| (key2(&v, "task_id", "sample_idx"), v))
    .collect();
    let theirs = reference["rm"].as_array().unwrap();
    let mut nonzero: BTreeSet<String> = BTreeSet::new();
    for t in theirs {
        let k = key2(t, "task_id", "sample_idx");
        let o = ours
            .get(&k)
            .unwrap_or_else(|| panic!("no rla-pipe row for {k:?}"));
        close(
            &format!("{k:?} RM reward"),
            num(o, "consistency_reward"),
            num(t, "raw_reward"),
        );
        close(
            &format!("{k:?} RM advantage"),
            num(o, "advantage"),
            num(t, "reward"),
        );
        if num(t, "reward") != 0.0 {
            nonzero.insert(k.0.clone());
        }
    }
    // Included here ⇔ in the reference's data, of a task whose tests do not all tie (the
    // reference keeps a tied task's rows with advantage 0; rla-pipe leaves them out).
    let in_data: BTreeSet<&(String, String)> = theirs
        .iter()
        .map(|t| key2(t, "task_id", "sample_idx"))
        .filter_map(|k| ours.get_key_value(&k).map(|(k, _)| k))
        .collect();
    for (k, o) in &ours {
        let expected = in_data.contains(k) && nonzero.contains(&k.0);
        assert_eq!(o["included"] == true, expected, "RM row {k:?} included");
    }
    assert!(
        theirs.len() >= 12 && !nonzero.is_empty(),
        "the reference trains its RM on tests of at least two tasks: {}",
        theirs.len()
    );

    // Pass-all shares and the logged metrics.
    let acc = table(
        &f,
        "SELECT task_id, acc, rollouts, successes FROM task_accuracy WHERE run_id = 'par' AND iter = 0",
    );
    assert_eq!(acc.len(), 5);
    let (mut won, mut all) = (0.0, 0.0);
    for a in &acc {
        let id = a["task_id"].as_str().unwrap();
        let theirs = reference["acc"][id]
            .as_f64()
            .unwrap_or_else(|| panic!("no acc of {id}"));
        close(&format!("{id} acc"), num(a, "acc"), theirs);
        won += num(a, "successes");
        all += num(a, "rollouts");
    }
    let m = &reference["metrics"];
    // The reference logs these with 6 decimals.
    let logged = |what: &str, ours: f64, theirs: f64| {
        assert!(
            (ours - theirs).abs() <= 5e-7,
            "{what}: rla-pipe {ours}, the reference {theirs}"
        );
    };
    logged("GT-pass-all acc", won / all, num(m, "acc"));
    let q = table(
        &f,
        "SELECT sum(CASE WHEN passing > 0 THEN tests ELSE 0 END) AS den_gt, \
                sum(CASE WHEN passing > 0 THEN consistent ELSE 0 END) AS consistent, \
                sum(CASE WHEN passing > 0 AND passing < programs THEN tests ELSE 0 END) AS den_gt_ngt, \
                sum(CASE WHEN passing > 0 AND passing < programs THEN perfect ELSE 0 END) AS perfect \
         FROM test_quality WHERE run_id = 'par' AND iter = 0",
    );
    let q = &q[0];
    assert_eq!(num(q, "den_gt"), num(m, "syn_ut_den_gt"));
    assert_eq!(num(q, "den_gt_ngt"), num(m, "syn_ut_den_gt_ngt"));
    logged(
        "syn_ut_acc",
        num(q, "consistent") / num(q, "den_gt"),
        num(m, "syn_ut_acc"),
    );
    logged(
        "perfect_ut_rate",
        num(q, "perfect") / num(q, "den_gt_ngt"),
        num(m, "perfect_ut_rate"),
    );
    eprintln!(
        "parity with the reference: {} policy rows, {} RM rows, 5 tasks; max |difference| {worst:e}",
        reference["policy"].as_array().unwrap().len(),
        theirs.len()
    );
}
