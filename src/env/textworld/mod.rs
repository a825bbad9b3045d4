//! `textworld`: Microsoft TextWorld's generated text games (the engine AlfWorld is built on),
//! played through a bridge process rla-pipe starts and owns.
//!
//! A task is a game spec: the family (`custom`: `tw-make custom`'s world size, object count and
//! quest length; `cooking`: First TextWorld Problems' recipe, ingredients to find, rooms and
//! skills), the generator's seed and the step-budget factor:
//! `{"family":"custom","world_size":2,"nb_objects":4,"quest_length":2,"seed":S,"budget_factor":2.0,"game":DIGEST}`.
//! The game files (`game.z8` and the `game.json` that must sit beside it) are made once per spec
//! by TextWorld's own generator and kept in a cache (`env.textworld.cache_dir`, one directory
//! per spec with the files' blake3). Generated tasks name their files' blake3 (`game`), and the
//! stages that introduce tasks hand their games to the engine as assets
//! ([`Environment::asset`]: spec and files, zstd-compressed), which it keeps in the store with
//! the run; a stage installs the run's committed games into the cache before it plays, so a
//! resumed run, `replay`, a branch or a cluster worker plays the committed files even on a
//! machine without the cache. That matters: `custom` games are a function of the spec and
//! TextWorld's version (the bridge sets the story file's date-stamped serial number to a
//! constant), but `cooking` games are not byte-reproducible when made again. A game made again
//! anyway (a spec not in the store) must arrive at the digest its task names, or the task is
//! refused with both digests named (`game` is optional in specs an LLM adapter proposes).
//!
//! The bridge (`textworld_bridge.py`, embedded in the binary and written beside the cache)
//! speaks the external environment's JSON lines ([`super::external`]) plus `make` (generate a
//! game into a directory) and the `planner` field (TextWorld's `policy_commands[0]`). The
//! oracle is TextWorld's remaining optimal plan: +1 when a step shortened it (or won), −1
//! otherwise. Observations are cleaned as AlfWorld's wrappers do (no banner, prompt, status bar
//! or score messages). A hung, crashed or flooding bridge gets the external environment's
//! errors.
//!
//! Difficulty: three levels per family ([`Level`]); held-out tasks are unseen seeds of the same
//! level, the OOD set the next level, `pretrain` the previous level. The procedural adapter moves
//! one knob of a task (harder: a longer quest, more objects or rooms, more ingredients or
//! skills; easier: the opposite) and regenerates the game.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use super::external::{ExternalConfig, Shown};
use crate::determinism::derive_seed;
use crate::error::{Error, Result};

/// The bridge's source, written next to the game cache at first use.
const BRIDGE: &str = include_str!("../textworld_bridge.py");
/// The small transformer's words: every word of TextWorld 1.7.0's grammars and cooking data plus
/// its command verbs (the bridge's `vocabulary` op wrote this file; fixed, so a model's shape
/// does not depend on the installed TextWorld).
const VOCABULARY: &str = include_str!("../textworld_vocab.txt");

/// Game families.
mod bridge;
mod config;
mod games;
mod spec;

use bridge::Bridges;
pub use config::{Family, Level, TextWorldConfig};
use games::{bundle, bundle_digest, cached_digest, place, read_game, unbundle};
use spec::{GameSpec, SEED_RANGE, SEED_TRIES};

/// The environment.
pub struct TextWorld {
    cfg: TextWorldConfig,
    bridges: Arc<Bridges>,
    episodes: AtomicU64,
    cache: PathBuf,
    /// The bridge's script (named by its content's hash) and whether it was written.
    script: PathBuf,
    written: OnceLock<std::result::Result<(), String>>,
}

impl TextWorld {
    pub fn new(cfg: TextWorldConfig) -> TextWorld {
        let cache = cfg.cache();
        let script = cache.join(format!(
            "bridge-{}.py",
            &blake3::hash(BRIDGE.as_bytes()).to_hex()[..12]
        ));
        let bridges = Arc::new(Bridges {
            cfg: ExternalConfig {
                name: "textworld".into(),
                command: vec![cfg.python.clone(), script.display().to_string()],
                timeout_secs: cfg.timeout_secs,
                max_line_bytes: 16 << 20,
            },
            timeout: Duration::from_secs_f64(cfg.timeout_secs),
            slots: (0..cfg.generation_workers.max(1))
                .map(|_| Mutex::new(None))
                .collect(),
        });
        TextWorld {
            cfg,
            bridges,
            episodes: AtomicU64::new(0),
            cache,
            script,
            written: OnceLock::new(),
        }
    }

    /// Writes the bridge's script beside the cache (once per build of it).
    fn ready(&self) -> Result<()> {
        let r = self.written.get_or_init(|| {
            if self.script.exists() {
                return Ok(());
            }
            let tmp = self
                .script
                .with_extension(format!("py.{}", std::process::id()));
            std::fs::create_dir_all(&self.cache)
                .and_then(|_| std::fs::write(&tmp, BRIDGE))
                .and_then(|_| std::fs::rename(&tmp, &self.script))
                .map_err(|e| format!("{}: {e}", self.script.display()))
        });
        r.clone().map_err(|e| {
            Error::Environment(format!(
                "textworld: cannot write the bridge script (env.textworld.cache_dir): {e}"
            ))
        })
    }

    fn call(&self, k: usize, request: Value) -> Result<Value> {
        self.ready()?;
        self.bridges.call(k, &request)
    }

    /// The directory of a spec's game and the game's digest: made if it is not in the cache
    /// (or its files do not match the digest recorded with them); a spec that names a digest
    /// gets that game or an error.
    fn game(&self, spec: &GameSpec, bridge: usize) -> Result<(PathBuf, String)> {
        let (dir, digest) = self.make(spec, bridge)?;
        match spec.0.get("game").and_then(Value::as_str) {
            Some(want) if want != digest => Err(Error::Environment(format!(
                "textworld: the game of {} is {digest} here, but the task names {want} (another TextWorld version made it? this build expects textworld==1.7.0; game cache {})",
                spec.0,
                dir.display()
            ))),
            _ => Ok((dir, digest)),
        }
    }

    fn make(&self, spec: &GameSpec, bridge: usize) -> Result<(PathBuf, String)> {
        let key = spec.key();
        let dir = self.cache.join("games").join(&key);
        if let Some(d) = cached_digest(&dir)
            && bundle_digest(&dir).ok().as_deref() == Some(d.as_str())
        {
            return Ok((dir, d));
        }
        // Incomplete or altered: made again (a directory in the way would keep the rename
        // below from placing the new files).
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        self.ready()?;
        let tmp = self.tmp_dir(&key);
        let made = self.call(bridge, json!({"op": "make", "spec": spec.0, "dir": tmp}));
        let made = made.map_err(|e| {
            let _ = std::fs::remove_dir_all(&tmp);
            Error::Environment(format!(
                "textworld: making the game of {}: {}",
                spec.0,
                e.detail()
            ))
        })?;
        let files = made["files"].as_array().map_or(0, Vec::len);
        let fs_err = |e: std::io::Error| {
            Error::Environment(format!("textworld: game cache {}: {e}", tmp.display()))
        };
        if files != 2 {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(Error::Environment(format!(
                "textworld: making {} wrote {files} of game.z8 and game.json",
                spec.0
            )));
        }
        let digest = bundle_digest(&tmp).map_err(fs_err)?;
        let _ = std::fs::remove_file(tmp.join("game.ni"));
        // Another thread or process that made it first keeps theirs.
        match place(&tmp, &dir, &digest).map_err(fs_err)? {
            Some(d) => Ok((dir, d)),
            None => Err(Error::Environment(format!(
                "textworld: cannot move a made game into {}",
                dir.display()
            ))),
        }
    }

    /// A fresh temporary directory for the game of cache key `key`, private to this process
    /// and thread, beside the cache's games (so a rename puts it in place).
    fn tmp_dir(&self, key: &str) -> PathBuf {
        let tmp = self.cache.join("games").join(format!(
            "tmp-{key}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        tmp
    }

    /// Specs of games that can be generated, made in parallel (`generation_workers`).
    fn make_all(&self, specs: Vec<Vec<GameSpec>>) -> Vec<Result<GameSpec>> {
        let workers = (self.cfg.generation_workers as usize).clamp(1, specs.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out: Vec<std::sync::Mutex<Option<Result<GameSpec>>>> =
            specs.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for w in 0..workers {
                let (next, out, specs) = (&next, &out, &specs);
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(tries) = specs.get(i) else { break };
                        let mut last = Err(Error::Environment("no seed to try".into()));
                        for spec in tries {
                            last = self.game(spec, w).map(|(_, digest)| {
                                let mut named = spec.0.clone();
                                named["game"] = json!(digest);
                                GameSpec(named)
                            });
                            if last.is_ok() {
                                break;
                            }
                        }
                        *out[i].lock().expect("slot") = Some(last);
                    }
                });
            }
        });
        out.into_iter()
            .map(|m| m.into_inner().expect("slot").expect("every slot filled"))
            .collect()
    }
}

/// The first line of a game asset (before its spec and files; the whole zstd-compressed).

impl Environment for TextWorld {
    fn name(&self) -> &str {
        "textworld"
    }

    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        let tries = (0..count)
            .map(|i| {
                (0..SEED_TRIES)
                    .map(|t| {
                        let s = derive_seed(seed, &["textworld", &i.to_string(), &t.to_string()]);
                        GameSpec(self.cfg.spec(s % SEED_RANGE))
                    })
                    .collect()
            })
            .collect();
        self.make_all(tries)
            .into_iter()
            .map(|r| r.map(|s| s.0))
            .collect()
    }

    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>> {
        let spec = GameSpec::parse(spec)?;
        let id = self.episodes.fetch_add(1, Ordering::Relaxed);
        let k = (id % self.bridges.slots.len() as u64) as usize;
        let (dir, _) = self.game(&spec, k)?;
        let task = json!({
            "game": dir.join("game.z8"),
            "max_steps": 1000,
            "budget_factor": spec.0["budget_factor"],
        });
        let reply = self.call(k, json!({"op": "reset", "episode": id, "task": task}))?;
        Ok(Box::new(TextWorldEpisode {
            bridges: self.bridges.clone(),
            k,
            id,
            shown: Shown::from_reset(&reply)?,
        }))
    }

    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        _critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        let spec = GameSpec::parse(spec)?;
        let up = direction == Direction::Harder;
        let v = &spec.0;
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let step = |k: &str, by: u64, lo: u64, hi: u64| -> Option<(String, Value)> {
            let x = if up {
                n(k) + by
            } else {
                n(k).saturating_sub(by)
            };
            (x != n(k) && (lo..=hi).contains(&x)).then(|| (k.to_string(), json!(x)))
        };
        let moves: Vec<(String, Value)> = if v["family"] == "custom" {
            [
                step("quest_length", 1, 1, 30),
                step("nb_objects", 2, 0, 60),
                step("world_size", 1, 1, 20),
            ]
            .into_iter()
            .flatten()
            .collect()
        } else {
            let gos = [1u64, 6, 9, 12];
            let gi = gos.iter().position(|g| *g == n("go")).unwrap_or(0);
            let go = if up {
                gos.get(gi + 1)
            } else {
                gi.checked_sub(1).map(|i| &gos[i])
            };
            let mut m: Vec<(String, Value)> = Vec::new();
            if let Some(r) = step("recipe", 1, 1, 5)
                && n("take") <= r.1.as_u64().unwrap_or(0)
            {
                m.push(r);
            }
            if let Some(t) = step("take", 1, 0, n("recipe")) {
                m.push(t);
            }
            if let Some(g) = go {
                m.push(("go".into(), json!(g)));
            }
            for skill in ["open", "cook", "cut", "drop"] {
                if v[skill].as_bool() == Some(!up) {
                    m.push((skill.into(), json!(up)));
                    break;
                }
            }
            m
        };
        let tries: Vec<Vec<GameSpec>> = moves
            .iter()
            .enumerate()
            .map(|(i, (k, x))| {
                (0..2)
                    .map(|t| {
                        let s = derive_seed(
                            seed,
                            &["textworld-mutate", &i.to_string(), &t.to_string()],
                        );
                        spec.with(k, x.clone(), s % SEED_RANGE)
                    })
                    .collect()
            })
            .collect();
        Ok(self
            .make_all(tries)
            .into_iter()
            .filter_map(|r| r.ok().map(|s| s.0))
            .collect())
    }

    fn vocabulary(&self) -> Vec<String> {
        VOCABULARY.lines().map(str::to_string).collect()
    }

    fn asset_id(&self, spec: &Value) -> Option<String> {
        spec.get("game").and_then(Value::as_str).map(str::to_string)
    }

    fn asset(&self, spec: &Value) -> Result<Vec<u8>> {
        let spec = GameSpec::parse(spec)?;
        let want = spec.0["game"].as_str().unwrap_or_default().to_string();
        let dir = self.cache.join("games").join(spec.key());
        match read_game(&dir) {
            Ok((files, here)) if here == want => bundle(&spec, &files).map_err(|e| {
                Error::Environment(format!("textworld: game cache {}: {e}", dir.display()))
            }),
            _ => Err(Error::Environment(format!(
                "textworld: the game of {} is not in the cache {} (or its files changed)",
                spec.0,
                dir.display()
            ))),
        }
    }

    fn missing_assets(&self, ids: &[&str]) -> Vec<String> {
        let games = self.cache.join("games");
        let mut here = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&games).into_iter().flatten().flatten() {
            if let Some(d) = cached_digest(&entry.path()) {
                here.insert(d, entry.path());
            }
        }
        ids.iter()
            .filter(|id| {
                here.get(**id)
                    .is_none_or(|dir| bundle_digest(dir).ok().as_deref() != Some(**id))
            })
            .map(|id| id.to_string())
            .collect()
    }

    fn install_asset(&self, id: &str, bytes: &[u8]) -> Result<()> {
        let bad = |m: String| Error::Environment(format!("textworld: game asset {id}: {m}"));
        let (spec, files) = unbundle(bytes).map_err(bad)?;
        let spec = GameSpec::parse(&spec)?;
        if spec.0["game"].as_str() != Some(id) {
            return Err(bad(format!("its spec names another game: {}", spec.0)));
        }
        let key = spec.key();
        let dir = self.cache.join("games").join(&key);
        let tmp = self.tmp_dir(&key);
        let fs_err = |e: std::io::Error| bad(format!("game cache {}: {e}", tmp.display()));
        std::fs::create_dir_all(&tmp).map_err(fs_err)?;
        for (name, body) in &files {
            std::fs::write(tmp.join(name), body).map_err(fs_err)?;
        }
        let got = bundle_digest(&tmp).map_err(fs_err)?;
        if got != id {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(bad(format!("its files hash to {got}")));
        }
        // What is there under the key (a game made again differently, altered files) gives way
        // to the committed game.
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        if place(&tmp, &dir, id).map_err(fs_err)?.as_deref() != Some(id) {
            return Err(bad(format!("cannot move it into {}", dir.display())));
        }
        Ok(())
    }
}

/// One episode, a session of one bridge process.
struct TextWorldEpisode {
    bridges: Arc<Bridges>,
    k: usize,
    id: u64,
    shown: Shown,
}

impl Drop for TextWorldEpisode {
    /// The bridge forgets the session (a bridge that died has forgotten it already).
    fn drop(&mut self) {
        self.bridges.close(self.k, self.id);
    }
}

impl Episode for TextWorldEpisode {
    fn observation(&self) -> &Observation {
        &self.shown.obs
    }

    fn max_steps(&self) -> u32 {
        self.shown.max_steps
    }

    fn oracle_action(&self) -> Option<String> {
        self.shown.planner.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step> {
        self.shown.admissible(action)?;
        let reply = self.bridges.call(
            self.k,
            &json!({"op": "step", "episode": self.id, "action": action}),
        )?;
        self.shown.apply_step(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::games::ASSET_MAX_BYTES;
    use super::*;

    #[test]
    fn specs_are_checked_and_keyed_by_their_game() {
        let cfg = TextWorldConfig::default();
        let s = cfg.spec(7);
        let g = GameSpec::parse(&s).unwrap();
        assert_eq!(g.0["quest_length"], 2);
        let mut other = s.clone();
        other["budget_factor"] = json!(3.0);
        assert_eq!(GameSpec::parse(&other).unwrap().key(), g.key(), "same game");
        other["seed"] = json!(8);
        assert_ne!(GameSpec::parse(&other).unwrap().key(), g.key());
        let mut bad = s.clone();
        bad["quest_length"] = json!(0);
        let e = GameSpec::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("quest_length"), "{e}");
        bad = s.clone();
        bad["extra"] = json!(1);
        assert!(GameSpec::parse(&bad).is_err());
        let mut named = s.clone();
        named["game"] = json!("ab".repeat(32));
        let named = GameSpec::parse(&named).unwrap();
        assert_eq!(named.key(), g.key(), "the digest names the same game");
        assert!(named.with("seed", json!(9), 9).0.get("game").is_none());
        bad = s.clone();
        bad["game"] = json!("xyz");
        assert!(
            GameSpec::parse(&bad)
                .unwrap_err()
                .to_string()
                .contains("blake3")
        );
        let cooking = TextWorldConfig {
            family: Family::Cooking,
            level: Level::Hard,
            ..Default::default()
        };
        let c = GameSpec::parse(&cooking.spec(1)).unwrap();
        assert_eq!(
            (c.0["go"].clone(), c.0["cut"].clone()),
            (json!(9), json!(true))
        );
        assert_eq!(cooking.easier().level, Level::Medium);
        assert_eq!(cooking.harder().level, Level::Hard);
    }

    /// A game's asset carries its spec and files; installed on a machine without the game (or
    /// with other files under its key) it puts the committed files in place; a bundle that does
    /// not hold what its id names, or is damaged, is refused. No bridge is started.
    #[test]
    fn game_assets_round_trip_and_are_checked() {
        let made = tempfile::tempdir().unwrap();
        let here = tempfile::tempdir().unwrap();
        let dir = made.path().join("g");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("game.json"), b"{\"json\": 1}").unwrap();
        std::fs::write(dir.join("game.z8"), vec![7u8; 5000]).unwrap();
        let id = bundle_digest(&dir).unwrap();
        let mut spec = TextWorldConfig::default().spec(3);
        spec["game"] = json!(id);
        let spec = GameSpec::parse(&spec).unwrap();
        let (files, _) = read_game(&dir).unwrap();
        let bytes = bundle(&spec, &files).unwrap();
        let (again, _) = read_game(&dir).unwrap();
        assert_eq!(
            bytes,
            bundle(&spec, &again).unwrap(),
            "same game, same bytes"
        );
        assert!(bytes.len() < 1000, "compressed: {}", bytes.len());

        let tw = TextWorld::new(TextWorldConfig {
            cache_dir: here.path().display().to_string(),
            ..Default::default()
        });
        assert_eq!(tw.missing_assets(&[id.as_str()]), vec![id.clone()]);
        assert!(tw.asset(&spec.0).is_err(), "not made here");
        tw.install_asset(&id, &bytes).unwrap();
        assert!(tw.missing_assets(&[id.as_str()]).is_empty());
        assert_eq!(tw.asset_id(&spec.0).as_deref(), Some(id.as_str()));
        assert_eq!(
            tw.asset(&spec.0).unwrap(),
            bytes,
            "what is installed is what was kept"
        );
        let cached = here.path().join("games").join(spec.key());
        assert_eq!(
            std::fs::read(cached.join("game.z8")).unwrap(),
            vec![7u8; 5000]
        );

        // Altered files under the key: missing again, and the install puts the game back.
        std::fs::write(cached.join("game.z8"), b"other").unwrap();
        assert_eq!(tw.missing_assets(&[id.as_str()]), vec![id.clone()]);
        tw.install_asset(&id, &bytes).unwrap();
        assert!(tw.missing_assets(&[id.as_str()]).is_empty());

        // Refused: another id, a damaged frame, a truncated file.
        let other = "ab".repeat(32);
        let e = tw.install_asset(&other, &bytes).unwrap_err().to_string();
        assert!(e.contains("names another game"), "{e}");
        let e = tw.install_asset(&id, b"garbage").unwrap_err().to_string();
        assert!(e.contains("zstd"), "{e}");
        let raw = zstd::bulk::decompress(&bytes, ASSET_MAX_BYTES).unwrap();
        let cut = zstd::bulk::compress(&raw[..raw.len() - 10], 3).unwrap();
        let e = tw.install_asset(&id, &cut).unwrap_err().to_string();
        assert!(e.contains("game.z8") && e.contains("bytes"), "{e}");
        let mut flipped = raw.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let e = tw
            .install_asset(&id, &zstd::bulk::compress(&flipped, 3).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("hash to"), "{e}");
    }
}
