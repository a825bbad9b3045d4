//! The DAG the engine runs: stages in execution order, validated so that each output table is
//! produced by exactly one stage, and where every input comes from. Which stages make a DAG is
//! the pipeline registry's business (`crate::pipeline`), not the engine's.

use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::schema;
use crate::stage::Stage;

/// Supplies the checkpoints no stage has written yet (the seeded initial models), by name.
pub type InitialCheckpoint = Arc<dyn Fn(&Config, &str) -> Result<bytes::Bytes> + Send + Sync>;

/// Names where the initial checkpoints come from when rla-pipe does not seed them (e.g.
/// `policy → "hf:models/x blake3:…"`): recorded in `run.json` and in the manifests that read
/// them, and checked on resume.
pub type ModelOrigins =
    Arc<dyn Fn(&Config) -> Result<std::collections::BTreeMap<String, String>> + Send + Sync>;

/// A validated DAG: stages in execution order, each output table produced by exactly one stage.
#[derive(Clone)]
pub struct Dag {
    stages: Vec<Arc<dyn Stage>>,
    initial: InitialCheckpoint,
    origins: Option<ModelOrigins>,
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
    /// A DAG of stages in execution order; `initial` supplies every checkpoint a stage reads
    /// before any stage of the DAG has written it.
    pub fn new(stages: Vec<Arc<dyn Stage>>, initial: InitialCheckpoint) -> Result<Dag> {
        let dag = Dag {
            stages,
            initial,
            origins: None,
        };
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

    /// The same DAG, recording where its initial checkpoints come from.
    pub fn with_origins(mut self, origins: ModelOrigins) -> Dag {
        self.origins = Some(origins);
        self
    }

    /// Where each initial checkpoint not seeded by rla-pipe comes from (see [`ModelOrigins`]).
    pub fn origins(&self, config: &Config) -> Result<std::collections::BTreeMap<String, String>> {
        match &self.origins {
            Some(f) => f(config),
            None => Ok(Default::default()),
        }
    }

    /// The initial checkpoint `name` under a config (iteration 0, or a checkpoint no stage of
    /// this DAG writes).
    pub fn initial_checkpoint(&self, config: &Config, name: &str) -> Result<bytes::Bytes> {
        (self.initial)(config, name)
    }

    /// The function building initial checkpoints (to build one later, apart from the DAG).
    pub fn initial_fn(&self) -> InitialCheckpoint {
        self.initial.clone()
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

    /// Producer and iteration of every checkpoint a stage reads at `iter`: the latest write
    /// before it (an earlier stage of the same iteration, else the last writer of an earlier
    /// iteration, skipping stages that did not run there). `None`: nothing wrote it yet, the
    /// initial checkpoint is used.
    pub fn checkpoint_sources(
        &self,
        stage: &str,
        iter: u32,
    ) -> Vec<(&'static str, Option<(&'static str, u32)>)> {
        let me = self.index(stage);
        self.stages[me]
            .checkpoints_in()
            .iter()
            .map(|name| {
                let writes = |s: &&Arc<dyn Stage>, at: u32| {
                    s.checkpoints_out().contains(name) && s.runs_at(at)
                };
                let same = self.stages[..me]
                    .iter()
                    .rev()
                    .find(|s| writes(s, iter))
                    .map(|s| (s.name(), iter));
                let earlier = || {
                    (0..iter).rev().find_map(|at| {
                        self.stages
                            .iter()
                            .rev()
                            .find(|s| writes(s, at))
                            .map(|s| (s.name(), at))
                    })
                };
                (*name, same.or_else(earlier))
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
