//! The text: command names, observations and feedback in AlfWorld's words, and the
//! vocabulary they are written in.

use std::fmt::Write as _;

use super::task::{Action, NOTHING, NOWHERE, State, Task};
use super::world::{CLEAN, COOL, HOT, MAX_NUMBER, OBJECTS, RECEPTACLES, list};

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

impl Task {
    pub(super) fn command(&self, a: Action) -> String {
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
    pub(super) fn feedback(&self, s: &State, a: Action, changed: bool, out: &mut String) {
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

/// Every word of the observations and commands (`Environment::vocabulary`).
pub(super) fn vocabulary() -> Vec<String> {
    let mut v: Vec<String> = WORDS.iter().map(|w| w.to_string()).collect();
    v.extend(WORDS.iter().map(|w| w.to_lowercase()));
    v.extend(RECEPTACLES.iter().map(|k| k.name.to_string()));
    v.extend(OBJECTS.iter().map(|k| k.name.to_string()));
    v.extend((1..=MAX_NUMBER).map(|i| i.to_string()));
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::determinism::Rng;
    use crate::env::household::tests::env;
    use crate::env::household::world::pick;
    use crate::env::{Environment, Episode};

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
}
