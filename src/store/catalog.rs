//! Reading what a store has committed: runs, their `run.json`, stage and iteration manifests.
//! Everything readers see comes from here, so uncommitted files stay invisible.

use std::collections::BTreeMap;

use object_store::path::Path;

use crate::error::{Error, Result};
use crate::store::manifest::{self, IterationManifest, RunManifest, StageManifest};
use crate::store::{Store, layout};

/// A committed stage manifest with the digest of its bytes.
#[derive(Debug, Clone)]
pub struct Committed {
    pub path: String,
    pub digest: String,
    pub manifest: StageManifest,
}

/// The committed state of one iteration.
#[derive(Debug, Clone, Default)]
pub struct IterState {
    pub stages: BTreeMap<String, Committed>,
    pub complete: Option<IterationManifest>,
}

/// The committed state of one run.
#[derive(Debug, Clone)]
pub struct RunState {
    pub run: RunManifest,
    pub iters: BTreeMap<u32, IterState>,
}

impl RunState {
    /// The run's resolved config, read as `C` (the crate's `Config`): fields added since the run
    /// was made take their defaults.
    pub fn config<C: serde::de::DeserializeOwned>(&self) -> Result<C> {
        serde_json::from_value(self.run.config.clone()).map_err(|e| {
            Error::data(format!(
                "{}/run.json: config does not parse with this build: {e}",
                self.run.run_id
            ))
        })
    }
}

/// One committed data file of a run: what `rla-pipe files` lists and `sql` reads.
#[derive(Debug, Clone)]
pub struct CommittedFile {
    /// The run whose rows the file holds.
    pub run: String,
    pub iter: u32,
    pub stage: String,
    pub file: crate::store::manifest::OutputFile,
    /// For a branch's shared iteration: the run that wrote the file (its `run_id` column says
    /// that run; `sql` reads it as `run`).
    pub written_by: Option<String>,
}

impl RunState {
    /// Every data file the run's committed manifests name, by table, iteration and path.
    pub fn files(&self) -> Vec<CommittedFile> {
        let mut out: Vec<CommittedFile> = self
            .iters
            .iter()
            .flat_map(|(iter, it)| it.stages.values().map(move |c| (*iter, c)))
            .flat_map(|(iter, c)| {
                c.manifest.outputs.iter().map(move |o| CommittedFile {
                    run: self.run.run_id.clone(),
                    iter,
                    stage: c.manifest.stage.clone(),
                    file: o.clone(),
                    written_by: c.manifest.shared.as_ref().map(|s| s.run.clone()),
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.file.table, a.iter, &a.file.path).cmp(&(&b.file.table, b.iter, &b.file.path))
        });
        out
    }
}

/// Read `run.json`; `Ok(None)` if the run does not exist.
pub async fn read_run(store: &Store, run_id: &str) -> Result<Option<RunManifest>> {
    layout::validate_run_id(run_id)?;
    let path = layout::run_json(run_id);
    match store.get_opt(&path).await? {
        None => Ok(None),
        Some(b) => Ok(Some(manifest::parse(&b, path.as_ref())?)),
    }
}

/// Read one stage manifest; `Ok(None)` if not committed.
pub async fn read_stage(
    store: &Store,
    run_id: &str,
    iter: u32,
    stage: &str,
) -> Result<Option<Committed>> {
    let path = layout::stage_manifest(run_id, iter, stage);
    read_committed(store, &path).await
}

/// The stage manifest at `path` (relative to the store root), if there is one.
pub async fn read_committed_at(store: &Store, path: &str) -> Result<Option<Committed>> {
    read_committed(store, &Path::from(path)).await
}

async fn read_committed(store: &Store, path: &Path) -> Result<Option<Committed>> {
    match store.get_opt(path).await? {
        None => Ok(None),
        Some(b) => {
            let manifest: StageManifest = manifest::parse(&b, path.as_ref())?;
            confined(&manifest, path.as_ref())?;
            Ok(Some(Committed {
                path: path.to_string(),
                digest: manifest::digest(&b),
                manifest,
            }))
        }
    }
}

/// A stage manifest may name only its own run's files: `<run>/data/…` and `<run>/artifacts/…`
/// (never another run's, never `..`), and must be of the run whose directory holds it. A branch
/// run's `shared` manifest names the files of the run that committed the stage instead, and that
/// run's manifest.
fn confined(m: &StageManifest, path: &str) -> Result<()> {
    let run_dir = path.split('/').next().unwrap_or("");
    if m.run_id != run_dir {
        return Err(Error::data(format!(
            "corrupt manifest {path}: it names run {:?}, but it is in run {run_dir:?}",
            m.run_id
        )));
    }
    let owner = match &m.shared {
        None => run_dir,
        Some(s) => {
            layout::validate_run_id(&s.run)
                .map_err(|e| Error::data(format!("corrupt manifest {path}: shared from {e}")))?;
            let expected = layout::stage_manifest(&s.run, m.iter, &m.stage);
            if s.run == run_dir || s.path != expected.as_ref() {
                return Err(Error::data(format!(
                    "corrupt manifest {path}: it is shared from {:?}, which is not the manifest of stage {} of iteration {} of another run",
                    s.path, m.stage, m.iter
                )));
            }
            s.run.as_str()
        }
    };
    let own = |p: &str| {
        let mut parts = p.split('/');
        parts.next() == Some(owner)
            && matches!(parts.next(), Some("data") | Some("artifacts"))
            && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
    };
    let files = m
        .outputs
        .iter()
        .map(|o| o.path.as_str())
        .chain(m.artifacts.iter().map(|a| a.path.as_str()));
    for f in files {
        if !own(f) {
            return Err(Error::data(format!(
                "corrupt manifest {path}: it names {f:?}, a file outside run {owner:?}'s data and artifacts"
            )));
        }
    }
    Ok(())
}

/// Read the committed state of a run (all iterations), or a clear error if it does not exist.
pub async fn load_run(store: &Store, run_id: &str) -> Result<RunState> {
    let Some(run) = read_run(store, run_id).await? else {
        return Err(missing_run(store, run_id).await);
    };
    let mut iters: BTreeMap<u32, IterState> = BTreeMap::new();
    for meta in store.list(&layout::commits_dir(run_id)).await? {
        let loc = meta.location.to_string();
        let mut parts = loc.rsplit('/');
        let (Some(file), Some(dir)) = (parts.next(), parts.next()) else {
            continue;
        };
        let (Some(iter), Some(name)) = (layout::parse_iter_dir(dir), file.strip_suffix(".json"))
        else {
            continue;
        };
        let state = iters.entry(iter).or_default();
        if name == "_iteration" {
            let bytes = store.get(&meta.location).await?;
            state.complete = Some(manifest::parse(&bytes, &loc)?);
        } else if let Some(c) = read_committed(store, &meta.location).await? {
            state.stages.insert(name.to_string(), c);
        }
    }
    Ok(RunState { run, iters })
}

/// Ids of every run in the store (directories holding a `run.json`).
pub async fn run_ids(store: &Store) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for dir in store.list_dirs(None).await? {
        if layout::validate_run_id(&dir).is_ok()
            && store.size(&layout::run_json(&dir)).await?.is_some()
        {
            ids.push(dir);
        }
    }
    Ok(ids)
}

/// The error for a run the store does not hold, naming the runs it does hold.
pub async fn missing_run(store: &Store, run_id: &str) -> Error {
    let there = match run_ids(store).await {
        Ok(ids) if ids.is_empty() => "the store holds no run".to_string(),
        Ok(ids) => format!("runs there: {}", ids.join(", ")),
        Err(e) => format!("listing its runs failed: {e}"),
    };
    Error::data(format!(
        "run {run_id:?} not found in store {} ({there}); check --run and --store",
        store.url()
    ))
}

/// Load one run (`Some(id)`) or every run of the store; a store holding no run is an error
/// (a mistyped `--store` must not answer with empty tables).
pub async fn load_runs(store: &Store, only: Option<&str>) -> Result<Vec<RunState>> {
    let ids = match only {
        Some(id) => vec![id.to_string()],
        None => run_ids(store).await?,
    };
    if ids.is_empty() {
        return Err(Error::data(format!(
            "store {} holds no run (no <run>/run.json under it); check --store or RLA_PIPE_STORE",
            store.url()
        )));
    }
    let mut runs = Vec::new();
    for id in ids {
        runs.push(load_run(store, &id).await?);
    }
    Ok(runs)
}
