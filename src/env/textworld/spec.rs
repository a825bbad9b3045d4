//! A task's game spec: parsed, checked and keyed by the game it makes.

use serde_json::{Value, json};

use crate::determinism::canonical;
use crate::error::{Error, Result};

/// TextWorld's generators take seeds below this.
pub(super) const SEED_RANGE: u64 = 1 << 31;
/// Seeds tried per task before giving up (a quest cannot always be generated).
pub(super) const SEED_TRIES: u64 = 8;

/// A checked game spec.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GameSpec(pub(super) Value);

impl GameSpec {
    pub(super) fn parse(v: &Value) -> Result<GameSpec> {
        let bad = |m: String| Error::Environment(format!("textworld task {v}: {m}"));
        let o = v
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let uint = |k: &str, lo: u64, hi: u64| -> Result<u64> {
            o.get(k)
                .and_then(Value::as_u64)
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| bad(format!("`{k}` must be an integer in [{lo}, {hi}]")))
        };
        let flag = |k: &str| -> Result<bool> {
            o.get(k)
                .and_then(Value::as_bool)
                .ok_or_else(|| bad(format!("`{k}` must be true or false")))
        };
        let factor = o
            .get("budget_factor")
            .and_then(Value::as_f64)
            .filter(|f| (1.0..=100.0).contains(f))
            .ok_or_else(|| bad("`budget_factor` must be a number in [1, 100]".into()))?;
        let seed = uint("seed", 0, SEED_RANGE - 1)?;
        let family = o.get("family").and_then(Value::as_str).unwrap_or("");
        let spec = match family {
            "custom" => json!({
                "family": "custom",
                "world_size": uint("world_size", 1, 20)?,
                "nb_objects": uint("nb_objects", 0, 60)?,
                "quest_length": uint("quest_length", 1, 30)?,
                "seed": seed,
                "budget_factor": factor,
            }),
            "cooking" => {
                let recipe = uint("recipe", 1, 5)?;
                let take = uint("take", 0, recipe)?;
                let go = uint("go", 1, 12)?;
                if ![1, 6, 9, 12].contains(&go) {
                    return Err(bad("`go` must be 1, 6, 9 or 12".into()));
                }
                json!({
                    "family": "cooking", "recipe": recipe, "take": take, "go": go,
                    "open": flag("open")?, "cook": flag("cook")?, "cut": flag("cut")?,
                    "drop": flag("drop")?, "seed": seed, "budget_factor": factor,
                })
            }
            _ => return Err(bad("`family` must be \"custom\" or \"cooking\"".into())),
        };
        let mut spec = spec;
        if let Some(g) = o.get("game") {
            let ok = g
                .as_str()
                .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
            let d = ok.ok_or_else(|| {
                bad("`game` must be the game files' blake3 (64 hex digits)".into())
            })?;
            spec["game"] = json!(d);
        }
        let known = spec.as_object().map_or(0, |s| s.len());
        if o.len() != known {
            return Err(bad(format!(
                "unknown keys (a {family} spec has exactly {known})"
            )));
        }
        Ok(GameSpec(spec))
    }

    /// What decides the game's files (the spec less its budget factor and digest): the cache
    /// key.
    pub(super) fn key(&self) -> String {
        let mut game = self.0.clone();
        if let Some(o) = game.as_object_mut() {
            o.remove("budget_factor");
            o.remove("game");
        }
        blake3::hash(canonical(&game).as_bytes()).to_hex()[..16].to_string()
    }

    pub(super) fn with(&self, knob: &str, value: Value, seed: u64) -> GameSpec {
        let mut v = self.0.clone();
        v[knob] = value;
        v["seed"] = json!(seed);
        if let Some(o) = v.as_object_mut() {
            o.remove("game");
        }
        GameSpec(v)
    }
}
