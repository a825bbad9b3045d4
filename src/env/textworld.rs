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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use super::external::{ExternalConfig, Process, Shown};
use crate::determinism::{canonical, derive_seed};
use crate::error::{Checks, Error, Result};

/// The bridge's source, written next to the game cache at first use.
const BRIDGE: &str = include_str!("textworld_bridge.py");
/// The small transformer's words: every word of TextWorld 1.7.0's grammars and cooking data plus
/// its command verbs (the bridge's `vocabulary` op wrote this file; fixed, so a model's shape
/// does not depend on the installed TextWorld).
const VOCABULARY: &str = include_str!("textworld_vocab.txt");
/// TextWorld's generators take seeds below this.
const SEED_RANGE: u64 = 1 << 31;
/// Seeds tried per task before giving up (a quest cannot always be generated).
const SEED_TRIES: u64 = 8;

/// Game families.
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
    fn shifted(self, by: i32) -> Level {
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

    fn preset_knob(&self, knob: &str) -> u32 {
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

    fn knob(&self, knob: &str, set: u32) -> u32 {
        if set > 0 { set } else { self.preset_knob(knob) }
    }

    /// The spec of a game of this level with `seed`.
    fn spec(&self, seed: u64) -> Value {
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

    fn cache(&self) -> PathBuf {
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

/// A checked game spec.
#[derive(Debug, Clone, PartialEq)]
struct GameSpec(Value);

impl GameSpec {
    fn parse(v: &Value) -> Result<GameSpec> {
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
    fn key(&self) -> String {
        let mut game = self.0.clone();
        if let Some(o) = game.as_object_mut() {
            o.remove("budget_factor");
            o.remove("game");
        }
        blake3::hash(canonical(&game).as_bytes()).to_hex()[..16].to_string()
    }

    fn with(&self, knob: &str, value: Value, seed: u64) -> GameSpec {
        let mut v = self.0.clone();
        v[knob] = value;
        v["seed"] = json!(seed);
        if let Some(o) = v.as_object_mut() {
            o.remove("game");
        }
        GameSpec(v)
    }
}

/// The bridge processes, started on demand; episode and generation calls are spread over them.
struct Bridges {
    cfg: ExternalConfig,
    timeout: Duration,
    slots: Vec<Mutex<Option<Process>>>,
}

impl Bridges {
    /// A call on bridge `k` (started if it is not running). A bridge that died or broke the
    /// protocol is dropped (the next call starts another); an error reply leaves it serving.
    fn call(&self, k: usize, request: &Value) -> Result<Value> {
        self.send(k, request, true)
            .expect("a bridge is started for it")
    }

    /// Tell a running bridge to forget an episode (one that is not running forgot it already).
    fn close(&self, k: usize, episode: u64) {
        let _ = self.send(k, &json!({"op": "close", "episode": episode}), false);
    }

    /// `request` on bridge `k`, starting it if `start`; `None`: not running and not started.
    fn send(&self, k: usize, request: &Value, start: bool) -> Option<Result<Value>> {
        let mut slot = self.slots[k % self.slots.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            if !start {
                return None;
            }
            match Process::spawn(&self.cfg) {
                Ok(p) => *slot = Some(p),
                Err(e) => return Some(Err(hint(e))),
            }
        }
        let p = slot.as_mut()?;
        let reply = p.call(request, self.timeout);
        if reply.is_err() && !p.alive() {
            *slot = None;
        }
        Some(reply.map_err(hint))
    }
}

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
            Error::Environment(format!("textworld: making the game of {}: {e}", spec.0))
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
const ASSET_MAGIC: &str = "rla-pipe textworld game 1\n";
/// The files of a game, in the order they are hashed and bundled.
const GAME_FILES: [&str; 2] = ["game.json", "game.z8"];
/// The largest game asset accepted (decompressed): TextWorld's games are ~0.4 MB.
const ASSET_MAX_BYTES: usize = 64 << 20;

/// A game's asset: the magic line, its spec (canonical JSON, naming the game's digest) and its
/// two files (name, newline, u64 little-endian length, bytes), zstd-compressed at a fixed level
/// (so the same game is the same bytes).
fn bundle(spec: &GameSpec, files: &GameFiles) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    raw.extend_from_slice(ASSET_MAGIC.as_bytes());
    raw.extend_from_slice(canonical(&spec.0).as_bytes());
    raw.push(b'\n');
    for (name, bytes) in files {
        raw.extend_from_slice(name.as_bytes());
        raw.push(b'\n');
        raw.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        raw.extend_from_slice(bytes);
    }
    zstd::bulk::compress(&raw, 12)
}

/// A game's files by name.
type GameFiles = Vec<(&'static str, Vec<u8>)>;

/// The spec and files of a game asset ([`bundle`]); an error says what is wrong with it.
fn unbundle(bytes: &[u8]) -> std::result::Result<(Value, GameFiles), String> {
    let raw = zstd::bulk::decompress(bytes, ASSET_MAX_BYTES)
        .map_err(|e| format!("not a zstd frame of at most {ASSET_MAX_BYTES} bytes: {e}"))?;
    let rest = raw
        .strip_prefix(ASSET_MAGIC.as_bytes())
        .ok_or("it does not start with the game asset header")?;
    let nl = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no spec line")?;
    let spec: Value = serde_json::from_slice(&rest[..nl]).map_err(|e| format!("spec: {e}"))?;
    let mut rest = &rest[nl + 1..];
    let mut files = Vec::new();
    for name in GAME_FILES {
        let head = format!("{name}\n");
        rest = rest
            .strip_prefix(head.as_bytes())
            .ok_or_else(|| format!("{name} is not where it should be"))?;
        let (len, body) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| format!("{name}: truncated length"))?;
        let len = u64::from_le_bytes(*len) as usize;
        if body.len() < len {
            return Err(format!("{name}: {} of {len} bytes", body.len()));
        }
        files.push((name, body[..len].to_vec()));
        rest = &body[len..];
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the files", rest.len()));
    }
    Ok((spec, files))
}

/// The digest recorded with a cached game, if its directory is complete.
fn cached_digest(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("digest")).ok()
}

/// A game directory's two files and their blake3 (over name, length, bytes; in name order).
fn read_game(dir: &Path) -> std::io::Result<(GameFiles, String)> {
    let mut h = blake3::Hasher::new();
    let mut files = Vec::new();
    for name in GAME_FILES {
        let bytes = std::fs::read(dir.join(name))?;
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
        files.push((name, bytes));
    }
    Ok((files, h.finalize().to_hex().to_string()))
}

/// The blake3 of a game directory's files ([`read_game`]).
fn bundle_digest(dir: &Path) -> std::io::Result<String> {
    read_game(dir).map(|(_, digest)| digest)
}

/// Put the complete game directory `tmp` (its files checked to hash to `digest`) in place as
/// `dir`, with its digest file. When another thread or process placed one there meanwhile,
/// theirs stays and `tmp` goes. The digest of the game now at `dir`, if any.
fn place(tmp: &Path, dir: &Path, digest: &str) -> std::io::Result<Option<String>> {
    std::fs::write(tmp.join("digest"), digest)?;
    if std::fs::rename(tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(tmp);
        return Ok(cached_digest(dir));
    }
    Ok(Some(digest.to_string()))
}

/// Adds the set-up step to a bridge that could not import TextWorld.
fn hint(e: Error) -> Error {
    let msg = e.to_string();
    if msg.contains("No module named") {
        Error::Environment(format!(
            "{msg} — TextWorld is not installed for env.textworld.python: pip install textworld==1.7.0"
        ))
    } else {
        e
    }
}

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
