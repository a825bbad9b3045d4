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

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};

/// Largest instance number of a receptacle or object kind (`cabinet 20`).
pub const MAX_NUMBER: u32 = 20;
/// Most receptacles in a home (the open state is a 64-bit mask).
pub const MAX_RECEPTACLES: usize = 48;
/// Most objects in a home.
pub const MAX_OBJECTS: usize = 48;

/// `State::loc` before the first `go to`.
const NOWHERE: u8 = u8::MAX;
/// `State::held` with empty hands.
const NOTHING: u8 = u8::MAX;
/// `State::at` of the held object.
const HELD: u8 = u8::MAX - 1;
/// "Infinitely many steps" in the planner (summing a few of them cannot overflow).
const INF: u32 = u32::MAX / 8;

const CLEAN: u8 = 1;
const HOT: u8 = 2;
const COOL: u8 = 4;

struct ObjKind {
    name: &'static str,
    clean: bool,
    heat: bool,
    cool: bool,
    light: bool,
}

const fn obj(name: &'static str, clean: bool, heat: bool, cool: bool, light: bool) -> ObjKind {
    ObjKind {
        name,
        clean,
        heat,
        cool,
        light,
    }
}

/// Object kinds and the goals they can take part in (every kind can be picked and placed).
const OBJECTS: &[ObjKind] = &[
    obj("apple", true, true, true, false),
    obj("book", false, false, false, true),
    obj("bowl", true, true, true, true),
    obj("bread", false, true, true, false),
    obj("candle", false, false, false, false),
    obj("cellphone", false, false, false, true),
    obj("cloth", true, false, false, false),
    obj("creditcard", false, false, false, true),
    obj("cup", true, true, true, false),
    obj("egg", true, true, true, false),
    obj("fork", true, false, false, false),
    obj("keychain", false, false, false, true),
    obj("knife", true, false, false, false),
    obj("lettuce", true, false, true, false),
    obj("mug", true, true, true, true),
    obj("pan", true, false, true, false),
    obj("pen", false, false, false, true),
    obj("pencil", false, false, false, true),
    obj("plate", true, true, true, false),
    obj("potato", true, true, true, false),
    obj("remotecontrol", false, false, false, true),
    obj("soapbar", true, false, false, false),
    obj("spoon", true, false, false, false),
    obj("tomato", true, true, true, false),
    obj("vase", false, false, false, true),
    obj("watch", false, false, false, true),
];

struct RecKind {
    name: &'static str,
    /// Can be opened and closed (starts closed).
    openable: bool,
    /// Most instances the generator puts in a home.
    max: u32,
}

const fn rec(name: &'static str, openable: bool, max: u32) -> RecKind {
    RecKind {
        name,
        openable,
        max,
    }
}

const RECEPTACLES: &[RecKind] = &[
    rec("armchair", false, MAX_NUMBER),
    rec("bed", false, MAX_NUMBER),
    rec("cabinet", true, MAX_NUMBER),
    rec("coffeetable", false, MAX_NUMBER),
    rec("countertop", false, MAX_NUMBER),
    rec("desk", false, MAX_NUMBER),
    rec("diningtable", false, MAX_NUMBER),
    rec("drawer", true, MAX_NUMBER),
    rec("dresser", false, MAX_NUMBER),
    rec("fridge", true, 1),
    rec("garbagecan", false, MAX_NUMBER),
    rec("microwave", true, 1),
    rec("safe", true, MAX_NUMBER),
    rec("shelf", false, MAX_NUMBER),
    rec("sidetable", false, MAX_NUMBER),
    rec("sinkbasin", false, 2),
    rec("sofa", false, MAX_NUMBER),
    rec("stoveburner", false, MAX_NUMBER),
];

/// Receptacle kinds a desklamp can stand on.
const LAMP_HOLDERS: &[&str] = &["desk", "dresser", "sidetable"];
/// Closed containers the mutations add.
const CONTAINERS: &[&str] = &["cabinet", "drawer", "safe"];

/// The words of every observation and command template (besides kind names and numbers).
const WORDS: &[&str] = &[
    "You",
    "are",
    "in",
    "the",
    "middle",
    "of",
    "a",
    "room",
    "Looking",
    "quickly",
    "around",
    "you",
    "see",
    "and",
    "Your",
    "task",
    "is",
    "to",
    "put",
    "clean",
    "hot",
    "cool",
    "find",
    "two",
    "them",
    "look",
    "at",
    "under",
    "desklamp",
    "arrive",
    "On",
    "The",
    "open",
    "closed",
    "In",
    "it",
    "nothing",
    "facing",
    "Next",
    "pick",
    "up",
    "from",
    "using",
    "heat",
    "turn",
    "on",
    "Nothing",
    "happens",
    "carrying",
    "not",
    "anything",
    "There",
    "special",
    "about",
    "close",
    "go",
    "take",
    "with",
    "use",
    "examine",
    "inventory",
    "in/on",
    "/",
    ".",
    ",",
    ":",
];

fn obj_kind(name: &str) -> Option<&'static ObjKind> {
    OBJECTS.iter().find(|k| k.name == name)
}

fn rec_kind(name: &str) -> Option<&'static RecKind> {
    RECEPTACLES.iter().find(|k| k.name == name)
}

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Environment(format!("household: {msg}"))
}

/// The kind of a `kind N` name.
fn kind_of(name: &str) -> &str {
    name.split_once(' ').map_or(name, |(k, _)| k)
}

/// `kind N` → (kind, N), N in 1..=MAX_NUMBER written without leading zeros.
fn split_name(name: &str) -> Option<(&str, u32)> {
    let (k, n) = name.split_once(' ')?;
    let num: u32 = n.parse().ok()?;
    ((1..=MAX_NUMBER).contains(&num) && num.to_string() == n && !k.is_empty()).then_some((k, num))
}

/// The next free `kind N` among `names` (None if N would exceed MAX_NUMBER).
fn next_name<'a>(kind: &str, names: impl Iterator<Item = &'a String>) -> Option<String> {
    let max = names
        .filter_map(|n| split_name(n))
        .filter(|(k, _)| *k == kind)
        .map(|(_, n)| n)
        .max()
        .unwrap_or(0);
    (max < MAX_NUMBER).then(|| format!("{kind} {}", max + 1))
}

fn name_key(name: &str) -> (String, u32) {
    split_name(name).map_or((name.to_string(), 0), |(k, n)| (k.to_string(), n))
}

fn pick<'a, T>(rng: &mut Rng, v: &'a [T]) -> Option<&'a T> {
    (!v.is_empty()).then(|| &v[(rng.next_u64() % v.len() as u64) as usize])
}

/// Step budget for a plan length.
fn budget(plan: u32, factor: f64) -> u32 {
    ((plan as f64 * factor).ceil() as u32).max(plan).max(1)
}

/// The goal families, from AlfWorld.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoalType {
    PickAndPlace,
    PickClean,
    PickHeat,
    PickCool,
    PickTwo,
    LookInLight,
}

impl GoalType {
    pub const ALL: [GoalType; 6] = [
        GoalType::PickAndPlace,
        GoalType::PickClean,
        GoalType::PickHeat,
        GoalType::PickCool,
        GoalType::PickTwo,
        GoalType::LookInLight,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GoalType::PickAndPlace => "pick_and_place",
            GoalType::PickClean => "pick_clean_then_place",
            GoalType::PickHeat => "pick_heat_then_place",
            GoalType::PickCool => "pick_cool_then_place",
            GoalType::PickTwo => "pick_two_and_place",
            GoalType::LookInLight => "look_at_obj_in_light",
        }
    }

    pub fn from_name(s: &str) -> Option<GoalType> {
        GoalType::ALL.into_iter().find(|g| g.name() == s)
    }

    /// Coarse difficulty order used by the goal-type mutation.
    pub fn rank(self) -> u8 {
        match self {
            GoalType::PickAndPlace => 0,
            GoalType::LookInLight => 1,
            GoalType::PickClean | GoalType::PickHeat | GoalType::PickCool => 2,
            GoalType::PickTwo => 3,
        }
    }

    /// The receptacle kind that cleans / heats / cools.
    fn appliance(self) -> Option<&'static str> {
        match self {
            GoalType::PickClean => Some("sinkbasin"),
            GoalType::PickHeat => Some("microwave"),
            GoalType::PickCool => Some("fridge"),
            _ => None,
        }
    }

    /// The state flag the goal object needs (0: none).
    fn flag(self) -> u8 {
        match self {
            GoalType::PickClean => CLEAN,
            GoalType::PickHeat => HOT,
            GoalType::PickCool => COOL,
            _ => 0,
        }
    }

    fn allows(self, k: &ObjKind) -> bool {
        match self {
            GoalType::PickAndPlace | GoalType::PickTwo => true,
            GoalType::PickClean => k.clean,
            GoalType::PickHeat => k.heat,
            GoalType::PickCool => k.cool,
            GoalType::LookInLight => k.light,
        }
    }

    fn needs(self) -> usize {
        if self == GoalType::PickTwo { 2 } else { 1 }
    }
}

fn default_goal_types() -> Vec<String> {
    GoalType::ALL.iter().map(|g| g.name().to_string()).collect()
}

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
    /// and distractor fewer (the goal still fits), a quarter fewer closed containers and hidden
    /// goal objects, a budget factor × 1.25. The goal types stay.
    pub fn easier(&self) -> HouseholdConfig {
        self.shifted(-1)
    }

    fn shifted(&self, level: i32) -> HouseholdConfig {
        if level < 0 {
            return HouseholdConfig {
                receptacles: self.receptacles.saturating_sub(1).max(1),
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

/// An object and the receptacle it starts in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placed {
    pub name: String,
    pub at: String,
}

/// What the agent must achieve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    /// A [`GoalType`] name.
    #[serde(rename = "type")]
    pub kind: String,
    /// The object kind (`apple`).
    pub object: String,
    /// The receptacle kind (`diningtable`); absent for `look_at_obj_in_light`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// A household task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// `kind N` names.
    pub receptacles: Vec<String>,
    pub objects: Vec<Placed>,
    /// The receptacle the desklamp stands on, if the home has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desklamp: Option<String>,
    pub goal: Goal,
    /// Step budget.
    pub budget: u32,
}

impl Spec {
    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("spec serializes")
    }

    /// Sort receptacles and objects by (kind, number): one spelling per task.
    fn canonicalize(&mut self) {
        self.receptacles.sort_by_key(|r| name_key(r));
        self.objects.sort_by_key(|o| name_key(&o.name));
    }

    fn is_openable(&self, r: &str) -> bool {
        rec_kind(kind_of(r)).is_some_and(|k| k.openable)
    }

    fn is_target(&self, r: &str) -> bool {
        self.goal.target.as_deref() == Some(kind_of(r))
    }

    /// Receptacle kinds present, sorted and deduplicated.
    fn rec_kinds(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .receptacles
            .iter()
            .map(|r| kind_of(r).to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    fn count_objects(&self, kind: &str) -> usize {
        self.objects
            .iter()
            .filter(|o| kind_of(&o.name) == kind)
            .count()
    }

    fn add_object(&mut self, kind: &str, at: String) -> Option<()> {
        let name = next_name(kind, self.objects.iter().map(|o| &o.name))?;
        self.objects.push(Placed { name, at });
        Some(())
    }

    fn add_receptacle(&mut self, kind: &str) -> Option<String> {
        let name = next_name(kind, self.receptacles.iter())?;
        self.receptacles.push(name.clone());
        Some(name)
    }
}

/// The abstract state of an episode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Receptacle the agent is at (`NOWHERE` at the start).
    loc: u8,
    /// Bit r: receptacle r is open (only meaningful for openable receptacles).
    open: u64,
    /// Receptacle of each object, or `HELD`.
    at: Vec<u8>,
    /// CLEAN | HOT | COOL per object.
    flags: Vec<u8>,
    /// The held object (`NOTHING`).
    held: u8,
    lamp_on: bool,
}

/// One command, resolved to indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
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

fn mv(from: u8, to: u8) -> u32 {
    u32::from(from != to)
}

/// A parsed, validated task: the static world plus the planner.
pub struct Task {
    spec: Spec,
    goal: GoalType,
    rec_names: Vec<String>,
    /// Bit r: receptacle r can be opened.
    openable: u64,
    /// The flag each receptacle applies (`CLEAN` at a sinkbasin, ...; 0 elsewhere).
    process: Vec<u8>,
    is_target: Vec<bool>,
    targets: Vec<u8>,
    /// Receptacles that apply the goal's flag.
    appliances: Vec<u8>,
    obj_names: Vec<String>,
    is_goal_obj: Vec<bool>,
    goal_objs: Vec<u8>,
    /// Receptacle of the desklamp (`NOWHERE`: none).
    lamp: u8,
    go_cmds: Vec<String>,
    goal_text: String,
    room_text: String,
    init: State,
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
    fn compile(spec: Spec) -> Result<Task> {
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

    fn closed(&self, s: &State, r: u8) -> bool {
        (self.openable & !s.open) & (1u64 << r) != 0
    }

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

    /// The admissible actions in `s` (unordered).
    fn actions(&self, s: &State, out: &mut Vec<Action>) {
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

    fn command(&self, a: Action) -> String {
        let r = |i: u8| &self.rec_names[i as usize];
        let o = |i: u8| &self.obj_names[i as usize];
        match a {
            Action::Go(x) => self.go_cmds[x as usize].clone(),
            Action::Open(x) => format!("open {}", r(x)),
            Action::Close(x) => format!("close {}", r(x)),
            Action::Take(i, x) => format!("take {} from {}", o(i), r(x)),
            Action::Put(i, x) => format!("put {} in/on {}", o(i), r(x)),
            Action::Process(i, x) => {
                let verb = match self.process[x as usize] {
                    CLEAN => "clean",
                    HOT => "heat",
                    _ => "cool",
                };
                format!("{verb} {} with {}", o(i), r(x))
            }
            Action::UseLamp => "use desklamp 1".to_string(),
            Action::ExamineRec(x) => format!("examine {}", r(x)),
            Action::ExamineObj(i) => format!("examine {}", o(i)),
            Action::Look => "look".to_string(),
            Action::Inventory => "inventory".to_string(),
        }
    }

    /// The admissible commands in `s`, sorted, with their actions.
    fn admissible(&self, s: &State) -> Vec<(String, Action)> {
        let mut acts = Vec::with_capacity(16);
        self.actions(s, &mut acts);
        let mut v: Vec<(String, Action)> = acts.into_iter().map(|a| (self.command(a), a)).collect();
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Apply an admissible action; false if it changed nothing it was meant to change.
    fn apply(&self, s: &mut State, a: Action) -> bool {
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

    /// `On the desk 1, you see a book 1, and a desklamp 1.` / `The drawer 1 is closed.`
    fn describe(&self, s: &State, r: u8, out: &mut String) {
        let name = &self.rec_names[r as usize];
        if self.openable & (1 << r) != 0 {
            if self.closed(s, r) {
                let _ = write!(out, "The {name} is closed.");
                return;
            }
            let _ = write!(out, "The {name} is open. In it, you see ");
        } else {
            let _ = write!(out, "On the {name}, you see ");
        }
        let objs = (0..s.at.len())
            .filter(|&o| s.at[o] == r)
            .map(|o| self.obj_names[o].as_str());
        let lamp = (self.lamp == r).then_some("desklamp 1");
        list(objs.chain(lamp), out);
        out.push('.');
    }

    /// The feedback of action `a` (already applied; `changed` as `apply` returned).
    fn feedback(&self, s: &State, a: Action, changed: bool, out: &mut String) {
        let r = |i: u8| &self.rec_names[i as usize];
        let o = |i: u8| &self.obj_names[i as usize];
        if !changed {
            out.push_str("Nothing happens.");
            return;
        }
        match a {
            Action::Go(x) => {
                let _ = write!(out, "You arrive at {}. ", r(x));
                self.describe(s, x, out);
            }
            Action::Open(x) => {
                let _ = write!(out, "You open the {}. ", r(x));
                self.describe(s, x, out);
            }
            Action::Close(x) => {
                let _ = write!(out, "You close the {}.", r(x));
            }
            Action::Take(i, x) => {
                let _ = write!(out, "You pick up the {} from the {}.", o(i), r(x));
            }
            Action::Put(i, x) => {
                let _ = write!(out, "You put the {} in/on the {}.", o(i), r(x));
            }
            Action::Process(i, x) => {
                let verb = match self.process[x as usize] {
                    CLEAN => "clean",
                    HOT => "heat",
                    _ => "cool",
                };
                let _ = write!(out, "You {verb} the {} using the {}.", o(i), r(x));
            }
            Action::UseLamp => out.push_str("You turn on the desklamp 1."),
            Action::ExamineRec(x) => self.describe(s, x, out),
            Action::ExamineObj(i) => {
                let f = s.flags[i as usize];
                if f == 0 {
                    let _ = write!(out, "There is nothing special about the {}.", o(i));
                } else {
                    let _ = write!(out, "The {} is ", o(i));
                    let words = [(CLEAN, "clean"), (HOT, "hot"), (COOL, "cool")];
                    let mut first = true;
                    for (bit, w) in words {
                        if f & bit != 0 {
                            if !first {
                                out.push_str(" and ");
                            }
                            out.push_str(w);
                            first = false;
                        }
                    }
                    out.push('.');
                }
            }
            Action::Look => {
                if s.loc == NOWHERE {
                    out.push_str(&self.room_text);
                } else {
                    let _ = write!(
                        out,
                        "You are facing the {}. Next to it, you see nothing.",
                        r(s.loc)
                    );
                }
            }
            Action::Inventory => {
                if s.held == NOTHING {
                    out.push_str("You are not carrying anything.");
                } else {
                    let _ = write!(out, "You are carrying: a {}.", o(s.held));
                }
            }
        }
    }
}

/// AlfWorld's listing: `nothing`, `a x`, `a x, and a y`, `a x, a y, and a z`.
fn list<'a>(items: impl Iterator<Item = &'a str> + Clone, out: &mut String) {
    let n = items.clone().count();
    if n == 0 {
        out.push_str("nothing");
    }
    for (i, it) in items.enumerate() {
        if i > 0 {
            out.push_str(if i + 1 == n { ", and " } else { ", " });
        }
        out.push_str("a ");
        out.push_str(it);
    }
}

/// The household environment with its difficulty distribution.
pub struct Household {
    cfg: HouseholdConfig,
}

impl Household {
    pub fn new(cfg: HouseholdConfig) -> Household {
        Household { cfg }
    }

    /// Start an episode (the concrete type; `reset` boxes it).
    pub fn start(&self, spec: &Value) -> Result<HouseholdEpisode> {
        Ok(HouseholdEpisode::new(Task::parse(spec)?))
    }

    /// One random solvable task from the configured distribution.
    fn sample(&self, rng: &mut Rng, goals: &[GoalType]) -> Result<Spec> {
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
        let goals = self.cfg.validate()?;
        let base = Task::parse(spec)?;
        let plan0 = base.plan_length(&base.init).expect("parse checks solvable");
        let slack0 = base.spec.budget - plan0;
        let key0 = difficulty_key(&base, plan0, base.spec.budget);
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
            if s.budget < plan || s == base.spec || out.contains(&s) {
                continue;
            }
            let key = difficulty_key(&t, plan, s.budget);
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

    fn vocabulary(&self) -> Vec<String> {
        let mut v: Vec<String> = WORDS.iter().map(|w| w.to_string()).collect();
        v.extend(WORDS.iter().map(|w| w.to_lowercase()));
        v.extend(RECEPTACLES.iter().map(|k| k.name.to_string()));
        v.extend(OBJECTS.iter().map(|k| k.name.to_string()));
        v.extend((1..=MAX_NUMBER).map(|i| i.to_string()));
        v.sort();
        v.dedup();
        v
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
    use std::collections::{HashSet, VecDeque};

    use super::*;

    fn env() -> Household {
        Household::new(HouseholdConfig::default())
    }

    fn plan_of(v: &Value) -> u32 {
        let t = Task::parse(v).unwrap();
        t.plan_length(&t.init).unwrap()
    }

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

    #[test]
    fn reset_shows_goal_and_alfworld_feedback() {
        let spec = serde_json::json!({
            "receptacles": ["countertop 1", "diningtable 1", "fridge 1", "sinkbasin 1"],
            "objects": [{"name": "apple 1", "at": "fridge 1"}, {"name": "mug 2", "at": "countertop 1"}],
            "goal": {"type": "pick_clean_then_place", "object": "apple", "target": "diningtable"},
            "budget": 9
        });
        let e = env();
        let mut ep = e.reset(&spec).unwrap();
        assert_eq!(
            ep.observation().text,
            "You are in the middle of a room. Looking quickly around you, you see a countertop 1, \
             a diningtable 1, a fridge 1, and a sinkbasin 1.\n\nYour task is to: put a clean \
             apple in diningtable."
        );
        assert_eq!(
            ep.observation().admissible,
            [
                "go to countertop 1",
                "go to diningtable 1",
                "go to fridge 1",
                "go to sinkbasin 1",
                "inventory",
                "look"
            ]
        );
        let script = [
            (
                "go to countertop 1",
                "You arrive at countertop 1. On the countertop 1, you see a mug 2.",
                -1,
            ),
            (
                "go to fridge 1",
                "You arrive at fridge 1. The fridge 1 is closed.",
                1,
            ),
            (
                "open fridge 1",
                "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1.",
                1,
            ),
            (
                "take apple 1 from fridge 1",
                "You pick up the apple 1 from the fridge 1.",
                1,
            ),
            (
                "cool apple 1 with fridge 1",
                "You cool the apple 1 using the fridge 1.",
                -1,
            ),
            ("cool apple 1 with fridge 1", "Nothing happens.", -1),
            ("inventory", "You are carrying: a apple 1.", -1),
            (
                "look",
                "You are facing the fridge 1. Next to it, you see nothing.",
                -1,
            ),
            ("close fridge 1", "You close the fridge 1.", -1),
        ];
        for (k, (a, text, oracle)) in script.into_iter().enumerate() {
            let st = ep.step(a).unwrap();
            assert_eq!(ep.observation().text, text, "{a}");
            assert_eq!(st.oracle_progress, Some(oracle), "{a}");
            assert_eq!(st.done, k == 8, "{a}");
            assert!(!st.won);
        }
        assert!(ep.step("look").is_err(), "stepped past the budget");

        let mut ep = e.start(&spec).unwrap();
        for a in [
            "go to fridge 1",
            "open fridge 1",
            "take apple 1 from fridge 1",
            "inventory",
            "examine apple 1",
            "go to sinkbasin 1",
        ] {
            ep.step(a).unwrap();
        }
        assert_eq!(
            ep.observation().admissible,
            [
                "clean apple 1 with sinkbasin 1",
                "examine apple 1",
                "examine sinkbasin 1",
                "go to countertop 1",
                "go to diningtable 1",
                "go to fridge 1",
                "inventory",
                "look",
                "put apple 1 in/on sinkbasin 1"
            ]
        );
        let st = ep.step("clean apple 1 with sinkbasin 1").unwrap();
        assert_eq!(
            ep.observation().text,
            "You clean the apple 1 using the sinkbasin 1."
        );
        assert_eq!(st.oracle_progress, Some(1));
        // Out of budget before the goal: lost.
        let st = ep.step("examine apple 1").unwrap();
        assert_eq!(ep.observation().text, "The apple 1 is clean.");
        assert!(!st.done);
        let st = ep.step("look").unwrap();
        assert!(st.done && !st.won, "out of budget: lost");

        // The planner's plan wins within the same budget.
        let mut ep = e.start(&spec).unwrap();
        let mut taken = Vec::new();
        loop {
            let c = ep.task().next_command(ep.state()).unwrap();
            taken.push(c.clone());
            if ep.step(&c).unwrap().done {
                break;
            }
        }
        assert_eq!(
            taken,
            [
                "go to fridge 1",
                "open fridge 1",
                "take apple 1 from fridge 1",
                "go to sinkbasin 1",
                "clean apple 1 with sinkbasin 1",
                "go to diningtable 1",
                "put apple 1 in/on diningtable 1"
            ]
        );
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

    fn levels() -> Vec<(&'static str, HouseholdConfig)> {
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

    #[test]
    fn vocabulary_covers_observations_and_commands() {
        let e = env();
        let vocab: HashSet<String> = e.vocabulary().into_iter().collect();
        let mut sorted = e.vocabulary();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, e.vocabulary());
        let check = |text: &str| {
            for w in text.split_whitespace() {
                let w = w.trim_end_matches(['.', ',', ':']);
                assert!(
                    w.is_empty() || vocab.contains(w),
                    "{w:?} missing (in {text:?})"
                );
            }
        };
        for (i, v) in e.generate(9, 30).unwrap().iter().enumerate() {
            let mut rng = Rng::new(i as u64);
            let mut ep = e.reset(v).unwrap();
            check(&ep.observation().text);
            loop {
                let adm = ep.observation().admissible.clone();
                adm.iter().for_each(|c| check(c));
                let st = ep.step(pick(&mut rng, &adm).unwrap()).unwrap();
                check(&ep.observation().text);
                if st.done {
                    break;
                }
            }
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
