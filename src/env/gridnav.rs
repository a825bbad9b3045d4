//! `gridnav`: a grid with walls, a start and a goal.
//!
//! Observation: `at X Y goal north east blocked west` — the position, the goal's direction, and
//! the blocked neighbours: enough for a small model to learn in minutes. Actions: `north`,
//! `south`, `east`, `west` (always admissible; walking into a wall or the border wastes the step).
//! Oracle: +1 when a step reduced the BFS distance to the goal. Difficulty: grid size, wall
//! density, shortest-path length and the step budget.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use crate::determinism::{Rng, derive_seed};
use crate::error::{Checks, Error, Result};

/// `[env.gridnav]`: the difficulty distribution of generated gridnav tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridNavConfig {
    /// Grid side length.
    pub size: u32,
    /// Probability that a cell is a wall.
    pub wall_density: f64,
    /// Shortest start→goal path length, lower bound.
    pub min_distance: u32,
    /// Shortest start→goal path length, upper bound.
    pub max_distance: u32,
    /// Step budget = ceil(budget_factor × shortest path length).
    pub budget_factor: f64,
}

impl Default for GridNavConfig {
    fn default() -> Self {
        GridNavConfig {
            size: 6,
            wall_density: 0.2,
            min_distance: 2,
            max_distance: 4,
            budget_factor: 4.0,
        }
    }
}

impl GridNavConfig {
    /// One difficulty level harder (the out-of-distribution evaluation set): shortest paths two
    /// steps longer (as far as the grid allows: at most 2·(size − 1)), 5 points more walls, a
    /// budget factor × 0.75 (at least 1).
    pub fn harder(&self) -> GridNavConfig {
        let cap = (2 * self.size.saturating_sub(1)).max(self.max_distance);
        let max_distance = (self.max_distance + 2).min(cap);
        GridNavConfig {
            size: self.size,
            wall_density: (self.wall_density + 0.05).min(0.5),
            min_distance: (self.min_distance + 2).min(max_distance),
            max_distance,
            budget_factor: (self.budget_factor * 0.75).max(1.0),
        }
    }

    /// One difficulty level easier (where `pretrain` draws its demonstrations): shortest paths
    /// up to two steps shorter (at least 1), 5 points fewer walls, a budget factor × 1.25.
    pub fn easier(&self) -> GridNavConfig {
        let min_distance = self.min_distance.saturating_sub(2).max(1);
        GridNavConfig {
            size: self.size,
            wall_density: (self.wall_density - 0.05).max(0.0),
            min_distance,
            max_distance: self.max_distance.saturating_sub(2).max(min_distance),
            budget_factor: self.budget_factor * 1.25,
        }
    }

    /// The section's own checks (keys `env.gridnav.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            (2..=64).contains(&self.size),
            "env.gridnav.size",
            "must be between 2 and 64",
        );
        c.check(
            (0.0..0.9).contains(&self.wall_density),
            "env.gridnav.wall_density",
            "must be in [0, 0.9)",
        );
        c.check(
            1 <= self.min_distance
                && self.min_distance <= self.max_distance
                && self.max_distance < self.size * self.size,
            "env.gridnav.min_distance",
            "need 1 <= min_distance <= max_distance < size²",
        );
        c.check(
            self.budget_factor >= 1.0,
            "env.gridnav.budget_factor",
            "must be at least 1",
        );
    }
}

/// The cell of an observation (`at X Y ...`).
fn parse_position(observation: &str) -> Option<[u32; 2]> {
    let mut words = observation.split_whitespace();
    if words.next()? != "at" {
        return None;
    }
    Some([words.next()?.parse().ok()?, words.next()?.parse().ok()?])
}

pub const ACTIONS: [&str; 4] = ["north", "south", "east", "west"];
const MOVES: [(i32, i32); 4] = [(0, -1), (0, 1), (1, 0), (-1, 0)];

/// A gridnav task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub width: u32,
    pub height: u32,
    /// Wall cells, sorted.
    pub walls: Vec<[u32; 2]>,
    pub start: [u32; 2],
    pub goal: [u32; 2],
    /// Step budget.
    pub budget: u32,
}

impl Spec {
    fn parse(v: &Value) -> Result<Spec> {
        let s: Spec = serde_json::from_value(v.clone())
            .map_err(|e| Error::Environment(format!("gridnav: invalid task spec: {e}")))?;
        let inside = |p: [u32; 2]| p[0] < s.width && p[1] < s.height;
        if s.width == 0 || s.height == 0 || s.width > 256 || s.height > 256 {
            return Err(Error::Environment(
                "gridnav: width and height must be 1..=256".into(),
            ));
        }
        if !inside(s.start) || !inside(s.goal) || s.walls.iter().any(|w| !inside(*w)) {
            return Err(Error::Environment(
                "gridnav: a cell lies outside the grid".into(),
            ));
        }
        if s.walls.contains(&s.start) || s.walls.contains(&s.goal) {
            return Err(Error::Environment(
                "gridnav: start or goal is a wall".into(),
            ));
        }
        if s.budget == 0 {
            return Err(Error::Environment(
                "gridnav: budget must be at least 1".into(),
            ));
        }
        Ok(s)
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("spec serializes")
    }

    fn idx(&self, p: [u32; 2]) -> usize {
        (p[1] * self.width + p[0]) as usize
    }

    fn wall_map(&self) -> Vec<bool> {
        let mut m = vec![false; (self.width * self.height) as usize];
        for w in &self.walls {
            m[self.idx(*w)] = true;
        }
        m
    }

    fn neighbour(&self, p: [u32; 2], a: usize) -> Option<[u32; 2]> {
        let (dx, dy) = MOVES[a];
        let (x, y) = (p[0] as i32 + dx, p[1] as i32 + dy);
        (x >= 0 && y >= 0 && (x as u32) < self.width && (y as u32) < self.height)
            .then_some([x as u32, y as u32])
    }

    /// BFS distance of every cell to the goal (`u32::MAX`: unreachable or wall).
    pub fn distances(&self) -> Vec<u32> {
        let walls = self.wall_map();
        let mut d = vec![u32::MAX; walls.len()];
        let mut q = VecDeque::from([self.goal]);
        d[self.idx(self.goal)] = 0;
        while let Some(p) = q.pop_front() {
            for a in 0..4 {
                if let Some(n) = self.neighbour(p, a) {
                    let i = self.idx(n);
                    if !walls[i] && d[i] == u32::MAX {
                        d[i] = d[self.idx(p)] + 1;
                        q.push_back(n);
                    }
                }
            }
        }
        d
    }

    /// Length of the shortest path from start to goal, if any.
    pub fn shortest_path(&self) -> Option<u32> {
        let d = self.distances()[self.idx(self.start)];
        (d != u32::MAX).then_some(d)
    }

    /// The planner: an action on a shortest path from `p` (None at the goal).
    pub fn plan(&self, dist: &[u32], p: [u32; 2]) -> Option<usize> {
        let here = dist[self.idx(p)];
        if here == 0 || here == u32::MAX {
            return None;
        }
        (0..4).find(|&a| {
            self.neighbour(p, a)
                .is_some_and(|n| dist[self.idx(n)] == here - 1)
        })
    }
}

/// The gridnav environment with its difficulty distribution.
pub struct GridNav {
    cfg: GridNavConfig,
    /// The rollout's step cap (`env.max_steps`): an episode ends after `min(budget, cap)` steps.
    step_cap: u32,
}

impl GridNav {
    pub fn new(cfg: GridNavConfig) -> GridNav {
        GridNav {
            cfg,
            step_cap: u32::MAX,
        }
    }

    /// The environment under a rollout step cap (`env.max_steps`): mutations judge a budget by
    /// what the cap leaves of it, and a rewrite the cap makes invisible is not a candidate.
    pub fn with_step_cap(mut self, cap: u32) -> GridNav {
        self.step_cap = cap;
        self
    }

    /// One random solvable task from the configured distribution.
    fn sample(&self, rng: &mut Rng) -> Result<Spec> {
        let c = &self.cfg;
        for attempt in 0..2000 {
            // Relax the wall density if the grid keeps coming out unsolvable.
            let density = c.wall_density * 0.9f64.powi(attempt / 20);
            let (w, h) = (c.size, c.size);
            let mut walls = Vec::new();
            for y in 0..h {
                for x in 0..w {
                    if rng.unit() < density {
                        walls.push([x, y]);
                    }
                }
            }
            let free: Vec<[u32; 2]> = (0..h)
                .flat_map(|y| (0..w).map(move |x| [x, y]))
                .filter(|p| !walls.contains(p))
                .collect();
            if free.len() < 2 {
                continue;
            }
            let goal = free[(rng.next_u64() % free.len() as u64) as usize];
            let mut spec = Spec {
                width: w,
                height: h,
                walls,
                start: goal,
                goal,
                budget: 1,
            };
            let dist = spec.distances();
            let candidates: Vec<[u32; 2]> = free
                .iter()
                .copied()
                .filter(|p| {
                    let d = dist[spec.idx(*p)];
                    d != u32::MAX && d >= c.min_distance && d <= c.max_distance
                })
                .collect();
            if candidates.is_empty() {
                continue;
            }
            spec.start = candidates[(rng.next_u64() % candidates.len() as u64) as usize];
            let d = dist[spec.idx(spec.start)];
            spec.budget = budget(d, c.budget_factor);
            return Ok(spec);
        }
        Err(Error::Environment(format!(
            "gridnav: no task with a shortest path in [{}, {}] on a {}×{} grid after 2000 tries",
            c.min_distance, c.max_distance, c.size, c.size
        )))
    }
}

fn budget(distance: u32, factor: f64) -> u32 {
    ((distance as f64 * factor).ceil() as u32)
        .max(distance)
        .max(1)
}

impl Environment for GridNav {
    fn name(&self) -> &str {
        "gridnav"
    }

    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        (0..count)
            .map(|i| {
                let mut rng = Rng::new(derive_seed(seed, &["gridnav", &i.to_string()]));
                Ok(self.sample(&mut rng)?.to_value())
            })
            .collect()
    }

    fn validate(&self, spec: &Value) -> Result<()> {
        let s = Spec::parse(spec)?;
        match s.shortest_path() {
            None => Err(Error::Environment(
                "gridnav: the goal cannot be reached from the start".into(),
            )),
            Some(d) if d > s.budget => Err(Error::Environment(format!(
                "gridnav: the shortest path ({d} steps) exceeds the budget ({})",
                s.budget
            ))),
            Some(_) => Ok(()),
        }
    }

    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>> {
        let spec = Spec::parse(spec)?;
        let dist = spec.distances();
        if dist[spec.idx(spec.start)] == u32::MAX {
            return Err(Error::Environment(
                "gridnav: the goal cannot be reached from the start".into(),
            ));
        }
        let walls = spec.wall_map();
        let mut ep = GridEpisode {
            pos: spec.start,
            steps: 0,
            dist,
            walls,
            obs: Observation {
                text: String::new(),
                admissible: ACTIONS.iter().map(|a| a.to_string()).collect(),
            },
            spec,
        };
        ep.render();
        Ok(Box::new(ep))
    }

    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        let base = Spec::parse(spec)?;
        let d0 = base
            .shortest_path()
            .ok_or_else(|| Error::Environment("gridnav: unsolvable task".into()))?;
        let mut rng = Rng::new(seed);
        // Where the reward model judged every sample of a step bad: the cells the policy stood
        // on (parsed from the observations it saw there). Wall edits go next to them first:
        // easier removes a wall beside a risky cell, harder adds one there.
        let risky: Vec<[u32; 2]> = critic
            .high_risk_observations
            .iter()
            .filter_map(|o| parse_position(o))
            .filter(|p| p[0] < base.width && p[1] < base.height)
            .collect();
        let near_risk = |p: &[u32; 2]| {
            risky
                .iter()
                .any(|r| r[0].abs_diff(p[0]) <= 1 && r[1].abs_diff(p[1]) <= 1)
        };
        let mut out = Vec::new();
        for attempt in 0..64 {
            if out.len() >= 4 {
                break;
            }
            let mut s = base.clone();
            // The first attempts use the critic's cells when there are any.
            let guided = attempt < 4 && !risky.is_empty();
            let op = if guided { 0 } else { rng.next_u64() % 3 };
            match (direction, op) {
                // Harder: more walls, a farther start, or a tighter budget.
                (Direction::Harder, 0) => {
                    let all: Vec<[u32; 2]> = (0..s.height)
                        .flat_map(|y| (0..s.width).map(move |x| [x, y]))
                        .filter(|p| !s.walls.contains(p) && *p != s.start && *p != s.goal)
                        .collect();
                    let near: Vec<[u32; 2]> = all.iter().copied().filter(near_risk).collect();
                    let free = if guided && !near.is_empty() {
                        near
                    } else {
                        all
                    };
                    if free.is_empty() {
                        continue;
                    }
                    s.walls
                        .push(free[(rng.next_u64() % free.len() as u64) as usize]);
                    s.walls.sort();
                }
                (Direction::Harder, 1) => {
                    let dist = s.distances();
                    let far: Vec<[u32; 2]> = (0..s.height)
                        .flat_map(|y| (0..s.width).map(move |x| [x, y]))
                        .filter(|p| {
                            let d = dist[s.idx(*p)];
                            d != u32::MAX && d > d0
                        })
                        .collect();
                    if far.is_empty() {
                        continue;
                    }
                    s.start = far[(rng.next_u64() % far.len() as u64) as usize];
                    // A longer path with the same slack.
                    s.budget = dist[s.idx(s.start)] + (base.budget - d0);
                }
                (Direction::Harder, _) => s.budget = (s.budget - 1).max(d0),
                // Easier: fewer walls, a nearer start, or a looser budget.
                (Direction::Easier, 0) => {
                    let near: Vec<usize> = (0..s.walls.len())
                        .filter(|i| near_risk(&s.walls[*i]))
                        .collect();
                    let pick_from: Vec<usize> = if guided && !near.is_empty() {
                        near
                    } else {
                        (0..s.walls.len()).collect()
                    };
                    if pick_from.is_empty() {
                        continue;
                    }
                    let i = pick_from[(rng.next_u64() % pick_from.len() as u64) as usize];
                    s.walls.remove(i);
                }
                (Direction::Easier, 1) => {
                    let dist = s.distances();
                    let near: Vec<[u32; 2]> = (0..s.height)
                        .flat_map(|y| (0..s.width).map(move |x| [x, y]))
                        .filter(|p| {
                            let d = dist[s.idx(*p)];
                            d >= 1 && d < d0
                        })
                        .collect();
                    if near.is_empty() {
                        continue;
                    }
                    // A shorter path with the same budget: more slack.
                    s.start = near[(rng.next_u64() % near.len() as u64) as usize];
                }
                (Direction::Easier, _) => s.budget += 1 + s.budget / 4,
            }
            // What an episode sees: the budget as far as the step cap lets it run.
            let cap = self.step_cap;
            let seen = |x: &Spec| Spec {
                budget: x.budget.min(cap),
                ..x.clone()
            };
            if seen(&s) != seen(&base)
                && s.shortest_path().is_some_and(|d| d <= s.budget.min(cap))
                && !out.contains(&s)
            {
                out.push(s);
            }
        }
        Ok(out.into_iter().map(|s| s.to_value()).collect())
    }

    fn vocabulary(&self) -> Vec<String> {
        let mut v: Vec<String> = ["at", "goal", "here", "blocked", "none"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(ACTIONS.iter().map(|s| s.to_string()));
        v.extend((0..self.cfg.size.max(1)).map(|i| i.to_string()));
        v
    }
}

struct GridEpisode {
    spec: Spec,
    dist: Vec<u32>,
    walls: Vec<bool>,
    pos: [u32; 2],
    steps: u32,
    obs: Observation,
}

impl GridEpisode {
    fn blocked(&self, a: usize) -> bool {
        self.spec
            .neighbour(self.pos, a)
            .is_none_or(|n| self.walls[self.spec.idx(n)])
    }

    fn render(&mut self) {
        use std::fmt::Write;
        let blocked: [bool; 4] = std::array::from_fn(|a| self.blocked(a));
        let t = &mut self.obs.text;
        t.clear();
        let (p, g) = (self.pos, self.spec.goal);
        let _ = write!(t, "at {} {} goal", p[0], p[1]);
        if p == g {
            t.push_str(" here");
        }
        if g[1] < p[1] {
            t.push_str(" north");
        }
        if g[1] > p[1] {
            t.push_str(" south");
        }
        if g[0] > p[0] {
            t.push_str(" east");
        }
        if g[0] < p[0] {
            t.push_str(" west");
        }
        t.push_str(" blocked");
        let mut any = false;
        for a in 0..4 {
            if blocked[a] {
                t.push(' ');
                t.push_str(ACTIONS[a]);
                any = true;
            }
        }
        if !any {
            t.push_str(" none");
        }
    }
}

impl Episode for GridEpisode {
    fn observation(&self) -> &Observation {
        &self.obs
    }

    fn max_steps(&self) -> u32 {
        self.spec.budget
    }

    fn oracle_action(&self) -> Option<String> {
        self.spec
            .plan(&self.dist, self.pos)
            .map(|a| ACTIONS[a].to_string())
    }

    fn step(&mut self, action: &str) -> Result<Step> {
        let a = ACTIONS.iter().position(|x| *x == action).ok_or_else(|| {
            Error::Environment(format!("gridnav: inadmissible action {action:?}"))
        })?;
        if self.steps >= self.spec.budget || self.pos == self.spec.goal {
            return Err(Error::Environment(
                "gridnav: step after the episode ended".into(),
            ));
        }
        let before = self.dist[self.spec.idx(self.pos)];
        if !self.blocked(a) {
            self.pos = self.spec.neighbour(self.pos, a).expect("not blocked");
        }
        self.steps += 1;
        let after = self.dist[self.spec.idx(self.pos)];
        let won = self.pos == self.spec.goal;
        self.render();
        Ok(Step {
            done: won || self.steps >= self.spec.budget,
            won,
            oracle_progress: Some(if after < before { 1 } else { -1 }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> GridNav {
        GridNav::new(GridNavConfig::default())
    }

    #[test]
    fn generated_tasks_are_solvable_within_budget_and_deterministic() {
        let e = env();
        let a = e.generate(7, 50).unwrap();
        assert_eq!(a, e.generate(7, 50).unwrap());
        assert_ne!(a, e.generate(8, 50).unwrap());
        for v in &a {
            let s = Spec::parse(v).unwrap();
            let d = s.shortest_path().unwrap();
            assert!(
                d >= e.cfg.min_distance && d <= e.cfg.max_distance && d <= s.budget,
                "{s:?}"
            );
        }
    }

    /// Following the planner always wins; on random play the oracle says +1 exactly when the
    /// planner's remaining distance went down.
    #[test]
    fn planner_wins_and_oracle_agrees_with_it() {
        let e = env();
        for (i, v) in e.generate(3, 40).unwrap().iter().enumerate() {
            let s = Spec::parse(v).unwrap();
            let dist = s.distances();
            let mut ep = e.reset(v).unwrap();
            let mut pos = s.start;
            loop {
                let a = s.plan(&dist, pos).expect("planner has a move");
                let st = ep.step(ACTIONS[a]).unwrap();
                assert_eq!(st.oracle_progress, Some(1));
                pos = s.neighbour(pos, a).unwrap();
                if st.done {
                    assert!(st.won, "task {i}: planner lost");
                    break;
                }
            }
            // Random play.
            let mut rng = Rng::new(i as u64);
            let mut ep = e.reset(v).unwrap();
            let mut pos = s.start;
            for _ in 0..s.budget {
                let a = (rng.next_u64() % 4) as usize;
                let next = s
                    .neighbour(pos, a)
                    .filter(|n| !s.walls.contains(n))
                    .unwrap_or(pos);
                let st = ep.step(ACTIONS[a]).unwrap();
                let progress = dist[s.idx(next)] < dist[s.idx(pos)];
                assert_eq!(st.oracle_progress, Some(if progress { 1 } else { -1 }));
                pos = next;
                if st.done {
                    break;
                }
            }
        }
    }

    /// `oracle_action` is the planner: following it wins every task, and every step makes
    /// progress; the easier level draws shorter tasks.
    #[test]
    fn oracle_action_wins_and_easier_is_easier() {
        let e = env();
        for spec in e.generate(3, 40).unwrap() {
            let mut ep = e.reset(&spec).unwrap();
            loop {
                let a = ep.oracle_action().expect("a plan until the goal");
                let st = ep.step(&a).unwrap();
                assert_eq!(st.oracle_progress, Some(1));
                if st.done {
                    assert!(st.won);
                    assert!(ep.oracle_action().is_none());
                    break;
                }
            }
        }
        let easy = GridNav::new(e.cfg.easier());
        let mean = |g: &GridNav| {
            let v = g.generate(5, 100).unwrap();
            v.iter()
                .map(|s| Spec::parse(s).unwrap().shortest_path().unwrap() as f64)
                .sum::<f64>()
                / v.len() as f64
        };
        assert!(mean(&easy) < mean(&e), "{} vs {}", mean(&easy), mean(&e));
    }

    #[test]
    fn bad_actions_and_specs_are_errors() {
        let e = env();
        let v = &e.generate(1, 1).unwrap()[0];
        let mut ep = e.reset(v).unwrap();
        assert!(ep.step("fly").is_err());
        assert!(e.reset(&serde_json::json!({"width": 2})).is_err());
        let walled = serde_json::json!({"width": 3, "height": 1, "walls": [[1, 0]], "start": [0, 0], "goal": [2, 0], "budget": 5});
        assert!(e.reset(&walled).is_err(), "unsolvable task accepted");
    }

    #[test]
    fn mutations_are_solvable_and_move_difficulty() {
        let e = env();
        let (mut harder, mut easier, mut n) = (0i64, 0i64, 0i64);
        for (i, v) in e.generate(11, 40).unwrap().iter().enumerate() {
            let s = Spec::parse(v).unwrap();
            let d0 = s.shortest_path().unwrap() as i64;
            let slack0 = s.budget as i64 - d0;
            for (dir, acc) in [
                (Direction::Harder, &mut harder),
                (Direction::Easier, &mut easier),
            ] {
                for c in e
                    .mutate(v, dir, &CriticSummary::default(), i as u64)
                    .unwrap()
                {
                    let c = Spec::parse(&c).unwrap();
                    let d = c.shortest_path().expect("solvable") as i64;
                    assert!(d as u32 <= c.budget);
                    // Difficulty score: path length, minus the budget's slack.
                    *acc += (d - d0) - ((c.budget as i64 - d) - slack0);
                    n += 1;
                }
            }
        }
        assert!(n > 0);
        assert!(
            harder > 0,
            "harder mutations should lengthen paths or cut slack: {harder}"
        );
        assert!(
            easier < 0,
            "easier mutations should shorten paths or add slack: {easier}"
        );
    }

    /// Under a step cap a candidate changes what an episode sees — not a budget past the cap —
    /// and its path fits within the cap; without the cap the budget past it is offered.
    #[test]
    fn a_budget_the_step_cap_hides_is_not_a_candidate() {
        let cap = 12;
        let seen = |v: &Value| {
            let s = Spec::parse(v).unwrap();
            Spec {
                budget: s.budget.min(cap),
                ..s
            }
        };
        let (free, capped) = (env(), env().with_step_cap(cap));
        let (mut at_cap, mut hidden_offered, mut n) = (0, 0, 0);
        for (i, v) in free.generate(5, 40).unwrap().iter().enumerate() {
            at_cap += usize::from(Spec::parse(v).unwrap().budget >= cap);
            for dir in [Direction::Harder, Direction::Easier] {
                for c in free
                    .mutate(v, dir, &CriticSummary::default(), i as u64)
                    .unwrap()
                {
                    hidden_offered += usize::from(seen(&c) == seen(v));
                }
                for c in capped
                    .mutate(v, dir, &CriticSummary::default(), i as u64)
                    .unwrap()
                {
                    assert_ne!(seen(&c), seen(v), "{v} → {c}: the same task under the cap");
                    let d = Spec::parse(&c).unwrap().shortest_path().unwrap();
                    assert!(d <= cap, "{v} → {c}: unwinnable under the cap");
                    n += 1;
                }
            }
        }
        assert!(
            at_cap >= 5 && hidden_offered >= 5,
            "{at_cap} {hidden_offered}"
        );
        assert!(n > 0);
    }

    /// The out-of-distribution level generates tasks on every grid size, with paths as long as
    /// the grid allows, never shorter than the training level's.
    #[test]
    fn one_level_harder_generates_everywhere() {
        for size in 2..=8 {
            let base = GridNavConfig {
                size,
                wall_density: 0.2,
                min_distance: 1,
                max_distance: (2 * (size - 1)).min(4),
                budget_factor: 4.0,
            };
            let h = base.harder();
            assert!(h.min_distance >= base.min_distance && h.max_distance >= base.max_distance);
            assert!(h.min_distance <= h.max_distance);
            let tasks = GridNav::new(h.clone()).generate(3, 10).unwrap();
            for t in &tasks {
                let d = Spec::parse(t).unwrap().shortest_path().unwrap();
                assert!(
                    d >= h.min_distance && d <= h.max_distance,
                    "size {size}: {d}"
                );
            }
        }
    }

    /// The critic's high-risk cells steer wall edits: easier removes a wall next to one,
    /// harder adds one next to one.
    #[test]
    fn critic_guides_wall_edits() {
        let e = env();
        let spec = serde_json::json!({
            "width": 6, "height": 6, "start": [0, 0], "goal": [5, 5], "budget": 30,
            "walls": [[1, 3], [4, 1], [4, 4]]
        });
        let critic = CriticSummary {
            high_risk_observations: vec!["at 3 3 goal south east blocked none".into()],
            ..Default::default()
        };
        let easier = e.mutate(&spec, Direction::Easier, &critic, 5).unwrap();
        let first = Spec::parse(&easier[0]).unwrap();
        assert_eq!(
            first.walls,
            vec![[1, 3], [4, 1]],
            "removes the wall beside (3, 3)"
        );
        let harder = e.mutate(&spec, Direction::Harder, &critic, 5).unwrap();
        let first = Spec::parse(&harder[0]).unwrap();
        let added: Vec<_> = first
            .walls
            .iter()
            .filter(|w| !Spec::parse(&spec).unwrap().walls.contains(w))
            .collect();
        assert_eq!(added.len(), 1);
        assert!(
            added[0][0].abs_diff(3) <= 1 && added[0][1].abs_diff(3) <= 1,
            "{added:?}"
        );
        assert!(e.validate(&easier[0]).is_ok());
        let unsolvable = serde_json::json!({
            "width": 3, "height": 1, "start": [0, 0], "goal": [2, 0], "budget": 5, "walls": [[1, 0]]
        });
        assert!(e.validate(&unsolvable).is_err());
        let tight = serde_json::json!({
            "width": 3, "height": 1, "start": [0, 0], "goal": [2, 0], "budget": 1, "walls": []
        });
        assert!(
            e.validate(&tight)
                .unwrap_err()
                .to_string()
                .contains("exceeds the budget")
        );
    }

    #[test]
    fn corrupted_specs_never_panic() {
        let e = env();
        let odd = [
            serde_json::json!(null),
            serde_json::json!(0),
            serde_json::json!(-3),
            serde_json::json!(u64::MAX),
            serde_json::json!([[300, 300]]),
            serde_json::json!([1, 2, 3]),
            serde_json::json!("x"),
        ];
        for spec in e.generate(2, 20).unwrap() {
            for k in ["width", "height", "walls", "start", "goal", "budget"] {
                for v in &odd {
                    let mut bad = spec.clone();
                    bad[k] = v.clone();
                    if let Ok(mut ep) = e.reset(&bad) {
                        let _ = ep.step("north");
                    }
                }
            }
        }
    }
}
