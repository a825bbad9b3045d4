//! What every environment is: the [`Environment`] and [`Episode`] traits and what they speak
//! in (observations, steps, directions, the critic summary), and a task's id. The bottom of
//! `env`: each environment builds on it, and `env`'s `mod.rs` (the registry) picks one.

use serde_json::Value;

use crate::determinism::canonical;
use crate::error::{Error, Result};

/// The content hash of a task: blake3 of `env` and the canonical JSON of its spec (16 hex chars).
pub fn task_id(env: &str, spec: &Value) -> String {
    blake3::hash(format!("{env}\n{}", canonical(spec)).as_bytes()).to_hex()[..16].to_string()
}

/// What the agent sees after `reset` or a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub text: String,
    /// The actions the agent may take now (never empty while the episode runs).
    pub admissible: Vec<String>,
}

/// The result of one step (the new observation is the episode's [`Episode::observation`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub done: bool,
    pub won: bool,
    /// +1 the step made progress, −1 it did not; `None` if the environment has no oracle.
    pub oracle_progress: Option<i8>,
}

/// Whether a mutation should make a task harder or easier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Harder,
    Easier,
}

/// What the adapter knows about a task's rollouts: the reward model's outputs, the task's
/// accuracy and which rollouts failed, never the environment's step oracle. Built by the `adapt`
/// stage (`adapt_critic_*.sql`); the task-level fields describe the failed rollouts only unless
/// `adapt.critic_from = "all"`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CriticSummary {
    /// acc(q): success rate of the task's rollouts this iteration.
    pub accuracy: f64,
    /// Rollouts behind the summary.
    pub rollouts: u32,
    /// Step indices where, in at least one rollout, every RM verdict was −1 (sorted).
    pub high_risk_steps: Vec<u32>,
    /// The observations the policy faced at those high-risk steps, most frequent first.
    pub high_risk_observations: Vec<String>,
    /// Verdict rates per step index, over all rollouts and samples.
    pub step_verdicts: Vec<StepVerdicts>,
    /// The most frequent critique words of the RM's reasoning, with their counts.
    pub critique_words: Vec<(String, u32)>,
    /// One entry per failed rollout, in rollout order (the reference's failure summaries).
    #[serde(default)]
    pub failed_rollouts: Vec<FailedRollout>,
}

/// What the critic says about one failed rollout of a task.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailedRollout {
    pub rollout_idx: u32,
    /// Steps the rollout took.
    pub steps: u32,
    /// Its high-risk steps: every RM sample judged the step −1 (sorted).
    pub high_risk_steps: Vec<u32>,
    /// The observation at each high-risk step (same order, truncated).
    pub high_risk_observations: Vec<String>,
    /// The most frequent critique words of the RM's reasoning on this rollout.
    pub critique_words: Vec<(String, u32)>,
    /// The environment model's failure summary (at most two sentences), when an LLM adapter
    /// wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// The RM's verdicts at one step index of a task's rollouts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepVerdicts {
    pub step_idx: u32,
    pub samples: u32,
    /// Share of samples judging the step good (+1) / bad (−1); the rest were unparsable.
    pub good: f64,
    pub bad: f64,
}

impl CriticSummary {
    /// How many times `word` was among the frequent critique words.
    pub fn word_count(&self, word: &str) -> u32 {
        self.critique_words
            .iter()
            .find(|(w, _)| w == word)
            .map_or(0, |(_, n)| *n)
    }
}

/// One running episode.
pub trait Episode: Send {
    /// The current observation.
    fn observation(&self) -> &Observation;
    /// Take an action; an action outside the admissible set is an error.
    fn step(&mut self, action: &str) -> Result<Step>;
    /// The step budget of the task.
    fn max_steps(&self) -> u32;
    /// The environment's planner: an admissible action on an optimal plan from here (`None`
    /// where the environment has no planner, or once the task is solved). `pretrain` imitates it.
    fn oracle_action(&self) -> Option<String> {
        None
    }
    /// A PNG of the screen the episode shows now: what the current observation describes
    /// while the episode runs, the state its last step left once it ended. `None` (the
    /// default) where the environment has no screen or keeps no pictures (web: unless
    /// `env.web.screenshots`); the stages that commit steps keep what it returns as artifacts.
    fn screenshot(&mut self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

/// An environment.
pub trait Environment: Send + Sync {
    /// Name used in configs and in task ids.
    fn name(&self) -> &str;
    /// `count` seed tasks drawn from the configured difficulty distribution.
    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>>;
    /// Start an episode of a task.
    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>>;
    /// Whether a spec is a valid, solvable task of this environment (what an LLM adapter's
    /// candidates must pass). Default: an episode can be started from it.
    fn validate(&self, spec: &Value) -> Result<()> {
        self.reset(spec).map(|_| ())
    }
    /// Candidate rewrites of a task in a direction (each valid and solvable), most preferred
    /// first: operators are picked using the critic summary where the environment can.
    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>>;
    /// The words observations and actions are made of (for the built-in tokenizer).
    fn vocabulary(&self) -> Vec<String>;
    /// The JSON Schema of a task's spec, where the environment has one (web): what an LLM
    /// adapter is shown, and what [`Environment::validate`] enforces.
    fn spec_schema(&self) -> Option<Value> {
        None
    }
    /// The id of the files a task has besides its spec (TextWorld: its game's blake3; web: its
    /// page's blake3), which the engine keeps in the store with the run; `None` (the default):
    /// the spec is the task.
    fn asset_id(&self, spec: &Value) -> Option<String> {
        let _ = spec;
        None
    }
    /// The bytes of a task's asset ([`Environment::asset_id`]), made by this environment
    /// earlier (by `generate`, `mutate` or `reset`): what [`Environment::install_asset`] takes.
    fn asset(&self, spec: &Value) -> Result<Vec<u8>> {
        Err(Error::Environment(format!(
            "{}: tasks have no files besides their spec ({spec})",
            self.name()
        )))
    }
    /// Which of these assets are not here (not in this machine's cache, or altered there).
    fn missing_assets(&self, ids: &[&str]) -> Vec<String> {
        let _ = ids;
        Vec::new()
    }
    /// Put an asset another machine (or an earlier run) made where this environment finds it,
    /// after checking it is what its id names.
    fn install_asset(&self, id: &str, bytes: &[u8]) -> Result<()> {
        let _ = bytes;
        Err(Error::Environment(format!(
            "{}: has no assets to install (asset {id})",
            self.name()
        )))
    }
}
