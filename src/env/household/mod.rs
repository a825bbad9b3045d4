//! `household`: AlfWorld-like text tasks in procedurally generated homes.
//!
//! A home is a list of receptacles (`countertop 1`, `fridge 1`, ...): `cabinet`, `drawer`,
//! `fridge`, `microwave` and `safe` can be opened and start closed; the others are open surfaces.
//! Objects (`apple 1`, `mug 2`, ...) lie in or on receptacles; a home may hold one `desklamp 1`
//! on a desk, dresser or sidetable. The agent starts in the middle of the room, moves with
//! `go to R` (one step to anywhere), and holds at most one object.
//!
//! Commands (AlfWorld's): `go to R`, `open R`, `close R`, `take O from R`, `put O in/on R`,
//! `clean O with sinkbasin N`, `heat O with microwave N`, `cool O with fridge N`,
//! `use desklamp 1`, `examine R`, `examine O`, `look`, `inventory`. Each observation lists the
//! admissible commands (sorted); anything else is an error. An admissible command that changes
//! nothing useful (cleaning a clean object, switching on a lit lamp) answers `Nothing happens.`
//!
//! Goals: `pick_and_place` ("put a apple in diningtable"), `pick_clean_then_place`,
//! `pick_heat_then_place`, `pick_cool_then_place` (the object must be cleaned at a sinkbasin,
//! heated with a microwave or cooled with a fridge before it is put in a receptacle of the target
//! kind), `pick_two_and_place` (two objects of the kind in receptacles of the target kind) and
//! `look_at_obj_in_light` (hold the object at the desklamp's receptacle with the lamp on).
//!
//! Oracle: +1 when a step made the planner's shortest remaining plan strictly shorter. The
//! planner ([`Task::plan_length`]) is exact (checked against breadth-first search in the tests)
//! and analytic: moves cost one step whatever the distance, so the shortest plan is a small
//! minimum over which object to fetch, which appliance and which target instance to use, and
//! which closed receptacles must be opened on the way.
//!
//! Task spec (JSON):
//! `{"receptacles": ["countertop 1", "fridge 1", ...], "objects": [{"name": "apple 1", "at":
//! "fridge 1"}, ...], "desklamp": "desk 1", "goal": {"type": "pick_cool_then_place", "object":
//! "apple", "target": "diningtable"}, "budget": 12}` — `desklamp` is optional, `target` is absent
//! for `look_at_obj_in_light`. Names are `kind N` with N in 1..=20.
//!
//! The files: `world` (receptacle and object kinds, names, goal types, the spec), `config`
//! (`[env.household]`), `task` (the state, the actions, parsing a spec), `planner`, `render`
//! (commands, observations and feedback as text), `generate` (sampling a task) and `mutate`
//! (harder / easier rewrites). This file holds the environment and its episodes.

mod config;
mod generate;
mod mutate;
mod planner;
mod render;
mod task;
mod world;

use serde_json::Value;

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use crate::determinism::{Rng, derive_seed};
use crate::error::Result;

pub use config::HouseholdConfig;
pub use task::{State, Task};
pub use world::{Goal, GoalType, MAX_NUMBER, MAX_OBJECTS, MAX_RECEPTACLES, Placed, Spec};

use task::Action;
use world::INF;
use world::err;

/// The household environment with its difficulty distribution.
pub struct Household {
    cfg: HouseholdConfig,
    /// The rollout's step cap (`env.max_steps`): an episode ends after `min(budget, cap)` steps,
    /// so mutations judge a budget by what the cap leaves of it.
    step_cap: u32,
}

impl Household {
    pub fn new(cfg: HouseholdConfig) -> Household {
        Household {
            cfg,
            step_cap: u32::MAX,
        }
    }

    /// The environment under a rollout step cap (`env.max_steps`): a mutation that only moves
    /// the budget where the cap hides it (a budget of 13 → 17 under a cap of 12) is the same
    /// task to the policy, and is not offered as a candidate.
    pub fn with_step_cap(mut self, cap: u32) -> Household {
        self.step_cap = cap;
        self
    }

    /// Start an episode (the concrete type; `reset` boxes it).
    pub fn start(&self, spec: &Value) -> Result<HouseholdEpisode> {
        Ok(HouseholdEpisode::new(Task::parse(spec)?))
    }
}

impl Environment for Household {
    fn name(&self) -> &'static str {
        "household"
    }

    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        let goals = self.cfg.validate()?;
        (0..count)
            .map(|i| {
                let mut rng = Rng::new(derive_seed(seed, &["household", &i.to_string()]));
                Ok(self.sample(&mut rng, &goals)?.to_value())
            })
            .collect()
    }

    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.start(spec)?))
    }

    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        self.mutants(spec, direction, critic, seed)
    }

    fn vocabulary(&self) -> Vec<String> {
        render::vocabulary()
    }
}

/// A running household episode.
pub struct HouseholdEpisode {
    task: Task,
    state: State,
    steps: u32,
    /// The planner's remaining plan length in `state`.
    plan: u32,
    done: bool,
    /// The actions of `obs.admissible`, index for index.
    actions: Vec<Action>,
    obs: Observation,
}

impl HouseholdEpisode {
    fn new(task: Task) -> HouseholdEpisode {
        let state = task.initial_state();
        let plan = task.plan_length(&state).unwrap_or(INF);
        let text = format!("{}\n\nYour task is to: {}.", task.room_text, task.goal_text);
        let mut ep = HouseholdEpisode {
            task,
            state,
            steps: 0,
            plan,
            done: false,
            actions: Vec::new(),
            obs: Observation {
                text,
                admissible: Vec::new(),
            },
        };
        ep.refresh();
        ep
    }

    fn refresh(&mut self) {
        self.actions.clear();
        self.obs.admissible.clear();
        for (c, a) in self.task.admissible(&self.state) {
            self.obs.admissible.push(c);
            self.actions.push(a);
        }
    }

    pub fn task(&self) -> &Task {
        &self.task
    }

    pub fn state(&self) -> &State {
        &self.state
    }
}

impl Episode for HouseholdEpisode {
    fn observation(&self) -> &Observation {
        &self.obs
    }

    fn max_steps(&self) -> u32 {
        self.task.spec.budget
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done {
            return None;
        }
        self.task.next_command(&self.state)
    }

    fn step(&mut self, action: &str) -> Result<Step> {
        if self.done {
            return Err(err("step after the episode ended"));
        }
        let i = self
            .obs
            .admissible
            .iter()
            .position(|c| c == action)
            .ok_or_else(|| {
                err(format!(
                    "inadmissible action {action:?}; admissible now: {}",
                    self.obs.admissible.join(", ")
                ))
            })?;
        let a = self.actions[i];
        let changed = self.task.apply(&mut self.state, a);
        let mut text = String::with_capacity(96);
        self.task.feedback(&self.state, a, changed, &mut text);
        self.steps += 1;
        let won = self.task.won(&self.state);
        let after = self.task.plan_length(&self.state).unwrap_or(INF);
        let progress = after < self.plan;
        self.plan = after;
        self.done = won || self.steps >= self.task.spec.budget;
        self.obs.text = text;
        self.refresh();
        Ok(Step {
            done: self.done,
            won,
            oracle_progress: Some(if progress { 1 } else { -1 }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn env() -> Household {
        Household::new(HouseholdConfig::default())
    }

    pub(super) fn plan_of(v: &Value) -> u32 {
        let t = Task::parse(v).unwrap();
        t.plan_length(&t.init).unwrap()
    }

    /// `oracle_action` is the planner: following it wins every task within its budget, each
    /// step making progress; the easier level's plans are no longer on average.
    #[test]
    fn oracle_action_wins_and_easier_is_easier() {
        let e = env();
        let plans = |h: &Household| {
            let specs = h.generate(11, 40).unwrap();
            specs.iter().map(plan_of).sum::<u32>() as f64 / specs.len() as f64
        };
        for spec in e.generate(11, 40).unwrap() {
            let mut ep = e.reset(&spec).unwrap();
            loop {
                let a = ep.oracle_action().expect("a plan until won");
                let st = ep.step(&a).unwrap();
                assert_eq!(st.oracle_progress, Some(1), "{a}");
                if st.done {
                    assert!(st.won);
                    break;
                }
            }
            assert!(ep.oracle_action().is_none());
        }
        let easy = Household::new(e.cfg.easier());
        assert!(
            plans(&easy) <= plans(&e),
            "{} vs {}",
            plans(&easy),
            plans(&e)
        );
    }

    fn uniform_success(e: &Household, tasks: u32, rollouts: u32, seed: u64) -> (f64, f64) {
        let (mut wins, mut total, mut plans) = (0u32, 0u32, 0u32);
        let specs = e.generate(seed, tasks).unwrap();
        for (i, v) in specs.iter().enumerate() {
            plans += plan_of(v);
            for r in 0..rollouts {
                let mut rng = Rng::new(derive_seed(seed, &[&i.to_string(), &r.to_string()]));
                let mut ep = e.reset(v).unwrap();
                loop {
                    let adm = &ep.observation().admissible;
                    let a = adm[(rng.next_u64() % adm.len() as u64) as usize].clone();
                    let st = ep.step(&a).unwrap();
                    if st.done {
                        wins += u32::from(st.won);
                        break;
                    }
                }
                total += 1;
            }
        }
        (
            f64::from(wins) / f64::from(total),
            f64::from(plans) / specs.len() as f64,
        )
    }

    pub(super) fn levels() -> Vec<(&'static str, HouseholdConfig)> {
        let two = vec!["pick_and_place".to_string(), "look_at_obj_in_light".into()];
        vec![
            (
                "easy",
                HouseholdConfig {
                    receptacles: 2,
                    distractors: 0,
                    closed_fraction: 0.0,
                    goal_types: two.clone(),
                    hidden_prob: 0.0,
                    budget_factor: 8.0,
                },
            ),
            (
                "medium",
                HouseholdConfig {
                    receptacles: 3,
                    distractors: 1,
                    closed_fraction: 0.0,
                    goal_types: two,
                    hidden_prob: 0.0,
                    budget_factor: 6.0,
                },
            ),
            (
                "hard",
                HouseholdConfig {
                    receptacles: 4,
                    distractors: 2,
                    closed_fraction: 0.25,
                    hidden_prob: 0.25,
                    budget_factor: 3.0,
                    ..HouseholdConfig::default()
                },
            ),
            ("default", HouseholdConfig::default()),
        ]
    }

    #[test]
    fn uniform_success_spans_difficulty_levels() {
        println!(
            "| level | receptacles | distractors | closed_fraction | goal types | hidden_prob | \
             budget_factor | mean plan | uniform success |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut rates = Vec::new();
        for (name, cfg) in levels() {
            let e = Household::new(cfg.clone());
            let (rate, plan) = uniform_success(&e, 100, 20, 42);
            let goals = if cfg.goal_types.len() == GoalType::ALL.len() {
                "all 6".to_string()
            } else {
                cfg.goal_types.join(", ")
            };
            println!(
                "| {name} | {} | {} | {} | {goals} | {} | {} | {plan:.1} | {rate:.3} |",
                cfg.receptacles,
                cfg.distractors,
                cfg.closed_fraction,
                cfg.hidden_prob,
                cfg.budget_factor
            );
            rates.push(rate);
        }
        assert!(rates[0] > 0.3, "{rates:?}");
        assert!(
            rates[0] > rates[1] + 0.1 && rates[1] > rates[2] + 0.05,
            "{rates:?}"
        );
        assert!(rates[2] < 0.05 && rates[3] < 0.05, "{rates:?}");
    }
}
