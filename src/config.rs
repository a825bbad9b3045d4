//! `iteration.toml`: the resolved settings of a run.
//!
//! The sections are owned by the components that read them (`[env]` and its subsections by
//! `env`, `[policy]` / `[reward_model]` / `[update]` by `model`, `[adapt]` by `adapt`); this
//! module aggregates them, owns the run-wide sections (`[run]`, `[rollout]`, `[reward]`,
//! `[eval]`) and keeps only the checks that span sections.
//!
//! Every section rejects unknown keys. Errors name the file, the line and the dotted key.
//! `--set a.b=v` overrides go through the same deserializer, so they are validated the same way.
//! The resolved config is stored canonically (JSON, sorted keys) in `run.json`; its hash identifies
//! the run. Execution-only settings (`run.store`, `run.iterations`, `run.memory_limit_mib`, ...)
//! are excluded from the hash so a run can be resumed elsewhere or extended.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::adapt::{AdaptConfig, AdapterKind, Bounds, CriticFrom, OpenAiConfig, RewriteFrom};
use crate::determinism::canonical;
pub use crate::env::external::ExternalConfig;
pub use crate::env::gridnav::GridNavConfig;
pub use crate::env::synthetic::SyntheticConfig;
pub use crate::env::{EnvConfig, EnvKind};
use crate::error::{Checks, Error, Result};

mod reference;
pub use crate::model::config::{
    ActionScore, Device, LogprobTemperature, PolicyConfig, PolicyKind, RewardModelConfig,
    UpdateConfig,
};
pub use crate::model::ppo::Schedule;
pub use reference::{REFERENCE_PAGE, reference_markdown};

/// The whole configuration of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunConfig,
    #[serde(default)]
    pub env: EnvConfig,
    #[serde(default)]
    pub rollout: RolloutConfig,
    #[serde(default)]
    pub policy: PolicyConfig,
    #[serde(default)]
    pub reward_model: RewardModelConfig,
    #[serde(default)]
    pub reward: RewardConfig,
    #[serde(default)]
    pub update: UpdateConfig,
    #[serde(default)]
    pub adapt: AdaptConfig,
    #[serde(default)]
    pub eval: EvalConfig,
    #[serde(default)]
    pub pretrain: PretrainConfig,
}

/// `[pretrain]`: the warm start. At iteration 0 the `pretrain` stage trains the policy by
/// behaviour cloning on planner (oracle) trajectories and the reward model on oracle-labelled
/// steps, both on tasks one difficulty level EASIER than training and disjoint from the
/// training pool, the held-out and the OOD sets; its checkpoints are the models' starting
/// point (in place of a pretrained LLM). Environments without a planner (external) start cold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PretrainConfig {
    /// false: today's cold start from the seeded random weights.
    pub enabled: bool,
    /// Seed of the demonstration tasks' draw.
    pub seed: u64,
    /// Demonstration tasks drawn (at least `policy_episodes`); the episodes cycle through them.
    /// Each is a task the environment makes (a TextWorld game is compiled: about a second).
    pub tasks: u32,
    /// Planner episodes the policy imitates.
    pub policy_episodes: u32,
    /// Passes over the policy's demonstration steps.
    pub policy_epochs: u32,
    /// Oracle-labelled steps the reward model learns its verdicts from.
    pub rm_steps: u32,
    /// Passes over the reward model's labelled steps.
    pub rm_epochs: u32,
    /// In the reward model's episodes, the share of steps where a uniformly random admissible
    /// action replaces the planner's (so both verdicts occur).
    pub random_action_prob: f64,
    /// AdamW learning rate of both models.
    pub lr: f64,
    /// Samples per optimizer step.
    pub minibatch: u32,
    /// Teach the reward model as many `<bad>` as `<good>` steps: every step of the rarer verdict
    /// and as many of the other, evenly spaced over the gathered order (false: every labelled
    /// step, whose verdicts follow the planner's and the random actions' mix).
    pub rm_balance: bool,
}

impl Default for PretrainConfig {
    fn default() -> Self {
        PretrainConfig {
            enabled: true,
            seed: 2_000_003,
            tasks: 64,
            policy_episodes: 128,
            policy_epochs: 4,
            rm_steps: 2048,
            rm_epochs: 4,
            random_action_prob: 0.5,
            lr: 3e-3,
            minibatch: 64,
            rm_balance: false,
        }
    }
}

impl PretrainConfig {
    /// The section's own checks (keys `pretrain.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            (0.0..=1.0).contains(&self.random_action_prob),
            "pretrain.random_action_prob",
            "must be in [0, 1]",
        );
        c.check(
            self.lr >= 0.0 && self.lr < 1.0,
            "pretrain.lr",
            "must be in [0, 1)",
        );
        c.check(
            self.minibatch >= 1,
            "pretrain.minibatch",
            "must be at least 1",
        );
    }
}

/// `[run]`: identity and execution of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run name; the default run id (required).
    pub name: String,
    /// Store URL (`./runs`, `file:///abs`, `memory://`, `s3://bucket/prefix`, ...). Not hashed.
    pub store: String,
    /// Root seed: every random draw derives from (seed, iter, stage, ...).
    pub seed: u64,
    /// Number of iterations `run` brings the run to. Not hashed (a run can be extended).
    pub iterations: u32,
    /// Memory budget of the query engine in MiB; larger operators spill to disk. Not hashed.
    pub memory_limit_mib: u64,
    /// Input rows per range when a relational stage runs range by range over task ids (bounds
    /// memory; results do not depend on it). Not hashed.
    pub chunk_rows: u64,
    /// Where the models run: `cpu` (burn's flex backend, bit-reproducible) or `cuda` (needs a
    /// build with `--features cuda`). Not hashed.
    pub device: Device,
    /// Workers (`host:port` of `rla-pipe worker --listen`) that run the rollouts and RM scoring
    /// (a shard each) and the relational stages' task ranges; empty (the default): everything
    /// runs in this process. Results are the same byte for byte (on CPU). Not hashed.
    pub cluster: Vec<String>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            name: String::new(),
            store: "./runs".into(),
            seed: 0,
            iterations: 1,
            memory_limit_mib: 1024,
            chunk_rows: 1_000_000,
            device: Device::Cpu,
            cluster: Vec::new(),
        }
    }
}

/// `[rollout]`: which tasks are rolled out each iteration, and how many times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Rollouts per task (the group size of the policy advantage).
    pub n: u32,
    /// Slots rolled out per iteration, drawn (seeded) from the slots without a pending
    /// candidate; every pending candidate is rolled out besides (the reference's `num_trial`,
    /// 16 on AlfWorld). 0 (the default): every slot without a pending candidate.
    pub slots_per_iter: u32,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            n: 8,
            slots_per_iter: 0,
        }
    }
}

/// How the held-out and OOD sets are played (`eval.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalMode {
    /// One greedy rollout per task (the most likely admissible action at every step).
    Greedy,
    /// `eval.rollouts` rollouts per task sampled at `eval.temperature` (the reference: 3 at 0.8).
    Sampled,
    /// Both, as a user evaluates a model: the sampled rollouts (splits `held_out` and `ood`,
    /// what the summary, the report and the ablation read) and one greedy rollout per task
    /// (splits `held_out_greedy` and `ood_greedy`).
    Both,
}

/// How policy advantages are standardized within a (task, step) group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdvantageMode {
    /// Population std; std ≤ 1e-8 → 0; group of one keeps R; zero advantages excluded.
    Reference,
    /// Unbiased std; (R − mean)/(std + 1e-6); group of one → R/(1 + 1e-6).
    Verl,
}

impl AdvantageMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdvantageMode::Reference => "reference",
            AdvantageMode::Verl => "verl",
        }
    }
}

/// How the reward model's included samples are weighted in its update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RmBalance {
    /// As the reference: every included sample counts the same.
    #[default]
    None,
    /// Won and lost trajectories' samples carry equal total weight (each sample's advantage
    /// times N / (2 · N_O)); not in the reference (docs/src/rm-question.md).
    Outcome,
}

impl RmBalance {
    pub fn as_str(self) -> &'static str {
        match self {
            RmBalance::None => "none",
            RmBalance::Outcome => "outcome",
        }
    }

    /// The reference's choice, which a config does not write: runs made before the key existed
    /// keep their resolved config and their stages' config hashes.
    pub fn is_none(&self) -> bool {
        *self == RmBalance::None
    }
}

/// `reward.train_candidates` at its default (the reference's): not written.
fn is_true(v: &bool) -> bool {
    *v
}

/// `[reward]`: reward integration, advantages, filters and the PPO clip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// λ in R = O + λ · mean_j S.
    pub lambda: f64,
    /// `reference` or `verl`.
    pub advantage_mode: AdvantageMode,
    /// Tasks with accuracy below this give no policy samples.
    pub policy_acc_min: f64,
    /// Tasks with accuracy above this give no policy samples.
    pub policy_acc_max: f64,
    /// Only tasks with rm_acc_min ≤ acc ≤ rm_acc_max train the RM.
    pub rm_acc_min: f64,
    pub rm_acc_max: f64,
    /// `none` (the reference) or `outcome`: the RM update's samples of won and lost
    /// trajectories weighted to equal totals. Not written when `none` (see [`RmBalance::is_none`]).
    #[serde(skip_serializing_if = "RmBalance::is_none")]
    pub rm_balance: RmBalance,
    /// Whether an accepted candidate's rollouts (the iteration that judged it) train both
    /// models, beside the active tasks' (`true`, the reference's order: judged first, then a
    /// rejected candidate never trains) — or only decide its verdict (`false`: the update sees
    /// the active tasks alone). Not written when `true`: older runs keep their hashes.
    #[serde(skip_serializing_if = "is_true")]
    pub train_candidates: bool,
    /// Consistency reward of an unparsable verdict.
    pub unparsable_reward: f64,
    /// PPO clip ε.
    pub clip_eps: f64,
    /// KL coefficient β (k3 estimator).
    pub kl_beta: f64,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            lambda: 1.0,
            advantage_mode: AdvantageMode::Reference,
            policy_acc_min: 0.125,
            policy_acc_max: 0.875,
            rm_acc_min: 0.2,
            rm_acc_max: 0.8,
            rm_balance: RmBalance::None,
            train_candidates: true,
            unparsable_reward: -2.0,
            clip_eps: 0.2,
            kl_beta: 0.01,
        }
    }
}

/// `[eval]`: the held-out task set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Number of held-out tasks.
    pub tasks: u32,
    /// Seed of the held-out set (fixed per run).
    pub seed: u64,
    /// `greedy` or `sampled` (the reference's evaluation). The uniform policy always samples.
    pub mode: EvalMode,
    /// Rollouts per held-out task when sampling.
    pub rollouts: u32,
    /// Sampling temperature of the evaluation rollouts.
    pub temperature: f64,
    /// Tasks of the out-of-distribution set: drawn like the held-out set but from the
    /// environment one difficulty level harder than training (0: no such set).
    pub ood_tasks: u32,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            tasks: 32,
            seed: 1_000_003,
            mode: EvalMode::Sampled,
            rollouts: 3,
            temperature: 0.8,
            ood_tasks: 32,
        }
    }
}

impl RunConfig {
    /// The section's own checks (keys `run.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(!self.name.is_empty(), "run.name", "must not be empty");
        c.check(self.iterations >= 1, "run.iterations", "must be at least 1");
        c.check(
            self.memory_limit_mib >= 64,
            "run.memory_limit_mib",
            "must be at least 64",
        );
        self.device.validate(c);
        if let Err(e) = cluster_urls(&self.cluster) {
            c.check(false, "run.cluster", e);
        }
    }
}

impl RewardConfig {
    /// The section's own checks (keys `reward.*`).
    pub fn validate(&self, c: &mut Checks) {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        c.check(
            self.lambda.is_finite() && self.lambda.abs() <= 1e6,
            "reward.lambda",
            "must be finite, |λ| ≤ 1e6",
        );
        for (key, v) in [
            ("reward.policy_acc_min", self.policy_acc_min),
            ("reward.policy_acc_max", self.policy_acc_max),
            ("reward.rm_acc_min", self.rm_acc_min),
            ("reward.rm_acc_max", self.rm_acc_max),
        ] {
            c.check(unit(v), key, "must be in [0, 1]");
        }
        c.check(
            self.unparsable_reward.is_finite(),
            "reward.unparsable_reward",
            "must be finite",
        );
        c.check(
            self.clip_eps > 0.0 && self.clip_eps < 1.0,
            "reward.clip_eps",
            "must be in (0, 1)",
        );
        c.check(self.kl_beta >= 0.0, "reward.kl_beta", "must be ≥ 0");
    }
}

/// The worker URLs of `run.cluster` / `--cluster`: each `host:port` or `http://host:port`,
/// none twice.
pub fn cluster_urls(addrs: &[String]) -> std::result::Result<Vec<url::Url>, String> {
    let mut urls = Vec::new();
    for a in addrs {
        let text = if a.contains("://") {
            a.clone()
        } else {
            format!("http://{a}")
        };
        let bad = |why: String| {
            format!(
                "worker address {a:?} must be host:port or http://host:port (the address `rla-pipe worker --listen` was given){why}"
            )
        };
        let url = url::Url::parse(&text).map_err(|e| bad(format!(": {e}")))?;
        if url.scheme() != "http"
            || url.host_str().is_none_or(str::is_empty)
            || url.port().is_none()
            || url.path() != "/"
        {
            return Err(bad(String::new()));
        }
        if urls.contains(&url) {
            return Err(format!("worker {url} is listed twice"));
        }
        urls.push(url);
    }
    Ok(urls)
}

/// Keys excluded from the config hash: they change how a run executes, not what it computes.
pub const UNHASHED_KEYS: &[&str] = &[
    "run.store",
    "run.iterations",
    "run.memory_limit_mib",
    "run.chunk_rows",
    "run.device",
    "run.cluster",
    "update.threads",
    "env.coding.workers",
    "adapt.openai.endpoint",
    "adapt.openai.timeout_secs",
    "adapt.openai.concurrency",
];

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

fn deserialize_text(text: &str, origin: &str) -> Result<Config> {
    let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, origin, "", &e))?;
    serde_path_to_error::deserialize::<_, Config>(de).map_err(|e| {
        let path = e.path().to_string();
        toml_error(text, origin, &path, e.inner())
    })
}

fn toml_error(text: &str, origin: &str, path: &str, e: &toml::de::Error) -> Error {
    let location = match e.span() {
        Some(span) => {
            let (l, c) = line_col(text, span.start);
            format!("{origin}:{l}:{c}")
        }
        None => origin.to_string(),
    };
    let key = if path.is_empty() || path == "." {
        String::new()
    } else {
        format!(" key `{path}`:")
    };
    Error::Config(format!("{location}:{key} {}", e.message().trim()))
}

impl Config {
    /// Parse a config file's text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config> {
        let mut cfg = deserialize_text(text, origin)?;
        cfg.resolve_auto();
        cfg.validate()?;
        Ok(cfg)
    }

    /// The `"auto"` precisions (`policy.inference_dtype`, `reward_model.inference_dtype`,
    /// `update.base_dtype`) made concrete for this machine and config: `"bf16"` for a
    /// pretrained model (with adapters, for the base) on `run.device = "cpu"` when the CPU has
    /// AMX-BF16 or AVX512-BF16, `"f32"` elsewhere. Done once, when the config is loaded: the
    /// run's committed config says which one ran.
    pub fn resolve_auto(&mut self) {
        use crate::model::InferenceDtype;
        let cpu = self.run.device == crate::model::Device::Cpu;
        let rm = self.reward_model.enabled && self.reward_model.pretrained();
        self.policy.inference_dtype = self
            .policy
            .inference_dtype
            .resolve(cpu && self.policy.pretrained());
        self.reward_model.inference_dtype = self.reward_model.inference_dtype.resolve(cpu && rm);
        let frozen = (self.policy.pretrained() && self.policy.lora.rank > 0)
            || (rm && self.reward_model.lora.rank > 0);
        self.update.base_dtype = self.update.base_dtype.resolve(cpu && frozen);
        debug_assert!(
            ![
                self.policy.inference_dtype,
                self.reward_model.inference_dtype,
                self.update.base_dtype
            ]
            .contains(&InferenceDtype::Auto)
        );
    }

    /// Read and parse a config file, then apply `--set key=value` overrides.
    pub fn load(path: &Path, sets: &[String]) -> Result<Config> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::config(format!("{origin}: {e}")))?;
        Self::from_toml_with_sets(&text, &origin, sets)
    }

    /// Parse text and apply overrides; each override is validated like a key of the file.
    pub fn from_toml_with_sets(text: &str, origin: &str, sets: &[String]) -> Result<Config> {
        let mut cfg = deserialize_text(text, origin)?;
        if sets.is_empty() {
            cfg.resolve_auto();
            cfg.validate()?;
            return Ok(cfg);
        }
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| toml_error(text, origin, "", &e))?;
        for set in sets {
            apply_set(&mut doc, set)?;
        }
        let mut cfg = serde_path_to_error::deserialize::<_, Config>(toml::Value::Table(doc))
            .map_err(|e| {
                Error::Config(format!(
                    "{origin} with --set {}: key `{}`: {}",
                    sets.join(" --set "),
                    e.path(),
                    e.inner().message().trim()
                ))
            })?;
        cfg.resolve_auto();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Semantic checks that types alone cannot express: every section checks its own keys,
    /// then the checks that span sections.
    pub fn validate(&self) -> Result<()> {
        let mut c = Checks::default();
        self.run.validate(&mut c);
        self.env.validate(&mut c);
        self.policy.validate(&mut c);
        self.reward_model.validate(&mut c);
        self.reward.validate(&mut c);
        self.update.validate(&mut c);
        self.adapt.validate(&mut c);
        self.pretrain.validate(&mut c);
        c.check(
            (1..=10_000).contains(&self.rollout.n),
            "rollout.n",
            "must be between 1 and 10000",
        );
        c.check(
            self.eval.rollouts >= 1,
            "eval.rollouts",
            "must be at least 1",
        );
        c.check(
            self.eval.temperature > 0.0 && self.eval.temperature.is_finite(),
            "eval.temperature",
            "must be positive",
        );
        let frozen = |init: &str, rank: usize| init.starts_with("hf:") && rank > 0;
        c.check(
            self.update.base_dtype == crate::model::InferenceDtype::F32
                || frozen(&self.policy.init, self.policy.lora.rank)
                || (self.reward_model.enabled
                    && frozen(&self.reward_model.init, self.reward_model.lora.rank)),
            "update.base_dtype",
            "\"bf16\" is for a pretrained model's frozen base: it needs adapters on one \
             (policy or reward_model: init = \"hf:DIR\" and lora.rank > 0)",
        );
        c.finish()
    }

    /// Canonical JSON (keys sorted, no whitespace) of the whole config.
    pub fn canonical_json(&self) -> String {
        canonical(&serde_json::to_value(self).expect("config serializes"))
    }

    /// The hashed part of the config as flat `dotted.key → JSON value`.
    pub fn hashed_keys(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        flatten(
            "",
            &serde_json::to_value(self).expect("config serializes"),
            &mut out,
        );
        out.retain(|k, _| !UNHASHED_KEYS.contains(&k.as_str()));
        out
    }

    /// blake3 of the hashed keys: the run's identity.
    pub fn hash(&self) -> String {
        let keys = self.hashed_keys();
        blake3::hash(canonical(&serde_json::to_value(&keys).unwrap()).as_bytes())
            .to_hex()
            .to_string()
    }

    /// Hash of the named top-level sections (what a stage depends on).
    pub fn section_hash(&self, sections: &[&str]) -> String {
        let picked = self.section_keys(sections);
        blake3::hash(canonical(&serde_json::to_value(&picked).unwrap()).as_bytes())
            .to_hex()
            .to_string()
    }

    /// The hashed keys of the named top-level sections, `dotted.key → JSON value` (what a stage
    /// manifest records, so replay can compare values even after the config gained keys).
    pub fn section_keys(&self, sections: &[&str]) -> BTreeMap<String, String> {
        self.hashed_keys()
            .into_iter()
            .filter(|(k, _)| {
                sections
                    .iter()
                    .any(|s| k == s || k.starts_with(&format!("{s}.")))
            })
            .collect()
    }

    /// This config with `--set key=value` overrides applied, validated like a file's keys
    /// (`origin` names this config in errors). Used for branch runs of a stored config.
    pub fn with_sets(&self, origin: &str, sets: &[String]) -> Result<Config> {
        let text = toml::to_string(self)
            .map_err(|e| Error::config(format!("{origin}: cannot be written as TOML: {e}")))?;
        Self::from_toml_with_sets(&text, origin, sets)
    }

    /// The hashed keys whose values differ between two configs, as `key: old → new`.
    pub fn diff(&self, other: &Config) -> Vec<String> {
        let (a, b) = (self.hashed_keys(), other.hashed_keys());
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| {
                format!(
                    "{k}: {} → {}",
                    a.get(k).map_or("(unset)", |s| s),
                    b.get(k).map_or("(unset)", |s| s)
                )
            })
            .collect()
    }
}

/// Apply one `key=value` override to a TOML document. The value is parsed as TOML (`3`, `0.5`,
/// `true`, `"x"`), and taken as a bare string if it does not parse.
fn apply_set(doc: &mut toml::Table, set: &str) -> Result<()> {
    let (key, raw) = set.split_once('=').ok_or_else(|| {
        Error::config(format!(
            "--set {set}: expected key=value, e.g. --set reward.lambda=0.5"
        ))
    })?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return Err(Error::config(format!("--set {set}: invalid key `{key}`")));
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut table = doc;
    for p in &parts[..parts.len() - 1] {
        let entry = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| {
            Error::config(format!("--set {set}: `{p}` is a value, not a section"))
        })?;
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Every leaf of a JSON value as (dotted key under `prefix`, its JSON text).
pub fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// A commented config with every key at its default: what `rla-pipe init` writes.
pub const DEFAULT_TOML: &str = include_str!("../pipelines/synthetic.toml");

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[run]\nname = \"t\"\n";

    #[test]
    fn with_sets_round_trips_a_stored_config_and_applies_overrides() {
        for file in [
            "gridnav.toml",
            "household.toml",
            "synthetic.toml",
            "coding-smollm2.toml",
            "coding.toml",
            "household-smollm2.toml",
            "textworld-smollm2.toml",
            "web.toml",
            "web-smollm2.toml",
            "ablation/gridnav.toml",
            "ablation/household.toml",
            "ablation/household-smollm2.toml",
            "ablation/textworld.toml",
            "ablation/textworld-smollm2.toml",
            "ablation/web.toml",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("pipelines")
                .join(file);
            // The GPU-sized file names cuda, which this build may lack.
            let cpu = ["run.device=cpu".to_string()];
            let sets: &[String] = if file == "coding.toml" { &cpu } else { &[] };
            let c = Config::load(&path, sets).unwrap();
            let same = c.with_sets("stored", &[]).unwrap();
            assert_eq!(same.hash(), c.hash(), "{file}");
            let b = c
                .with_sets("stored", &["reward.lambda=0.25".into()])
                .unwrap();
            let d = b.diff(&c);
            assert!(
                d.len() == 1 && d[0].starts_with("reward.lambda: 0.25 →"),
                "{file}: {d:?}"
            );
        }
        let e = Config::from_toml(MIN, "t.toml")
            .unwrap()
            .with_sets("run \"p\"'s config", &["reward.nope=1".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run \"p\"'s config") && e.contains("nope"),
            "{e}"
        );
    }

    #[test]
    fn defaults_fill_every_section() {
        let c = Config::from_toml(MIN, "t.toml").unwrap();
        assert_eq!(c.reward.lambda, 1.0);
        assert_eq!(c.reward.advantage_mode, AdvantageMode::Reference);
        assert_eq!(c.rollout.n, 8);
        assert_eq!(c.reward_model.samples, 3);
    }

    /// The `init` template writes out every key, each at its default (but the noted run
    /// length), so it documents the config completely.
    #[test]
    fn shipped_template_lists_every_key_at_its_default() {
        let shipped = Config::from_toml(DEFAULT_TOML, "synthetic.toml").unwrap();
        let mut defaults = Config::from_toml("[run]\nname = \"synthetic\"\n", "t").unwrap();
        defaults.run.iterations = 3;
        assert_eq!(shipped.diff(&defaults), Vec::<String>::new());
        let doc: toml::Table = toml::from_str(DEFAULT_TOML).unwrap();
        let keys = defaults
            .hashed_keys()
            .into_keys()
            .chain(UNHASHED_KEYS.iter().map(|k| k.to_string()));
        for key in keys {
            let mut at = &doc;
            let parts: Vec<&str> = key.split('.').collect();
            for p in &parts[..parts.len() - 1] {
                at = at
                    .get(*p)
                    .and_then(|v| v.as_table())
                    .unwrap_or_else(|| panic!("template lacks [{p}] for {key}"));
            }
            assert!(
                at.contains_key(parts[parts.len() - 1]),
                "template lacks {key}"
            );
        }
    }

    /// `reward.rm_balance` at its default (the reference's) is not written: a run made before
    /// the key existed keeps its config hash, so its stages still resume and branches share;
    /// `outcome` is written, survives a branch's round trip, and changes the hash.
    #[test]
    fn rm_balance_at_its_default_keeps_the_config_hash() {
        let c = Config::from_toml(MIN, "t.toml").unwrap();
        assert!(!c.hashed_keys().contains_key("reward.rm_balance"));
        let b = c
            .with_sets("t", &["reward.rm_balance=\"outcome\"".into()])
            .unwrap();
        assert_eq!(b.reward.rm_balance, RmBalance::Outcome);
        assert_eq!(
            b.hashed_keys().get("reward.rm_balance").map(String::as_str),
            Some("\"outcome\"")
        );
        assert_ne!(b.section_hash(&["reward"]), c.section_hash(&["reward"]));
        let again = b.with_sets("t", &[]).unwrap();
        assert_eq!(again.reward.rm_balance, RmBalance::Outcome);
    }

    /// `reward.train_candidates` at its default (the reference's) is not written either; `false`
    /// is, changes the advantage stage's section hash and survives a branch.
    #[test]
    fn train_candidates_at_its_default_keeps_the_config_hash() {
        let c = Config::from_toml(MIN, "t.toml").unwrap();
        assert!(c.reward.train_candidates);
        assert!(!c.hashed_keys().contains_key("reward.train_candidates"));
        let b = c
            .with_sets("t", &["reward.train_candidates=false".into()])
            .unwrap();
        assert_eq!(
            b.hashed_keys()
                .get("reward.train_candidates")
                .map(String::as_str),
            Some("false")
        );
        assert_ne!(b.section_hash(&["reward"]), c.section_hash(&["reward"]));
        assert!(!b.with_sets("t", &[]).unwrap().reward.train_candidates);
    }

    /// `update.target_kl` at its default (off) is not written either: older runs keep their
    /// hash; a target is written, changes the update's section hash and survives a branch.
    #[test]
    fn target_kl_at_its_default_keeps_the_config_hash() {
        let c = Config::from_toml(MIN, "t.toml").unwrap();
        assert!(!c.hashed_keys().contains_key("update.target_kl"));
        let b = c.with_sets("t", &["update.target_kl=0.05".into()]).unwrap();
        assert_eq!(
            b.hashed_keys().get("update.target_kl").map(String::as_str),
            Some("0.05")
        );
        assert_ne!(b.section_hash(&["update"]), c.section_hash(&["update"]));
        assert_eq!(b.with_sets("t", &[]).unwrap().update.target_kl, 0.05);
        let e = c
            .with_sets("t", &["update.target_kl=-1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("update.target_kl"), "{e}");
    }

    /// `"auto"` is resolved when the config is loaded: `bf16` only for a pretrained model on the
    /// CPU of a machine with a bf16 kernel (with adapters, for the base), `f32` for the small
    /// transformer, on `cuda` and on other CPUs; never left as `auto` in a run's config.
    #[test]
    fn auto_dtypes_resolve_when_loaded() {
        use crate::model::InferenceDtype::{Auto, Bf16, F32};
        let here = if crate::model::amx::available() {
            Bf16
        } else {
            F32
        };
        let auto = "[policy]\ninference_dtype = \"auto\"\n[reward_model]\ninference_dtype = \"auto\"\n\
                    [update]\nbase_dtype = \"auto\"\n";
        let small = Config::from_toml(&format!("{MIN}{auto}"), "t").unwrap();
        assert_eq!(
            [
                small.policy.inference_dtype,
                small.reward_model.inference_dtype,
                small.update.base_dtype
            ],
            [F32, F32, F32]
        );
        let hf = format!("{MIN}{auto}[policy.lora]\nrank = 8\n[reward_model.lora]\nrank = 0\n")
            .replace("[policy]\n", "[policy]\ninit = \"hf:m\"\n")
            .replace("[reward_model]\n", "[reward_model]\ninit = \"hf:m\"\n");
        let c = Config::from_toml(&hf, "t").unwrap();
        assert_eq!(
            [
                c.policy.inference_dtype,
                c.reward_model.inference_dtype,
                c.update.base_dtype
            ],
            [here, here, here]
        );
        // Not on a GPU.
        let mut cuda = deserialize_text(&hf, "t").unwrap();
        assert_eq!(cuda.policy.inference_dtype, Auto);
        cuda.run.device = crate::model::Device::Cuda;
        cuda.resolve_auto();
        assert_eq!(
            [
                cuda.policy.inference_dtype,
                cuda.reward_model.inference_dtype,
                cuda.update.base_dtype
            ],
            [F32, F32, F32]
        );
        // Through --set too (a branch's overrides take this path).
        let set = Config::from_toml_with_sets(&hf, "t", &["policy.lora.rank=0".into()]).unwrap();
        assert_eq!(set.update.base_dtype, F32, "no adapters: no frozen base");
        assert_eq!(set.policy.inference_dtype, here);
        assert!(!c.canonical_json().contains("auto"));
        assert_eq!(Auto.resolve(false), F32);
        assert_eq!(
            Bf16.resolve(false),
            Bf16,
            "an explicit bf16 stays (refused later, naming the key)"
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = "[run]\nname = \"t\"\n\n[reward]\nlamda = 2.0\n";
        let e = Config::from_toml(text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("x.toml:5:"), "{e}");
        assert!(e.contains("lamda"), "{e}");
        assert!(e.contains("reward"), "{e}");
    }

    #[test]
    fn wrong_type_names_line_and_key() {
        let text = "[run]\nname = \"t\"\n[rollout]\nn = \"eight\"\n";
        let e = Config::from_toml(text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("x.toml:4:"), "{e}");
        assert!(e.contains("rollout.n"), "{e}");
    }

    #[test]
    fn malformed_toml_names_line() {
        let e = Config::from_toml("[run\nname = 1", "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml:1:"), "{e}");
    }

    #[test]
    fn set_overrides_and_validates() {
        let c = Config::from_toml_with_sets(
            MIN,
            "t.toml",
            &[
                "reward.lambda=0.5".into(),
                "reward.advantage_mode=verl".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.reward.lambda, 0.5);
        assert_eq!(c.reward.advantage_mode, AdvantageMode::Verl);
        let e = Config::from_toml_with_sets(MIN, "t.toml", &["reward.lamda=0.5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lamda") && e.contains("--set"), "{e}");
        let e = Config::from_toml_with_sets(MIN, "t.toml", &["rollout.n=many".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.n"), "{e}");
        let e = Config::from_toml_with_sets(MIN, "t.toml", &["reward.lambda=nan".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("reward.lambda"), "{e}");
    }

    #[test]
    fn model_settings_are_validated() {
        let ok = "[run]\nname = 't'\n[env]\nname = 'gridnav'\n";
        Config::from_toml(ok, "t").unwrap();
        for (set, key) in [
            ("policy.heads=3", "policy.d_model"),
            ("reward_model.layers=0", "reward_model.layers"),
            ("reward_model.max_tokens=60", "reward_model.max_tokens"),
            ("policy.kind=lstm", "policy.kind"),
            ("run.device=tpu", "run.device"),
            ("update.grad_clip=0", "update.grad_clip"),
            ("policy.temperature=0", "policy.temperature"),
        ] {
            let e = Config::from_toml_with_sets(ok, "t", &[set.into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{set}: {e}");
        }
        if !cfg!(feature = "cuda") {
            let e = Config::from_toml_with_sets(ok, "t", &["run.device=cuda".into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
        let e = Config::from_toml_with_sets(ok, "t", &["env.gridnav.min_distance=9".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("env.gridnav.min_distance"), "{e}");
    }

    #[test]
    fn hash_ignores_execution_keys_and_diff_lists_keys() {
        let a = Config::from_toml(MIN, "t").unwrap();
        let mut b = a.clone();
        b.run.iterations = 7;
        b.run.store = "memory://".into();
        assert_eq!(a.hash(), b.hash());
        b.reward.lambda = 0.25;
        assert_ne!(a.hash(), b.hash());
        assert_eq!(a.diff(&b), vec!["reward.lambda: 1.0 → 0.25".to_string()]);
        assert_eq!(a.section_hash(&["rollout"]), b.section_hash(&["rollout"]));
        assert_ne!(a.section_hash(&["reward"]), b.section_hash(&["reward"]));
    }

    #[test]
    fn canonical_json_round_trips() {
        let a = Config::from_toml(MIN, "t").unwrap();
        let back: Config = serde_json::from_str(&a.canonical_json()).unwrap();
        assert_eq!(a, back);
    }
}
