//! The iteration DAG and its runner.
//!
//! A [`Stage`] is a pure function: the engine registers its input tables (over committed files)
//! in a DataFusion session, the stage returns plans or batch streams for its output tables, and
//! the engine writes, hashes and commits them. Stages never see the store.

pub mod catalog;
pub mod exec;
pub mod replay;
pub mod runner;
pub mod summary;

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::schema;

pub use runner::Engine;

/// What a stage gets: its inputs as DataFusion tables, the resolved config and a derived seed.
pub struct StageContext {
    pub run_id: String,
    pub iter: u32,
    /// Seed derived from (run seed, iter, stage): see [`derive_seed`].
    pub seed: u64,
    pub config: Arc<Config>,
    /// A session where every input table of the stage is registered under its table name.
    pub session: SessionContext,
    /// The committed files behind the session's tables (`None` when a test registers batches).
    /// The engine uses them to run a partitioned stage range by range.
    pub inputs: Option<Arc<InputFiles>>,
    /// Model checkpoints the stage reads ([`Stage::checkpoints_in`]), by name, digests verified.
    pub checkpoints: std::collections::BTreeMap<String, bytes::Bytes>,
    /// Artifacts (checkpoints) the stage writes: the engine stores them content-addressed
    /// before the manifest that names them.
    pub artifacts: std::sync::Mutex<Vec<(String, bytes::Bytes)>>,
}

impl StageContext {
    /// A context over a session with no committed files behind it (tests, range chunks).
    pub fn detached(
        run_id: String,
        iter: u32,
        seed: u64,
        config: Arc<Config>,
        session: SessionContext,
    ) -> StageContext {
        StageContext {
            run_id,
            iter,
            seed,
            config,
            session,
            inputs: None,
            checkpoints: Default::default(),
            artifacts: Default::default(),
        }
    }

    /// The bytes of an input checkpoint.
    pub fn checkpoint(&self, name: &str) -> Result<&bytes::Bytes> {
        self.checkpoints.get(name).ok_or_else(|| {
            Error::Model(format!(
                "stage input checkpoint {name:?} was not provided by the engine"
            ))
        })
    }

    /// Hand an artifact to the engine.
    pub fn emit_artifact(&self, name: &str, bytes: bytes::Bytes) {
        self.artifacts
            .lock()
            .expect("artifact list")
            .push((name.to_string(), bytes));
    }
}

/// The committed input files of a stage, per table.
#[derive(Debug, Clone)]
pub struct InputFiles {
    pub store: crate::store::Store,
    pub memory_limit_mib: u64,
    pub tables: Vec<(schema::TableDef, Vec<crate::store::manifest::OutputFile>)>,
}

/// One output table of a stage.
pub enum TableOutput {
    /// A lazy plan. The engine sorts it by the table's key before writing.
    Frame(DataFrame),
    /// Batches the stage guarantees to be in key order already (streamed, never sorted).
    Sorted(SendableRecordBatchStream),
}

/// A stage of the iteration DAG.
#[async_trait]
pub trait Stage: Send + Sync {
    /// Stage name: the manifest file name and the `stage` column of `stage_runs`.
    fn name(&self) -> &'static str;
    /// Tables this stage reads. A table produced by an earlier stage of the DAG is read from the
    /// same iteration; one produced by this or a later stage is read from the previous iteration.
    fn inputs(&self) -> &'static [&'static str] {
        &[]
    }
    /// Tables this stage writes (every one of them, every time, possibly empty).
    fn outputs(&self) -> &'static [&'static str];
    /// Top-level config sections whose values the stage depends on (hashed into its manifest).
    fn config_sections(&self) -> &'static [&'static str] {
        &[]
    }
    /// A column (of every input that has it, and the first key column of every output) whose
    /// values the stage treats independently: rows with different values never meet. The engine
    /// may then run the stage on contiguous ranges of the column and concatenate the outputs.
    fn partition_column(&self) -> Option<&'static str> {
        None
    }
    /// Model checkpoints this stage reads, by name. Like tables: one written by an earlier stage
    /// is read from the same iteration, one written by this or a later stage from the previous
    /// iteration; at iteration 0 the engine provides the initial checkpoint (seeded).
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[]
    }
    /// Checkpoints this stage writes (as artifacts, every time).
    fn checkpoints_out(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether the outputs are a pure function of inputs, config and seed (checked by replay).
    fn deterministic(&self) -> bool {
        true
    }
    /// Compute the outputs.
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>>;
}

/// A validated DAG: stages in execution order, each output table produced by exactly one stage.
#[derive(Clone)]
pub struct Dag {
    stages: Vec<Arc<dyn Stage>>,
}

/// Where a stage's input table comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSource {
    pub table: &'static str,
    pub stage: &'static str,
    /// 0: same iteration; 1: previous iteration.
    pub iter_offset: u32,
}

impl Dag {
    pub fn new(stages: Vec<Arc<dyn Stage>>) -> Result<Dag> {
        let dag = Dag { stages };
        let mut seen = std::collections::BTreeMap::new();
        for s in &dag.stages {
            if s.name().starts_with('_') || s.name().contains('/') {
                return Err(Error::config(format!("invalid stage name {:?}", s.name())));
            }
            for t in s.outputs() {
                if schema::table_def(t).is_none() || *t == "stage_runs" {
                    return Err(Error::config(format!(
                        "stage {} writes unknown table {t}",
                        s.name()
                    )));
                }
                if let Some(other) = seen.insert(*t, s.name()) {
                    return Err(Error::config(format!(
                        "table {t} is written by both {other} and {}",
                        s.name()
                    )));
                }
            }
        }
        for s in &dag.stages {
            for t in s.inputs() {
                if !seen.contains_key(t) {
                    return Err(Error::config(format!(
                        "stage {} reads table {t}, which no stage of this DAG writes",
                        s.name()
                    )));
                }
            }
        }
        Ok(dag)
    }

    /// The DAG a config runs. Environments, models and adaptation plug in here.
    pub fn for_config(cfg: &Config) -> Result<Dag> {
        use crate::stages;
        let mut dag: Vec<Arc<dyn Stage>> = match cfg.env.name.as_str() {
            "synthetic" => vec![Arc::new(stages::synthetic::Synthetic)],
            _ => vec![
                Arc::new(stages::pool::Pool),
                Arc::new(stages::rollout::Rollout),
                Arc::new(stages::rm_score::RmScore),
            ],
        };
        dag.push(Arc::new(stages::reward_join::RewardJoin));
        dag.push(Arc::new(stages::advantage::Advantage));
        if cfg.env.name != "synthetic" {
            dag.push(Arc::new(stages::update::Update));
        }
        dag.push(Arc::new(stages::task_accuracy::TaskAccuracy));
        if cfg.env.name != "synthetic" {
            dag.push(Arc::new(stages::adapt::Adapt {
                deterministic: cfg.adapt.adapter == crate::config::AdapterKind::Procedural,
            }));
            dag.push(Arc::new(stages::evaluate::Evaluate));
        }
        Dag::new(dag)
    }

    pub fn stages(&self) -> &[Arc<dyn Stage>] {
        &self.stages
    }

    pub fn stage(&self, name: &str) -> Option<&Arc<dyn Stage>> {
        self.stages.iter().find(|s| s.name() == name)
    }

    fn index(&self, name: &str) -> usize {
        self.stages
            .iter()
            .position(|s| s.name() == name)
            .expect("stage of this DAG")
    }

    /// Producer and iteration offset of every checkpoint a stage reads (`None`: no stage of
    /// this DAG writes it, the initial checkpoint is used at every iteration).
    pub fn checkpoint_sources(
        &self,
        stage: &str,
    ) -> Vec<(&'static str, Option<(&'static str, u32)>)> {
        let me = self.index(stage);
        self.stages[me]
            .checkpoints_in()
            .iter()
            .map(|name| {
                let producer = self
                    .stages
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.checkpoints_out().contains(name))
                    .map(|(i, s)| (s.name(), u32::from(i >= me)));
                (*name, producer)
            })
            .collect()
    }

    /// Producer and iteration offset of every input of a stage.
    pub fn sources(&self, stage: &str) -> Vec<InputSource> {
        let me = self.index(stage);
        self.stages[me]
            .inputs()
            .iter()
            .map(|t| {
                let (i, producer) = self
                    .stages
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.outputs().contains(t))
                    .expect("validated");
                InputSource {
                    table: t,
                    stage: producer.name(),
                    iter_offset: u32::from(i >= me),
                }
            })
            .collect()
    }
}

/// A stable 64-bit seed from a run seed and a path of labels (iter, stage, task, rollout, ...):
/// the first 8 bytes of blake3 over the parts, length-prefixed.
pub fn derive_seed(root: u64, parts: &[&str]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&root.to_le_bytes());
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_stable_and_distinct() {
        assert_eq!(
            derive_seed(1, &["0", "rollout"]),
            derive_seed(1, &["0", "rollout"])
        );
        assert_ne!(
            derive_seed(1, &["0", "rollout"]),
            derive_seed(2, &["0", "rollout"])
        );
        assert_ne!(
            derive_seed(1, &["0r", "ollout"]),
            derive_seed(1, &["0", "rollout"])
        );
    }

    #[test]
    fn default_dag_wires_tables() {
        let cfg = crate::config::Config::from_toml("[run]\nname='x'\n", "t").unwrap();
        let dag = Dag::for_config(&cfg).unwrap();
        let src = dag.sources("advantage");
        assert!(src.iter().all(|s| s.iter_offset == 0));
        assert!(
            src.iter()
                .any(|s| s.table == "step_rewards" && s.stage == "reward_join")
        );
    }
}
