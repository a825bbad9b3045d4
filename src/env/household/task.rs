//! A parsed task: the abstract state, the actions, the validation of a spec (`Task::parse`)
//! and the transitions (which commands are admissible, what each one does).

use serde_json::Value;

use super::world::{
    CLEAN, COOL, GoalType, HOT, INF, MAX_NUMBER, MAX_OBJECTS, MAX_RECEPTACLES, Spec,
    default_goal_types, kind_of, obj_kind, rec_kind, split_name,
};
use super::world::{err, list};
use crate::error::Result;

/// `State::loc` before the first `go to`.
pub(super) const NOWHERE: u8 = u8::MAX;
/// `State::held` with empty hands.
pub(super) const NOTHING: u8 = u8::MAX;
/// `State::at` of the held object.
pub(super) const HELD: u8 = u8::MAX - 1;

/// The abstract state of an episode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Receptacle the agent is at (`NOWHERE` at the start).
    pub(super) loc: u8,
    /// Bit r: receptacle r is open (only meaningful for openable receptacles).
    pub(super) open: u64,
    /// Receptacle of each object, or `HELD`.
    pub(super) at: Vec<u8>,
    /// CLEAN | HOT | COOL per object.
    pub(super) flags: Vec<u8>,
    /// The held object (`NOTHING`).
    pub(super) held: u8,
    pub(super) lamp_on: bool,
}

/// One command, resolved to indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Go(u8),
    Open(u8),
    Close(u8),
    Take(u8, u8),
    Put(u8, u8),
    Process(u8, u8),
    UseLamp,
    ExamineRec(u8),
    ExamineObj(u8),
    Look,
    Inventory,
}

/// A parsed, validated task: the static world plus the planner.
pub struct Task {
    pub(super) spec: Spec,
    pub(super) goal: GoalType,
    pub(super) rec_names: Vec<String>,
    /// Bit r: receptacle r can be opened.
    pub(super) openable: u64,
    /// The flag each receptacle applies (`CLEAN` at a sinkbasin, ...; 0 elsewhere).
    pub(super) process: Vec<u8>,
    pub(super) is_target: Vec<bool>,
    pub(super) targets: Vec<u8>,
    /// Receptacles that apply the goal's flag.
    pub(super) appliances: Vec<u8>,
    pub(super) obj_names: Vec<String>,
    pub(super) is_goal_obj: Vec<bool>,
    pub(super) goal_objs: Vec<u8>,
    /// Receptacle of the desklamp (`NOWHERE`: none).
    pub(super) lamp: u8,
    pub(super) go_cmds: Vec<String>,
    pub(super) goal_text: String,
    pub(super) room_text: String,
    pub(super) init: State,
}

impl Task {
    /// Parse and validate a spec: well-formed, not already won, solvable within its budget.
    pub fn parse(v: &Value) -> Result<Task> {
        let spec: Spec = serde_json::from_value(v.clone())
            .map_err(|e| err(format!("invalid task spec: {e}")))?;
        let task = Task::compile(spec)?;
        let plan = task.plan_length(&task.init).unwrap_or(INF);
        if task.spec.budget < plan {
            return Err(err(format!(
                "the task needs {plan} steps but its budget is {}",
                task.spec.budget
            )));
        }
        Ok(task)
    }

    /// Everything but the budget check.
    pub(super) fn compile(spec: Spec) -> Result<Task> {
        let n = spec.receptacles.len();
        if n == 0 || n > MAX_RECEPTACLES {
            return Err(err(format!(
                "a home has 1..={MAX_RECEPTACLES} receptacles, not {n}"
            )));
        }
        if spec.objects.len() > MAX_OBJECTS {
            return Err(err(format!(
                "a home has at most {MAX_OBJECTS} objects, not {}",
                spec.objects.len()
            )));
        }
        let goal = GoalType::from_name(&spec.goal.kind).ok_or_else(|| {
            err(format!(
                "unknown goal type {:?} (known: {})",
                spec.goal.kind,
                default_goal_types().join(", ")
            ))
        })?;
        let mut openable = 0u64;
        let mut process = Vec::with_capacity(n);
        for (i, r) in spec.receptacles.iter().enumerate() {
            let (k, _) = split_name(r).ok_or_else(|| {
                err(format!(
                    "receptacle {r:?}: expected `kind N` with N in 1..={MAX_NUMBER}"
                ))
            })?;
            let kind = rec_kind(k).ok_or_else(|| err(format!("unknown receptacle kind {k:?}")))?;
            if spec.receptacles[..i].contains(r) {
                return Err(err(format!("receptacle {r:?} appears twice")));
            }
            if kind.openable {
                openable |= 1 << i;
            }
            process.push(match k {
                "sinkbasin" => CLEAN,
                "microwave" => HOT,
                "fridge" => COOL,
                _ => 0,
            });
        }
        let rec_index = |r: &str| spec.receptacles.iter().position(|x| x == r);
        let mut at = Vec::with_capacity(spec.objects.len());
        for (i, o) in spec.objects.iter().enumerate() {
            let (k, _) = split_name(&o.name).ok_or_else(|| {
                err(format!(
                    "object {:?}: expected `kind N` with N in 1..={MAX_NUMBER}",
                    o.name
                ))
            })?;
            obj_kind(k).ok_or_else(|| err(format!("unknown object kind {k:?}")))?;
            if spec.objects[..i].iter().any(|p| p.name == o.name) {
                return Err(err(format!("object {:?} appears twice", o.name)));
            }
            let r = rec_index(&o.at).ok_or_else(|| {
                err(format!(
                    "object {:?} is at {:?}, which is not a receptacle of the home",
                    o.name, o.at
                ))
            })?;
            at.push(r as u8);
        }
        let lamp = match &spec.desklamp {
            None => NOWHERE,
            Some(r) => {
                let i = rec_index(r).ok_or_else(|| {
                    err(format!(
                        "the desklamp is on {r:?}, which is not a receptacle"
                    ))
                })?;
                if openable & (1 << i) != 0 {
                    return Err(err(format!(
                        "the desklamp cannot stand inside the closed container {r:?}"
                    )));
                }
                i as u8
            }
        };
        let ok = obj_kind(&spec.goal.object)
            .ok_or_else(|| err(format!("unknown goal object kind {:?}", spec.goal.object)))?;
        if !goal.allows(ok) {
            return Err(err(format!(
                "a {} cannot be used in a {} task",
                ok.name,
                goal.name()
            )));
        }
        let is_target: Vec<bool> = spec.receptacles.iter().map(|r| spec.is_target(r)).collect();
        match (&spec.goal.target, goal) {
            (Some(t), GoalType::LookInLight) => {
                return Err(err(format!(
                    "a look_at_obj_in_light task has no target (got {t:?})"
                )));
            }
            (None, GoalType::LookInLight) => {
                if lamp == NOWHERE {
                    return Err(err("a look_at_obj_in_light task needs a desklamp"));
                }
            }
            (None, _) => {
                return Err(err(format!("a {} task needs a target", goal.name())));
            }
            (Some(t), _) => {
                if !is_target.contains(&true) {
                    return Err(err(format!("the home has no {t:?} (the goal's target)")));
                }
            }
        }
        if let Some(a) = goal.appliance()
            && !spec.receptacles.iter().any(|r| kind_of(r) == a)
        {
            return Err(err(format!("a {} task needs a {a}", goal.name())));
        }
        let is_goal_obj: Vec<bool> = spec
            .objects
            .iter()
            .map(|o| kind_of(&o.name) == spec.goal.object)
            .collect();
        let goal_objs: Vec<u8> = (0..spec.objects.len() as u8)
            .filter(|&o| is_goal_obj[o as usize])
            .collect();
        if goal_objs.len() < goal.needs() {
            return Err(err(format!(
                "a {} task needs {} {} object(s), the home has {}",
                goal.name(),
                goal.needs(),
                spec.goal.object,
                goal_objs.len()
            )));
        }
        let flag = goal.flag();
        let appliances: Vec<u8> = (0..n as u8)
            .filter(|&r| flag != 0 && process[r as usize] == flag)
            .collect();
        let targets: Vec<u8> = (0..n as u8).filter(|&r| is_target[r as usize]).collect();
        let goal_text = match goal {
            GoalType::PickAndPlace => format!(
                "put a {} in {}",
                spec.goal.object,
                spec.goal.target.as_deref().unwrap_or_default()
            ),
            GoalType::PickClean | GoalType::PickHeat | GoalType::PickCool => format!(
                "put a {} {} in {}",
                match goal {
                    GoalType::PickClean => "clean",
                    GoalType::PickHeat => "hot",
                    _ => "cool",
                },
                spec.goal.object,
                spec.goal.target.as_deref().unwrap_or_default()
            ),
            GoalType::PickTwo => format!(
                "find two {} and put them in {}",
                spec.goal.object,
                spec.goal.target.as_deref().unwrap_or_default()
            ),
            GoalType::LookInLight => {
                format!("look at {} under the desklamp", spec.goal.object)
            }
        };
        let mut room_text =
            String::from("You are in the middle of a room. Looking quickly around you, you see ");
        list(spec.receptacles.iter().map(|s| s.as_str()), &mut room_text);
        room_text.push('.');
        let init = State {
            loc: NOWHERE,
            open: 0,
            flags: vec![0; at.len()],
            at,
            held: NOTHING,
            lamp_on: false,
        };
        let task = Task {
            goal,
            rec_names: spec.receptacles.clone(),
            openable,
            process,
            is_target,
            targets,
            appliances,
            obj_names: spec.objects.iter().map(|o| o.name.clone()).collect(),
            is_goal_obj,
            goal_objs,
            lamp,
            go_cmds: spec
                .receptacles
                .iter()
                .map(|r| format!("go to {r}"))
                .collect(),
            goal_text,
            room_text,
            init,
            spec,
        };
        if task.won(&task.init) {
            return Err(err("the goal already holds at the start"));
        }
        if task.plan_length(&task.init).is_none() {
            return Err(err("the goal cannot be reached"));
        }
        Ok(task)
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn initial_state(&self) -> State {
        self.init.clone()
    }

    /// The goal text, e.g. `put a clean apple in diningtable`.
    pub fn goal_text(&self) -> &str {
        &self.goal_text
    }

    pub(super) fn closed(&self, s: &State, r: u8) -> bool {
        (self.openable & !s.open) & (1u64 << r) != 0
    }

    /// The admissible actions in `s` (unordered).
    pub(super) fn actions(&self, s: &State, out: &mut Vec<Action>) {
        out.clear();
        let n = self.rec_names.len() as u8;
        out.extend((0..n).filter(|&r| r != s.loc).map(Action::Go));
        out.push(Action::Look);
        out.push(Action::Inventory);
        if s.held != NOTHING {
            out.push(Action::ExamineObj(s.held));
        }
        if s.loc == NOWHERE {
            return;
        }
        let r = s.loc;
        out.push(Action::ExamineRec(r));
        let closed = self.closed(s, r);
        if self.openable & (1 << r) != 0 {
            out.push(if closed {
                Action::Open(r)
            } else {
                Action::Close(r)
            });
        }
        if !closed {
            if s.held == NOTHING {
                out.extend(
                    (0..s.at.len() as u8)
                        .filter(|&o| s.at[o as usize] == r)
                        .map(|o| Action::Take(o, r)),
                );
            } else {
                out.push(Action::Put(s.held, r));
            }
        }
        if s.held != NOTHING && self.process[r as usize] != 0 {
            out.push(Action::Process(s.held, r));
        }
        if self.lamp == r {
            out.push(Action::UseLamp);
        }
    }

    /// The admissible commands in `s`, sorted, with their actions.
    pub(super) fn admissible(&self, s: &State) -> Vec<(String, Action)> {
        let mut acts = Vec::with_capacity(16);
        self.actions(s, &mut acts);
        let mut v: Vec<(String, Action)> = acts.into_iter().map(|a| (self.command(a), a)).collect();
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Apply an admissible action; false if it changed nothing it was meant to change.
    pub(super) fn apply(&self, s: &mut State, a: Action) -> bool {
        match a {
            Action::Go(r) => s.loc = r,
            Action::Open(r) => s.open |= 1 << r,
            Action::Close(r) => s.open &= !(1 << r),
            Action::Take(o, _) => {
                s.at[o as usize] = HELD;
                s.held = o;
            }
            Action::Put(o, r) => {
                s.at[o as usize] = r;
                s.held = NOTHING;
            }
            Action::Process(o, r) => {
                let f = self.process[r as usize];
                if s.flags[o as usize] & f != 0 {
                    return false;
                }
                s.flags[o as usize] |= f;
            }
            Action::UseLamp => {
                if s.lamp_on {
                    return false;
                }
                s.lamp_on = true;
            }
            Action::ExamineRec(_) | Action::ExamineObj(_) | Action::Look | Action::Inventory => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::determinism::Rng;
    use crate::env::Environment;
    use crate::env::household::tests::env;
    use crate::env::household::{Household, HouseholdConfig};

    #[test]
    fn bad_actions_and_specs_are_errors() {
        let e = env();
        let v = &e.generate(1, 1).unwrap()[0];
        let mut ep = e.reset(v).unwrap();
        assert!(ep.step("fly").is_err());
        assert!(ep.step("").is_err());
        assert!(ep.step("go to  countertop 1").is_err());
        assert!(ep.step("open fridge 1").is_err(), "open before arriving");
        let good = serde_json::json!({
            "receptacles": ["countertop 1", "diningtable 1"],
            "objects": [{"name": "apple 1", "at": "countertop 1"}],
            "goal": {"type": "pick_and_place", "object": "apple", "target": "diningtable"},
            "budget": 4
        });
        assert!(e.reset(&good).is_ok());
        let mut ep = e.reset(&good).unwrap();
        assert!(
            ep.step("take apple 1 from countertop 1").is_err(),
            "take from afar"
        );
        let bad = |patch: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            patch(&mut v);
            e.reset(&v).err().map(|e| e.to_string())
        };
        let cases: Vec<(&str, Box<dyn Fn(&mut Value)>)> = vec![
            ("unknown key", Box::new(|v| v["colour"] = "red".into())),
            ("budget", Box::new(|v| v["budget"] = 3.into())),
            (
                "kind",
                Box::new(|v| v["receptacles"][0] = "spaceship 1".into()),
            ),
            (
                "number",
                Box::new(|v| v["receptacles"][0] = "countertop 0".into()),
            ),
            (
                "name",
                Box::new(|v| v["receptacles"][0] = "countertop".into()),
            ),
            (
                "twice",
                Box::new(|v| v["receptacles"][1] = "countertop 1".into()),
            ),
            (
                "object at",
                Box::new(|v| v["objects"][0]["at"] = "shelf 1".into()),
            ),
            (
                "object kind",
                Box::new(|v| v["objects"][0]["name"] = "dragon 1".into()),
            ),
            (
                "goal type",
                Box::new(|v| v["goal"]["type"] = "juggle".into()),
            ),
            ("target", Box::new(|v| v["goal"]["target"] = "shelf".into())),
            (
                "no goal object",
                Box::new(|v| v["goal"]["object"] = "mug".into()),
            ),
            (
                "won",
                Box::new(|v| v["objects"][0]["at"] = "diningtable 1".into()),
            ),
            (
                "appliance",
                Box::new(|v| v["goal"]["type"] = "pick_heat_then_place".into()),
            ),
            (
                "two",
                Box::new(|v| v["goal"]["type"] = "pick_two_and_place".into()),
            ),
            (
                "lamp",
                Box::new(|v| {
                    v["goal"]["type"] = "look_at_obj_in_light".into();
                    v["goal"]["object"] = "apple".into();
                    v["goal"].as_object_mut().unwrap().remove("target");
                }),
            ),
            (
                "heat a book",
                Box::new(|v| {
                    v["receptacles"][1] = "microwave 1".into();
                    v["objects"][0]["name"] = "book 1".into();
                    v["goal"] = serde_json::json!({"type": "pick_heat_then_place", "object": "book", "target": "countertop"});
                }),
            ),
            (
                "lamp in drawer",
                Box::new(|v| {
                    v["receptacles"][1] = "drawer 1".into();
                    v["desklamp"] = "drawer 1".into();
                }),
            ),
        ];
        for (what, patch) in &cases {
            let r = bad(patch.as_ref());
            assert!(r.is_some(), "{what}: accepted");
            let msg = r.unwrap();
            assert!(msg.contains("household"), "{what}: {msg}");
        }
    }

    /// Corrupted specs (fields removed or replaced by odd values) give an error or a valid
    /// episode — never a panic — and mutations of whatever parses stay solvable.
    #[test]
    fn corrupted_specs_never_panic() {
        let env = Household::new(HouseholdConfig::default());
        let odd: Vec<Value> = vec![
            Value::Null,
            serde_json::json!(-1),
            serde_json::json!(1e300),
            serde_json::json!(""),
            serde_json::json!("apple 1"),
            serde_json::json!("fridge 99"),
            serde_json::json!([]),
            serde_json::json!([["x"]]),
            serde_json::json!({"name": "apple 1", "at": "nowhere 1"}),
            serde_json::json!(u64::MAX),
        ];
        let mut rng = Rng::new(99);
        for spec in env.generate(4, 30).unwrap() {
            let keys: Vec<String> = spec.as_object().unwrap().keys().cloned().collect();
            for k in &keys {
                let mut removed = spec.clone();
                removed.as_object_mut().unwrap().remove(k);
                let _ = env.reset(&removed);
                for v in &odd {
                    let mut bad = spec.clone();
                    bad[k.as_str()] = v.clone();
                    if let Ok(mut ep) = env.reset(&bad) {
                        let adm = ep.observation().admissible.clone();
                        let _ = ep.step(&adm[(rng.next_u64() % adm.len() as u64) as usize]);
                    }
                }
            }
            // Nested corruption: objects and goal fields.
            let mut bad = spec.clone();
            if let Some(objs) = bad["objects"].as_array_mut() {
                objs.push(serde_json::json!({"name": "apple 1", "at": "fridge 1"}));
                objs.push(serde_json::json!({"name": "zzz 3", "at": "countertop 1"}));
            }
            let _ = env.reset(&bad);
            let mut bad = spec.clone();
            bad["goal"]["type"] = serde_json::json!("fly_to_moon");
            assert!(env.reset(&bad).is_err());
            bad["goal"] = serde_json::json!({"type": "pick_two_and_place", "object": "apple", "target": "apple"});
            let _ = env.reset(&bad);
        }
    }
}
