//! The settings of the `synthetic` environment: not an [`Environment`](super::Environment) with
//! episodes but a seeded generator of rollouts and reward-model verdicts with known statistics,
//! run by the source stage `stages::synthetic` (a load generator for the relational stages).

use serde::{Deserialize, Serialize};

use crate::error::Checks;

/// `[env.synthetic]`: a seeded generator of trajectories, oracle labels and RM verdicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Shortest episode (steps).
    pub min_steps: u32,
    /// Probability that an RM verdict agrees with the step oracle.
    pub rm_accuracy: f64,
    /// Probability that an RM sample has no parsable verdict (score 0).
    pub unparsable_rate: f64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            min_steps: 1,
            rm_accuracy: 0.75,
            unparsable_rate: 0.02,
        }
    }
}

impl SyntheticConfig {
    /// The section's own checks; `max_steps` is `env.max_steps`.
    pub fn validate(&self, max_steps: u32, c: &mut Checks) {
        c.check(
            self.min_steps >= 1 && self.min_steps <= max_steps,
            "env.synthetic.min_steps",
            "must be between 1 and env.max_steps",
        );
        c.check(
            (0.0..=1.0).contains(&self.rm_accuracy),
            "env.synthetic.rm_accuracy",
            "must be in [0, 1]",
        );
        c.check(
            (0.0..=1.0).contains(&self.unparsable_rate),
            "env.synthetic.unparsable_rate",
            "must be in [0, 1]",
        );
    }
}
