//! Environments: task generation, episodes with admissible actions and a step oracle, and the
//! mutation operators the adapter uses. Tasks are JSON specs owned by their environment;
//! `task_id` is a content hash of (env, canonical spec).
//!
//! Built in: [`gridnav`], [`household`]; any other program through [`external`]. Environments
//! never touch storage; the rollout stage drives them.

pub mod coding;
pub mod external;
pub mod gridnav;
pub mod household;
pub mod synthetic;
pub mod textworld;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::determinism::{Rng, canonical};
use crate::error::{Checks, Error, Result};

/// The environments of this build: `env.name`. Adding one: its module (the environment and its
/// settings section), a variant here, its section in [`EnvConfig`], and a line in
/// [`from_config`] (see ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvKind {
    /// The seeded load generator ([`synthetic`]): no episodes, no models.
    Synthetic,
    Gridnav,
    Household,
    External,
    /// Microsoft TextWorld's generated games through a bridge process ([`textworld`]).
    Textworld,
    /// Programming problems: the policy writes programs, the reward model unit tests, both run
    /// in a sandbox ([`coding`]).
    Coding,
}

impl EnvKind {
    /// Whether the environment plays episodes (and so runs the policy, the reward model and
    /// adaptation); `synthetic` generates rollouts directly.
    pub fn has_episodes(self) -> bool {
        self != EnvKind::Synthetic
    }

    /// Whether the environment has a planner ([`Episode::oracle_action`]) and an easier level
    /// ([`easier_from_config`]): what `pretrain` needs.
    pub fn has_planner(self) -> bool {
        matches!(
            self,
            EnvKind::Gridnav | EnvKind::Household | EnvKind::Textworld
        )
    }

    /// Whether the policy writes programs that run against tests (the coding setting: its own
    /// DAG, `crate::pipeline`).
    pub fn runs_programs(self) -> bool {
        self == EnvKind::Coding
    }

    /// Whether its tasks need files besides their specs ([`Environment::asset_id`]), which the
    /// engine keeps in the store with the run.
    pub fn has_assets(self) -> bool {
        self == EnvKind::Textworld
    }
}

/// `[env]`: which environment generates tasks and how hard they are. Each environment owns its
/// subsection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// Environment name: synthetic, gridnav, household, textworld, coding or external.
    pub name: EnvKind,
    /// Number of tasks in the pool.
    pub initial_tasks: u32,
    /// Step budget per episode.
    pub max_steps: u32,
    /// Knobs of the `synthetic` environment.
    pub synthetic: synthetic::SyntheticConfig,
    /// Difficulty distribution of the `gridnav` environment.
    pub gridnav: gridnav::GridNavConfig,
    /// The subprocess of an `external` environment (JSON lines; see src/env/external.rs).
    pub external: external::ExternalConfig,
    /// Difficulty distribution of the `household` environment.
    pub household: household::HouseholdConfig,
    /// TextWorld's games: family, level, knobs, the bridge (src/env/textworld.rs).
    pub textworld: textworld::TextWorldConfig,
    /// The coding setting's problems and sandbox (src/env/coding/).
    pub coding: coding::CodingConfig,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            name: EnvKind::Synthetic,
            initial_tasks: 64,
            max_steps: 12,
            synthetic: Default::default(),
            gridnav: Default::default(),
            external: Default::default(),
            household: Default::default(),
            textworld: Default::default(),
            coding: Default::default(),
        }
    }
}

impl EnvConfig {
    /// The section's checks (keys `env.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            self.initial_tasks >= 1,
            "env.initial_tasks",
            "must be at least 1",
        );
        c.check(self.max_steps >= 1, "env.max_steps", "must be at least 1");
        self.synthetic.validate(self.max_steps, c);
        self.gridnav.validate(c);
        if self.name == EnvKind::Household
            && let Err(e) = self.household.validate()
        {
            c.check(false, "env.household", e);
        }
        self.external.validate(self.name == EnvKind::External, c);
        self.textworld.validate(c);
        self.coding.validate(c);
    }
}

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
    /// The id of the files a task needs besides its spec (TextWorld: its game's blake3), which
    /// the engine keeps in the store with the run; `None` (the default): the spec is the task.
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

/// The environment a config names.
pub fn from_config(cfg: &EnvConfig) -> Result<Box<dyn Environment>> {
    match cfg.name {
        EnvKind::Gridnav => Ok(Box::new(gridnav::GridNav::new(cfg.gridnav.clone()))),
        EnvKind::Household => Ok(Box::new(household::Household::new(cfg.household.clone()))),
        EnvKind::External => Ok(Box::new(external::External::new(cfg.external.clone()))),
        EnvKind::Textworld => Ok(Box::new(textworld::TextWorld::new(cfg.textworld.clone()))),
        EnvKind::Coding => Ok(Box::new(coding::Coding::new(&cfg.coding.problems))),
        EnvKind::Synthetic => Err(Error::config(
            "key `env.name`: the synthetic environment has no episodes (it generates rollouts in the `synthetic` stage)",
        )),
    }
}

/// The environment one difficulty level harder than the config's (for the out-of-distribution
/// evaluation set), where the environment has difficulty knobs: gridnav and household.
pub fn harder_from_config(cfg: &EnvConfig) -> Result<Option<Box<dyn Environment>>> {
    Ok(match cfg.name {
        EnvKind::Gridnav => Some(Box::new(gridnav::GridNav::new(cfg.gridnav.harder()))),
        EnvKind::Household => Some(Box::new(household::Household::new(cfg.household.harder()))),
        EnvKind::Textworld => Some(Box::new(textworld::TextWorld::new(cfg.textworld.harder()))),
        EnvKind::External | EnvKind::Synthetic | EnvKind::Coding => None,
    })
}

/// The environment one difficulty level easier than the config's (where `pretrain` draws its
/// demonstrations: a distribution disjoint from training's), where the environment has
/// difficulty knobs and a planner: gridnav and household.
pub fn easier_from_config(cfg: &EnvConfig) -> Result<Option<Box<dyn Environment>>> {
    Ok(match cfg.name {
        EnvKind::Gridnav => Some(Box::new(gridnav::GridNav::new(cfg.gridnav.easier()))),
        EnvKind::Household => Some(Box::new(household::Household::new(cfg.household.easier()))),
        EnvKind::Textworld => Some(Box::new(textworld::TextWorld::new(cfg.textworld.easier()))),
        EnvKind::External | EnvKind::Synthetic | EnvKind::Coding => None,
    })
}

/// Uniform random play on one thread until `steps` steps are taken (episodes restart as they
/// end): (steps taken, seconds). The environment's own cost, for `rla-pipe bench-env`.
pub fn throughput(
    env: &dyn Environment,
    tasks: &[Value],
    steps: u64,
    seed: u64,
) -> Result<(u64, f64)> {
    if tasks.is_empty() {
        return Err(Error::Environment("no tasks to play".into()));
    }
    let mut rng = Rng::new(seed);
    let started = std::time::Instant::now();
    let mut taken = 0u64;
    let mut t = 0usize;
    let mut action = String::new();
    while taken < steps {
        let mut episode = env.reset(&tasks[t % tasks.len()])?;
        t += 1;
        for _ in 0..episode.max_steps() {
            let admissible = &episode.observation().admissible;
            action.clear();
            action.push_str(&admissible[(rng.next_u64() % admissible.len() as u64) as usize]);
            taken += 1;
            if episode.step(&action)?.done || taken >= steps {
                break;
            }
        }
    }
    Ok((taken, started.elapsed().as_secs_f64()))
}
