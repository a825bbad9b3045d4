//! `iteration.toml`: the resolved settings of a run.
//!
//! Every section rejects unknown keys. Errors name the file, the line and the dotted key.
//! `--set a.b=v` overrides go through the same deserializer, so they are validated the same way.
//! The resolved config is stored canonically (JSON, sorted keys) in `run.json`; its hash identifies
//! the run. Execution-only settings (`run.store`, `run.iterations`, `run.memory_limit_mib`) are
//! excluded from the hash so a run can be resumed elsewhere or extended.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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
}

/// `[run]`: identity and execution of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Run name; the default run id.
    pub name: String,
    /// Store URL (`./runs`, `file:///abs`, `memory://`, `s3://bucket/prefix`, ...). Not hashed.
    #[serde(default = "default_store")]
    pub store: String,
    /// Root seed: every random draw derives from (seed, iter, stage, ...).
    #[serde(default)]
    pub seed: u64,
    /// Number of iterations `run` brings the run to. Not hashed (a run can be extended).
    #[serde(default = "one")]
    pub iterations: u32,
    /// Memory budget of the query engine in MiB; larger operators spill to disk. Not hashed.
    #[serde(default = "default_memory")]
    pub memory_limit_mib: u64,
    /// Input rows per range when a relational stage runs range by range over task ids (bounds
    /// memory; results do not depend on it). Not hashed.
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: u64,
    /// Where the models run: `cpu` (burn's flex backend, bit-reproducible) or `cuda` (needs a
    /// build with `--features cuda`). Not hashed.
    #[serde(default = "default_device")]
    pub device: String,
}

/// `[env]`: which environment generates tasks and how hard they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Environment name. This build has `synthetic` (a seeded load generator, see README).
    #[serde(default = "default_env")]
    pub name: String,
    /// Number of tasks in the pool.
    #[serde(default = "default_tasks")]
    pub initial_tasks: u32,
    /// Step budget per episode.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// Knobs of the `synthetic` environment.
    #[serde(default)]
    pub synthetic: SyntheticConfig,
    /// Difficulty distribution of the `gridnav` environment.
    #[serde(default)]
    pub gridnav: GridNavConfig,
    /// The subprocess of an `external` environment (JSON lines; see src/env/external.rs).
    #[serde(default)]
    pub external: ExternalConfig,
    /// Difficulty distribution of the `household` environment.
    #[serde(default)]
    pub household: crate::env::household::HouseholdConfig,
}

/// `[env.external]`: an environment served by a subprocess speaking JSON lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalConfig {
    /// Name of the environment (part of every task id).
    #[serde(default = "default_external_name")]
    pub name: String,
    /// Program and arguments, e.g. ["python3", "envs/textworld_env.py"].
    #[serde(default)]
    pub command: Vec<String>,
    /// Seconds each call may take before the process is killed and the call fails.
    #[serde(default = "default_external_timeout")]
    pub timeout_secs: f64,
}

/// `[env.gridnav]`: the difficulty distribution of generated gridnav tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridNavConfig {
    /// Grid side length.
    #[serde(default = "default_grid_size")]
    pub size: u32,
    /// Probability that a cell is a wall.
    #[serde(default = "default_wall_density")]
    pub wall_density: f64,
    /// Shortest start→goal path length, lower bound.
    #[serde(default = "default_min_distance")]
    pub min_distance: u32,
    /// Shortest start→goal path length, upper bound.
    #[serde(default = "default_max_distance")]
    pub max_distance: u32,
    /// Step budget = ceil(budget_factor × shortest path length).
    #[serde(default = "default_budget_factor")]
    pub budget_factor: f64,
}

impl GridNavConfig {
    /// One difficulty level harder (the out-of-distribution evaluation set): shortest paths two
    /// steps longer (as far as the grid allows: at most 2·(size − 1)), 5 points more walls, a
    /// budget factor × 0.75 (at least 1).
    pub fn harder(&self) -> GridNavConfig {
        let cap = (2 * self.size.saturating_sub(1)).max(self.max_distance);
        let max_distance = (self.max_distance + 2).min(cap);
        GridNavConfig {
            size: self.size,
            wall_density: (self.wall_density + 0.05).min(0.5),
            min_distance: (self.min_distance + 2).min(max_distance),
            max_distance,
            budget_factor: (self.budget_factor * 0.75).max(1.0),
        }
    }
}

/// `[env.synthetic]`: a seeded generator of trajectories, oracle labels and RM verdicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Shortest episode (steps).
    #[serde(default = "one")]
    pub min_steps: u32,
    /// Probability that an RM verdict agrees with the step oracle.
    #[serde(default = "default_rm_accuracy")]
    pub rm_accuracy: f64,
    /// Probability that an RM sample has no parsable verdict (score 0).
    #[serde(default = "default_unparsable")]
    pub unparsable_rate: f64,
}

/// `[rollout]`: how many rollouts per task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// Rollouts per task (the group size of the policy advantage).
    #[serde(default = "default_n")]
    pub n: u32,
}

/// `[policy]`: the acting policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// `transformer` (the learned policy) or `uniform` (uniform over admissible actions, never
    /// trained: the floor for ablations).
    #[serde(default = "default_policy")]
    pub kind: String,
    /// Sampling temperature during training rollouts (evaluation is greedy).
    #[serde(default = "one_f")]
    pub temperature: f64,
    /// Width of the transformer.
    #[serde(default = "default_d_model")]
    pub d_model: usize,
    /// Transformer blocks.
    #[serde(default = "default_layers")]
    pub layers: usize,
    /// Attention heads (must divide d_model).
    #[serde(default = "default_heads")]
    pub heads: usize,
    /// Maximum prompt + action length in tokens (older history is dropped first).
    #[serde(default = "default_context")]
    pub context: usize,
    /// Previous (observation, action) pairs kept in the prompt.
    #[serde(default = "default_history")]
    pub history: usize,
    /// A Hugging Face `tokenizer.json`; empty: the environment's word-level vocabulary.
    #[serde(default)]
    pub tokenizer: String,
    /// An action's logit: `sum` of its token log-likelihoods (DESIGN.md) or their `mean` (length
    /// normalization: an untrained LM otherwise strongly prefers the shortest commands).
    #[serde(default = "default_action_score")]
    pub action_score: String,
}

/// `[reward_model]`: the generative reward model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelConfig {
    /// `false`: outcome-only reward (R = O) and no RM training.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// m: verdict samples per step.
    #[serde(default = "default_m")]
    pub samples: u32,
    /// Sampling temperature of the RM.
    #[serde(default = "default_rm_temp")]
    pub temperature: f64,
    /// Most tokens generated per sample (critique words, then the verdict); a sample without a
    /// verdict within the limit scores 0.
    #[serde(default = "default_rm_max_tokens")]
    pub max_tokens: usize,
    #[serde(default = "default_d_model")]
    pub d_model: usize,
    #[serde(default = "default_layers")]
    pub layers: usize,
    #[serde(default = "default_heads")]
    pub heads: usize,
    #[serde(default = "default_rm_context")]
    pub context: usize,
    /// Previous (observation, action) pairs kept in the prompt.
    #[serde(default = "default_rm_history")]
    pub history: usize,
    /// A Hugging Face `tokenizer.json`; empty: the environment's word-level vocabulary.
    #[serde(default)]
    pub tokenizer: String,
}

/// `[update]`: the PPO optimizer (both models; ε and β are in `[reward]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateConfig {
    /// Policy optimizer steps per iteration.
    #[serde(default = "default_policy_steps")]
    pub policy_steps: u32,
    /// Reward-model optimizer steps per iteration.
    #[serde(default = "default_rm_steps")]
    pub rm_steps: u32,
    /// Samples per minibatch (a seeded shuffle of the included samples, cycled).
    #[serde(default = "default_minibatch")]
    pub minibatch: u32,
    /// AdamW learning rate of the policy.
    #[serde(default = "default_lr")]
    pub policy_lr: f64,
    /// AdamW learning rate of the reward model.
    #[serde(default = "default_lr")]
    pub rm_lr: f64,
    #[serde(default)]
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    #[serde(default = "one_f")]
    pub grad_clip: f64,
    /// The log-ratio is clamped to ±this before exponentiating.
    #[serde(default = "default_log_ratio_clamp")]
    pub log_ratio_clamp: f64,
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

/// `[reward]`: reward integration, advantages, filters and the PPO clip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// λ in R = O + λ · mean_j S.
    #[serde(default = "one_f")]
    pub lambda: f64,
    /// `reference` or `verl`.
    #[serde(default = "default_mode")]
    pub advantage_mode: AdvantageMode,
    /// Tasks with accuracy below this give no policy samples.
    #[serde(default = "default_policy_min")]
    pub policy_acc_min: f64,
    /// Tasks with accuracy above this give no policy samples.
    #[serde(default = "default_policy_max")]
    pub policy_acc_max: f64,
    /// Only tasks with rm_acc_min ≤ acc ≤ rm_acc_max train the RM.
    #[serde(default = "default_rm_min")]
    pub rm_acc_min: f64,
    #[serde(default = "default_rm_max")]
    pub rm_acc_max: f64,
    /// Consistency reward of an unparsable verdict.
    #[serde(default = "default_unparsable_reward")]
    pub unparsable_reward: f64,
    /// PPO clip ε.
    #[serde(default = "default_eps")]
    pub clip_eps: f64,
    /// KL coefficient β (k3 estimator).
    #[serde(default = "default_beta")]
    pub kl_beta: f64,
}

/// Whether acceptance bounds of the adaptation rule are inclusive or strict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bounds {
    Inclusive,
    Strict,
}

/// `[adapt]`: environment adaptation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// acc ≥ alpha_high → make harder.
    #[serde(default = "default_rm_max")]
    pub alpha_high: f64,
    /// acc ≤ alpha_low → make easier.
    #[serde(default = "default_rm_min")]
    pub alpha_low: f64,
    #[serde(default = "default_bounds")]
    pub bounds: Bounds,
    /// Who writes candidates: `procedural` (the environment's mutation operators, chosen with
    /// the critic summary) or `openai` (an OpenAI-compatible chat-completions endpoint).
    #[serde(default = "default_adapter")]
    pub adapter: AdapterKind,
    /// Most frequent critique words kept in a task's critic summary.
    #[serde(default = "default_critic_words")]
    pub critic_words: u32,
    #[serde(default)]
    pub openai: OpenAiConfig,
}

/// The adapter that writes candidate tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdapterKind {
    Procedural,
    Openai,
}

/// `[adapt.openai]`: an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's server,
/// ...). The API key is read from the environment variable named here; it never enters the
/// config, the manifests or the logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Base URL; `/chat/completions` is appended.
    #[serde(default = "default_openai_endpoint")]
    pub endpoint: String,
    #[serde(default = "default_openai_model")]
    pub model: String,
    /// Name of the environment variable holding the API key; empty: no Authorization header.
    #[serde(default = "default_openai_key_env")]
    pub api_key_env: String,
    #[serde(default = "default_openai_temperature")]
    pub temperature: f64,
    /// Requests per task; the first candidate the environment validates is kept.
    #[serde(default = "default_openai_attempts")]
    pub attempts: u32,
    #[serde(default = "default_openai_max_tokens")]
    pub max_tokens: u32,
    /// Seconds one request may take.
    #[serde(default = "default_openai_timeout")]
    pub timeout_secs: u64,
    /// Requests in flight at once (tasks are asked in slot order, this many at a time).
    #[serde(default = "default_openai_concurrency")]
    pub concurrency: u32,
}

/// `[eval]`: the held-out task set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Number of held-out tasks.
    #[serde(default = "default_eval_tasks")]
    pub tasks: u32,
    /// Seed of the held-out set (fixed per run).
    #[serde(default = "default_eval_seed")]
    pub seed: u64,
    /// Rollouts per held-out task.
    #[serde(default = "default_n")]
    pub rollouts: u32,
    /// Tasks of the out-of-distribution set: drawn like the held-out set but from the
    /// environment one difficulty level harder than training (0: no such set).
    #[serde(default = "default_eval_tasks")]
    pub ood_tasks: u32,
}

fn default_store() -> String {
    "./runs".into()
}
fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_memory() -> u64 {
    1024
}
fn default_chunk_rows() -> u64 {
    1_000_000
}
fn default_grid_size() -> u32 {
    6
}
fn default_wall_density() -> f64 {
    0.2
}
fn default_min_distance() -> u32 {
    2
}
fn default_max_distance() -> u32 {
    4
}
fn default_budget_factor() -> f64 {
    4.0
}
fn default_external_name() -> String {
    "external".into()
}
fn default_external_timeout() -> f64 {
    10.0
}
fn default_env() -> String {
    "synthetic".into()
}
fn default_tasks() -> u32 {
    64
}
fn default_max_steps() -> u32 {
    12
}
fn default_rm_accuracy() -> f64 {
    0.75
}
fn default_unparsable() -> f64 {
    0.02
}
fn default_n() -> u32 {
    8
}
fn default_policy() -> String {
    "transformer".into()
}
fn default_action_score() -> String {
    "sum".into()
}
fn default_device() -> String {
    "cpu".into()
}
fn default_d_model() -> usize {
    32
}
fn default_layers() -> usize {
    2
}
fn default_heads() -> usize {
    4
}
fn default_context() -> usize {
    64
}
fn default_rm_context() -> usize {
    96
}
fn default_history() -> usize {
    0
}
fn default_rm_history() -> usize {
    0
}
fn default_rm_max_tokens() -> usize {
    4
}
fn default_policy_steps() -> u32 {
    48
}
fn default_rm_steps() -> u32 {
    48
}
fn default_minibatch() -> u32 {
    256
}
fn default_lr() -> f64 {
    3e-3
}
fn default_log_ratio_clamp() -> f64 {
    10.0
}
fn default_m() -> u32 {
    3
}
fn default_rm_temp() -> f64 {
    0.8
}
fn default_mode() -> AdvantageMode {
    AdvantageMode::Reference
}
fn default_policy_min() -> f64 {
    0.125
}
fn default_policy_max() -> f64 {
    0.875
}
fn default_rm_min() -> f64 {
    0.2
}
fn default_rm_max() -> f64 {
    0.8
}
fn default_unparsable_reward() -> f64 {
    -2.0
}
fn default_eps() -> f64 {
    0.2
}
fn default_beta() -> f64 {
    0.01
}
fn default_bounds() -> Bounds {
    Bounds::Inclusive
}
fn default_adapter() -> AdapterKind {
    AdapterKind::Procedural
}
fn default_critic_words() -> u32 {
    5
}
fn default_openai_endpoint() -> String {
    "http://127.0.0.1:8000/v1".into()
}
fn default_openai_model() -> String {
    "default".into()
}
fn default_openai_key_env() -> String {
    "OPENAI_API_KEY".into()
}
fn default_openai_temperature() -> f64 {
    0.8
}
fn default_openai_attempts() -> u32 {
    3
}
fn default_openai_max_tokens() -> u32 {
    1024
}
fn default_openai_timeout() -> u64 {
    120
}
fn default_openai_concurrency() -> u32 {
    4
}
fn default_eval_tasks() -> u32 {
    32
}
fn default_eval_seed() -> u64 {
    1_000_003
}

macro_rules! default_from_empty {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                toml::from_str("").expect("every key of this section has a default")
            }
        }
    )*};
}
default_from_empty!(
    EnvConfig,
    SyntheticConfig,
    GridNavConfig,
    ExternalConfig,
    RolloutConfig,
    PolicyConfig,
    RewardModelConfig,
    RewardConfig,
    UpdateConfig,
    AdaptConfig,
    OpenAiConfig,
    EvalConfig
);

/// Keys excluded from the config hash: they change how a run executes, not what it computes.
pub const UNHASHED_KEYS: &[&str] = &[
    "run.store",
    "run.iterations",
    "run.memory_limit_mib",
    "run.chunk_rows",
    "run.device",
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
        let cfg = deserialize_text(text, origin)?;
        cfg.validate()?;
        Ok(cfg)
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
        let cfg = deserialize_text(text, origin)?;
        if sets.is_empty() {
            cfg.validate()?;
            return Ok(cfg);
        }
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| toml_error(text, origin, "", &e))?;
        for set in sets {
            apply_set(&mut doc, set)?;
        }
        let cfg = serde_path_to_error::deserialize::<_, Config>(toml::Value::Table(doc)).map_err(
            |e| {
                Error::Config(format!(
                    "{origin} with --set {}: key `{}`: {}",
                    sets.join(" --set "),
                    e.path(),
                    e.inner().message().trim()
                ))
            },
        )?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Semantic checks that types alone cannot express.
    pub fn validate(&self) -> Result<()> {
        let mut errs = Vec::new();
        let mut check = |ok: bool, key: &str, msg: &str| {
            if !ok {
                errs.push(format!("key `{key}`: {msg}"));
            }
        };
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        check(!self.run.name.is_empty(), "run.name", "must not be empty");
        check(
            self.run.iterations >= 1,
            "run.iterations",
            "must be at least 1",
        );
        check(
            self.run.memory_limit_mib >= 64,
            "run.memory_limit_mib",
            "must be at least 64",
        );
        check(
            matches!(
                self.env.name.as_str(),
                "synthetic" | "gridnav" | "household" | "external"
            ),
            "env.name",
            "unknown environment (this build has: synthetic, gridnav, household, external)",
        );
        let household = match (self.env.name.as_str(), self.env.household.validate()) {
            ("household", Err(e)) => e.to_string(),
            _ => String::new(),
        };
        check(household.is_empty(), "env.household", &household);
        check(
            self.env.name != "external" || !self.env.external.command.is_empty(),
            "env.external.command",
            "must name the program to run, e.g. [\"python3\", \"my_env.py\"]",
        );
        check(
            self.env.external.timeout_secs > 0.0 && self.env.external.timeout_secs <= 3600.0,
            "env.external.timeout_secs",
            "must be in (0, 3600]",
        );
        check(
            matches!(self.policy.kind.as_str(), "transformer" | "uniform"),
            "policy.kind",
            "must be \"transformer\" (learned) or \"uniform\"",
        );
        check(
            matches!(self.policy.action_score.as_str(), "sum" | "mean"),
            "policy.action_score",
            "must be \"sum\" or \"mean\"",
        );
        check(
            matches!(self.run.device.as_str(), "cpu" | "cuda")
                || (self.run.device == "ndarray" && cfg!(feature = "ndarray")),
            "run.device",
            "must be \"cpu\" or \"cuda\"",
        );
        check(
            self.run.device != "cuda" || cfg!(feature = "cuda"),
            "run.device",
            "this build has no CUDA backend: rebuild with `cargo build --release --features cuda`",
        );
        for (section, d, l, h, c, t) in [
            (
                "policy",
                self.policy.d_model,
                self.policy.layers,
                self.policy.heads,
                self.policy.context,
                self.policy.temperature,
            ),
            (
                "reward_model",
                self.reward_model.d_model,
                self.reward_model.layers,
                self.reward_model.heads,
                self.reward_model.context,
                self.reward_model.temperature,
            ),
        ] {
            check(
                d > 0 && h > 0 && d % h == 0 && d <= 4096,
                &format!("{section}.d_model"),
                "must be a positive multiple of heads (at most 4096)",
            );
            check(
                (1..=64).contains(&l),
                &format!("{section}.layers"),
                "must be 1..=64",
            );
            check(
                (16..=8192).contains(&c),
                &format!("{section}.context"),
                "must be 16..=8192",
            );
            check(
                t > 0.0 && t <= 100.0,
                &format!("{section}.temperature"),
                "must be in (0, 100]",
            );
        }
        check(
            (1..=64).contains(&self.reward_model.max_tokens),
            "reward_model.max_tokens",
            "must be 1..=64",
        );
        check(
            self.reward_model.max_tokens < self.reward_model.context / 2,
            "reward_model.max_tokens",
            "must be less than half of reward_model.context",
        );
        check(
            self.reward_model.samples >= 1,
            "reward_model.samples",
            "must be at least 1",
        );
        let u = &self.update;
        check(u.minibatch >= 1, "update.minibatch", "must be at least 1");
        check(
            u.policy_lr >= 0.0 && u.policy_lr < 1.0,
            "update.policy_lr",
            "must be in [0, 1)",
        );
        check(
            u.rm_lr >= 0.0 && u.rm_lr < 1.0,
            "update.rm_lr",
            "must be in [0, 1)",
        );
        check(u.grad_clip > 0.0, "update.grad_clip", "must be positive");
        check(
            u.log_ratio_clamp > 0.0,
            "update.log_ratio_clamp",
            "must be positive",
        );
        check(
            (0.0..1.0).contains(&u.weight_decay),
            "update.weight_decay",
            "must be in [0, 1)",
        );
        let g = &self.env.gridnav;
        check(
            (2..=64).contains(&g.size),
            "env.gridnav.size",
            "must be between 2 and 64",
        );
        check(
            (0.0..0.9).contains(&g.wall_density),
            "env.gridnav.wall_density",
            "must be in [0, 0.9)",
        );
        check(
            1 <= g.min_distance
                && g.min_distance <= g.max_distance
                && g.max_distance < g.size * g.size,
            "env.gridnav.min_distance",
            "need 1 <= min_distance <= max_distance < size²",
        );
        check(
            g.budget_factor >= 1.0,
            "env.gridnav.budget_factor",
            "must be at least 1",
        );
        check(
            self.env.initial_tasks >= 1,
            "env.initial_tasks",
            "must be at least 1",
        );
        check(
            self.env.max_steps >= 1,
            "env.max_steps",
            "must be at least 1",
        );
        check(
            self.env.synthetic.min_steps >= 1 && self.env.synthetic.min_steps <= self.env.max_steps,
            "env.synthetic.min_steps",
            "must be between 1 and env.max_steps",
        );
        check(
            unit(self.env.synthetic.rm_accuracy),
            "env.synthetic.rm_accuracy",
            "must be in [0, 1]",
        );
        check(
            unit(self.env.synthetic.unparsable_rate),
            "env.synthetic.unparsable_rate",
            "must be in [0, 1]",
        );
        check(
            self.eval.rollouts >= 1,
            "eval.rollouts",
            "must be at least 1",
        );
        check(
            (1..=10_000).contains(&self.rollout.n),
            "rollout.n",
            "must be between 1 and 10000",
        );
        check(
            self.policy.temperature > 0.0,
            "policy.temperature",
            "must be > 0",
        );
        check(
            self.reward_model.samples >= 1,
            "reward_model.samples",
            "must be at least 1",
        );
        check(
            self.reward_model.temperature > 0.0,
            "reward_model.temperature",
            "must be > 0",
        );
        check(
            self.reward.lambda.is_finite() && self.reward.lambda.abs() <= 1e6,
            "reward.lambda",
            "must be finite, |λ| ≤ 1e6",
        );
        check(
            unit(self.reward.policy_acc_min),
            "reward.policy_acc_min",
            "must be in [0, 1]",
        );
        check(
            unit(self.reward.policy_acc_max),
            "reward.policy_acc_max",
            "must be in [0, 1]",
        );
        check(
            unit(self.reward.rm_acc_min),
            "reward.rm_acc_min",
            "must be in [0, 1]",
        );
        check(
            unit(self.reward.rm_acc_max),
            "reward.rm_acc_max",
            "must be in [0, 1]",
        );
        check(
            self.reward.unparsable_reward.is_finite(),
            "reward.unparsable_reward",
            "must be finite",
        );
        check(
            self.reward.clip_eps > 0.0 && self.reward.clip_eps < 1.0,
            "reward.clip_eps",
            "must be in (0, 1)",
        );
        check(self.reward.kl_beta >= 0.0, "reward.kl_beta", "must be ≥ 0");
        check(
            unit(self.adapt.alpha_low) && unit(self.adapt.alpha_high),
            "adapt.alpha_low",
            "alphas must be in [0, 1]",
        );
        check(
            self.adapt.alpha_low < self.adapt.alpha_high,
            "adapt.alpha_high",
            "must be greater than adapt.alpha_low",
        );
        let o = &self.adapt.openai;
        check(
            o.endpoint.starts_with("http://") || o.endpoint.starts_with("https://"),
            "adapt.openai.endpoint",
            "must be an http:// or https:// URL",
        );
        check(
            o.temperature >= 0.0 && o.temperature.is_finite(),
            "adapt.openai.temperature",
            "must be ≥ 0",
        );
        check(
            o.attempts >= 1,
            "adapt.openai.attempts",
            "must be at least 1",
        );
        check(
            o.max_tokens >= 1,
            "adapt.openai.max_tokens",
            "must be at least 1",
        );
        check(
            o.timeout_secs >= 1,
            "adapt.openai.timeout_secs",
            "must be at least 1",
        );
        check(
            (1..=64).contains(&o.concurrency),
            "adapt.openai.concurrency",
            "must be in 1..=64",
        );
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(errs.join("; ")))
        }
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

/// Serialize a JSON value with object keys sorted and no insignificant whitespace.
pub fn canonical(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", serde_json::to_string(k).unwrap(), canonical(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        serde_json::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
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
