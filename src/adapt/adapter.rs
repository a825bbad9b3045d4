//! What every adapter is: the [`Adapter`] trait, the [`Request`] it answers and the
//! [`Proposal`] it makes, and the names of the directions. The adapters
//! ([`super::procedural`], [`super::openai`]) build on it; `adapt`'s `mod.rs` picks one.

use std::collections::BTreeSet;

use async_trait::async_trait;
use serde_json::Value;

use crate::env::{CriticSummary, Direction, Environment};
use crate::error::Result;

/// What an adapter is asked to rewrite.
pub struct Request<'a> {
    pub env: &'a dyn Environment,
    pub task_id: &'a str,
    pub spec: &'a Value,
    pub direction: Direction,
    pub critic: &'a CriticSummary,
    /// Derived from (run seed, iter, adapt, task id).
    pub seed: u64,
    /// Task ids a candidate must not have: the pool's tasks and the candidates judged this
    /// iteration.
    pub exclude: &'a BTreeSet<String>,
    /// The coding setting: the root problem and the policy's pass rates per test, which an
    /// environment model is shown (`None` elsewhere).
    pub evidence: Option<&'a crate::env::coding::curate::Evidence>,
}

/// What an adapter proposes: the candidate's spec and, where it annotated the critic summary
/// (e.g. the failure summaries an LLM wrote first), the summary as the rewrite used it.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub spec: Value,
    pub critic: Option<CriticSummary>,
}

/// Writes candidate tasks.
#[async_trait]
pub trait Adapter: Send + Sync {
    /// `procedural` or `openai` (as in the config).
    fn name(&self) -> &'static str;
    /// How many requests may be in flight at once (an LLM endpoint serves several; the
    /// procedural adapter is CPU work and goes one by one).
    fn concurrency(&self) -> usize {
        1
    }
    /// A candidate spec (valid, solvable, not excluded), or `None` when the adapter found none.
    async fn propose(&self, request: &Request<'_>) -> Result<Option<Proposal>>;
}

/// `harder` / `easier`, as written in `adaptations.direction`.
pub fn direction_name(d: Direction) -> &'static str {
    match d {
        Direction::Harder => "harder",
        Direction::Easier => "easier",
    }
}

/// The inverse of [`direction_name`].
pub fn parse_direction(s: &str) -> Option<Direction> {
    match s {
        "harder" => Some(Direction::Harder),
        "easier" => Some(Direction::Easier),
        _ => None,
    }
}
