//! Task generation: one random solvable task from the configured distribution.

use super::world::{
    Goal, GoalType, LAMP_HOLDERS, MAX_NUMBER, MAX_RECEPTACLES, OBJECTS, RECEPTACLES, Spec, kind_of,
    rec_kind,
};
use super::world::{err, pick};
use super::{Household, Task};
use crate::determinism::Rng;
use crate::error::Result;

/// Step budget for a plan length.
pub(super) fn budget(plan: u32, factor: f64) -> u32 {
    ((plan as f64 * factor).ceil() as u32).max(plan).max(1)
}

impl Household {
    /// One random solvable task from the configured distribution.
    pub(super) fn sample(&self, rng: &mut Rng, goals: &[GoalType]) -> Result<Spec> {
        let c = &self.cfg;
        for _ in 0..200 {
            let goal = *pick(rng, goals).expect("validated non-empty");
            let okinds: Vec<&str> = OBJECTS
                .iter()
                .filter(|k| goal.allows(k))
                .map(|k| k.name)
                .collect();
            let tkind = *pick(rng, &okinds).expect("every goal has objects");
            let mut kinds: Vec<&'static str> = Vec::new();
            if let Some(a) = goal.appliance() {
                kinds.push(a);
            }
            if goal == GoalType::LookInLight {
                kinds.push(pick(rng, LAMP_HOLDERS).expect("holders"));
            }
            let target = if goal == GoalType::LookInLight {
                None
            } else {
                let ts: Vec<&'static str> = RECEPTACLES
                    .iter()
                    .map(|r| r.name)
                    .filter(|k| Some(*k) != goal.appliance())
                    .collect();
                let t = *pick(rng, &ts).expect("targets");
                kinds.push(t);
                Some(t)
            };
            let n = (c.receptacles as usize)
                .max(kinds.len() + 1)
                .min(MAX_RECEPTACLES);
            let n_closed = (c.closed_fraction * n as f64).round() as usize;
            while kinds.len() < n {
                let closed_now = kinds
                    .iter()
                    .filter(|k| rec_kind(k).is_some_and(|r| r.openable))
                    .count();
                let want_closed = closed_now < n_closed;
                let pool: Vec<&'static str> = RECEPTACLES
                    .iter()
                    .filter(|r| {
                        r.openable == want_closed
                            && (kinds.iter().filter(|k| **k == r.name).count() as u32) < r.max
                    })
                    .map(|r| r.name)
                    .collect();
                match pick(rng, &pool) {
                    Some(k) => kinds.push(k),
                    None => break,
                }
            }
            kinds.sort_unstable();
            let mut names: Vec<String> = Vec::with_capacity(kinds.len());
            for (i, k) in kinds.iter().enumerate() {
                let num = kinds[..i].iter().filter(|x| *x == k).count() + 1;
                names.push(format!("{k} {num}"));
            }
            let holders: Vec<&String> = names
                .iter()
                .filter(|r| LAMP_HOLDERS.contains(&kind_of(r)))
                .collect();
            let desklamp = pick(rng, &holders).map(|r| (*r).clone());
            let is_target = |r: &str| Some(kind_of(r)) == target;
            let openable = |r: &str| rec_kind(kind_of(r)).is_some_and(|k| k.openable);
            let closed_src: Vec<&String> = names
                .iter()
                .filter(|r| !is_target(r) && openable(r))
                .collect();
            let open_src: Vec<&String> = names
                .iter()
                .filter(|r| !is_target(r) && !openable(r))
                .collect();
            if closed_src.is_empty() && open_src.is_empty() {
                continue;
            }
            let mut spec = Spec {
                receptacles: names.clone(),
                objects: Vec::new(),
                desklamp,
                goal: Goal {
                    kind: goal.name().to_string(),
                    object: tkind.to_string(),
                    target: target.map(str::to_string),
                },
                budget: 0,
            };
            for _ in 0..goal.needs() {
                let hide = rng.unit() < c.hidden_prob;
                let pool = if (hide && !closed_src.is_empty()) || open_src.is_empty() {
                    &closed_src
                } else {
                    &open_src
                };
                let at = (*pick(rng, pool).expect("non-empty")).clone();
                spec.add_object(tkind, at);
            }
            for _ in 0..c.distractors {
                let dk: Vec<&str> = OBJECTS
                    .iter()
                    .map(|k| k.name)
                    .filter(|k| *k != tkind && (spec.count_objects(k) as u32) < MAX_NUMBER)
                    .collect();
                let k = *pick(rng, &dk).expect("object kinds");
                let at = pick(rng, &names).expect("receptacles").clone();
                spec.add_object(k, at);
            }
            spec.canonicalize();
            let Ok(task) = Task::compile(spec.clone()) else {
                continue;
            };
            let plan = task
                .plan_length(&task.init)
                .expect("compile checks solvable");
            spec.budget = budget(plan, c.budget_factor);
            return Ok(spec);
        }
        Err(err(
            "no solvable task after 200 tries; check the config's goal types and sizes",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::env::Environment;
    use crate::env::household::HouseholdConfig;
    use crate::env::household::tests::env;

    #[test]
    fn generation_is_deterministic_solvable_and_covers_goal_types() {
        let e = env();
        let a = e.generate(7, 120).unwrap();
        assert_eq!(a, e.generate(7, 120).unwrap());
        assert_ne!(a, e.generate(8, 120).unwrap());
        let mut seen = HashSet::new();
        for v in &a {
            let t = Task::parse(v).unwrap();
            let plan = t.plan_length(&t.init).unwrap();
            assert!(plan >= 1 && plan <= t.spec.budget, "{v}");
            assert_eq!(t.spec.budget, budget(plan, 2.0), "{v}");
            assert_eq!(t.spec.receptacles.len(), 8, "{v}");
            seen.insert(t.spec.goal.kind.clone());
            // Round trip: the spec is canonical.
            assert_eq!(&t.spec.to_value(), v);
        }
        for g in GoalType::ALL {
            assert!(seen.contains(g.name()), "{} never generated", g.name());
        }
        // Bad configs are errors.
        let bad = Household::new(HouseholdConfig {
            goal_types: vec!["juggle".into()],
            ..HouseholdConfig::default()
        });
        assert!(bad.generate(1, 1).is_err());
        let bad = Household::new(HouseholdConfig {
            receptacles: 1,
            ..HouseholdConfig::default()
        });
        assert!(bad.generate(1, 1).is_err());
    }
}
