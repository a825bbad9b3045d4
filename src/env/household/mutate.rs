//! Mutations: rewrite a task one notch harder or easier (goal type, goal object, target,
//! distractors, hidden objects, closed containers, budget), the critic choosing the operators
//! to try first; each candidate is kept only if it is solvable and moves difficulty the stated
//! way.

use serde_json::Value;

use super::world::pick;
use super::world::{
    CONTAINERS, GoalType, LAMP_HOLDERS, OBJECTS, Spec, kind_of, next_name, obj_kind,
};
use super::{CriticSummary, Direction, Household, Task};
use crate::determinism::{Rng, derive_seed};
use crate::error::Result;

impl Household {
    /// Up to four rewrites of `spec` that move its difficulty in `direction`
    /// (`Environment::mutate`).
    pub(super) fn mutants(
        &self,
        spec: &Value,
        direction: Direction,
        critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        let goals = self.cfg.validate()?;
        let base = Task::parse(spec)?;
        let plan0 = base.plan_length(&base.init).expect("parse checks solvable");
        let slack0 = base.spec.budget - plan0;
        // An episode runs `min(budget, step cap)` steps: the difficulty a budget gives is what
        // the cap leaves of it.
        let cap = self.step_cap;
        let key0 = difficulty_key(&base, plan0, base.spec.budget.min(cap));
        let mut rng = Rng::new(derive_seed(seed, &["household", "mutate"]));
        let preferred = preferred_ops(critic, direction, plan0);
        let mut out: Vec<Spec> = Vec::new();
        for attempt in 0..64 {
            if out.len() >= 4 {
                break;
            }
            // The critic's operators first (a few tries each), then any.
            let op = match preferred.get(attempt / 3) {
                Some(op) => *op,
                None => Mutation::draw(&mut rng),
            };
            let Some((mut s, keep_slack)) =
                self.mutation(&base.spec, direction, op, plan0, &goals, &mut rng)
            else {
                continue;
            };
            s.canonicalize();
            let Ok(t) = Task::compile(s.clone()) else {
                continue;
            };
            let plan = t.plan_length(&t.init).expect("compile checks solvable");
            if keep_slack {
                s.budget = plan + slack0;
            }
            if s.budget.min(cap) < plan || s == base.spec || out.contains(&s) {
                continue;
            }
            let key = difficulty_key(&t, plan, s.budget.min(cap));
            let moved = match direction {
                Direction::Harder => key > key0,
                Direction::Easier => key < key0,
            };
            if moved {
                out.push(s);
            }
        }
        Ok(out.iter().map(Spec::to_value).collect())
    }

    /// One random rewrite of `b` (None if the operator does not apply). The flag says whether
    /// the budget should be reset to keep the old slack over the new plan length.
    fn mutation(
        &self,
        b: &Spec,
        dir: Direction,
        op: Mutation,
        plan0: u32,
        goals: &[GoalType],
        rng: &mut Rng,
    ) -> Option<(Spec, bool)> {
        let mut s = b.clone();
        let goal = GoalType::from_name(&s.goal.kind)?;
        let tkind = s.goal.object.clone();
        let harder = dir == Direction::Harder;
        match op {
            Mutation::GoalType => {
                let choices: Vec<GoalType> = goals
                    .iter()
                    .copied()
                    .filter(|g| {
                        if harder {
                            g.rank() > goal.rank()
                        } else {
                            g.rank() < goal.rank()
                        }
                    })
                    .collect();
                let new = *pick(rng, &choices)?;
                s.goal.kind = new.name().to_string();
                if !obj_kind(&tkind).is_some_and(|k| new.allows(k)) {
                    let ks: Vec<&str> = OBJECTS
                        .iter()
                        .filter(|k| new.allows(k))
                        .map(|k| k.name)
                        .collect();
                    let nk = *pick(rng, &ks)?;
                    for i in 0..s.objects.len() {
                        if kind_of(&s.objects[i].name) == tkind {
                            s.objects[i].name = next_name(nk, s.objects.iter().map(|o| &o.name))?;
                        }
                    }
                    s.goal.object = nk.to_string();
                }
                if let Some(a) = new.appliance()
                    && !s.receptacles.iter().any(|r| kind_of(r) == a)
                {
                    s.add_receptacle(a)?;
                }
                if new == GoalType::LookInLight {
                    s.goal.target = None;
                    if s.desklamp.is_none() {
                        let holders: Vec<String> = s
                            .receptacles
                            .iter()
                            .filter(|r| LAMP_HOLDERS.contains(&kind_of(r)))
                            .cloned()
                            .collect();
                        s.desklamp = Some(match pick(rng, &holders) {
                            Some(h) => h.clone(),
                            None => s.add_receptacle("desk")?,
                        });
                    }
                } else if s.goal.target.is_none() || s.goal.target.as_deref() == new.appliance() {
                    let kinds: Vec<String> = s
                        .rec_kinds()
                        .into_iter()
                        .filter(|k| Some(k.as_str()) != new.appliance())
                        .collect();
                    s.goal.target = Some(pick(rng, &kinds)?.clone());
                }
                let object = s.goal.object.clone();
                while s.count_objects(&object) < new.needs() {
                    let srcs: Vec<String> = s
                        .receptacles
                        .iter()
                        .filter(|r| !s.is_target(r))
                        .cloned()
                        .collect();
                    let at = pick(rng, &srcs)?.clone();
                    s.add_object(&object, at)?;
                }
                Some((s, true))
            }
            Mutation::GoalObject => {
                let mut kinds: Vec<String> = s
                    .objects
                    .iter()
                    .map(|o| kind_of(&o.name).to_string())
                    .filter(|k| {
                        *k != tkind
                            && obj_kind(k).is_some_and(|ok| goal.allows(ok))
                            && s.count_objects(k) >= goal.needs()
                    })
                    .collect();
                kinds.sort();
                kinds.dedup();
                s.goal.object = pick(rng, &kinds)?.clone();
                Some((s, true))
            }
            Mutation::Target => {
                let cur = s.goal.target.clone()?;
                let kinds: Vec<String> = s
                    .rec_kinds()
                    .into_iter()
                    .filter(|k| *k != cur && Some(k.as_str()) != goal.appliance())
                    .collect();
                s.goal.target = Some(pick(rng, &kinds)?.clone());
                Some((s, true))
            }
            Mutation::Distractors => {
                if harder {
                    let ks: Vec<&str> = OBJECTS
                        .iter()
                        .map(|k| k.name)
                        .filter(|k| *k != tkind)
                        .collect();
                    let k = *pick(rng, &ks)?;
                    let at = pick(rng, &s.receptacles)?.clone();
                    s.add_object(k, at)?;
                } else {
                    let ds: Vec<usize> = (0..s.objects.len())
                        .filter(|&i| kind_of(&s.objects[i].name) != tkind)
                        .collect();
                    let i = *pick(rng, &ds)?;
                    s.objects.remove(i);
                }
                Some((s, true))
            }
            Mutation::Hide => {
                let objs: Vec<usize> = (0..s.objects.len())
                    .filter(|&i| {
                        let o = &s.objects[i];
                        kind_of(&o.name) == tkind
                            && !s.is_target(&o.at)
                            && s.is_openable(&o.at) != harder
                    })
                    .collect();
                let i = *pick(rng, &objs)?;
                let dests: Vec<String> = s
                    .receptacles
                    .iter()
                    .filter(|r| !s.is_target(r) && s.is_openable(r) == harder)
                    .cloned()
                    .collect();
                let dest = match pick(rng, &dests) {
                    Some(d) => d.clone(),
                    None if harder => s.add_receptacle(pick(rng, CONTAINERS)?)?,
                    None => return None,
                };
                s.objects[i].at = dest;
                Some((s, true))
            }
            Mutation::Container => {
                if harder {
                    let c = s.add_receptacle(pick(rng, CONTAINERS)?)?;
                    let ds: Vec<usize> = (0..s.objects.len())
                        .filter(|&i| kind_of(&s.objects[i].name) != tkind)
                        .collect();
                    if let Some(&i) = pick(rng, &ds) {
                        s.objects[i].at = c;
                    }
                } else {
                    let removable: Vec<String> = s
                        .receptacles
                        .iter()
                        .filter(|r| {
                            s.is_openable(r)
                                && !s.is_target(r)
                                && Some(kind_of(r)) != goal.appliance()
                        })
                        .cloned()
                        .collect();
                    let gone = pick(rng, &removable)?.clone();
                    s.receptacles.retain(|r| *r != gone);
                    let dests: Vec<String> = s
                        .receptacles
                        .iter()
                        .filter(|r| !s.is_openable(r) && !s.is_target(r))
                        .cloned()
                        .collect();
                    for i in 0..s.objects.len() {
                        if s.objects[i].at == gone {
                            s.objects[i].at = pick(rng, &dests)?.clone();
                        }
                    }
                }
                Some((s, true))
            }
            Mutation::Budget => {
                if harder {
                    let slack = s.budget.checked_sub(plan0)?;
                    if slack == 0 {
                        return None;
                    }
                    s.budget -= (slack / 3).max(1);
                } else {
                    s.budget += 1 + s.budget / 4;
                }
                Some((s, false))
            }
        }
    }
}

/// The mutation operators of [`Household::mutate`]: each rewrites a task one notch harder or
/// easier (the direction decides which way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    /// A harder / easier goal type (within the configured ones).
    GoalType,
    /// Another object kind of the home becomes the goal object.
    GoalObject,
    /// Another receptacle kind of the home becomes the target.
    Target,
    /// One more / one fewer distractor.
    Distractors,
    /// Hide a goal object in a closed container / bring one out onto a surface.
    Hide,
    /// Add a closed container (with a distractor moved into it) / remove one.
    Container,
    /// Tighten / loosen the budget.
    Budget,
}

impl Mutation {
    /// Every operator, in the order a uniform draw indexes (seeded draws depend on it).
    const ALL: [Mutation; 7] = [
        Mutation::GoalType,
        Mutation::GoalObject,
        Mutation::Target,
        Mutation::Distractors,
        Mutation::Hide,
        Mutation::Container,
        Mutation::Budget,
    ];

    /// A uniformly drawn operator.
    fn draw(rng: &mut Rng) -> Mutation {
        Mutation::ALL[(rng.next_u64() % Mutation::ALL.len() as u64) as usize]
    }
}

/// The mutation operators (see `Household::mutation`) to try first, read from the critic
/// summary. Where the reward model sees the policy fail decides the edit: trouble in the first
/// steps (finding the object) → hide or expose the goal object, add or remove a container;
/// trouble late in the episode, or critique of wasted / repeated moves → the budget and the
/// distractors. Without any high-risk step the critic has nothing to say: no preference.
fn preferred_ops(critic: &CriticSummary, direction: Direction, plan: u32) -> Vec<Mutation> {
    if critic.high_risk_steps.is_empty() {
        return Vec::new();
    }
    let early = critic
        .high_risk_steps
        .iter()
        .filter(|s| **s < plan.div_ceil(2))
        .count();
    let late = critic.high_risk_steps.len() - early;
    let wasteful = critic.word_count("wasted")
        + critic.word_count("repeat")
        + critic.word_count("stuck")
        + critic.word_count("detour");
    let searching = critic.word_count("farther") + critic.word_count("blocked");
    let late_trouble = late > early || wasteful > searching;
    match (direction, late_trouble) {
        // Hide the object / a closed container to search; or the goal itself gets harder.
        (Direction::Harder, false) => vec![Mutation::Hide, Mutation::Container, Mutation::GoalType],
        // Less slack, more distractors to waste moves on.
        (Direction::Harder, true) => {
            vec![Mutation::Budget, Mutation::Distractors, Mutation::Target]
        }
        // Bring the object out, remove a container to search.
        (Direction::Easier, false) => {
            vec![Mutation::Hide, Mutation::Container, Mutation::GoalObject]
        }
        // More budget, fewer distractors.
        (Direction::Easier, true) => {
            vec![Mutation::Budget, Mutation::Distractors, Mutation::GoalType]
        }
    }
}

/// Difficulty order of mutations: plan length minus slack, then clutter (branching).
fn difficulty_key(t: &Task, plan: u32, budget: u32) -> (i64, usize) {
    let s = &t.spec;
    let clutter = s.objects.len() + s.receptacles.len() + t.openable.count_ones() as usize;
    (2 * i64::from(plan) - i64::from(budget), clutter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Environment;
    use crate::env::household::HouseholdConfig;
    use crate::env::household::tests::{env, levels, plan_of};

    /// Late high-risk steps and critique of wasted moves: "easier" first loosens the budget.
    #[test]
    fn critic_picks_the_operator() {
        let e = env();
        let late = CriticSummary {
            high_risk_steps: vec![6, 7, 8],
            critique_words: vec![("wasted".into(), 9), ("goal".into(), 2)],
            ..Default::default()
        };
        assert_eq!(
            preferred_ops(&late, Direction::Easier, 4),
            vec![Mutation::Budget, Mutation::Distractors, Mutation::GoalType]
        );
        let early = CriticSummary {
            high_risk_steps: vec![0, 1],
            ..Default::default()
        };
        assert_eq!(
            preferred_ops(&early, Direction::Harder, 6),
            vec![Mutation::Hide, Mutation::Container, Mutation::GoalType]
        );
        assert!(preferred_ops(&CriticSummary::default(), Direction::Harder, 6).is_empty());
        let v = &e.generate(3, 1).unwrap()[0];
        let first = &e.mutate(v, Direction::Easier, &late, 1).unwrap()[0];
        let (a, b) = (
            Task::parse(v).unwrap().spec,
            Task::parse(first).unwrap().spec,
        );
        assert!(b.budget > a.budget, "{v} → {first}");
        assert_eq!(
            Spec {
                budget: a.budget,
                ..b
            },
            a,
            "only the budget changed"
        );
    }

    #[test]
    fn mutations_are_solvable_and_move_difficulty() {
        let e = env();
        let (mut harder, mut easier, mut n) = (0i64, 0i64, [0usize; 2]);
        for (i, v) in e.generate(11, 40).unwrap().iter().enumerate() {
            let t = Task::parse(v).unwrap();
            let p0 = t.plan_length(&t.init).unwrap() as i64;
            let slack0 = t.spec.budget as i64 - p0;
            for (k, dir) in [Direction::Harder, Direction::Easier]
                .into_iter()
                .enumerate()
            {
                let out = e
                    .mutate(v, dir, &CriticSummary::default(), i as u64)
                    .unwrap();
                assert_eq!(
                    out,
                    e.mutate(v, dir, &CriticSummary::default(), i as u64)
                        .unwrap()
                );
                assert!(out.len() <= 4);
                for c in &out {
                    let ct = Task::parse(c).expect("mutation is valid and solvable");
                    assert_ne!(c, v);
                    let p = ct.plan_length(&ct.init).unwrap() as i64;
                    let score = (p - p0) - ((ct.spec.budget as i64 - p) - slack0);
                    if dir == Direction::Harder {
                        assert!(score >= 0, "{v} → {c}");
                        harder += score;
                    } else {
                        assert!(score <= 0, "{v} → {c}");
                        easier += score;
                    }
                    n[k] += 1;
                }
            }
        }
        println!(
            "mutations: {} harder (Σscore {harder}), {} easier (Σscore {easier})",
            n[0], n[1]
        );
        assert!(n[0] >= 80 && n[1] >= 80, "{n:?}");
        assert!(harder > 0 && easier < 0);
    }

    /// Under a step cap (`env.max_steps`) a budget the cap hides is no easier: the household
    /// SmolLM2 grid's pool (two receptacles, no distractor, `pick_and_place` only, budget factor
    /// 2.5, cap 12) had nothing else to make easier, and 15 of its 36 candidates were a budget
    /// of 13 or more raised further — the same task under the cap, judged on luck. With the cap
    /// every candidate moves what an episode sees, and none needs more steps than the cap
    /// allows; without it (`u32::MAX`) the budget operator is offered as before.
    #[test]
    fn a_budget_the_step_cap_hides_is_not_a_candidate() {
        let cfg = HouseholdConfig {
            receptacles: 2,
            distractors: 0,
            closed_fraction: 0.0,
            goal_types: vec!["pick_and_place".into()],
            hidden_prob: 0.0,
            budget_factor: 2.5,
        };
        let cap = 12;
        let capped = Household::new(cfg.clone()).with_step_cap(cap);
        let free = Household::new(cfg);
        let late = CriticSummary {
            high_risk_steps: vec![9, 10, 11],
            critique_words: vec![("wasted".into(), 9)],
            ..Default::default()
        };
        let (mut hidden_offered, mut tasks_at_cap, mut easier_under_cap) = (0, 0, 0);
        for (i, v) in free.generate(3, 60).unwrap().iter().enumerate() {
            let t = Task::parse(v).unwrap();
            let at_cap = t.spec.budget >= cap;
            tasks_at_cap += usize::from(at_cap);
            for dir in [Direction::Easier, Direction::Harder] {
                let seen = |c: &Value| {
                    let s = Task::parse(c).unwrap().spec;
                    Spec {
                        budget: s.budget.min(cap),
                        ..s
                    }
                };
                let base = seen(v);
                for c in free.mutate(v, dir, &late, i as u64).unwrap() {
                    hidden_offered += usize::from(seen(&c) == base);
                }
                for c in capped.mutate(v, dir, &late, i as u64).unwrap() {
                    assert_ne!(seen(&c), base, "{v} → {c}: the same task under the cap");
                    assert!(plan_of(&c) <= cap, "{v} → {c}: unwinnable under the cap");
                    easier_under_cap += usize::from(at_cap && dir == Direction::Easier);
                }
            }
        }
        println!(
            "{tasks_at_cap} of 60 tasks at the cap; without it {hidden_offered} candidates \
             the cap hides; {easier_under_cap} easier candidates of tasks at the cap"
        );
        assert!(
            tasks_at_cap >= 10,
            "the draw reaches the cap: {tasks_at_cap}"
        );
        assert!(
            hidden_offered >= 10,
            "without the cap they are offered: {hidden_offered}"
        );
        assert_eq!(
            easier_under_cap, 0,
            "nothing left to make easier at the cap"
        );
    }

    /// Harder mutations lower the uniform policy's success, easier ones raise it (on average).
    #[test]
    fn mutations_move_uniform_success() {
        let e = Household::new(levels()[1].1.clone());
        let rate = |v: &Value, seed: u64| {
            let mut wins = 0;
            for r in 0..30u64 {
                let mut rng = Rng::new(derive_seed(seed, &[&r.to_string()]));
                let mut ep = e.reset(v).unwrap();
                loop {
                    let adm = ep.observation().admissible.clone();
                    let st = ep.step(pick(&mut rng, &adm).unwrap()).unwrap();
                    if st.done {
                        wins += u32::from(st.won);
                        break;
                    }
                }
            }
            f64::from(wins) / 30.0
        };
        let (mut base, mut harder, mut easier) = ((0.0, 0), (0.0, 0), (0.0, 0));
        for (i, v) in e.generate(5, 40).unwrap().iter().enumerate() {
            let b = rate(v, i as u64);
            for (dir, acc) in [
                (Direction::Harder, &mut harder),
                (Direction::Easier, &mut easier),
            ] {
                for c in e
                    .mutate(v, dir, &CriticSummary::default(), i as u64)
                    .unwrap()
                {
                    acc.0 += rate(&c, i as u64) - b;
                    acc.1 += 1;
                }
            }
            base.0 += b;
            base.1 += 1;
        }
        let mean = |a: (f64, i32)| a.0 / f64::from(a.1.max(1));
        println!(
            "uniform success: base {:.3}, harder Δ {:+.3} ({}), easier Δ {:+.3} ({})",
            mean(base),
            mean(harder),
            harder.1,
            mean(easier),
            easier.1
        );
        assert!(mean(harder) < -0.02 && mean(easier) > 0.02);
    }
}
