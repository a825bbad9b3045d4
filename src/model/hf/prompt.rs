//! Chat prompts for pretrained models, through the model's own chat template (the wording
//! follows the reference implementation's AlfWorld prompts: a text game, the trajectory so far,
//! the candidate actions; the reward model judges one step and answers `\boxed{1}` or
//! `\boxed{-1}`).
//!
//! When a prompt exceeds its token budget the oldest history goes first; a prompt that still
//! does not fit is used as it is (the model's context, not the budget, is the hard limit).

use super::tokenizer::{ChatMessage, HfTokenizer};
use crate::error::Result;

const POLICY_SYSTEM: &str =
    "You are playing a text game. Your objective is to complete the task as soon as possible.";

const RM_SYSTEM: &str = "You judge the steps of an agent playing a text game.";

fn trajectory(past: &[(&str, &str)]) -> String {
    if past.is_empty() {
        return "(empty)".into();
    }
    past.iter()
        .enumerate()
        .map(|(i, (o, a))| format!("[{}] observation: {o}\n[{}] action: {a}", i + 1, i + 1))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Render `messages(kept history)` with the fewest dropped pairs that fit `budget` tokens.
fn fit(
    tok: &HfTokenizer,
    (keep, budget): (usize, usize),
    past: &[(&str, &str)],
    reply_prefix: &str,
    messages: impl Fn(&[(&str, &str)]) -> Vec<ChatMessage>,
) -> Result<Vec<u32>> {
    let mut from = past.len().saturating_sub(keep);
    loop {
        let mut text = tok.apply_chat_template(&messages(&past[from..]), true)?;
        text.push_str(reply_prefix);
        let ids = tok.encode(&text, false)?;
        if ids.len() <= budget || from == past.len() {
            return Ok(ids);
        }
        from += 1;
    }
}

/// The policy's chat: the task, the trajectory so far and the observation, then `choose` (the
/// candidate actions and what to answer).
fn policy_chat(
    tok: &HfTokenizer,
    (keep, budget): (usize, usize),
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
    choose: &str,
) -> Result<Vec<u32>> {
    fit(tok, (keep, budget), past, "", |past| {
        vec![
            ChatMessage::new("system", POLICY_SYSTEM),
            ChatMessage::new(
                "user",
                &format!(
                    "Task: {task}\n\nYour trajectory so far:\n{}\n\nCurrent observation: {obs}\n\n{choose}",
                    trajectory(past)
                ),
            ),
        ]
    })
}

/// The policy's prompt: the task, the trajectory so far, the observation and the admissible
/// actions; the reply is one of them (scored as a continuation in `score` mode).
pub fn policy(
    tok: &HfTokenizer,
    keep: usize,
    budget: usize,
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
    admissible: &[String],
) -> Result<Vec<u32>> {
    let options = admissible
        .iter()
        .map(|a| format!("- {a}"))
        .collect::<Vec<_>>()
        .join("\n");
    let choose =
        format!("Admissible actions:\n{options}\n\nReply with exactly one admissible action.");
    policy_chat(tok, (keep, budget), task, past, obs, &choose)
}

/// The policy's prompt in `generate` mode (the reference's AlfWorld prompt): the task, the
/// trajectory so far, the observation and the numbered admissible actions; the reply reasons
/// (when `reasoning`) and ends with `\boxed{index}`.
#[allow(clippy::too_many_arguments)]
pub fn policy_generate(
    tok: &HfTokenizer,
    keep: usize,
    budget: usize,
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
    admissible: &[String],
    reasoning: bool,
) -> Result<Vec<u32>> {
    let options = admissible
        .iter()
        .enumerate()
        .map(|(k, a)| format!("{k}) {a}"))
        .collect::<Vec<_>>()
        .join("\n");
    let ask = if reasoning {
        "You need to think step by step, then put the number of your chosen action in \\boxed{}."
    } else {
        "Answer with only the number of your chosen action in \\boxed{}, e.g. \\boxed{0}."
    };
    let choose = format!("Choose one action by number:\n{options}\n\n{ask}");
    policy_chat(tok, (keep, budget), task, past, obs, &choose)
}

/// The action a `generate`-mode reply chose: the last `\boxed{…}` holding an index of
/// `admissible` (as the reference reads it) or the text of one of them; `None` when there is
/// no such answer (an invalid reply).
pub fn parse_choice(reply: &str, admissible: &[String]) -> Option<usize> {
    let inner = last_boxed(reply)?;
    let inner = inner.trim();
    if let Ok(k) = inner.parse::<usize>() {
        return (k < admissible.len()).then_some(k);
    }
    let norm = |s: &str| s.trim().trim_end_matches('.').to_lowercase();
    admissible.iter().position(|a| norm(a) == norm(inner))
}

/// The text inside the last `\boxed{…}` (braces balanced), if any.
fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed{")?;
    let rest = &text[start + "\\boxed{".len()..];
    let mut depth = 1;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// A `generate`-mode reply choosing action `k` (the warm start's teacher forcing).
pub fn choice_reply(tok: &HfTokenizer, k: usize) -> Result<Vec<u32>> {
    action(tok, &format!("\\boxed{{{k}}}"))
}

/// An action as the policy's reply: its tokens, then the end of the turn.
pub fn action(tok: &HfTokenizer, action: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(action, false)?;
    ids.extend(tok.eos_ids.first());
    Ok(ids)
}

/// The reward model's prompt for one step; `reply_prefix` opens the model's reply (e.g.
/// `\boxed{`: the verdict first).
#[allow(clippy::too_many_arguments)]
pub fn reward(
    tok: &HfTokenizer,
    reply_prefix: &str,
    keep: usize,
    budget: usize,
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
    action: &str,
    next_obs: &str,
) -> Result<Vec<u32>> {
    fit(tok, (keep, budget), past, reply_prefix, |past| {
        vec![
            ChatMessage::new("system", RM_SYSTEM),
            ChatMessage::new(
                "user",
                &format!(
                    "Task: {task}\n\nThe agent's trajectory so far:\n{}\n\nObservation: {obs}\n\
                     Action: {action}\nNext observation: {next_obs}\n\nDid this action make \
                     progress toward the task? Think briefly, then give your verdict as \
                     \\boxed{{1}} (progress) or \\boxed{{-1}} (no progress).",
                    trajectory(past)
                ),
            ),
        ]
    })
}

/// The reward model's answer for a verdict (teacher forcing): `\boxed{1}` or `\boxed{-1}`, then
/// the end of the turn — less `reply_prefix` where the answer starts with it (the prompt ends
/// with the prefix).
pub fn verdict(tok: &HfTokenizer, good: bool, reply_prefix: &str) -> Result<Vec<u32>> {
    let answer = if good { "\\boxed{1}" } else { "\\boxed{-1}" };
    action(tok, answer.strip_prefix(reply_prefix).unwrap_or(answer))
}

/// The verdict in a reward model's reply, as the reference parses it: the last `\boxed{…}`
/// holding exactly one of 1 / +1 / −1 (fractions and other numbers do not count); rla-pipe's
/// own `<good>` / `<bad>` also count. 0 when there is none.
pub fn parse_verdict(text: &str) -> i8 {
    if text.contains("\\boxed{") {
        let Some(inner) = last_boxed(text) else {
            return 0;
        };
        let inner = inner.trim().replace(['−', '–'], "-");
        match inner.as_str() {
            "1" | "+1" => return 1,
            "-1" => return -1,
            _ => {}
        }
        if inner.contains('/') {
            return 0;
        }
        let nums: Vec<i64> = inner
            .split(|c: char| !(c.is_ascii_digit() || c == '-' || c == '+'))
            .filter_map(|s| s.parse().ok())
            .collect();
        let signals: Vec<i64> = nums.into_iter().filter(|n| *n == 1 || *n == -1).collect();
        return if signals.len() == 1 {
            signals[0] as i8
        } else {
            0
        };
    }
    match (text.rfind("<good>"), text.rfind("<bad>")) {
        (Some(g), Some(b)) => {
            if g > b {
                1
            } else {
                -1
            }
        }
        (Some(_), None) => 1,
        (None, Some(_)) => -1,
        (None, None) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_by_index_or_text() {
        let adm: Vec<String> = ["go north", "take apple"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(parse_choice("I should move. \\boxed{0}", &adm), Some(0));
        assert_eq!(parse_choice("\\boxed{ 1 }", &adm), Some(1));
        assert_eq!(parse_choice("\\boxed{2}", &adm), None);
        assert_eq!(parse_choice("\\boxed{Take apple.}", &adm), Some(1));
        assert_eq!(parse_choice("\\boxed{1} no wait \\boxed{0}", &adm), Some(0));
        assert_eq!(parse_choice("take apple", &adm), None);
        assert_eq!(parse_choice("\\boxed{1", &adm), None);
    }

    #[test]
    fn verdicts_parse_as_the_reference_parses_them() {
        assert_eq!(parse_verdict("It opened the fridge. \\boxed{1}"), 1);
        assert_eq!(parse_verdict("\\boxed{+1}"), 1);
        assert_eq!(parse_verdict("no use \\boxed{ −1 }"), -1);
        assert_eq!(parse_verdict("\\boxed{1} then \\boxed{-1}"), -1);
        assert_eq!(parse_verdict("\\boxed{1/8}"), 0);
        assert_eq!(parse_verdict("\\boxed{score: -1}"), -1);
        assert_eq!(parse_verdict("\\boxed{1 or -1}"), 0);
        assert_eq!(parse_verdict("\\boxed{2}"), 0);
        assert_eq!(parse_verdict("\\boxed{1"), 0);
        assert_eq!(parse_verdict("fine <good>"), 1);
        assert_eq!(parse_verdict("<good> no, <bad>"), -1);
        assert_eq!(parse_verdict("I am not sure."), 0);
    }
}
