//! `[env.textworld]`: the game families, their difficulty levels and the section's keys.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::Checks;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `tw-make custom`: rooms, objects and a quest of a given length.
    Custom,
    /// `tw-make tw-cooking` (First TextWorld Problems): gather ingredients, prepare, eat.
    Cooking,
}

/// Difficulty levels, each a preset of the family's generator knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// custom 2 rooms / 4 objects / quest 2; cooking recipe 1, take 1, 1 room (2–5 steps).
    Easy,
    /// custom 6 / 10 / 6; cooking recipe 2, take 2, 6 rooms, open and cook (4–13 steps).
    Medium,
    /// custom 10 / 20 / 10; cooking recipe 3, take 3, 9 rooms, open, cook, cut, drop (≤ ~46).
    Hard,
}

impl Level {
    pub(super) fn shifted(self, by: i32) -> Level {
        let all = [Level::Easy, Level::Medium, Level::Hard];
        let i = all.iter().position(|l| *l == self).unwrap_or(0) as i32 + by;
        all[i.clamp(0, 2) as usize]
    }
}

/// `[env.textworld]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TextWorldConfig {
    /// `custom` or `cooking`.
    pub family: Family,
    /// `easy`, `medium` or `hard`: the knobs' presets.
    pub level: Level,
    /// Knob overrides (0: the level's preset). custom: rooms, objects, quest length.
    pub world_size: u32,
    pub nb_objects: u32,
    pub quest_length: u32,
    /// cooking: ingredients in the recipe, ingredients to find, rooms (1, 6, 9 or 12).
    pub recipe: u32,
    pub take: u32,
    pub go: u32,
    /// Step budget = ceil(budget_factor × the walkthrough's length) (capped by `env.max_steps`).
    pub budget_factor: f64,
    /// Bridge processes: games generated at once, and the processes a stage's episodes are
    /// spread over (each serves many episodes).
    pub generation_workers: u32,
    /// The Python that has TextWorld (`pip install textworld==1.7.0`).
    pub python: String,
    /// Where games are kept ("": `$RLA_PIPE_TEXTWORLD_CACHE`, else `~/.cache/rla-pipe/textworld`).
    pub cache_dir: String,
    /// Seconds a bridge call may take (generating a hard game takes several).
    pub timeout_secs: f64,
}

impl Default for TextWorldConfig {
    fn default() -> Self {
        TextWorldConfig {
            family: Family::Custom,
            level: Level::Easy,
            world_size: 0,
            nb_objects: 0,
            quest_length: 0,
            recipe: 0,
            take: 0,
            go: 0,
            budget_factor: 2.0,
            generation_workers: 2,
            python: "python3".into(),
            cache_dir: String::new(),
            timeout_secs: 120.0,
        }
    }
}

impl TextWorldConfig {
    /// The section's checks (keys `env.textworld.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            self.budget_factor >= 1.0 && self.budget_factor <= 100.0,
            "env.textworld.budget_factor",
            "must be in [1, 100]",
        );
        c.check(
            (1..=64).contains(&self.generation_workers),
            "env.textworld.generation_workers",
            "must be in [1, 64]",
        );
        c.check(
            !self.python.trim().is_empty(),
            "env.textworld.python",
            "must name a Python interpreter",
        );
        c.check(
            self.timeout_secs > 0.0 && self.timeout_secs <= 3600.0,
            "env.textworld.timeout_secs",
            "must be in (0, 3600]",
        );
        c.check(
            self.go == 0 || [1, 6, 9, 12].contains(&self.go),
            "env.textworld.go",
            "must be 1, 6, 9 or 12 (TextWorld's cooking maps)",
        );
        c.check(
            self.take <= self.recipe.max(self.preset_knob("recipe")),
            "env.textworld.take",
            "must not exceed the recipe's ingredients",
        );
    }

    /// One level harder (the OOD evaluation set). A knob the config sets stays set, one step
    /// harder and at least the harder level's preset (a longer quest by one, two more objects,
    /// one more room; one more ingredient in the recipe or to find, the next map): with
    /// `quest_length = 3` on easy, OOD games have quests of 6 (medium's), and with 8, of 9.
    pub fn harder(&self) -> TextWorldConfig {
        self.shifted(1)
    }

    /// One level easier (where `pretrain` draws its demonstrations): the mirror of
    /// [`Self::harder`], never below a knob's least value.
    pub fn easier(&self) -> TextWorldConfig {
        self.shifted(-1)
    }

    fn shifted(&self, by: i32) -> TextWorldConfig {
        let mut c = TextWorldConfig {
            level: self.level.shifted(by),
            ..self.clone()
        };
        let up = by > 0;
        let target = c.clone();
        // (knob, its step, least value) as the procedural adapter moves them.
        let knob = |set: u32, name: &str, step: u32, least: u32| -> u32 {
            if set == 0 {
                return 0;
            }
            let preset = target.preset_knob(name);
            if up {
                (set + step).max(preset)
            } else {
                set.saturating_sub(step).max(least).min(preset.max(least))
            }
        };
        c.world_size = knob(self.world_size, "world_size", 1, 1);
        c.nb_objects = knob(self.nb_objects, "nb_objects", 2, 0);
        c.quest_length = knob(self.quest_length, "quest_length", 1, 1);
        c.recipe = knob(self.recipe, "recipe", 1, 1);
        c.take = knob(self.take, "take", 1, 1);
        if self.go > 0 {
            const GOS: [u32; 4] = [1, 6, 9, 12];
            let i = GOS.iter().position(|g| *g == self.go).unwrap_or(0);
            let next = if up {
                GOS[(i + 1).min(3)]
            } else {
                GOS[i.saturating_sub(1)]
            };
            let preset = target.preset_knob("go");
            c.go = if up {
                next.max(preset)
            } else {
                next.min(preset)
            };
        }
        // Never more ingredients to find than the recipe has.
        let recipe = c.knob("recipe", c.recipe);
        if c.take > recipe {
            c.take = recipe;
        }
        c
    }

    pub(super) fn preset_knob(&self, knob: &str) -> u32 {
        let l = self.level as usize;
        match knob {
            "world_size" => [2, 6, 10][l],
            "nb_objects" => [4, 10, 20][l],
            "quest_length" => [2, 6, 10][l],
            "recipe" => [1, 2, 3][l],
            "take" => [1, 2, 3][l],
            "go" => [1, 6, 9][l],
            _ => 0,
        }
    }

    pub(super) fn knob(&self, knob: &str, set: u32) -> u32 {
        if set > 0 { set } else { self.preset_knob(knob) }
    }

    /// The spec of a game of this level with `seed`.
    pub(super) fn spec(&self, seed: u64) -> Value {
        match self.family {
            Family::Custom => json!({
                "family": "custom",
                "world_size": self.knob("world_size", self.world_size),
                "nb_objects": self.knob("nb_objects", self.nb_objects),
                "quest_length": self.knob("quest_length", self.quest_length),
                "seed": seed,
                "budget_factor": self.budget_factor,
            }),
            Family::Cooking => {
                let l = self.level;
                json!({
                    "family": "cooking",
                    "recipe": self.knob("recipe", self.recipe),
                    "take": self.knob("take", self.take),
                    "go": self.knob("go", self.go),
                    "open": l >= Level::Medium,
                    "cook": l >= Level::Medium,
                    "cut": l >= Level::Hard,
                    "drop": l >= Level::Hard,
                    "seed": seed,
                    "budget_factor": self.budget_factor,
                })
            }
        }
    }

    pub(super) fn cache(&self) -> PathBuf {
        if !self.cache_dir.is_empty() {
            return PathBuf::from(&self.cache_dir);
        }
        if let Some(dir) = std::env::var_os("RLA_PIPE_TEXTWORLD_CACHE") {
            return PathBuf::from(dir);
        }
        let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
        home.join(".cache").join("rla-pipe").join("textworld")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quest(c: &TextWorldConfig) -> u64 {
        c.spec(1)["quest_length"].as_u64().unwrap()
    }

    /// Without overrides the OOD and warm-start sets are the neighbouring levels' presets, as
    /// before; an overridden knob stays at least one step harder (easier) than training.
    #[test]
    fn ood_stays_harder_and_the_warm_start_easier_whatever_the_knobs() {
        let easy = TextWorldConfig::default();
        assert_eq!(easy.harder().level, Level::Medium);
        assert_eq!(easy.harder().quest_length, 0, "presets stay presets");
        assert_eq!(quest(&easy.harder()), 6);
        for (set, ood, warm) in [(3, 6, 2), (8, 9, 2), (1, 6, 1)] {
            let c = TextWorldConfig {
                quest_length: set,
                ..TextWorldConfig::default()
            };
            assert_eq!(quest(&c), set as u64);
            assert_eq!(quest(&c.harder()), ood, "quest_length = {set}");
            assert_eq!(quest(&c.easier()), warm, "quest_length = {set}");
            assert!(quest(&c.harder()) > quest(&c) || set >= 30);
        }
        let hard = TextWorldConfig {
            level: Level::Hard,
            quest_length: 10,
            world_size: 10,
            ..TextWorldConfig::default()
        };
        assert_eq!((quest(&hard.harder()), hard.harder().world_size), (11, 11));
        let cooking = TextWorldConfig {
            family: Family::Cooking,
            recipe: 2,
            take: 2,
            go: 6,
            ..TextWorldConfig::default()
        };
        let knobs = |c: &TextWorldConfig| {
            let spec = c.spec(1);
            ["recipe", "take", "go"].map(|k| spec[k].as_u64().unwrap())
        };
        assert_eq!(knobs(&cooking.harder()), [3, 3, 9]);
        assert_eq!(knobs(&cooking.easier()), [1, 1, 1]);
    }
}
