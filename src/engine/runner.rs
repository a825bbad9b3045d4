//! `run`: execute the DAG iteration by iteration, committing each stage; resume from the store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tracing::info;

use super::Dag;
use super::checkpoints::{check_digest, read_checked};
use super::exec::{self, Sink};
use super::shard::{ShardCheckpoint, StageCodec};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::determinism::derive_seed;
use crate::error::{Error, Result};
use crate::schema;
use crate::stage::{CheckpointInput, InputFiles, Stage, StageContext};
use crate::store::catalog::{self, Committed};
use crate::store::manifest::{
    self, InputKind, InputRef, IterationManifest, RunManifest, StageDigest, StageManifest,
};
use crate::store::tables::FileOrder;
use crate::store::{Store, layout};

/// Runs one run's DAG over a store.
pub struct Engine {
    store: Store,
    run_id: String,
    config: Arc<Config>,
    dag: Dag,
    /// Where the initial checkpoints not seeded by rla-pipe come from (`run.json`'s `models`,
    /// resolved once at open).
    models: std::collections::BTreeMap<String, String>,
    /// Print per-stage lines and progress bars on stderr.
    pub verbose: bool,
    /// `run.cluster`'s workers, which run the partitioned stages' ranges and the model stages'
    /// shards.
    cluster: Option<Cluster>,
    /// The run this one branches from (`run.json`'s `branch`): a stage that would compute what
    /// the parent committed is shared with it instead ([`Engine::shared_with_parent`]).
    branch: Option<manifest::Branch>,
    /// Share a branch's stages that would compute what its parent committed (the default);
    /// `false` executes them (`replay --into … --recompute`).
    pub share_with_parent: bool,
    /// [`Engine::row_digest`]'s answers by (table, file digest): a branch compares a table
    /// whose bytes differ from its parent's once for every stage that reads it.
    row_digests: std::sync::Mutex<std::collections::HashMap<(String, String), (u64, String)>>,
}

impl Engine {
    /// Open (or create) a run. A new run gets `run.json` (put-if-absent); an existing run must have
    /// been created with the same config hash, otherwise the differing keys are listed.
    pub async fn open(store: Store, run_id: &str, config: Config, dag: Dag) -> Result<Engine> {
        Self::open_branch(store, run_id, config, dag, None).await
    }

    /// [`Engine::open`] for a run that may be a branch (`run.json`'s `branch`); an existing run
    /// must have been created as the same branch (or as no branch).
    pub async fn open_branch(
        store: Store,
        run_id: &str,
        config: Config,
        dag: Dag,
        branch: Option<manifest::Branch>,
    ) -> Result<Engine> {
        layout::validate_run_id(run_id)?;
        let wanted = RunManifest {
            format: manifest::FORMAT,
            run_id: run_id.to_string(),
            code_version: manifest::code_version(),
            config_hash: config.hash(),
            created_at: manifest::now_rfc3339(),
            config: serde_json::from_str(&config.canonical_json()).expect("canonical json parses"),
            models: dag.origins(&config)?,
            branch,
        };
        let existing = match catalog::read_run(&store, run_id).await? {
            Some(r) => Some(r),
            None => match store
                .put_if_absent(&layout::run_json(run_id), manifest::to_bytes(&wanted))
                .await
            {
                Ok(()) => None,
                Err(Error::CommitConflict(_)) => catalog::read_run(&store, run_id).await?,
                Err(e) => return Err(e),
            },
        };
        if let Some(existing) = existing {
            if existing.branch != wanted.branch {
                let says = |b: &Option<manifest::Branch>| match b {
                    None => "not a branch".to_string(),
                    Some(b) => format!(
                        "a branch of {:?} from iteration {} (--set {})",
                        b.parent,
                        b.from_iter,
                        b.overrides.join(" --set ")
                    ),
                };
                return Err(Error::Config(format!(
                    "run {run_id:?} already exists and is {}; this command makes it {}. Choose another run id.",
                    says(&existing.branch),
                    says(&wanted.branch)
                )));
            }
            // Compare values, not only hashes: the stored config is read with this build's defaults
            // for keys it did not have yet, so a run can be resumed after an upgrade that only
            // added keys, as long as every value is the same.
            let diff = match serde_json::from_value::<Config>(existing.config.clone()) {
                Ok(old) => old.diff(&config),
                Err(e) => vec![format!(
                    "(the stored config does not parse with this build: {e})"
                )],
            };
            if !diff.is_empty() {
                return Err(Error::Config(format!(
                    "run {run_id:?} already exists with a different config (hash {} ≠ {}); refusing to resume. Keys that differ:\n  {}\nStart a new run with --run-id, or restore the settings.",
                    &existing.config_hash[..12],
                    &wanted.config_hash[..12],
                    diff.join("\n  "),
                )));
            }
            for (name, origin) in &existing.models {
                let now = wanted.models.get(name);
                if now != Some(origin) {
                    return Err(Error::Config(format!(
                        "run {run_id:?} started its {name} model from {origin}; this config now gives {}. \
                         Refusing to resume with different weights: restore them, or start a new run with --run-id.",
                        now.map(String::as_str)
                            .unwrap_or("the seeded small transformer")
                    )));
                }
            }
            if existing.config_hash != wanted.config_hash {
                info!(run = %run_id, "run.json predates some config keys; their defaults apply and all values match");
            }
        }
        let branch = wanted.branch.clone();
        // The cluster's codec decodes a shard to the stage of this DAG it names.
        let stages = dag.stages().to_vec();
        let codec = StageCodec::new(
            store.clone(),
            Arc::new(move |_: &Config, name: &str| {
                stages
                    .iter()
                    .find(|s| s.name() == name)
                    .cloned()
                    .ok_or_else(|| Error::data(format!("no stage {name} in this run's DAG")))
            }),
        );
        Ok(Engine {
            cluster: Cluster::parse(&config.run.cluster)?.map(|c| c.with_codec(Arc::new(codec))),
            store,
            run_id: run_id.to_string(),
            config: Arc::new(config),
            dag,
            models: wanted.models,
            verbose: false,
            branch,
            share_with_parent: true,
            row_digests: Default::default(),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bring the run to `iterations` committed iterations, skipping every stage already
    /// committed. With `until`, stop after that stage of the last iteration it reaches.
    pub async fn run(&self, iterations: u32, until: Option<&str>) -> Result<()> {
        if let Some(u) = until
            && self.dag.stage(u).is_none()
        {
            let names: Vec<_> = self.dag.stages().iter().map(|s| s.name()).collect();
            return Err(Error::config(format!(
                "--until {u}: no such stage (stages: {})",
                names.join(", ")
            )));
        }
        if let Some(cluster) = &self.cluster {
            cluster.check(&self.store).await?;
            self.say(format!(
                "cluster: {} workers ({})",
                cluster.urls().len(),
                cluster
                    .urls()
                    .iter()
                    .map(crate::cluster::show)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for iter in 0..iterations {
            if self
                .store
                .size(&layout::iteration_manifest(&self.run_id, iter))
                .await?
                .is_some()
            {
                self.say(format!("iter {iter:>3}  already committed"));
                continue;
            }
            let started = Instant::now();
            let mut done: BTreeMap<(u32, String), Committed> = BTreeMap::new();
            for stage in self.dag.stages() {
                if !stage.runs_at(iter) {
                    continue;
                }
                let committed =
                    match catalog::read_stage(&self.store, &self.run_id, iter, stage.name()).await?
                    {
                        Some(c) => {
                            self.say(format!(
                                "iter {iter:>3}  {:<16} committed earlier, skipped",
                                stage.name()
                            ));
                            c
                        }
                        None => match self.shared_with_parent(iter, stage, &mut done).await? {
                            Some(c) => c,
                            None => self.run_stage(iter, stage, &mut done).await?,
                        },
                    };
                done.insert((iter, stage.name().to_string()), committed);
                if until == Some(stage.name()) {
                    return Ok(());
                }
            }
            let it = IterationManifest {
                format: manifest::FORMAT,
                run_id: self.run_id.clone(),
                iter,
                code_version: manifest::code_version(),
                stages: self
                    .dag
                    .stages()
                    .iter()
                    .filter(|s| s.runs_at(iter))
                    .map(|s| StageDigest {
                        stage: s.name().to_string(),
                        digest: done[&(iter, s.name().to_string())].digest.clone(),
                    })
                    .collect(),
                seconds: started.elapsed().as_secs_f64(),
            };
            let path = layout::iteration_manifest(&self.run_id, iter);
            crash_point("before-iteration");
            match self
                .store
                .put_if_absent(&path, manifest::to_bytes(&it))
                .await
            {
                // Another writer finished the same iteration first: it is complete either way.
                Ok(()) | Err(Error::CommitConflict(_)) => {}
                Err(e) => return Err(e),
            }
            if self.verbose {
                let manifests = it
                    .stages
                    .iter()
                    .map(|s| &done[&(iter, s.stage.clone())].manifest);
                let summary = match super::summary::of_iteration(&self.store, manifests).await {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("(no summary: {e})"),
                };
                self.say(format!(
                    "iter {iter:>3}  committed in {:.1}s · {summary}",
                    started.elapsed().as_secs_f64(),
                ));
            }
        }
        Ok(())
    }

    /// A branch's stage that would compute exactly what its parent committed for the same
    /// iteration — the same config values and seed, and the same inputs (the rows of the
    /// tables it reads, whatever run id they were written under; its checkpoints and the
    /// environment's files, by their bytes) — is shared with the parent instead of executed:
    /// its manifest names the parent's files, as the iterations before the branch point do. So
    /// a branch re-executes only what its overrides reach (`--set adapt.enabled=false` from
    /// iteration 0 shares the warm start, the rollout, the rewards, the update and the
    /// evaluation; `reward.lambda` shares the rollout, the RM's verdicts, the judge and the
    /// adaptation). `None`: the stage must run.
    async fn shared_with_parent(
        &self,
        iter: u32,
        stage: &Arc<dyn Stage>,
        done: &mut BTreeMap<(u32, String), Committed>,
    ) -> Result<Option<Committed>> {
        let Some(branch) = self.branch.as_ref().filter(|_| self.share_with_parent) else {
            return Ok(None);
        };
        let Some(theirs) =
            catalog::read_stage(&self.store, &branch.parent, iter, stage.name()).await?
        else {
            return Ok(None);
        };
        let m = &theirs.manifest;
        let same_config = same_settings(m, stage.config_sections(), &self.config);
        if !same_config || m.seed != stage_seed(&self.config, iter, stage.name()) {
            return Ok(None);
        }
        // Tables read from other stages, by their rows: the bytes of the files committed for
        // them, or where those differ, the rows without `run_id` (a stage a branch executed
        // again — its config section changed — that committed the parent's rows under its own
        // run id counts as the same input, so what reads it is shared in turn).
        let read = |c: &Committed, tables: &[String]| -> Vec<manifest::OutputFile> {
            c.manifest
                .outputs
                .iter()
                .filter(|o| tables.contains(&o.table))
                .cloned()
                .collect()
        };
        let mut mine = Vec::new();
        for (c, tables) in self.inputs_of(iter, stage.as_ref(), done).await? {
            let tables: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
            mine.push((tables.clone(), read(&c, &tables)));
        }
        let mut parents = Vec::new();
        for input in m.inputs.iter().filter(|i| i.kind == InputKind::Manifest) {
            let Some(c) = catalog::read_committed_at(&self.store, &input.path).await? else {
                return Ok(None);
            };
            if c.digest != input.digest {
                return Ok(None);
            }
            parents.push((input.tables.clone(), read(&c, &input.tables)));
        }
        mine.sort_by(|a, b| a.0.cmp(&b.0));
        parents.sort_by(|a, b| a.0.cmp(&b.0));
        if mine.len() != parents.len() {
            return Ok(None);
        }
        for ((tables, ours), (their_tables, theirs)) in mine.iter().zip(&parents) {
            if tables != their_tables || !self.same_rows(ours, theirs).await? {
                return Ok(None);
            }
        }
        // Checkpoints, by their bytes (and the pretrained weights an adapter builds on).
        let theirs_ck: BTreeMap<&str, &InputRef> = m
            .inputs
            .iter()
            .filter(|i| i.kind != InputKind::Manifest)
            .filter_map(|i| i.tables.first().map(|n| (n.as_str(), i)))
            .collect();
        let sources = self.dag.checkpoint_sources(stage.name(), iter);
        if sources.len() != theirs_ck.len() {
            return Ok(None);
        }
        for (name, from) in sources {
            let Some(t) = theirs_ck.get(name) else {
                return Ok(None);
            };
            if t.source != self.models.get(name).cloned() {
                return Ok(None);
            }
            let digest = match from {
                Some((producer, from)) => {
                    if t.kind != InputKind::Artifact {
                        return Ok(None);
                    }
                    let key = (from, producer.to_string());
                    if !done.contains_key(&key) {
                        let Some(c) =
                            catalog::read_stage(&self.store, &self.run_id, from, producer).await?
                        else {
                            return Ok(None);
                        };
                        done.insert(key.clone(), c);
                    }
                    match done[&key]
                        .manifest
                        .artifacts
                        .iter()
                        .find(|a| a.name == name)
                    {
                        Some(a) => a.digest.clone(),
                        None => return Ok(None),
                    }
                }
                None => {
                    if t.kind != InputKind::Init {
                        return Ok(None);
                    }
                    manifest::digest(&self.dag.initial_checkpoint(&self.config, name)?)
                }
            };
            if digest != t.digest {
                return Ok(None);
            }
        }
        // The environment's files committed before the stage, by their bytes.
        if stage.assets_in(&self.config) {
            let before = |a: crate::stage::Assets| -> BTreeMap<String, String> {
                a.files
                    .into_iter()
                    .filter(|(id, _)| a.before.contains(id))
                    .map(|(id, f)| (id, f.digest))
                    .collect()
            };
            let dag = &self.dag;
            let ours = super::assets::committed(&self.store, &self.run_id, dag, iter, stage.name());
            let parent =
                super::assets::committed(&self.store, &branch.parent, dag, iter, stage.name());
            if before(ours.await?) != before(parent.await?) {
                return Ok(None);
            }
        }
        let mut shared = m.clone();
        shared.shared = Some(m.shared.clone().unwrap_or(manifest::Shared {
            run: branch.parent.clone(),
            path: theirs.path.clone(),
            digest: theirs.digest.clone(),
        }));
        shared.run_id = self.run_id.clone();
        shared.status = "shared".into();
        let bytes = manifest::to_bytes(&shared);
        let path = layout::stage_manifest(&self.run_id, iter, stage.name());
        self.store
            .put_if_absent(&path, bytes.clone())
            .await
            .map_err(|e| match e {
                Error::CommitConflict(_) => Error::CommitConflict(format!(
                    "stage {} of iteration {iter} of run {} was committed by another writer first",
                    stage.name(),
                    self.run_id
                )),
                e => e,
            })?;
        let by = shared.shared.as_ref().map_or("", |s| s.run.as_str());
        info!(run = %self.run_id, iter, stage = stage.name(), parent = %by, "stage shared");
        self.say(format!(
            "iter {iter:>3}  {:<16} same inputs and settings as run {by:?}: shared",
            stage.name()
        ));
        Ok(Some(Committed {
            path: path.to_string(),
            digest: manifest::digest(&bytes),
            manifest: shared,
        }))
    }

    /// Whether two stages' files of the same tables hold the same rows: the same bytes, or
    /// the same rows once `run_id` (and the table's wall-clock columns, which replay leaves
    /// out too) are left out — a table's files are written in key order, so equal rows encode
    /// equally. Compared per table as multisets (a partitioned stage writes several files).
    async fn same_rows(
        &self,
        ours: &[manifest::OutputFile],
        theirs: &[manifest::OutputFile],
    ) -> Result<bool> {
        fn by_table(files: &[manifest::OutputFile]) -> BTreeMap<&str, Vec<&manifest::OutputFile>> {
            let mut t: BTreeMap<&str, Vec<&manifest::OutputFile>> = BTreeMap::new();
            for f in files {
                t.entry(f.table.as_str()).or_default().push(f);
            }
            t
        }
        let (ours, theirs) = (by_table(ours), by_table(theirs));
        if !ours.keys().eq(theirs.keys()) {
            return Ok(false);
        }
        for (table, a) in &ours {
            let b = &theirs[table];
            let digests = |files: &[&manifest::OutputFile]| {
                let mut d: Vec<String> = files.iter().map(|f| f.digest.clone()).collect();
                d.sort();
                d
            };
            if digests(a) == digests(b) {
                continue;
            }
            let rows = |files: &[&manifest::OutputFile]| files.iter().map(|f| f.rows).sum::<u64>();
            if rows(a) != rows(b) {
                return Ok(false);
            }
            let mut content = Vec::new();
            for files in [a, b] {
                let mut d = Vec::new();
                for f in files {
                    d.push(self.row_digest(f).await?);
                }
                d.sort();
                content.push(d);
            }
            if content[0] != content[1] {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A committed file's rows without `run_id` and its table's wall-clock columns
    /// ([`exec::digest_without`]), read and encoded once per file and table.
    async fn row_digest(&self, f: &manifest::OutputFile) -> Result<(u64, String)> {
        let key = (f.table.clone(), f.digest.clone());
        if let Some(d) = self.row_digests.lock().expect("row digests").get(&key) {
            return Ok(d.clone());
        }
        let mut drop = vec!["run_id"];
        drop.extend_from_slice(schema::volatile(&f.table));
        let d = exec::digest_without(self.committed_file(f).await?, &drop).await?;
        self.row_digests
            .lock()
            .expect("row digests")
            .insert(key, d.clone());
        Ok(d)
    }

    /// A committed data file's bytes, refused when they no longer match its manifest.
    async fn committed_file(&self, f: &manifest::OutputFile) -> Result<bytes::Bytes> {
        let path = object_store::path::Path::from(f.path.as_str());
        let bytes = self.store.get_opt(&path).await?.ok_or_else(|| {
            Error::data(format!(
                "table {}: committed file {} is missing",
                f.table, f.path
            ))
        })?;
        if manifest::digest(&bytes) != f.digest {
            return Err(Error::data(format!(
                "table {}: committed file {} no longer matches its manifest",
                f.table, f.path
            )));
        }
        Ok(bytes)
    }

    /// Execute one stage of one iteration and commit it, without the resume check: if the stage
    /// is already committed (or another writer commits first) this is a commit conflict.
    pub async fn commit_stage(&self, iter: u32, stage: &str) -> Result<StageManifest> {
        let stage = self
            .dag
            .stage(stage)
            .ok_or_else(|| Error::config(format!("no stage {stage} in this DAG")))?
            .clone();
        let mut done = BTreeMap::new();
        Ok(self.run_stage(iter, &stage, &mut done).await?.manifest)
    }

    fn say(&self, line: String) {
        if self.verbose {
            eprintln!("{line}");
        }
    }

    /// Resolve a stage's inputs from committed manifests (cache first, then the store).
    async fn inputs_of(
        &self,
        iter: u32,
        stage: &dyn Stage,
        done: &mut BTreeMap<(u32, String), Committed>,
    ) -> Result<Vec<(Committed, Vec<&'static str>)>> {
        let mut by_producer: BTreeMap<(u32, &'static str), Vec<&'static str>> = BTreeMap::new();
        for src in self.dag.sources(stage.name()) {
            // Iteration 0 has no previous iteration: the table is empty.
            let Some(from) = iter.checked_sub(src.iter_offset) else {
                continue;
            };
            by_producer
                .entry((from, src.stage))
                .or_default()
                .push(src.table);
        }
        let mut out = Vec::new();
        for ((from, producer), tables) in by_producer {
            let key = (from, producer.to_string());
            if !done.contains_key(&key) {
                let c = catalog::read_stage(&self.store, &self.run_id, from, producer).await?.ok_or_else(|| {
                    Error::data(format!(
                        "stage {} of iteration {iter} needs {} from stage {producer} of iteration {from}, which is not committed",
                        stage.name(),
                        tables.join(", ")
                    ))
                })?;
                done.insert(key.clone(), c);
            }
            out.push((done[&key].clone(), tables));
        }
        Ok(out)
    }

    async fn run_stage(
        &self,
        iter: u32,
        stage: &Arc<dyn Stage>,
        done: &mut BTreeMap<(u32, String), Committed>,
    ) -> Result<Committed> {
        let started_at = manifest::now_rfc3339();
        let t0 = Instant::now();
        let cpu0 = process_cpu_seconds();
        let peak_reset = reset_peak_rss();
        let inputs = self.inputs_of(iter, stage.as_ref(), done).await?;
        let seed = stage_seed(&self.config, iter, stage.name());
        let (mut ctx, mut input_refs) = build_context(
            &self.store,
            &self.run_id,
            iter,
            seed,
            self.config.clone(),
            stage.inputs(),
            &inputs,
            InputOrder::Checked,
        )
        .await?;
        // Sharded stages hand their checkpoints to workers: those are loaded (and an initial one
        // stored) before the stage; every other stage loads each when it asks for it.
        let eager = self.cluster.is_some()
            && (stage.partition_column().is_some() || stage.shard_column(&self.config).is_some());
        let (checkpoints, refs, pending) = self
            .checkpoints_of(iter, stage.as_ref(), done, eager)
            .await?;
        if stage.assets_in(&self.config) {
            let assets =
                super::assets::committed(&self.store, &self.run_id, &self.dag, iter, stage.name())
                    .await?;
            ctx.assets = Some(Arc::new(assets));
        }
        let on_cluster = self
            .on_cluster(iter, stage.as_ref(), &refs, &checkpoints)
            .await?;
        ctx.checkpoints = checkpoints;
        let first_ref = input_refs.len();
        input_refs.extend(refs);
        let attempt = layout::new_attempt();
        info!(run = %self.run_id, iter, stage = stage.name(), attempt = %attempt, "stage started");
        let bar = self.progress_bar(iter, stage.name());
        let sink = Sink::Store {
            store: self.store.clone(),
            run_id: self.run_id.clone(),
            iter,
            attempt: attempt.clone(),
        };
        let on_rows = |table: &str, rows: u64| bar.set_message(format!("{table}: {rows} rows"));
        let outputs =
            exec::execute(stage.clone(), &ctx, &sink, on_cluster.as_ref(), &on_rows).await;
        bar.finish_and_clear();
        let (outputs, writing) = outputs?;
        crash_point("after-data");
        let t_artifacts = Instant::now();
        let artifacts = store_artifacts(&self.store, &self.run_id, iter, &ctx).await?;
        let store_seconds = writing + t_artifacts.elapsed().as_secs_f64();
        crash_point("after-artifacts");
        // An initial checkpoint built when the stage asked for it has its digest now; one the
        // stage did not ask for is built here.
        for (i, digest) in pending {
            let r = &mut input_refs[first_ref + i];
            r.digest = match digest.get() {
                Some(d) => d.clone(),
                None => {
                    let name = r.tables.first().map(String::as_str).unwrap_or("?");
                    manifest::digest(&self.dag.initial_checkpoint(&self.config, name)?)
                }
            };
        }
        let m = StageManifest {
            format: manifest::FORMAT,
            run_id: self.run_id.clone(),
            iter,
            stage: stage.name().to_string(),
            code_version: manifest::code_version(),
            config_sections: stage
                .config_sections()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            config_hash: self.config.section_hash(stage.config_sections()),
            config: self.config.section_keys(stage.config_sections()),
            seed,
            // Model stages are bit-reproducible on the CPU backend only; on a GPU, replay checks
            // their files' integrity and says so instead of re-executing them.
            deterministic: stage.deterministic()
                && (self.config.run.device.is_deterministic() || stage.checkpoints_in().is_empty()),
            inputs: input_refs,
            outputs,
            artifacts,
            started_at,
            seconds: t0.elapsed().as_secs_f64(),
            store_seconds: Some(store_seconds),
            cpu_seconds: process_cpu_seconds().zip(cpu0).map(|(a, b)| a - b),
            peak_rss_bytes: peak_reset.then(peak_rss_bytes).flatten(),
            peak_device_bytes: *ctx.device_peak.lock().expect("device peak"),
            tokens: *ctx.tokens.lock().expect("token counts"),
            status: "committed".into(),
            shared: None,
        };
        let bytes = manifest::to_bytes(&m);
        let path = layout::stage_manifest(&self.run_id, iter, stage.name());
        self.store.put_if_absent(&path, bytes.clone()).await.map_err(|e| match e {
            Error::CommitConflict(_) => Error::CommitConflict(format!(
                "stage {} of iteration {iter} of run {} was committed by another writer first; this attempt's files are left for `rla-pipe gc`",
                stage.name(),
                self.run_id
            )),
            e => e,
        })?;
        crash_point("after-manifest");
        let rows: u64 = m.outputs.iter().map(|o| o.rows).sum();
        info!(run = %self.run_id, iter, stage = stage.name(), rows, seconds = m.seconds, "stage committed");
        self.say(format!(
            "iter {iter:>3}  {:<16} {rows:>10} rows  {:>7.2}s  committed",
            stage.name(),
            m.seconds
        ));
        Ok(Committed {
            path: path.to_string(),
            digest: manifest::digest(&bytes),
            manifest: m,
        })
    }

    /// The cluster a stage runs on: `run.cluster`'s workers (checked: between stages a worker
    /// may have gone; it is named before any work is sent) for a partitioned or sharded stage,
    /// with the checkpoints its shards read (an initial one stored for them first).
    async fn on_cluster(
        &self,
        iter: u32,
        stage: &dyn Stage,
        refs: &[InputRef],
        checkpoints: &BTreeMap<String, CheckpointInput>,
    ) -> Result<Option<exec::OnCluster<'_>>> {
        let Some(cluster) = &self.cluster else {
            return Ok(None);
        };
        if stage.partition_column().is_none() && stage.shard_column(&self.config).is_none() {
            return Ok(None);
        }
        cluster.check(&self.store).await?;
        let mut stored = Vec::new();
        if stage.partition_column().is_none() {
            // One input record per checkpoint, named by its first table (`checkpoints_of`).
            for r in refs {
                let name = r.tables.first().map(String::as_str).unwrap_or("?");
                let Some(CheckpointInput::Bytes(bytes)) = checkpoints.get(name) else {
                    return Err(Error::data(format!(
                        "checkpoint {name} of stage {} was not loaded",
                        stage.name()
                    )));
                };
                stored.push(
                    ShardCheckpoint::stored(&self.store, &self.run_id, iter, r, bytes).await?,
                );
            }
        }
        Ok(Some(exec::OnCluster {
            cluster,
            checkpoints: stored,
        }))
    }

    /// Resolve the checkpoints a stage reads: the artifact a committed producer wrote (digest
    /// verified), or the seeded initial checkpoint where no earlier one exists. `eager`: load
    /// them now; otherwise each is loaded when the stage asks for it, and an initial one's
    /// digest is known only then (`pending`: the index of its input record and where its digest
    /// will be).
    #[allow(clippy::type_complexity)]
    async fn checkpoints_of(
        &self,
        iter: u32,
        stage: &dyn Stage,
        done: &mut BTreeMap<(u32, String), Committed>,
        eager: bool,
    ) -> Result<(
        BTreeMap<String, CheckpointInput>,
        Vec<InputRef>,
        Vec<(usize, Arc<std::sync::OnceLock<String>>)>,
    )> {
        let mut pending = Vec::new();
        let mut out = BTreeMap::new();
        let mut refs = Vec::new();
        for (name, from) in self.dag.checkpoint_sources(stage.name(), iter) {
            let (bytes, r) = match from {
                Some((producer, from)) => {
                    let key = (from, producer.to_string());
                    if !done.contains_key(&key) {
                        let c = catalog::read_stage(&self.store, &self.run_id, from, producer)
                            .await?
                            .ok_or_else(|| {
                                Error::data(format!(
                                    "stage {} of iteration {iter} needs checkpoint {name} from stage {producer} of iteration {from}, which is not committed",
                                    stage.name()
                                ))
                            })?;
                        done.insert(key.clone(), c);
                    }
                    let c = &done[&key];
                    let a = c.manifest.artifacts.iter().find(|a| a.name == name).ok_or_else(|| {
                        Error::data(format!(
                            "manifest {} names no checkpoint {name} (stage {} of iteration {iter} needs it)",
                            c.path,
                            stage.name()
                        ))
                    })?;
                    let r = InputRef {
                        kind: InputKind::Artifact,
                        tables: vec![name.to_string()],
                        path: a.path.clone(),
                        digest: a.digest.clone(),
                        // A pretrained model's checkpoint builds on the weights the run
                        // started from (an adapter needs them): their directory and blake3.
                        source: self.models.get(name).cloned(),
                    };
                    let input = if eager {
                        CheckpointInput::Bytes(
                            load_checkpoint(&self.store, &self.dag, &self.config, &r).await?,
                        )
                    } else {
                        let (store, name, path, digest) = (
                            self.store.clone(),
                            name.to_string(),
                            r.path.clone(),
                            r.digest.clone(),
                        );
                        CheckpointInput::Deferred(Arc::new(move || {
                            let (store, name, path, digest) =
                                (store.clone(), name.clone(), path.clone(), digest.clone());
                            Box::pin(async move {
                                read_checked(&store, &name, &path, &digest, "its manifest recorded")
                                    .await
                            })
                        }))
                    };
                    (input, r)
                }
                None => {
                    let mut r = InputRef {
                        kind: InputKind::Init,
                        tables: vec![name.to_string()],
                        path: String::new(),
                        digest: String::new(),
                        source: self.models.get(name).cloned(),
                    };
                    let input = if eager {
                        let bytes = self.dag.initial_checkpoint(&self.config, name)?;
                        r.digest = manifest::digest(&bytes);
                        CheckpointInput::Bytes(bytes)
                    } else {
                        let cell = Arc::new(std::sync::OnceLock::new());
                        pending.push((refs.len(), cell.clone()));
                        let (build, config, name) =
                            (self.dag.initial_fn(), self.config.clone(), name.to_string());
                        CheckpointInput::Deferred(Arc::new(move || {
                            let bytes = build(&config, &name);
                            if let Ok(b) = &bytes {
                                // Built from the config alone: every build is the same bytes.
                                let _ = cell.set(manifest::digest(b));
                            }
                            Box::pin(std::future::ready(bytes))
                        }))
                    };
                    (input, r)
                }
            };
            out.insert(name.to_string(), bytes);
            refs.push(r);
        }
        Ok((out, refs, pending))
    }

    fn progress_bar(&self, iter: u32, stage: &str) -> ProgressBar {
        if !self.verbose {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new_spinner().with_prefix(format!("iter {iter:>3}  {stage:<16}"));
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {msg} [{elapsed}]")
                .expect("static template"),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }
}

/// The bytes of a checkpoint input a manifest recorded: an artifact read from the store, or the
/// initial checkpoint rebuilt from the config; either way its digest must match the record.
pub async fn load_checkpoint(
    store: &Store,
    dag: &Dag,
    config: &Config,
    r: &InputRef,
) -> Result<bytes::Bytes> {
    let name = r.tables.first().map(String::as_str).unwrap_or("?");
    const WHOSE: &str = "its manifest recorded";
    match r.kind {
        InputKind::Artifact => read_checked(store, name, &r.path, &r.digest, WHOSE).await,
        InputKind::Init => {
            let bytes = dag.initial_checkpoint(config, name)?;
            check_digest(name, "initial", &bytes, &r.digest, WHOSE)?;
            Ok(bytes)
        }
        InputKind::Manifest => Err(Error::data(format!(
            "checkpoint {name}: its input record names a manifest, not a checkpoint"
        ))),
    }
}

/// Write a stage's artifacts, content-addressed (an existing file of the same name has the same
/// bytes), and describe them for its manifest.
async fn store_artifacts(
    store: &Store,
    run_id: &str,
    iter: u32,
    ctx: &StageContext,
) -> Result<Vec<manifest::ArtifactFile>> {
    let produced = std::mem::take(&mut *ctx.artifacts.lock().expect("artifact list"));
    let mut out = Vec::new();
    for (name, bytes) in produced {
        let digest = manifest::digest(&bytes);
        let path = layout::artifact(run_id, iter, &name, &digest);
        match store.put_if_absent(&path, bytes.clone()).await {
            Ok(()) | Err(Error::CommitConflict(_)) => {}
            Err(e) => return Err(e),
        }
        out.push(manifest::ArtifactFile {
            name,
            path: path.to_string(),
            bytes: bytes.len() as u64,
            digest,
        });
    }
    Ok(out)
}

/// Whether a parent's stage manifest `m` ran with the settings this build's stage reads
/// (`sections` of `config`): the values of those keys as it recorded them. Its recorded
/// sections may be these or wider (`reward` where this build reads `reward.clip_eps`), not
/// narrower; a manifest that recorded only a hash must have recorded these sections.
fn same_settings(m: &StageManifest, sections: &[&str], config: &Config) -> bool {
    let within = |k: &str, s: &str| k == s || k.starts_with(&format!("{s}."));
    if m.config.is_empty() {
        return m
            .config_sections
            .iter()
            .map(String::as_str)
            .eq(sections.iter().copied())
            && m.config_hash == config.section_hash(sections);
    }
    let covered = sections
        .iter()
        .all(|s| m.config_sections.iter().any(|r| within(s, r)));
    let recorded: BTreeMap<String, String> = m
        .config
        .iter()
        .filter(|(k, _)| sections.iter().any(|s| within(k, s)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    covered && recorded == config.section_keys(sections)
}

/// The seed of a stage in an iteration.
pub fn stage_seed(cfg: &Config, iter: u32, stage: &str) -> u64 {
    derive_seed(cfg.run.seed, &[&iter.to_string(), stage])
}

/// Which input tables a stage is told are sorted by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputOrder {
    /// Those whose files the writer checked for key order ([`FileOrder::of`]).
    Checked,
    /// All of them, as builds before 2026-11-24 did: for replaying a stage such a build
    /// committed, which must plan as it did then.
    AllDeclared,
}

/// A stage context whose input tables are the files named by the given committed manifests.
#[allow(clippy::too_many_arguments)]
pub async fn build_context(
    store: &Store,
    run_id: &str,
    iter: u32,
    seed: u64,
    config: Arc<Config>,
    declared: &[&'static str],
    inputs: &[(Committed, Vec<&'static str>)],
    order: InputOrder,
) -> Result<(StageContext, Vec<InputRef>)> {
    let session = crate::store::tables::new_session(store, config.run.memory_limit_mib, None)?;
    let mut refs = Vec::new();
    let mut tables_in = Vec::new();
    for (c, tables) in inputs {
        for table in tables {
            let files: Vec<_> = c
                .manifest
                .outputs
                .iter()
                .filter(|o| o.table == *table)
                .cloned()
                .collect();
            let def = schema::table_def(table).expect("known table");
            crate::store::tables::check_files(store, &def, &files).await?;
            crate::store::tables::register_files(
                &session,
                store,
                def.name,
                &def,
                &files
                    .iter()
                    .map(|f| (f.path.clone(), run_id.to_string()))
                    .collect::<Vec<_>>(),
                match order {
                    InputOrder::Checked => FileOrder::of(&files),
                    InputOrder::AllDeclared => FileOrder::Key,
                },
            )?;
            tables_in.push((def, files));
        }
        refs.push(InputRef {
            kind: InputKind::Manifest,
            tables: tables.iter().map(|t| t.to_string()).collect(),
            path: c.path.clone(),
            digest: c.digest.clone(),
            source: None,
        });
    }
    // A declared input no committed manifest provides (the previous iteration's table at
    // iteration 0) is an empty table.
    for table in declared {
        if !inputs.iter().any(|(_, ts)| ts.contains(table)) {
            let def = schema::table_def(table).expect("known table");
            crate::store::tables::register_files(
                &session,
                store,
                def.name,
                &def,
                &[],
                FileOrder::Key,
            )?;
            tables_in.push((def, Vec::new()));
        }
    }
    Ok((
        StageContext {
            run_id: run_id.to_string(),
            iter,
            seed,
            inputs: Some(Arc::new(InputFiles {
                store: store.clone(),
                memory_limit_mib: config.run.memory_limit_mib,
                tables: tables_in,
            })),
            config,
            session,
            checkpoints: Default::default(),
            artifacts: Default::default(),
            tokens: Default::default(),
            device_peak: Default::default(),
            assets: None,
        },
        refs,
    ))
}

/// CPU seconds (user + system, every thread) this process has used so far; `None` where the
/// platform does not say.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes the struct it is handed and nothing else.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
            return None;
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        Some(secs(u.ru_utime) + secs(u.ru_stime))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Resets this process's resident-memory high-water mark (Linux: `5` into
/// `/proc/self/clear_refs`), so that [`peak_rss_bytes`] measures from now; false where it
/// cannot (another platform, a kernel that refuses), and the stage then records no peak.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's resident-memory high-water mark (`VmHWM` of `/proc/self/status`) in bytes,
/// since the process started or the last [`reset_peak_rss`]; `None` where the platform does not
/// say.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A crash hook for the soak (`benches/soak.sh`): with `RLA_PIPE_CRASH_AT=<point>:<n>` the
/// process aborts — no cleanup, as `kill -9` — the n-th time it reaches `<point>`:
/// `after-data` (a stage's Parquet files written, nothing else), `after-artifacts` (its
/// checkpoints too, no manifest), `after-manifest` (the stage committed, the run not told),
/// `before-iteration` (every stage of an iteration committed, `_iteration.json` not written).
fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static REACHED: AtomicU32 = AtomicU32::new(0);
    let Ok(spec) = std::env::var("RLA_PIPE_CRASH_AT") else {
        return;
    };
    if let Some((p, n)) = spec.split_once(':')
        && p == point
        && REACHED.fetch_add(1, Ordering::SeqCst) + 1 == n.parse::<u32>().unwrap_or(1)
    {
        eprintln!("RLA_PIPE_CRASH_AT={spec}: aborting at {point}");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(sections: &[&str], config: &Config) -> StageManifest {
        let names: Vec<String> = sections.iter().map(|s| s.to_string()).collect();
        StageManifest {
            format: manifest::FORMAT,
            run_id: "p".into(),
            iter: 0,
            stage: "update".into(),
            code_version: manifest::code_version(),
            config_sections: names,
            config_hash: config.section_hash(sections),
            config: config.section_keys(sections),
            seed: 0,
            deterministic: true,
            inputs: vec![],
            outputs: vec![],
            artifacts: vec![],
            started_at: manifest::now_rfc3339(),
            seconds: 0.0,
            store_seconds: None,
            cpu_seconds: None,
            peak_rss_bytes: None,
            peak_device_bytes: None,
            tokens: None,
            status: "committed".into(),
            shared: None,
        }
    }

    /// A parent's stage recorded with a wider section than this build's stage reads is the
    /// same setting when the keys read agree; not when one of them differs, nor when it
    /// recorded narrower sections or only a hash of other sections.
    #[test]
    fn settings_compare_the_keys_this_build_reads() {
        let base = Config::from_toml(crate::config::DEFAULT_TOML, "t.toml").unwrap();
        let set = |kv: &str| base.with_sets("t", &[kv.to_string()]).unwrap();
        let narrow = ["update", "reward.clip_eps", "reward.kl_beta"];
        let wide = recorded(&["update", "reward"], &base);
        assert!(same_settings(&wide, &narrow, &base));
        assert!(same_settings(&wide, &narrow, &set("reward.lambda=0.5")));
        assert!(same_settings(
            &wide,
            &narrow,
            &set("reward.train_candidates=false")
        ));
        assert!(!same_settings(&wide, &narrow, &set("reward.clip_eps=0.3")));
        assert!(!same_settings(&wide, &narrow, &set("update.policy_lr=0.1")));
        assert!(!same_settings(&wide, &["update", "reward", "env"], &base));
        assert!(same_settings(&wide, &["update", "reward"], &base));
        assert!(!same_settings(
            &wide,
            &["update", "reward"],
            &set("reward.lambda=0.5")
        ));
        let mut hashed = wide.clone();
        hashed.config.clear();
        assert!(same_settings(&hashed, &["update", "reward"], &base));
        assert!(!same_settings(&hashed, &narrow, &base));
    }
}
