//! The stage contract: what the engine and the stages agree on, below both of them.
//!
//! A [`Stage`] is a pure function: the engine registers its input tables (over committed files)
//! in a DataFusion session, the stage returns plans or batch streams for its output tables, and
//! the engine writes, hashes and commits them. Stages never see the store; the engine never
//! names a concrete stage (the pipeline registry, `crate::pipeline`, assembles the DAG).
//!
//! [`sql`] holds what every relational stage uses to run the SQL files beside it; stages read
//! query results by column name and build their output batches with
//! [`crate::schema::rows`].

pub mod sql;

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::schema;

/// What a stage gets: its inputs as DataFusion tables, the resolved config and a derived seed.
pub struct StageContext {
    pub run_id: String,
    pub iter: u32,
    /// Seed derived from (run seed, iter, stage): see [`crate::determinism::derive_seed`].
    pub seed: u64,
    pub config: Arc<Config>,
    /// A session where every input table of the stage is registered under its table name.
    pub session: SessionContext,
    /// The committed files behind the session's tables (`None` when a test registers batches).
    /// The engine uses them to run a partitioned stage range by range.
    pub inputs: Option<Arc<InputFiles>>,
    /// Model checkpoints the stage reads ([`Stage::checkpoints_in`]), by name, digests verified
    /// when they are loaded ([`StageContext::checkpoint`]).
    pub checkpoints: std::collections::BTreeMap<String, CheckpointInput>,
    /// Artifacts (checkpoints) the stage writes: the engine stores them content-addressed
    /// before the manifest that names them.
    pub artifacts: std::sync::Mutex<Vec<(String, bytes::Bytes)>>,
    /// Tokens the stage's models computed and reused, as [`StageContext::add_tokens`] reports
    /// them (`stage_runs.tokens_computed`, `tokens_reused`).
    pub tokens: std::sync::Mutex<Option<crate::store::manifest::TokenCounts>>,
    /// The largest device memory the stage's models reserved, in bytes, as
    /// [`StageContext::note_device_peak`] reports it (`stage_runs.peak_device_bytes`; GPU only).
    pub device_peak: std::sync::Mutex<Option<u64>>,
    /// The environment assets the run has committed ([`Stage::assets_in`]; `None` otherwise).
    pub assets: Option<Arc<Assets>>,
}

/// A checkpoint a stage reads: in memory already, or loaded (its digest checked) when the stage
/// asks for it, so that a stage holds only the models it is working on — a pretrained model's
/// update does not keep the reward model's bytes while it trains the policy.
#[derive(Clone)]
pub enum CheckpointInput {
    Bytes(bytes::Bytes),
    Deferred(DeferredCheckpoint),
}

/// Loads a deferred checkpoint (the engine's: it reads the store or rebuilds an initial one).
pub type DeferredCheckpoint =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> + Send + Sync>;

/// The prefix of an environment asset's artifact name: `asset-<id>`.
pub const ASSET_PREFIX: &str = "asset-";

/// The prefix of a screenshot's artifact name: `screenshot-<of>-<step>` (stored as `.png`), see
/// [`StageContext::emit_screenshot`].
pub use crate::store::layout::SCREENSHOT_PREFIX;

/// An environment asset a run committed (an artifact named `asset-<id>`, e.g. a TextWorld
/// game's files): where it lies in the store and the blake3 of its bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssetRef {
    pub id: String,
    pub path: String,
    pub digest: String,
}

/// The environment assets of a run, as a stage sees them: every one the run's committed
/// manifests name (what the stage installs before it plays or makes a task), and which of them
/// were committed before the stage (what it need not store again: the same set when the stage is
/// replayed).
#[derive(Debug, Clone)]
pub struct Assets {
    pub store: crate::store::Store,
    pub files: std::collections::BTreeMap<String, AssetRef>,
    pub before: std::collections::BTreeSet<String>,
}

impl Assets {
    /// The bytes of asset `id`, read from the store and checked against their digest.
    pub async fn read(&self, id: &str) -> Result<bytes::Bytes> {
        let a = self.files.get(id).ok_or_else(|| {
            Error::data(format!(
                "environment asset {id} is not committed in this run"
            ))
        })?;
        let path = object_store::path::Path::from(a.path.as_str());
        let bytes = self.store.get_opt(&path).await?.ok_or_else(|| {
            Error::data(format!(
                "environment asset {id}: {} is missing from the store {}",
                a.path,
                self.store.url()
            ))
        })?;
        let got = blake3::hash(&bytes).to_hex().to_string();
        if got != a.digest {
            return Err(Error::Mismatch(format!(
                "environment asset {id} ({}): blake3 {} does not match the digest its manifest recorded ({}); refusing to use it",
                a.path,
                &got[..16],
                &a.digest[..16.min(a.digest.len())]
            )));
        }
        Ok(bytes)
    }
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
            tokens: Default::default(),
            device_peak: Default::default(),
            assets: None,
        }
    }

    /// Report the device memory a part of the stage's model work reserved at its peak (the
    /// stage keeps the largest).
    pub fn note_device_peak(&self, bytes: u64) {
        let mut p = self.device_peak.lock().expect("device peak");
        *p = Some(p.map_or(bytes, |q| q.max(bytes)));
    }

    /// Report model work: `computed` tokens fed to a model, `reused` tokens a shared prefix
    /// saved (added to what the stage reported before).
    pub fn add_tokens(&self, computed: u64, reused: u64) {
        let mut t = self.tokens.lock().expect("token counts");
        let c = t.get_or_insert_with(Default::default);
        c.computed += computed;
        c.reused += reused;
    }

    /// The bytes of an input checkpoint, loaded now if the engine deferred them (each call
    /// loads again: keep the bytes only as long as they are needed).
    pub async fn checkpoint(&self, name: &str) -> Result<bytes::Bytes> {
        match self.checkpoints.get(name) {
            Some(CheckpointInput::Bytes(b)) => Ok(b.clone()),
            Some(CheckpointInput::Deferred(load)) => load().await,
            None => Err(Error::Model(format!(
                "stage input checkpoint {name:?} was not provided by the engine"
            ))),
        }
    }

    /// Whether asset `id` is to be handed to the engine: not committed before this stage, not
    /// emitted by it already.
    pub fn asset_is_new(&self, id: &str) -> bool {
        let name = format!("{ASSET_PREFIX}{id}");
        !self.assets.as_ref().is_some_and(|a| a.before.contains(id))
            && !self
                .artifacts
                .lock()
                .expect("artifact list")
                .iter()
                .any(|(n, _)| *n == name)
    }

    /// Hand an environment asset to the engine (stored content-addressed like a checkpoint,
    /// named `asset-<id>`).
    pub fn emit_asset(&self, id: &str, bytes: bytes::Bytes) {
        self.emit_artifact(&format!("{ASSET_PREFIX}{id}"), bytes);
    }

    /// Hand the engine a screenshot (`env.web.screenshots`): the screen at step `step` of `of`
    /// (a trajectory's id, or the warm start's `demo-<purpose>-<episode>`; `step` = its step
    /// count for the screen after its last step), named `screenshot-<of>-<step>` so that it
    /// joins the table of those steps. `replay --verify` compares screenshots by name only.
    pub fn emit_screenshot(&self, of: &str, step: usize, png: Vec<u8>) {
        self.emit_artifact(&format!("{SCREENSHOT_PREFIX}{of}-{step}"), png.into());
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
    /// Top-level config sections whose values the stage depends on (hashed into its manifest),
    /// or single keys of a section it reads only a few of (`"reward.clip_eps"`).
    fn config_sections(&self) -> &'static [&'static str] {
        &[]
    }
    /// A column (of every input that has it, and the first key column of every output) whose
    /// values the stage treats independently: rows with different values never meet. The engine
    /// may then run the stage on contiguous ranges of the column and concatenate the outputs.
    fn partition_column(&self) -> Option<&'static str> {
        None
    }
    /// A column (as [`Stage::partition_column`]) by which a heavy stage — a model stage — may
    /// be split into shards under `config`, one per worker of a cluster: contiguous ranges of
    /// the column, each run whole on one worker, their outputs concatenated. Only where the
    /// stage's results do not depend on which rows share a shard, bit for bit (seeds per row,
    /// batch-independent models), or where nothing is bit-reproducible anyway (a GPU). A single
    /// node runs the stage whole.
    fn shard_column(&self, config: &Config) -> Option<&'static str> {
        let _ = config;
        None
    }
    /// Model checkpoints this stage reads, by name: the latest one written before it — by an
    /// earlier stage of the same iteration, else by the last stage that wrote it in an earlier
    /// iteration (stages that did not run there skipped); before any, the engine provides the
    /// initial checkpoint (seeded).
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[]
    }
    /// Checkpoints this stage writes (as artifacts, every time).
    fn checkpoints_out(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether the stage runs at iteration `iter` (default: every iteration). Where it does not,
    /// it commits nothing and no other stage may read its tables there (e.g. `pretrain`, which
    /// runs at iteration 0 only and is read for its checkpoints).
    fn runs_at(&self, iter: u32) -> bool {
        let _ = iter;
        true
    }
    /// Whether the stage plays or makes the environment's tasks under `config` with an
    /// environment whose tasks need files kept in the store (TextWorld's games): the engine then
    /// gives it the run's committed assets ([`StageContext::assets`]).
    fn assets_in(&self, config: &Config) -> bool {
        let _ = config;
        false
    }
    /// Whether the outputs are a pure function of inputs, config and seed (checked by replay).
    fn deterministic(&self) -> bool {
        true
    }
    /// Compute the outputs.
    ///
    /// A boxed future written out rather than an `async fn` under `#[async_trait]`: that macro
    /// bounds the method by `Self: 'async_trait`, and under such bounds rustc proves the future
    /// `Send` afresh for every stage — down through every DataFusion type a stage holds — with
    /// nothing shared between stages. Without them the proofs are cached once for all: the
    /// library compiles in 31 s instead of 168 s (cold, non-incremental; docs/src/quick-start.md,
    /// "First build time"). An implementation:
    /// `fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> { Box::pin(async move { … }) }`.
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a>;
}

/// What [`Stage::run`] returns: the stage's outputs, by table name, once computed.
pub type StageRun<'a> = futures::future::BoxFuture<'a, Result<Vec<(&'static str, TableOutput)>>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn deferred_checkpoints_load_when_asked_and_each_time() {
        let loads = Arc::new(AtomicUsize::new(0));
        let cfg = Config::from_toml("[run]\nname='t'\n", "t").unwrap();
        let mut ctx =
            StageContext::detached("r".into(), 0, 1, Arc::new(cfg), SessionContext::new());
        let counter = loads.clone();
        ctx.checkpoints.insert(
            "policy".into(),
            CheckpointInput::Deferred(Arc::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                Box::pin(std::future::ready(Ok(bytes::Bytes::from_static(
                    b"weights",
                ))))
            })),
        );
        ctx.checkpoints.insert(
            "rm".into(),
            CheckpointInput::Bytes(bytes::Bytes::from_static(b"rm")),
        );
        assert_eq!(
            loads.load(Ordering::SeqCst),
            0,
            "nothing is loaded before it is asked for"
        );
        assert_eq!(&ctx.checkpoint("policy").await.unwrap()[..], b"weights");
        assert_eq!(&ctx.checkpoint("policy").await.unwrap()[..], b"weights");
        assert_eq!(
            loads.load(Ordering::SeqCst),
            2,
            "no copy is kept between calls"
        );
        assert_eq!(&ctx.checkpoint("rm").await.unwrap()[..], b"rm");
        let err = ctx.checkpoint("critic").await.unwrap_err().to_string();
        assert!(err.contains("\"critic\""), "{err}");
    }
}
