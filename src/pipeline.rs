//! The pipeline registry: the one place that knows which stages make the DAG of a config, and
//! where the models' initial checkpoints come from. `run`, `replay` and the tests get their DAG
//! here; the engine below only runs what it is given.
//!
//! Adding a stage: write `src/stages/<name>.rs` (+ its `.sql` files) and list it below.

use std::sync::Arc;

use crate::config::Config;
use crate::engine::{Dag, InitialCheckpoint, ModelOrigins};
use crate::error::{Error, Result};
use crate::stage::Stage;
use crate::stages;

/// The DAG a config runs.
pub fn dag(cfg: &Config) -> Result<Dag> {
    if cfg.env.name.runs_programs() {
        return coding_dag(cfg);
    }
    let mut dag: Vec<Arc<dyn Stage>> = Vec::new();
    let episodes = cfg.env.name.has_episodes();
    // The warm start (iteration 0 only) where the environment has a planner to imitate.
    if episodes && cfg.pretrain.enabled && cfg.env.name.has_planner() {
        dag.push(Arc::new(stages::pretrain::Pretrain));
    }
    if episodes {
        dag.push(Arc::new(stages::pool::Pool));
        dag.push(Arc::new(stages::rollout::Rollout));
        dag.push(Arc::new(stages::rm_score::RmScore));
    } else {
        dag.push(Arc::new(stages::synthetic::Synthetic));
    }
    dag.push(Arc::new(stages::reward_join::RewardJoin));
    // Accuracies, then the judgement of pending candidates, BEFORE any training data is built:
    // a rejected candidate's samples never train (the reference implementation's order).
    dag.push(Arc::new(stages::task_accuracy::TaskAccuracy));
    if episodes {
        dag.push(Arc::new(stages::judge::Judge));
    }
    dag.push(Arc::new(stages::advantage::Advantage { judged: episodes }));
    if episodes {
        dag.push(Arc::new(stages::update::Update { coding: false }));
        dag.push(Arc::new(stages::adapt::Adapt {
            deterministic: cfg.adapt.adapter.is_deterministic(),
            coding: false,
        }));
        dag.push(Arc::new(stages::evaluate::Evaluate));
    }
    Ok(Dag::new(dag, initial_checkpoints())?.with_origins(model_origins()))
}

/// The coding setting's DAG (docs/src/coding.md): programs and unit tests written, run in the
/// sandbox (`execute`), rewarded from the runs; no step oracle, so no warm start.
fn coding_dag(cfg: &Config) -> Result<Dag> {
    let dag: Vec<Arc<dyn Stage>> = vec![
        Arc::new(stages::pool::Pool),
        Arc::new(stages::coding_loop::CodingRollout),
        Arc::new(stages::coding_loop::CodingRm),
        Arc::new(stages::execute::Execute),
        Arc::new(stages::coding::CodingAccuracy),
        Arc::new(stages::judge::Judge),
        Arc::new(stages::coding::CodingAdvantage),
        Arc::new(stages::update::Update { coding: true }),
        Arc::new(stages::adapt::Adapt {
            deterministic: cfg.adapt.adapter.is_deterministic(),
            coding: true,
        }),
        Arc::new(stages::coding_loop::CodingEvaluate),
    ];
    Ok(Dag::new(dag, initial_checkpoints())?.with_origins(model_origins()))
}

/// The stage `name` of a config's DAG (what a cluster worker runs a shard of).
pub fn stage(cfg: &Config, name: &str) -> Result<Arc<dyn Stage>> {
    dag(cfg)?.stage(name).cloned().ok_or_else(|| {
        Error::data(format!(
            "the config's pipeline has no stage {name} (is the coordinator the same build?)"
        ))
    })
}

/// The seeded initial checkpoints of the models (`policy`, `rm`): the same bytes for the same
/// config on every machine.
pub fn initial_checkpoints() -> InitialCheckpoint {
    Arc::new(|cfg: &Config, name: &str| {
        let spec = stages::model_spec(cfg, name)?;
        let seed = crate::determinism::derive_seed(cfg.run.seed, &["init", name]);
        crate::model::initial_checkpoint(&spec, seed)
    })
}

/// Where the pretrained models come from (`policy.init` / `reward_model.init = "hf:DIR"`):
/// `hf:DIR blake3:<digest of its weight files>`.
pub fn model_origins() -> ModelOrigins {
    Arc::new(|cfg: &Config| {
        let mut out = std::collections::BTreeMap::new();
        for (name, on) in [
            (
                crate::model::POLICY,
                cfg.policy.kind != crate::config::PolicyKind::Uniform,
            ),
            (crate::model::RM, cfg.reward_model.enabled),
        ] {
            let init = if name == crate::model::POLICY {
                &cfg.policy.init
            } else {
                &cfg.reward_model.init
            };
            if on && !init.is_empty() {
                let spec = stages::model_spec(cfg, name)?;
                if let Some(h) = &spec.hf {
                    out.insert(name.to_string(), format!("{init} blake3:{}", h.digest));
                }
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dag_wires_tables() {
        let cfg = Config::from_toml("[run]\nname='x'\n", "t").unwrap();
        let dag = dag(&cfg).unwrap();
        let src = dag.sources("advantage");
        assert!(src.iter().all(|s| s.iter_offset == 0));
        assert!(
            src.iter()
                .any(|s| s.table == "step_rewards" && s.stage == "reward_join")
        );
    }

    /// `pretrain` runs at iteration 0 only; a stage reads the latest checkpoint written before
    /// it: at iteration 0 pretrain's, later the previous iteration's update's.
    #[test]
    fn warm_start_checkpoints_come_from_pretrain_then_update() {
        let cfg = Config::from_toml("[run]\nname='x'\n[env]\nname='gridnav'\n", "t").unwrap();
        let dag = dag(&cfg).unwrap();
        let from = |stage: &str, iter: u32| dag.checkpoint_sources(stage, iter);
        assert_eq!(from("rollout", 0), vec![("policy", Some(("pretrain", 0)))]);
        assert_eq!(from("rollout", 3), vec![("policy", Some(("update", 2)))]);
        assert_eq!(
            from("update", 0),
            vec![
                ("policy", Some(("pretrain", 0))),
                ("rm", Some(("pretrain", 0)))
            ]
        );
        assert_eq!(from("pretrain", 0), vec![("policy", None), ("rm", None)]);
        let cold = Config::from_toml(
            "[run]\nname='x'\n[env]\nname='gridnav'\n[pretrain]\nenabled=false\n",
            "t",
        )
        .unwrap();
        let dag = super::dag(&cold).unwrap();
        assert_eq!(dag.checkpoint_sources("rollout", 0), vec![("policy", None)]);
        assert_eq!(
            dag.checkpoint_sources("rollout", 1),
            vec![("policy", Some(("update", 0)))]
        );
    }

    #[test]
    fn episode_environments_run_the_model_stages() {
        let cfg = Config::from_toml("[run]\nname='x'\n[env]\nname='gridnav'\n", "t").unwrap();
        let names: Vec<&str> = dag(&cfg)
            .unwrap()
            .stages()
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(
            names,
            [
                "pretrain",
                "pool",
                "rollout",
                "rm_score",
                "reward_join",
                "task_accuracy",
                "judge",
                "advantage",
                "update",
                "adapt",
                "evaluate"
            ]
        );
    }

    /// The coding setting's DAG: programs and tests written, run, rewarded; `execute` writes
    /// the trajectories (their outcomes come from running the programs).
    #[test]
    fn coding_runs_programs_between_writing_and_rewards() {
        let cfg = Config::from_toml("[run]\nname='x'\n[env]\nname='coding'\n", "t").unwrap();
        let dag = dag(&cfg).unwrap();
        let names: Vec<&str> = dag.stages().iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "pool",
                "rollout",
                "rm_score",
                "execute",
                "task_accuracy",
                "judge",
                "advantage",
                "update",
                "adapt",
                "evaluate"
            ]
        );
        assert!(
            dag.sources("task_accuracy")
                .iter()
                .any(|s| s.table == "trajectories" && s.stage == "execute")
        );
    }
}
