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

    /// One level harder (the OOD evaluation set); knob overrides stay.
    pub fn harder(&self) -> TextWorldConfig {
        TextWorldConfig {
            level: self.level.shifted(1),
            ..self.clone()
        }
    }

    /// One level easier (where `pretrain` draws its demonstrations).
    pub fn easier(&self) -> TextWorldConfig {
        TextWorldConfig {
            level: self.level.shifted(-1),
            ..self.clone()
        }
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
