//! The coding setting's text formats, as the reference implementation has them
//! (Gen-Verse/Open-AgentRL, `sample/llm_policy_rollout.py`, `sample/llm_reward_rollout.py`,
//! `reward/execute.py`): the policy's prompt and how its program is read, the reward model's
//! unit-test prompt and how its test is read, and how outputs are compared.

use regex::Regex;
use std::sync::LazyLock;

/// What the reference stores when a reply has no ```` ```python ```` block (a program that
/// fails to run). `llm_policy_rollout.py:144-148`.
pub const NO_CODE: &str = "We can not extract the code in the output. ";

/// The policy's prompt for a stdin/stdout problem, verbatim (`llm_policy_rollout.py:392-396`,
/// its missing space in "script.This" included); `eval` adds the evaluation sentence
/// (`:398-402`).
pub fn policy_prompt(problem: &str, eval: bool) -> String {
    let extra = if eval {
        " Your code should output the results based on the input read in, rather than generating the given test example."
    } else {
        ""
    };
    format!(
        "<|im_start|>You are a helpful assistant help user solve problems. <|im_end|>\n<|im_start|>User: You need to think first then write python script. You should use input() to input and print() to output in your script.{extra}This is the problem:\n{problem} <|im_end|>\n<|im_start|>Assistant: "
    )
}

/// The program of a policy reply: the last ```` ```python … ``` ```` block, stripped; else
/// [`NO_CODE`] (`llm_policy_rollout.py:144-148`).
pub fn extract_program(reply: &str) -> String {
    static CODE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?s)```python(.*?)```").expect("static regex"));
    match CODE.captures_iter(reply).last() {
        Some(c) => py_strip(&c[1]).to_string(),
        None => NO_CODE.to_string(),
    }
}

/// The reward model's unit-test prompt, verbatim (`llm_reward_rollout.py:459-488`).
pub fn unit_test_prompt(problem: &str) -> String {
    format!(
        "<|im_start|>system\nYou are a rigorous unit-test designer for coding problems.\nYou must produce exactly ONE new test example that is correct and discriminative.\n<|im_end|>\n<|im_start|>user\nYou need to provide a new test example. A good test example should be completely accurate and conform to the problem’s format requirements, while also possessing enough discriminative power to distinguish correct code from incorrect code.\n\nBefore providing a test example, you must think carefully and reason step by step to derive an input and output you are very confident are correct. For example, start by designing an input you can reliably handle, then compute the output step by step. If you're unsure about the output, revise or re-design the input to ensure accuracy. Directly providing input/output pairs without this process is discouraged, as it often results in low accuracy.\n\nFinally, after completing these previous thinking and derivation steps (you should not write the final test example unless you have gone through these steps very thoroughly), you MUST put your final test example in the following format:\n\n**Test Input:**\n```<put the EXACT stdin content here>```\n\n**Test Output:**\n```<put the EXACT stdout content here>```\n\n**Explanation:**\n<brief explanation here>\n\nIMPORTANT:\n- Output must contain exactly one **Test Input:** block and one **Test Output:** block.\n- Use triple backticks exactly as shown.\n- The test must be self-contained and match the problem format.\n\nProblem:\n{problem}\n<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// The unit-test prompt for a function-call problem (HumanEval's): the reference's prompt with
/// its stdin/stdout format replaced by a call of `entry_point` and the value it returns, both
/// Python expressions (rla-pipe's extension; the reference's coding data is stdin/stdout only).
pub fn unit_test_prompt_for_function(problem: &str, entry_point: &str) -> String {
    unit_test_prompt(problem)
        .replace(
            "```<put the EXACT stdin content here>```",
            &format!("```<a call of {entry_point}, e.g. {entry_point}(...)>```"),
        )
        .replace(
            "```<put the EXACT stdout content here>```",
            "```<the value the call must return, as a Python literal>```",
        )
}

/// A test the reward model wrote: its stdin and expected stdout, and the reply from the last
/// `**Test Input:**` on (what RM training keeps as the example).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenTest {
    pub input: String,
    pub output: String,
    pub example: String,
}

/// The test of a reward-model reply (`llm_reward_rollout.py:80-116`): the last fenced
/// `**Test Input:**` block (else the plain text up to `**Test Output:**`), the last fenced
/// `**Test Output:**` block (else the plain text up to `**Explanation:`, `**Test Input:` or the
/// end), CRLF made LF and surrounding newlines removed. `None` where any part is missing (the
/// reference's all-empty test, which fails every program).
pub fn extract_test(reply: &str) -> Option<WrittenTest> {
    static INPUT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?s)\*\*Test Input:\*\*\s*```(.*?)```").expect("static regex")
    });
    static OUTPUT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?s)\*\*Test Output:\*\*\s*```(.*?)```").expect("static regex")
    });
    const IN: &str = "**Test Input:**";
    const OUT: &str = "**Test Output:**";
    let input = match INPUT.captures_iter(reply).last() {
        Some(c) => normalize(c[1].trim_start_matches('\n')),
        // `\*\*Test Input:\*\*\s*([\s\S]*?)(?=\*\*Test Output:\*\*)`, findall's last match.
        None => {
            let mut last = None;
            let mut at = 0;
            while let Some(i) = reply[at..].find(IN).map(|i| at + i) {
                let body = i + IN.len();
                let Some(o) = reply[body..].find(OUT).map(|o| body + o) else {
                    break;
                };
                last = Some(&reply[body..o]);
                at = o;
            }
            normalize(py_strip(last?))
        }
    };
    let output = match OUTPUT.captures_iter(reply).last() {
        Some(c) => normalize(c[1].trim_start_matches('\n')),
        // `\*\*Test Output:\*\*\s*([\s\S]*?)(?=\*\*Explanation:|\*\*Test Input:|$)`.
        None => {
            let mut last = None;
            let mut at = 0;
            while let Some(i) = reply[at..].find(OUT).map(|i| at + i) {
                let body = i + OUT.len();
                let rest = &reply[body..];
                let end = [rest.find("**Explanation:"), rest.find("**Test Input:")]
                    .into_iter()
                    .flatten()
                    .min()
                    // `$` without MULTILINE: the end, or just before a final newline.
                    .unwrap_or(if rest.ends_with('\n') {
                        rest.len() - 1
                    } else {
                        rest.len()
                    });
                last = Some(&rest[..end]);
                at = body + end;
            }
            normalize(py_strip(last?))
        }
    };
    // An empty part is the reference's failure value (`[""]`) too.
    if input.is_empty() || output.is_empty() {
        return None;
    }
    let example = &reply[reply.rfind(IN)?..];
    Some(WrittenTest {
        input,
        output,
        example: example.to_string(),
    })
}

/// Whether a program's output is the expected one: equal after collapsing whitespace
/// (`reward/execute.py:148-149`).
pub fn outputs_match(got: &str, want: &str) -> bool {
    got.split_whitespace().eq(want.split_whitespace())
}

/// `_normalize`: CRLF → LF, then leading and trailing newlines removed.
fn normalize(s: &str) -> String {
    s.replace("\r\n", "\n").trim_matches('\n').to_string()
}

/// Python's `str.strip()` (ASCII and Unicode whitespace).
fn py_strip(s: &str) -> &str {
    s.trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_python_block_is_the_program() {
        let reply = "think\n```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```\nend";
        assert_eq!(extract_program(reply), "print(2)");
        assert_eq!(extract_program("```py\nx\n```"), NO_CODE);
        assert_eq!(extract_program("```python\nunclosed"), NO_CODE);
        assert!(policy_prompt("P", false).contains("script.This is the problem:\nP <|im_end|>"));
        assert!(policy_prompt("P", true).contains("the given test example.This is"));
    }

    #[test]
    fn written_tests_are_read_as_the_reference_reads_them() {
        let fenced = "reasoning\n**Test Input:**\n```\n5\n1 2 3 4 5\n```\n\n**Test Output:**\n```\n15\n```\n\n**Explanation:**\nsum";
        let t = extract_test(fenced).unwrap();
        assert_eq!(
            (t.input.as_str(), t.output.as_str()),
            ("5\n1 2 3 4 5", "15")
        );
        assert!(t.example.starts_with("**Test Input:**") && t.example.ends_with("sum"));
        // The last block wins; CRLF becomes LF.
        let two =
            format!("{fenced}\n**Test Input:**\n```\r\n2\r\n```\n**Test Output:**\n```\n4\n```");
        let t = extract_test(&two).unwrap();
        assert_eq!((t.input.as_str(), t.output.as_str()), ("2", "4"));
        // A language tag stays inside (the reference's quirk).
        let tagged = "**Test Input:**\n```text\n3\n```\n**Test Output:**\n```\n9\n```";
        assert_eq!(extract_test(tagged).unwrap().input, "text\n3");
        // Plain-text fallbacks.
        let plain = "**Test Input:** 3 4\n**Test Output:** 7\n**Explanation:** add";
        let t = extract_test(plain).unwrap();
        assert_eq!((t.input.as_str(), t.output.as_str()), ("3 4", "7"));
        let to_end = "**Test Input:**\n1\n**Test Output:**\n2\n";
        assert_eq!(extract_test(to_end).unwrap().output, "2");
        // Missing parts: no test.
        assert_eq!(extract_test("**Test Input:**\n```\n1\n```"), None);
        assert_eq!(extract_test("no test here"), None);
        assert_eq!(
            extract_test("**Test Input:**\n```\n```\n**Test Output:**\n```\n1\n```"),
            None
        );
        assert_eq!(extract_test("**Test Output:**\n```\n1\n```"), None);
    }

    #[test]
    fn outputs_are_compared_with_whitespace_collapsed() {
        assert!(outputs_match("1  2\n3\n", "1 2 3"));
        assert!(outputs_match("", "  \n"));
        assert!(!outputs_match("1 2", "12"));
        assert!(
            unit_test_prompt("P").ends_with("Problem:\nP\n<|im_end|>\n<|im_start|>assistant\n")
        );
        let f = unit_test_prompt_for_function("def inc(x):", "inc");
        assert!(f.contains("```<a call of inc, e.g. inc(...)>```") && !f.contains("stdin"));
    }
}
