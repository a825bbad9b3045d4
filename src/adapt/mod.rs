//! Task adapters: who writes a candidate q′ from a task q, a direction and the reward model's
//! critic summary of q's rollouts — and the rule that judges the candidate one iteration later.
//!
//! - [`procedural`]: the environment's own mutation operators, picked with the critic summary
//!   (no language model; deterministic).
//! - [`openai`]: any OpenAI-compatible chat-completions endpoint; the first reply the
//!   environment validates (parseable and solvable) is kept.
//!
//! An adapter never sees the environment's oracle: only the task, its accuracy and the RM's
//! outputs (the [`CriticSummary`](crate::env::CriticSummary)).

pub mod adapter;
pub mod config;
pub mod openai;
pub mod procedural;

use crate::env::Direction;
use crate::error::Result;
pub use adapter::{Adapter, Proposal, Request, direction_name, parse_direction};
pub use config::{
    AdaptConfig, AdapterKind, Bounds, CriticFrom, Decision, OpenAiConfig, RewriteFrom,
};

/// The adapter a config names.
pub fn from_config(cfg: &AdaptConfig) -> Result<Box<dyn Adapter>> {
    Ok(match cfg.adapter {
        AdapterKind::Procedural => Box::new(procedural::Procedural),
        AdapterKind::Openai => Box::new(openai::OpenAi::new(cfg.openai.clone())?),
    })
}

/// Whether a task with accuracy `acc` should be rewritten, and in which direction:
/// acc ≥ α_high → harder, acc ≤ α_low → easier (both inclusive, as in the reference).
pub fn direction_for(acc: f64, cfg: &AdaptConfig) -> Option<Direction> {
    if acc >= cfg.alpha_high {
        Some(Direction::Harder)
    } else if acc <= cfg.alpha_low {
        Some(Direction::Easier)
    } else {
        None
    }
}

/// The acceptance rule (DESIGN.md): accept iff acc(q′) > 0 and
/// harder: α_low ≤ acc(q′) < acc(q); easier: acc(q) < acc(q′) ≤ α_high.
/// With `bounds = "strict"` the α bounds are strict as well (α_low < acc(q′), acc(q′) < α_high).
pub fn accept(direction: Direction, prev_acc: f64, candidate_acc: f64, cfg: &AdaptConfig) -> bool {
    let strict = cfg.bounds == Bounds::Strict;
    let above_low = if strict {
        candidate_acc > cfg.alpha_low
    } else {
        candidate_acc >= cfg.alpha_low
    };
    let below_high = if strict {
        candidate_acc < cfg.alpha_high
    } else {
        candidate_acc <= cfg.alpha_high
    };
    candidate_acc > 0.0
        && match direction {
            Direction::Harder => above_low && candidate_acc < prev_acc,
            Direction::Easier => prev_acc < candidate_acc && below_high,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every branch of the rule, in both bound modes (α_low 0.2, α_high 0.8).
    #[test]
    fn acceptance_rule_table() {
        use Direction::{Easier, Harder};
        // (direction, acc(q), acc(q′), inclusive, strict)
        let table: &[(Direction, f64, f64, bool, bool)] = &[
            // harder: must land in [α_low, acc(q)) and above 0
            (Harder, 1.0, 0.5, true, true),       // in the band
            (Harder, 1.0, 0.2, true, false),      // on α_low: inclusive only
            (Harder, 1.0, 0.125, false, false),   // too hard
            (Harder, 1.0, 0.0, false, false),     // unsolved: never
            (Harder, 0.875, 0.875, false, false), // not harder
            (Harder, 0.875, 1.0, false, false),   // easier than q
            (Harder, 0.875, 0.75, true, true),
            (Harder, 0.8, 0.8, false, false), // equal to acc(q) on α_high
            (Harder, 0.25, 0.2, true, false), // α_low < acc(q): on α_low is inclusive only
            // easier: must land in (acc(q), α_high]
            (Easier, 0.0, 0.5, true, true),
            (Easier, 0.0, 0.8, true, false), // on α_high: inclusive only
            (Easier, 0.0, 0.875, false, false), // too easy
            (Easier, 0.0, 0.0, false, false), // still unsolved
            (Easier, 0.125, 0.125, false, false), // not easier
            (Easier, 0.125, 0.0, false, false), // harder than q
            (Easier, 0.2, 0.25, true, true),
            (Easier, 0.2, 1.0, false, false),
        ];
        for &(dir, prev, cand, inclusive, strict) in table {
            for (bounds, want) in [(Bounds::Inclusive, inclusive), (Bounds::Strict, strict)] {
                let cfg = AdaptConfig {
                    bounds,
                    ..Default::default()
                };
                assert_eq!(
                    accept(dir, prev, cand, &cfg),
                    want,
                    "{dir:?} acc(q)={prev} acc(q')={cand} {bounds:?}"
                );
            }
        }
    }

    #[test]
    fn direction_thresholds_are_inclusive() {
        let cfg = AdaptConfig::default();
        assert_eq!(direction_for(0.8, &cfg), Some(Direction::Harder));
        assert_eq!(direction_for(1.0, &cfg), Some(Direction::Harder));
        assert_eq!(direction_for(0.2, &cfg), Some(Direction::Easier));
        assert_eq!(direction_for(0.0, &cfg), Some(Direction::Easier));
        assert_eq!(direction_for(0.5, &cfg), None);
        assert_eq!(direction_for(0.79, &cfg), None);
        for d in [Direction::Harder, Direction::Easier] {
            assert_eq!(parse_direction(direction_name(d)), Some(d));
        }
        assert_eq!(parse_direction("sideways"), None);
    }
}
