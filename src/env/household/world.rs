//! The static world: the receptacle and object kinds, their `kind N` names, the goal types
//! and the task spec.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::determinism::Rng;
use crate::error::Error;

/// AlfWorld's listing: `nothing`, `a x`, `a x, and a y`, `a x, a y, and a z`.
pub(super) fn list<'a>(items: impl Iterator<Item = &'a str> + Clone, out: &mut String) {
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

/// "Infinitely many steps" in the planner (summing a few of them cannot overflow).
pub(super) const INF: u32 = u32::MAX / 8;

/// Largest instance number of a receptacle or object kind (`cabinet 20`).
pub const MAX_NUMBER: u32 = 20;
/// Most receptacles in a home (the open state is a 64-bit mask).
pub const MAX_RECEPTACLES: usize = 48;
/// Most objects in a home.
pub const MAX_OBJECTS: usize = 48;

pub(super) const CLEAN: u8 = 1;
pub(super) const HOT: u8 = 2;
pub(super) const COOL: u8 = 4;

pub(super) struct ObjKind {
    pub(super) name: &'static str,
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
pub(super) const OBJECTS: &[ObjKind] = &[
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

pub(super) struct RecKind {
    pub(super) name: &'static str,
    /// Can be opened and closed (starts closed).
    pub(super) openable: bool,
    /// Most instances the generator puts in a home.
    pub(super) max: u32,
}

const fn rec(name: &'static str, openable: bool, max: u32) -> RecKind {
    RecKind {
        name,
        openable,
        max,
    }
}

pub(super) const RECEPTACLES: &[RecKind] = &[
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
pub(super) const LAMP_HOLDERS: &[&str] = &["desk", "dresser", "sidetable"];
/// Closed containers the mutations add.
pub(super) const CONTAINERS: &[&str] = &["cabinet", "drawer", "safe"];

pub(super) fn obj_kind(name: &str) -> Option<&'static ObjKind> {
    OBJECTS.iter().find(|k| k.name == name)
}

pub(super) fn rec_kind(name: &str) -> Option<&'static RecKind> {
    RECEPTACLES.iter().find(|k| k.name == name)
}

/// The kind of a `kind N` name.
pub(super) fn kind_of(name: &str) -> &str {
    name.split_once(' ').map_or(name, |(k, _)| k)
}

/// `kind N` → (kind, N), N in 1..=MAX_NUMBER written without leading zeros.
pub(super) fn split_name(name: &str) -> Option<(&str, u32)> {
    let (k, n) = name.split_once(' ')?;
    let num: u32 = n.parse().ok()?;
    ((1..=MAX_NUMBER).contains(&num) && num.to_string() == n && !k.is_empty()).then_some((k, num))
}

/// The next free `kind N` among `names` (None if N would exceed MAX_NUMBER).
pub(super) fn next_name<'a>(kind: &str, names: impl Iterator<Item = &'a String>) -> Option<String> {
    let max = names
        .filter_map(|n| split_name(n))
        .filter(|(k, _)| *k == kind)
        .map(|(_, n)| n)
        .max()
        .unwrap_or(0);
    (max < MAX_NUMBER).then(|| format!("{kind} {}", max + 1))
}

pub(super) fn name_key(name: &str) -> (String, u32) {
    split_name(name).map_or((name.to_string(), 0), |(k, n)| (k.to_string(), n))
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
    pub(super) fn appliance(self) -> Option<&'static str> {
        match self {
            GoalType::PickClean => Some("sinkbasin"),
            GoalType::PickHeat => Some("microwave"),
            GoalType::PickCool => Some("fridge"),
            _ => None,
        }
    }

    /// The state flag the goal object needs (0: none).
    pub(super) fn flag(self) -> u8 {
        match self {
            GoalType::PickClean => CLEAN,
            GoalType::PickHeat => HOT,
            GoalType::PickCool => COOL,
            _ => 0,
        }
    }

    pub(super) fn allows(self, k: &ObjKind) -> bool {
        match self {
            GoalType::PickAndPlace | GoalType::PickTwo => true,
            GoalType::PickClean => k.clean,
            GoalType::PickHeat => k.heat,
            GoalType::PickCool => k.cool,
            GoalType::LookInLight => k.light,
        }
    }

    pub(super) fn needs(self) -> usize {
        if self == GoalType::PickTwo { 2 } else { 1 }
    }
}

pub(super) fn default_goal_types() -> Vec<String> {
    GoalType::ALL.iter().map(|g| g.name().to_string()).collect()
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
    pub(super) fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("spec serializes")
    }

    /// Sort receptacles and objects by (kind, number): one spelling per task.
    pub(super) fn canonicalize(&mut self) {
        self.receptacles.sort_by_key(|r| name_key(r));
        self.objects.sort_by_key(|o| name_key(&o.name));
    }

    pub(super) fn is_openable(&self, r: &str) -> bool {
        rec_kind(kind_of(r)).is_some_and(|k| k.openable)
    }

    pub(super) fn is_target(&self, r: &str) -> bool {
        self.goal.target.as_deref() == Some(kind_of(r))
    }

    /// Receptacle kinds present, sorted and deduplicated.
    pub(super) fn rec_kinds(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .receptacles
            .iter()
            .map(|r| kind_of(r).to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub(super) fn count_objects(&self, kind: &str) -> usize {
        self.objects
            .iter()
            .filter(|o| kind_of(&o.name) == kind)
            .count()
    }

    pub(super) fn add_object(&mut self, kind: &str, at: String) -> Option<()> {
        let name = next_name(kind, self.objects.iter().map(|o| &o.name))?;
        self.objects.push(Placed { name, at });
        Some(())
    }

    pub(super) fn add_receptacle(&mut self, kind: &str) -> Option<String> {
        let name = next_name(kind, self.receptacles.iter())?;
        self.receptacles.push(name.clone());
        Some(name)
    }
}

pub(super) fn err(msg: impl std::fmt::Display) -> Error {
    Error::Environment(format!("household: {msg}"))
}

pub(super) fn pick<'a, T>(rng: &mut Rng, v: &'a [T]) -> Option<&'a T> {
    (!v.is_empty()).then(|| &v[(rng.next_u64() % v.len() as u64) as usize])
}
