//! Environments: task generation, episodes with admissible actions and a step oracle, and the
//! mutation operators the adapter uses. Tasks are JSON specs owned by their environment;
//! `task_id` is a content hash of (env, canonical spec).
//!
//! Built in: [`gridnav`], [`household`]; any other program through [`external`]. Environments
//! never touch storage; the rollout stage drives them.

pub mod coding;
pub mod contract;
pub mod external;
pub mod gridnav;
pub mod household;
pub mod synthetic;
pub mod textworld;
pub mod web;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::determinism::Rng;
use crate::error::{Checks, Error, Result};
pub use contract::{
    CriticSummary, Direction, Environment, Episode, FailedRollout, Observation, Step, StepVerdicts,
    task_id,
};

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
    /// Web tasks in a headless Chromium, observed as the accessibility tree ([`web`]).
    Web,
}

impl EnvKind {
    /// Whether the environment plays episodes (and so runs the policy, the reward model and
    /// adaptation); `synthetic` generates rollouts directly.
    pub fn has_episodes(self) -> bool {
        self != EnvKind::Synthetic
    }

    /// Whether the environment has a planner ([`Episode::oracle_action`]) and difficulty levels
    /// ([`at_level`]): what `pretrain` and `env.pool_level` need.
    pub fn has_planner(self) -> bool {
        matches!(
            self,
            EnvKind::Gridnav | EnvKind::Household | EnvKind::Textworld | EnvKind::Web
        )
    }

    /// Whether the policy writes programs that run against tests (the coding setting: its own
    /// DAG, `crate::pipeline`).
    pub fn runs_programs(self) -> bool {
        self == EnvKind::Coding
    }

    /// Whether its tasks have files besides their specs ([`Environment::asset_id`]: TextWorld's
    /// games, web's pages), which the engine keeps in the store with the run.
    pub fn has_assets(self) -> bool {
        matches!(self, EnvKind::Textworld | EnvKind::Web)
    }
}

/// `[env]`: which environment generates tasks and how hard they are. Each environment owns its
/// subsection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// Environment name: synthetic, gridnav, household, textworld, coding, web or external.
    pub name: EnvKind,
    /// Number of tasks in the pool.
    pub initial_tasks: u32,
    /// Difficulty of iteration 0's pool relative to the held-out set's (the config's knobs):
    /// 0 the same, -1 one level easier (the warm start then draws one level below the pool).
    pub pool_level: i32,
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
    /// TextWorld's games: family, level, knobs, the bridge (src/env/textworld/).
    pub textworld: textworld::TextWorldConfig,
    /// The coding setting's problems and sandbox (src/env/coding/).
    pub coding: coding::CodingConfig,
    /// Web tasks in a headless Chromium: families, knobs, the browser (src/env/web/).
    pub web: web::WebConfig,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            name: EnvKind::Synthetic,
            initial_tasks: 64,
            pool_level: 0,
            max_steps: 12,
            synthetic: Default::default(),
            gridnav: Default::default(),
            external: Default::default(),
            household: Default::default(),
            textworld: Default::default(),
            coding: Default::default(),
            web: Default::default(),
        }
    }
}

impl EnvConfig {
    /// Whether the environment's episodes keep screenshots (`env.web.screenshots` with
    /// `env.name = "web"`): the stages that commit steps store them as artifacts.
    pub fn screenshots(&self) -> bool {
        self.name == EnvKind::Web && self.web.screenshots
    }

    /// The section with screenshots off: for a stage that plays episodes but commits no steps
    /// (evaluation), whose episodes then capture nothing.
    pub fn without_screenshots(&self) -> EnvConfig {
        let mut c = self.clone();
        c.web.screenshots = false;
        c
    }

    /// The section's checks (keys `env.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            self.initial_tasks >= 1,
            "env.initial_tasks",
            "must be at least 1",
        );
        c.check(self.max_steps >= 1, "env.max_steps", "must be at least 1");
        c.check(
            (-3..=0).contains(&self.pool_level),
            "env.pool_level",
            "must be 0 (the held-out set's difficulty) or -1 to -3 (that many levels easier)",
        );
        c.check(
            self.pool_level == 0 || self.name.has_planner(),
            "env.pool_level",
            "this environment has no difficulty levels: must be 0",
        );
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
        self.web.validate(c);
    }
}

/// The environment a config names (one with difficulty knobs: [`at_level`] 0, where each is
/// built).
pub fn from_config(cfg: &EnvConfig) -> Result<Box<dyn Environment>> {
    match cfg.name {
        EnvKind::External => Ok(Box::new(external::External::new(cfg.external.clone()))),
        EnvKind::Coding => Ok(Box::new(coding::Coding::new(&cfg.coding.problems))),
        EnvKind::Synthetic => Err(Error::config(
            "key `env.name`: the synthetic environment has no episodes (it generates rollouts in the `synthetic` stage)",
        )),
        EnvKind::Gridnav | EnvKind::Household | EnvKind::Textworld | EnvKind::Web => {
            Ok(at_level(cfg, 0)?.expect("an environment with difficulty knobs"))
        }
    }
}

/// The environment one difficulty level harder than the config's (for the out-of-distribution
/// evaluation set), where the environment has difficulty knobs ([`at_level`]).
pub fn harder_from_config(cfg: &EnvConfig) -> Result<Option<Box<dyn Environment>>> {
    at_level(cfg, 1)
}

/// The environment of iteration 0's training pool: `env.pool_level` levels from the config's
/// (the held-out set's) difficulty.
pub fn pool_from_config(cfg: &EnvConfig) -> Result<Box<dyn Environment>> {
    at_level(cfg, cfg.pool_level)?.ok_or_else(|| {
        Error::config(format!(
            "key `env.pool_level`: the {:?} environment has no difficulty levels; set it to 0",
            cfg.name
        ))
    })
}

/// The environment `level` difficulty levels from the config's (negative: easier; each level
/// is the knobs' `harder()` / `easier()` once); `None` for a nonzero level of an environment
/// without difficulty knobs (external, synthetic, coding).
pub fn at_level(cfg: &EnvConfig, level: i32) -> Result<Option<Box<dyn Environment>>> {
    fn shift<C: Clone>(c: &C, level: i32, harder: fn(&C) -> C, easier: fn(&C) -> C) -> C {
        let step = if level > 0 { harder } else { easier };
        (0..level.unsigned_abs()).fold(c.clone(), |c, _| step(&c))
    }
    Ok(match cfg.name {
        EnvKind::Gridnav => Some(Box::new(
            gridnav::GridNav::new(shift(
                &cfg.gridnav,
                level,
                gridnav::GridNavConfig::harder,
                gridnav::GridNavConfig::easier,
            ))
            .with_step_cap(cfg.max_steps),
        )),
        EnvKind::Household => Some(Box::new(
            household::Household::new(shift(
                &cfg.household,
                level,
                household::HouseholdConfig::harder,
                household::HouseholdConfig::easier,
            ))
            .with_step_cap(cfg.max_steps),
        )),
        EnvKind::Textworld => Some(Box::new(textworld::TextWorld::new(shift(
            &cfg.textworld,
            level,
            textworld::TextWorldConfig::harder,
            textworld::TextWorldConfig::easier,
        )))),
        EnvKind::Web => Some(Box::new(web::Web::new(shift(
            &cfg.web,
            level,
            web::WebConfig::harder,
            web::WebConfig::easier,
        )))),
        EnvKind::External | EnvKind::Synthetic | EnvKind::Coding if level == 0 => {
            Some(from_config(cfg)?)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn ids(e: &dyn Environment) -> Vec<String> {
        e.generate(7, 12)
            .unwrap()
            .iter()
            .map(|s| task_id(e.name(), s))
            .collect()
    }

    #[test]
    fn levels_shift_the_knobs_that_many_times_and_the_pool_follows_pool_level() {
        let mut c = EnvConfig {
            name: EnvKind::Household,
            ..Default::default()
        };
        let h = |k: household::HouseholdConfig| household::Household::new(k);
        let at = |c: &EnvConfig, l| ids(at_level(c, l).unwrap().unwrap().as_ref());
        let level = |l| at(&c, l);
        assert_eq!(level(0), ids(from_config(&c).unwrap().as_ref()));
        assert_eq!(level(1), ids(&h(c.household.harder())));
        assert_eq!(level(-1), ids(&h(c.household.easier())));
        assert_eq!(level(-2), ids(&h(c.household.easier().easier())));
        assert_ne!(level(-1), level(0));
        assert_ne!(level(-2), level(-1));
        let (same, easier) = (level(0), level(-1));
        assert_eq!(ids(pool_from_config(&c).unwrap().as_ref()), same);
        c.pool_level = -1;
        assert_eq!(ids(pool_from_config(&c).unwrap().as_ref()), easier);
        // Every level below the smallest homes still makes tasks.
        c.household.receptacles = 2;
        c.household.distractors = 0;
        for l in -3..=1 {
            assert_eq!(at(&c, l).len(), 12, "level {l}");
        }
        // Environments without difficulty knobs have only their own level.
        c.name = EnvKind::Coding;
        assert!(at_level(&c, -1).unwrap().is_none());
        assert!(pool_from_config(&c).is_err());
    }

    #[test]
    fn pool_level_is_checked() {
        let load = |env: &str| Config::from_toml(&format!("[run]\nname='t'\n[env]\n{env}\n"), "t");
        assert!(load("name='household'\npool_level=-1").is_ok());
        for bad in [
            "name='household'\npool_level=1",
            "name='gridnav'\npool_level=-4",
            "pool_level=-1",
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains("env.pool_level"), "{bad}: {e}");
        }
    }
}
