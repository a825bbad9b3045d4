//! `[env.household]`: the difficulty distribution of generated tasks, one level harder or
//! easier, and its checks.

use serde::{Deserialize, Serialize};

use super::world::err;
use super::world::{GoalType, MAX_OBJECTS, MAX_RECEPTACLES, default_goal_types};
use crate::error::Result;

/// The difficulty distribution of generated household tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HouseholdConfig {
    /// Receptacles per home (raised to what the goal needs: appliance, lamp, target, source).
    pub receptacles: u32,
    /// Objects besides the goal objects.
    pub distractors: u32,
    /// Fraction of the receptacles that are closed containers (cabinet, drawer, fridge, ...).
    pub closed_fraction: f64,
    /// Goal types drawn uniformly (names as in [`GoalType::name`]).
    pub goal_types: Vec<String>,
    /// Probability that a goal object starts inside a closed container.
    pub hidden_prob: f64,
    /// Step budget = max(plan, ceil(budget_factor × optimal plan length)).
    pub budget_factor: f64,
}

impl Default for HouseholdConfig {
    fn default() -> Self {
        HouseholdConfig {
            receptacles: 8,
            distractors: 4,
            closed_fraction: 0.4,
            goal_types: default_goal_types(),
            hidden_prob: 0.5,
            budget_factor: 2.0,
        }
    }
}

impl HouseholdConfig {
    /// One difficulty level harder (the out-of-distribution evaluation set): one more
    /// receptacle and distractor, a quarter more closed containers and hidden goal objects, a
    /// budget factor × 0.75 (at least 1). The goal types stay.
    pub fn harder(&self) -> HouseholdConfig {
        self.shifted(1)
    }

    /// One difficulty level easier (where `pretrain` draws its demonstrations): one receptacle
    /// (at least 2) and distractor fewer (the goal still fits), a quarter fewer closed
    /// containers and hidden goal objects, a budget factor × 1.25. The goal types stay.
    pub fn easier(&self) -> HouseholdConfig {
        self.shifted(-1)
    }

    fn shifted(&self, level: i32) -> HouseholdConfig {
        if level < 0 {
            return HouseholdConfig {
                receptacles: self.receptacles.saturating_sub(1).max(2),
                distractors: self.distractors.saturating_sub(1),
                closed_fraction: (self.closed_fraction - 0.25).max(0.0),
                goal_types: self.goal_types.clone(),
                hidden_prob: (self.hidden_prob - 0.25).max(0.0),
                budget_factor: self.budget_factor * 1.25,
            };
        }
        HouseholdConfig {
            receptacles: self.receptacles + 1,
            distractors: self.distractors + 1,
            closed_fraction: (self.closed_fraction + 0.25).min(1.0),
            goal_types: self.goal_types.clone(),
            hidden_prob: (self.hidden_prob + 0.25).min(1.0),
            budget_factor: (self.budget_factor * 0.75).max(1.0),
        }
    }

    pub fn validate(&self) -> Result<Vec<GoalType>> {
        if self.goal_types.is_empty() {
            return Err(err("config `goal_types` is empty"));
        }
        let goals = self
            .goal_types
            .iter()
            .map(|g| {
                GoalType::from_name(g).ok_or_else(|| {
                    err(format!(
                        "config `goal_types`: unknown goal type {g:?} (known: {})",
                        default_goal_types().join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if self.receptacles < 2 || self.receptacles as usize > MAX_RECEPTACLES {
            return Err(err(format!(
                "config `receptacles` must be 2..={MAX_RECEPTACLES}, not {}",
                self.receptacles
            )));
        }
        if self.distractors as usize > MAX_OBJECTS - 2 {
            return Err(err(format!(
                "config `distractors` must be at most {}, not {}",
                MAX_OBJECTS - 2,
                self.distractors
            )));
        }
        for (key, p) in [
            ("closed_fraction", self.closed_fraction),
            ("hidden_prob", self.hidden_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(err(format!("config `{key}` must be in [0, 1], not {p}")));
            }
        }
        if !(self.budget_factor.is_finite() && self.budget_factor > 0.0) {
            return Err(err(format!(
                "config `budget_factor` must be a positive number, not {}",
                self.budget_factor
            )));
        }
        Ok(goals)
    }
}
