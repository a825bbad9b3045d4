//! Prompts. The task is the episode's first observation (for household it holds the goal).
//!
//! - policy: `<bos> task <sep> [obs <act> action <sep>]… obs <act>` — then each admissible action
//!   is scored as a continuation;
//! - reward model: `<bos> task <sep> [obs <act> action <sep>]… obs <act> action <next> next_obs
//!   <critic>` — then it generates critique words and a verdict.
//!
//! When a prompt exceeds its token budget, the oldest history goes first, then the end of the
//! task text, then the start of what is left.

use super::tokenizer::{ACT, BOS, CRITIC, NEXT, SEP, Tokenizer};

/// Fit `head + history + tail` into `budget` tokens.
fn assemble(head: Vec<u32>, mut history: Vec<Vec<u32>>, tail: Vec<u32>, budget: usize) -> Vec<u32> {
    let len = |h: &[Vec<u32>]| h.iter().map(Vec::len).sum::<usize>();
    while !history.is_empty() && head.len() + len(&history) + tail.len() > budget {
        history.remove(0);
    }
    let mut head = head;
    if head.len() + tail.len() > budget {
        // Keep <bos> and as much of the task as fits, ending in <sep>.
        let keep = budget.saturating_sub(tail.len()).max(2).min(head.len());
        let sep = *head.last().expect("head ends with <sep>");
        head.truncate(keep.saturating_sub(1).max(1));
        head.push(sep);
    }
    let mut out = head;
    for h in history {
        out.extend(h);
    }
    out.extend(tail);
    if out.len() > budget {
        out.drain(..out.len() - budget);
    }
    out
}

fn head(tok: &Tokenizer, task: &str) -> Vec<u32> {
    let mut v = vec![tok.special(BOS)];
    v.extend(tok.encode(task));
    v.push(tok.special(SEP));
    v
}

fn history(tok: &Tokenizer, past: &[(&str, &str)], keep: usize) -> Vec<Vec<u32>> {
    past[past.len().saturating_sub(keep)..]
        .iter()
        .map(|(o, a)| {
            let mut v = tok.encode(o);
            v.push(tok.special(ACT));
            v.extend(tok.encode(a));
            v.push(tok.special(SEP));
            v
        })
        .collect()
}

/// The policy's prompt at a step: `past` are the earlier (observation, action) pairs.
pub fn policy(
    tok: &Tokenizer,
    keep: usize,
    budget: usize,
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
) -> Vec<u32> {
    let mut tail = tok.encode(obs);
    tail.push(tok.special(ACT));
    assemble(head(tok, task), history(tok, past, keep), tail, budget)
}

/// The reward model's prompt for judging one step.
#[allow(clippy::too_many_arguments)]
pub fn reward(
    tok: &Tokenizer,
    keep: usize,
    budget: usize,
    task: &str,
    past: &[(&str, &str)],
    obs: &str,
    action: &str,
    next_obs: &str,
) -> Vec<u32> {
    let mut tail = tok.encode(obs);
    tail.push(tok.special(ACT));
    tail.extend(tok.encode(action));
    tail.push(tok.special(NEXT));
    tail.extend(tok.encode(next_obs));
    tail.push(tok.special(CRITIC));
    assemble(head(tok, task), history(tok, past, keep), tail, budget)
}

/// Tokens of an action (never empty).
pub fn action(tok: &Tokenizer, action: &str) -> Vec<u32> {
    let v = tok.encode(action);
    if v.is_empty() {
        vec![tok.special(super::tokenizer::UNK)]
    } else {
        v
    }
}

/// One step, as the models need it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step_idx: u32,
    pub observation: String,
    pub action: String,
    pub next_observation: String,
    pub admissible: Vec<String>,
    /// `generate` mode: the policy's whole reply.
    pub response: Option<String>,
}

/// One trajectory's steps, in step order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    pub task_id: String,
    pub traj_id: String,
    pub steps: Vec<StepRow>,
}

impl Trajectory {
    /// The task text of the prompts: the first observation.
    pub fn task(&self) -> &str {
        self.steps.first().map_or("", |s| s.observation.as_str())
    }

    /// The (observation, action) pairs before step `i`.
    pub fn past(&self, i: usize) -> Vec<(&str, &str)> {
        self.steps[..i]
            .iter()
            .map(|s| (s.observation.as_str(), s.action.as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_fit_the_budget_dropping_old_history_first() {
        let tok = Tokenizer::words(&["a b c d e f g h north south".into()]);
        let past = [("a b", "north"), ("c d", "south"), ("e f", "north")];
        let full = policy(&tok, 5, 100, "g h", &past, "a");
        // <bos> g h <sep> | a b <act> north <sep> | c d … | e f … | a <act>
        assert_eq!(full.len(), 4 + 3 * 5 + 2);
        let cut = policy(&tok, 5, 14, "g h", &past, "a");
        assert_eq!(cut.len(), 4 + 5 + 2, "two oldest pairs dropped");
        assert_eq!(&cut[4..6], &tok.encode("e f")[..]);
        let tiny = policy(&tok, 5, 3, "g h", &past, "a b c d");
        assert_eq!(tiny.len(), 3);
        assert_eq!(*tiny.last().unwrap(), tok.special(ACT));
        let r = reward(&tok, 1, 100, "g", &past, "a", "north", "b");
        assert_eq!(*r.last().unwrap(), tok.special(CRITIC));
    }
}
