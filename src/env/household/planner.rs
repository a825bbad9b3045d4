//! The planner: the exact length of a shortest winning command sequence from any state, in
//! closed form (moves cost one step whatever the distance), and the optimal next command.

use super::task::{HELD, NOTHING, State, Task};
use super::world::{GoalType, INF};

fn mv(from: u8, to: u8) -> u32 {
    u32::from(from != to)
}

impl Task {
    /// 1 if `r` must still be opened, given the receptacles a plan opened on the way.
    fn cl(&self, s: &State, r: u8, opened: &[u8]) -> u32 {
        u32::from(self.closed(s, r) && !opened.contains(&r))
    }

    fn in_target(&self, s: &State, o: u8) -> bool {
        let r = s.at[o as usize];
        r != HELD && self.is_target[r as usize]
    }

    pub fn won(&self, s: &State) -> bool {
        match self.goal {
            GoalType::PickTwo => {
                self.goal_objs
                    .iter()
                    .filter(|&&o| self.in_target(s, o))
                    .count()
                    >= 2
            }
            GoalType::LookInLight => {
                s.lamp_on
                    && s.loc == self.lamp
                    && s.held != NOTHING
                    && self.is_goal_obj[s.held as usize]
            }
            _ => {
                let flag = self.goal.flag();
                self.goal_objs
                    .iter()
                    .any(|&o| self.in_target(s, o) && s.flags[o as usize] & flag == flag)
            }
        }
    }

    /// The length of a shortest command sequence that wins from `s` (None: impossible).
    pub fn plan_length(&self, s: &State) -> Option<u32> {
        if self.won(s) {
            return Some(0);
        }
        let best = match self.goal {
            GoalType::PickTwo => self.plan_two(s),
            GoalType::LookInLight => self.plan_light(s),
            _ => self.plan_place(s),
        };
        (best < INF).then_some(best)
    }

    /// Cheapest `go to t`, `open t`, `put` from `loc` into any target.
    fn put_cost(&self, s: &State, loc: u8, opened: &[u8]) -> u32 {
        self.targets
            .iter()
            .map(|&t| mv(loc, t) + self.cl(s, t, opened) + 1)
            .min()
            .unwrap_or(INF)
    }

    /// `go to r`, `open r`, `take`.
    fn fetch_cost(&self, s: &State, loc: u8, r: u8, opened: &[u8]) -> u32 {
        mv(loc, r) + self.cl(s, r, opened) + 1
    }

    fn held_goal(&self, s: &State) -> bool {
        s.held != NOTHING && self.is_goal_obj[s.held as usize]
    }

    /// Place goals (with or without a flag to apply first).
    fn plan_place(&self, s: &State) -> u32 {
        let flag = self.goal.flag();
        // Holding an object with flags `f` at `loc`, having opened `opened`: finish the task.
        let finish = |loc: u8, f: u8, opened: &[u8]| -> u32 {
            if f & flag == flag {
                self.put_cost(s, loc, opened)
            } else {
                self.appliances
                    .iter()
                    .map(|&a| mv(loc, a) + 1 + self.put_cost(s, a, opened))
                    .min()
                    .unwrap_or(INF)
            }
        };
        let mut best = INF;
        if self.held_goal(s) {
            best = finish(s.loc, s.flags[s.held as usize], &[]);
        }
        // Putting the held object down costs one `put` at the next object's receptacle.
        let dispose = u32::from(s.held != NOTHING);
        for &o in &self.goal_objs {
            if o == s.held {
                continue;
            }
            let r = s.at[o as usize];
            let c =
                dispose + self.fetch_cost(s, s.loc, r, &[]) + finish(r, s.flags[o as usize], &[r]);
            best = best.min(c);
        }
        best
    }

    fn plan_two(&self, s: &State) -> u32 {
        let delivered = self
            .goal_objs
            .iter()
            .filter(|&&o| self.in_target(s, o))
            .count();
        let need = 2usize.saturating_sub(delivered);
        let cands: Vec<u8> = self
            .goal_objs
            .iter()
            .copied()
            .filter(|&o| o != s.held && !self.in_target(s, o))
            .collect();
        let dispose = u32::from(s.held != NOTHING);
        let held_goal = self.held_goal(s);
        let mut best = INF;
        if need == 1 {
            if held_goal {
                best = self.put_cost(s, s.loc, &[]);
            }
            for &o in &cands {
                let r = s.at[o as usize];
                best = best
                    .min(dispose + self.fetch_cost(s, s.loc, r, &[]) + self.put_cost(s, r, &[r]));
            }
            return best;
        }
        if held_goal {
            for &t1 in &self.targets {
                let c1 = mv(s.loc, t1) + self.cl(s, t1, &[]) + 1;
                for &o2 in &cands {
                    let r2 = s.at[o2 as usize];
                    let c2 = self.fetch_cost(s, t1, r2, &[t1]);
                    best = best.min(c1 + c2 + self.put_cost(s, r2, &[t1, r2]));
                }
            }
        }
        for &o1 in &cands {
            let r1 = s.at[o1 as usize];
            let c1 = dispose + self.fetch_cost(s, s.loc, r1, &[]);
            for &t1 in &self.targets {
                let c2 = c1 + mv(r1, t1) + self.cl(s, t1, &[r1]) + 1;
                for &o2 in &cands {
                    if o2 == o1 {
                        continue;
                    }
                    let r2 = s.at[o2 as usize];
                    let c3 = c2 + self.fetch_cost(s, t1, r2, &[r1, t1]);
                    best = best.min(c3 + self.put_cost(s, r2, &[r1, t1, r2]));
                }
            }
        }
        best
    }

    fn plan_light(&self, s: &State) -> u32 {
        let switch = u32::from(!s.lamp_on);
        let mut best = INF;
        if self.held_goal(s) {
            best = mv(s.loc, self.lamp) + switch;
        }
        let dispose = u32::from(s.held != NOTHING);
        for &o in &self.goal_objs {
            if o == s.held {
                continue;
            }
            let r = s.at[o as usize];
            best =
                best.min(dispose + self.fetch_cost(s, s.loc, r, &[]) + mv(r, self.lamp) + switch);
        }
        best
    }

    /// An optimal next command (the first admissible one, in sorted order, that shortens the
    /// plan); None once won.
    pub fn next_command(&self, s: &State) -> Option<String> {
        let here = self.plan_length(s)?;
        if here == 0 {
            return None;
        }
        self.admissible(s).into_iter().find_map(|(c, a)| {
            let mut t = s.clone();
            self.apply(&mut t, a);
            (self.plan_length(&t) == Some(here - 1)).then_some(c)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashSet, VecDeque};

    use super::*;
    use crate::determinism::Rng;
    use crate::env::household::tests::env;
    use crate::env::household::world::pick;
    use crate::env::household::{Household, HouseholdConfig};
    use crate::env::{Environment, Episode};

    /// Exact shortest plan by breadth-first search over the real transitions.
    fn bfs(t: &Task, s0: &State, cap: u32) -> Option<u32> {
        let mut seen = HashSet::from([s0.clone()]);
        let mut q = VecDeque::from([(s0.clone(), 0u32)]);
        let mut acts = Vec::new();
        while let Some((s, d)) = q.pop_front() {
            if t.won(&s) {
                return Some(d);
            }
            if d >= cap {
                continue;
            }
            t.actions(&s, &mut acts);
            for &a in &acts {
                let mut n = s.clone();
                t.apply(&mut n, a);
                if seen.insert(n.clone()) {
                    q.push_back((n, d + 1));
                }
            }
        }
        None
    }

    /// Following the planner always wins with +1 on every step; on random play the oracle says
    /// +1 exactly when the planner's remaining plan got shorter.
    #[test]
    fn planner_wins_and_oracle_agrees_with_it() {
        let e = env();
        for (i, v) in e.generate(3, 150).unwrap().iter().enumerate() {
            let mut ep = e.start(v).unwrap();
            let plan0 = ep.task().plan_length(ep.state()).unwrap();
            let mut n = 0;
            loop {
                let c = ep
                    .task()
                    .next_command(ep.state())
                    .expect("planner has a move");
                let st = ep.step(&c).unwrap();
                n += 1;
                assert_eq!(st.oracle_progress, Some(1), "task {i}: {c}");
                if st.done {
                    assert!(st.won, "task {i}: planner lost");
                    break;
                }
            }
            assert_eq!(n, plan0, "task {i}");
            // Random play.
            let mut rng = Rng::new(i as u64);
            let mut ep = e.start(v).unwrap();
            for _ in 0..ep.max_steps() {
                let before = ep.task().plan_length(ep.state()).unwrap();
                let adm = ep.observation().admissible.clone();
                let a = pick(&mut rng, &adm).unwrap();
                let st = ep.step(a).unwrap();
                let after = ep.task().plan_length(ep.state()).unwrap();
                assert_eq!(
                    st.oracle_progress,
                    Some(if after < before { 1 } else { -1 })
                );
                assert_eq!(st.won, after == 0);
                if st.done {
                    break;
                }
                assert!(!ep.observation().admissible.is_empty());
            }
        }
    }

    /// The analytic planner equals breadth-first search on states met in random play.
    #[test]
    fn planner_is_exact() {
        let small = Household::new(HouseholdConfig {
            receptacles: 4,
            distractors: 2,
            closed_fraction: 0.5,
            hidden_prob: 0.5,
            ..HouseholdConfig::default()
        });
        let mut specs = small.generate(5, 60).unwrap();
        // A cooling task whose target is the fridge itself, and several instances of a kind.
        specs.push(serde_json::json!({
            "receptacles": ["cabinet 1", "countertop 1", "fridge 1", "shelf 1", "shelf 2"],
            "objects": [{"name": "apple 1", "at": "cabinet 1"}, {"name": "apple 2", "at": "fridge 1"}],
            "goal": {"type": "pick_cool_then_place", "object": "apple", "target": "fridge"},
            "budget": 20
        }));
        specs.push(serde_json::json!({
            "receptacles": ["cabinet 1", "cabinet 2", "drawer 1", "shelf 1"],
            "objects": [{"name": "mug 1", "at": "drawer 1"}, {"name": "mug 2", "at": "drawer 1"},
                        {"name": "mug 3", "at": "shelf 1"}, {"name": "pen 1", "at": "drawer 1"}],
            "goal": {"type": "pick_two_and_place", "object": "mug", "target": "cabinet"},
            "budget": 20
        }));
        let mut checked = 0;
        for (i, v) in specs.iter().enumerate() {
            let t = Task::parse(v).unwrap();
            let mut rng = Rng::new(100 + i as u64);
            let mut acts = Vec::new();
            for _ in 0..3 {
                let mut s = t.initial_state();
                for _ in 0..12 {
                    let p = t.plan_length(&s).unwrap();
                    assert_eq!(Some(p), bfs(&t, &s, p + 1), "task {i} state {s:?}");
                    checked += 1;
                    if p == 0 {
                        break;
                    }
                    t.actions(&s, &mut acts);
                    let a = *pick(&mut rng, &acts).unwrap();
                    t.apply(&mut s, a);
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }
}
