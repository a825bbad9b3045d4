//! `replay --verify`: prove that an iteration's committed outputs are what its committed inputs,
//! config and seeds produce.
//!
//! 1. Integrity: every file named by the iteration's manifests still has its recorded size and
//!    blake3 digest, and every input manifest still has the digest its consumer recorded.
//! 2. Re-execution: every deterministic stage runs again on the files its manifest names as
//!    inputs, outputs are hashed (not written) and compared with the committed digests; its
//!    artifacts must be the committed ones, byte for byte, except screenshots
//!    ([`crate::stage::SCREENSHOT_PREFIX`]), whose names alone are compared
//!    (`compare_artifacts`).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::path::Path;

use super::Dag;
use super::exec::{self, Sink};
use super::runner::{InputOrder, build_context, load_checkpoint};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::catalog::{self, Committed};
use crate::store::manifest::InputKind;
use crate::store::{Store, manifest};

/// One line of the replay report.
#[derive(Debug, Clone)]
pub struct Verified {
    pub stage: String,
    pub table: String,
    pub rows: u64,
    pub digest: String,
    /// `replayed` (re-executed, identical) or `integrity` (bytes checked only: non-deterministic
    /// stage); `shared, …` for a branch's iteration shared with its parent (verified there).
    pub how: &'static str,
}

type Pipeline<'a> = &'a (dyn Fn(&Config) -> Result<Dag> + Sync);

/// Verify iteration `iter` of `run_id` (all its stages, or one). `pipeline` gives the DAG of
/// the run's config (the registry, `crate::pipeline::dag`: the engine names no stage).
pub async fn verify(
    store: &Store,
    run_id: &str,
    iter: u32,
    only: Option<&str>,
    pipeline: impl Fn(&Config) -> Result<Dag> + Sync,
) -> Result<Vec<Verified>> {
    verify_in(store, run_id, iter, only, &pipeline).await
}

fn verify_in<'a>(
    store: &'a Store,
    run_id: &'a str,
    iter: u32,
    only: Option<&'a str>,
    pipeline: Pipeline<'a>,
) -> futures::future::BoxFuture<'a, Result<Vec<Verified>>> {
    Box::pin(verify_run(store, run_id, iter, only, pipeline))
}

async fn verify_run(
    store: &Store,
    run_id: &str,
    iter: u32,
    only: Option<&str>,
    pipeline: Pipeline<'_>,
) -> Result<Vec<Verified>> {
    let state = catalog::load_run(store, run_id).await?;
    let config: Arc<Config> = Arc::new(state.config()?);
    let dag = pipeline(&config)?;
    let it = state
        .iters
        .get(&iter)
        .filter(|s| !s.stages.is_empty())
        .ok_or_else(|| {
            let have: Vec<String> = state.iters.keys().map(|i| i.to_string()).collect();
            Error::data(format!(
                "run {run_id:?} has no committed iteration {iter} (committed: {})",
                if have.is_empty() {
                    "none".into()
                } else {
                    have.join(", ")
                }
            ))
        })?;
    if let Some(s) = only
        && !it.stages.contains_key(s)
    {
        let have: Vec<_> = it.stages.keys().cloned().collect();
        return Err(Error::data(format!(
            "iteration {iter} of run {run_id:?} has no committed stage {s:?} (committed: {})",
            have.join(", ")
        )));
    }

    // A branch shares whole iterations before its branch point, and from it on each stage that
    // would have computed what its parent committed: those are verified in the run that
    // executed them, the rest here.
    let shared: std::collections::BTreeSet<&str> = it
        .stages
        .values()
        .filter(|c| c.manifest.shared.is_some())
        .map(|c| c.manifest.stage.as_str())
        .collect();
    if shared.len() == it.stages.len() || only.is_some_and(|s| shared.contains(s)) {
        return verify_shared(store, run_id, iter, it, only, pipeline).await;
    }
    let mut report = Vec::new();
    if only.is_none() {
        for s in &shared {
            report.extend(verify_shared(store, run_id, iter, it, Some(s), pipeline).await?);
        }
    }
    let skip = |stage: &str| only.is_some_and(|s| s != stage) || shared.contains(stage);

    // 1. Integrity of every committed file and recorded input manifest; the schemas the files
    // were written with (an earlier build may have written fewer columns).
    let mut as_written: BTreeMap<(String, String), arrow::datatypes::SchemaRef> = BTreeMap::new();
    for c in it.stages.values() {
        if skip(&c.manifest.stage) {
            continue;
        }
        for f in &c.manifest.outputs {
            let bytes = store
                .get_opt(&Path::from(f.path.as_str()))
                .await?
                .ok_or_else(|| {
                    Error::Mismatch(format!(
                        "stage {}: table {}: committed file {} is missing",
                        c.manifest.stage, f.table, f.path
                    ))
                })?;
            let d = manifest::digest(&bytes);
            if bytes.len() as u64 != f.bytes || d != f.digest {
                return Err(Error::Mismatch(format!(
                    "stage {}: table {}: committed file {} no longer matches its manifest ({} bytes, blake3 {}; manifest: {} bytes, blake3 {})",
                    c.manifest.stage,
                    f.table,
                    f.path,
                    bytes.len(),
                    &d[..16],
                    f.bytes,
                    &f.digest[..16]
                )));
            }
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .map_err(|e| Error::data(format!("{}: {e}", f.path)))?;
            crate::store::tables::check_row_counts(f, reader.metadata())?;
            let volatile = crate::schema::volatile(&f.table);
            if !volatile.is_empty() {
                // Wall-clock columns are left out of the comparison: the replay encodes its rows
                // without them, and the committed file is compared without them.
                let written = reader.schema().clone();
                let keep: Vec<usize> = (0..written.fields().len())
                    .filter(|i| !volatile.contains(&written.field(*i).name().as_str()))
                    .collect();
                as_written.insert(
                    (c.manifest.stage.clone(), f.table.clone()),
                    Arc::new(written.project(&keep)?),
                );
            } else if f.rows > 0 {
                as_written.insert(
                    (c.manifest.stage.clone(), f.table.clone()),
                    reader.schema().clone(),
                );
            }
        }
        for a in &c.manifest.artifacts {
            let bytes = store.get_opt(&Path::from(a.path.as_str())).await?;
            if bytes.as_ref().map(|b| manifest::digest(b)) != Some(a.digest.clone()) {
                return Err(Error::Mismatch(format!(
                    "stage {}: artifact {} ({}) is missing or no longer matches its manifest",
                    c.manifest.stage, a.name, a.path
                )));
            }
        }
        for input in &c.manifest.inputs {
            if input.kind == InputKind::Init {
                continue;
            }
            let bytes = store.get(&Path::from(input.path.as_str())).await?;
            if manifest::digest(&bytes) != input.digest {
                let what = match input.kind {
                    InputKind::Artifact => format!(
                        "checkpoint {}",
                        input.tables.first().map_or("?", String::as_str)
                    ),
                    _ => "manifest".to_string(),
                };
                return Err(Error::Mismatch(format!(
                    "stage {}: input {what} ({}) no longer matches the digest recorded when the stage committed",
                    c.manifest.stage, input.path
                )));
            }
        }
    }

    // 2. Re-execute deterministic stages from the inputs their manifests name.
    for stage in dag.stages() {
        let Some(c) = it.stages.get(stage.name()) else {
            continue;
        };
        if skip(stage.name()) {
            continue;
        }
        let m = &c.manifest;
        if !m.deterministic || !stage.deterministic() {
            report.extend(m.outputs.iter().map(|o| Verified {
                stage: m.stage.clone(),
                table: o.table.clone(),
                rows: o.rows,
                digest: o.digest.clone(),
                how: "integrity",
            }));
            continue;
        }
        // The config the stage ran with: every value the manifest recorded must be the value in
        // run.json (keys added to the config since then take their defaults). The sections are
        // those the manifest recorded: a later build may read fewer or more of them.
        let recorded: Vec<&str> = m.config_sections.iter().map(String::as_str).collect();
        let sections = match recorded.is_empty() {
            true => stage.config_sections(),
            false => &recorded[..],
        };
        let now = config.section_keys(sections);
        let changed: Vec<String> = if m.config.is_empty() {
            let want = config.section_hash(sections);
            if want == m.config_hash {
                vec![]
            } else {
                vec![format!(
                    "hash {} ≠ recorded {}",
                    &want[..12],
                    &m.config_hash[..12]
                )]
            }
        } else {
            m.config
                .iter()
                .filter(|(k, v)| now.get(*k) != Some(*v))
                .map(|(k, v)| {
                    format!(
                        "{k}: recorded {v}, run.json {}",
                        now.get(k).map_or("(unset)", |s| s)
                    )
                })
                .collect()
        };
        if !changed.is_empty() {
            return Err(Error::Mismatch(format!(
                "stage {}: the config sections {:?} differ from what the stage ran with: {}",
                m.stage,
                m.config_sections,
                changed.join("; ")
            )));
        }
        // Committed before the writer checked key order (README, Key order).
        let unchecked = m.outputs.iter().any(|o| !o.sorted);
        let mut inputs: Vec<(Committed, Vec<&'static str>)> = Vec::new();
        let mut checkpoints = std::collections::BTreeMap::new();
        for input in &m.inputs {
            if input.kind != InputKind::Manifest {
                let name = input.tables.first().cloned().unwrap_or_default();
                checkpoints.insert(
                    name,
                    crate::stage::CheckpointInput::Bytes(
                        load_checkpoint(store, &dag, &config, input).await?,
                    ),
                );
                continue;
            }
            let bytes = store.get(&Path::from(input.path.as_str())).await?;
            let manifest = manifest::parse(&bytes, &input.path)?;
            let tables = input
                .tables
                .iter()
                .map(|t| stage.inputs().iter().find(|s| **s == t.as_str()).copied().ok_or_else(|| {
                    Error::Mismatch(format!("stage {}: manifest input table {t} is not an input of this build's stage", m.stage))
                }))
                .collect::<Result<Vec<_>>>()?;
            inputs.push((
                Committed {
                    path: input.path.clone(),
                    digest: input.digest.clone(),
                    manifest,
                },
                tables,
            ));
        }
        let (mut ctx, _) = build_context(
            store,
            run_id,
            iter,
            m.seed,
            config.clone(),
            stage.inputs(),
            &inputs,
            // A stage committed before the writer checked key order declared all its inputs
            // sorted; it is replayed as it ran.
            if unchecked {
                InputOrder::AllDeclared
            } else {
                InputOrder::Checked
            },
        )
        .await?;
        ctx.checkpoints = checkpoints;
        if stage.assets_in(&config) {
            let assets = super::assets::committed(store, run_id, &dag, iter, &m.stage).await?;
            ctx.assets = Some(Arc::new(assets));
        }
        let sink = Sink::HashOnly {
            as_written: as_written
                .iter()
                .filter(|((s, _), _)| *s == m.stage)
                .map(|((_, t), schema)| (t.clone(), schema.clone()))
                .collect(),
        };
        let (outputs, _) = exec::execute(stage.clone(), &ctx, &sink, None, &|_, _| {}).await?;
        let produced = std::mem::take(&mut *ctx.artifacts.lock().expect("artifact list"));
        report.extend(compare_artifacts(&m.stage, &m.artifacts, produced)?);
        for out in outputs {
            let Some(committed) = m.outputs.iter().find(|o| o.table == out.table) else {
                // A table its stage has written only since a later build: a manifest of an
                // earlier build cannot list it, so there is nothing to compare it with.
                if crate::schema::added_to_its_stage_later(&out.table) {
                    report.push(Verified {
                        stage: m.stage.clone(),
                        table: out.table,
                        rows: out.rows,
                        digest: out.digest,
                        how: "not compared: the build that ran the stage did not write this table yet",
                    });
                    continue;
                }
                return Err(Error::Mismatch(format!(
                    "stage {}: table {} was replayed but is not in the manifest",
                    m.stage, out.table
                )));
            };
            // A file written before the writer checked key order may hold the replayed rows in
            // another order (README, Key order): compared with its rows put in key order.
            let mut how = "replayed";
            let volatile = crate::schema::volatile(&out.table);
            if !volatile.is_empty() {
                let bytes = store.get(&Path::from(committed.path.as_str())).await?;
                if exec::digest_without(bytes, volatile).await? == (out.rows, out.digest.clone()) {
                    how = "replayed, wall-clock columns left out";
                } else {
                    return Err(Error::Mismatch(format!(
                        "stage {}: table {} differs (compared without its wall-clock columns {}): committed {} rows; replayed {} rows, blake3 {}",
                        m.stage,
                        out.table,
                        volatile.join(", "),
                        committed.rows,
                        out.rows,
                        &out.digest[..16]
                    )));
                }
            }
            if committed.digest != out.digest && committed.rows == out.rows && !committed.sorted {
                let def = crate::schema::table_def(&out.table).expect("a stage's output table");
                let bytes = store.get(&Path::from(committed.path.as_str())).await?;
                if exec::digest_in_key_order(&def, bytes).await? == (out.rows, out.digest.clone()) {
                    how = "replayed, rows in key order";
                }
            }
            if how == "replayed" && (committed.digest != out.digest || committed.rows != out.rows) {
                return Err(Error::Mismatch(format!(
                    "stage {}: table {} differs: committed {} rows, blake3 {}; replayed {} rows, blake3 {}",
                    m.stage,
                    out.table,
                    committed.rows,
                    &committed.digest[..16],
                    out.rows,
                    &out.digest[..16]
                )));
            }
            report.push(Verified {
                stage: m.stage.clone(),
                table: out.table,
                rows: out.rows,
                digest: out.digest,
                how,
            });
        }
    }
    Ok(report)
}

/// Compare the artifacts a replayed stage produced with those its manifest committed: the same
/// names, and the same bytes, except for screenshots (names starting with
/// [`crate::stage::SCREENSHOT_PREFIX`], `env.web.screenshots`): pixels are not deterministic
/// across machines (fonts, renderer), so a screenshot's bytes are left out of the comparison
/// and only its name must match. The committed screenshots' bytes were checked against their
/// manifest in step 1 like every other file. Report lines: one per checkpoint; the environment
/// assets as one line per stage (their count, and the blake3 of their digests in order); the
/// screenshots as one line (their count, and the blake3 of their names in order).
fn compare_artifacts(
    stage: &str,
    committed: &[manifest::ArtifactFile],
    produced: Vec<(String, bytes::Bytes)>,
) -> Result<Vec<Verified>> {
    let by_name: BTreeMap<&str, &manifest::ArtifactFile> =
        committed.iter().map(|a| (a.name.as_str(), a)).collect();
    let replayed: std::collections::BTreeSet<&str> =
        produced.iter().map(|(name, _)| name.as_str()).collect();
    for a in committed {
        if !replayed.contains(a.name.as_str()) {
            return Err(Error::Mismatch(format!(
                "stage {stage}: artifact {} was committed but the replay did not produce it",
                a.name
            )));
        }
    }
    let mut report = Vec::new();
    let mut assets = (0u64, blake3::Hasher::new());
    let mut screenshots = (0u64, blake3::Hasher::new());
    for (name, bytes) in &produced {
        let committed = by_name.get(name.as_str());
        if name.starts_with(crate::stage::SCREENSHOT_PREFIX) {
            if committed.is_none() {
                return Err(Error::Mismatch(format!(
                    "stage {stage}: screenshot {name} was replayed but not committed"
                )));
            }
            screenshots.0 += 1;
            screenshots.1.update(name.as_bytes());
            screenshots.1.update(b"\n");
            continue;
        }
        let digest = manifest::digest(bytes);
        if committed.map(|a| &a.digest) != Some(&digest) {
            return Err(Error::Mismatch(format!(
                "stage {stage}: artifact {name} differs: committed blake3 {}; replayed blake3 {}",
                committed.map_or("(none)", |a| &a.digest[..16]),
                &digest[..16]
            )));
        }
        if name.starts_with(crate::stage::ASSET_PREFIX) {
            assets.0 += 1;
            assets.1.update(digest.as_bytes());
            continue;
        }
        report.push(Verified {
            stage: stage.to_string(),
            table: format!("checkpoint:{name}"),
            rows: 0,
            digest,
            how: "replayed",
        });
    }
    // One line per kind of counted artifact that the stage produced.
    for (kind, (count, hasher), how) in [
        ("assets", assets, "replayed"),
        (
            "screenshots",
            screenshots,
            "replayed, names compared (pixels vary by machine)",
        ),
    ] {
        if count > 0 {
            report.push(Verified {
                stage: stage.to_string(),
                table: format!("{kind}:{count}"),
                rows: 0,
                digest: hasher.finalize().to_hex().to_string(),
                how,
            });
        }
    }
    Ok(report)
}

/// A branch's iteration shared with its parent (or, with `only`, one shared stage of it): each
/// manifest must be the committing run's (same bytes but for run id, status and `shared`, which
/// holds that manifest's digest); the iteration is then verified in the run that executed it.
async fn verify_shared(
    store: &Store,
    run_id: &str,
    iter: u32,
    it: &catalog::IterState,
    only: Option<&str>,
    pipeline: Pipeline<'_>,
) -> Result<Vec<Verified>> {
    let mut origins = std::collections::BTreeSet::new();
    for c in it.stages.values() {
        if only.is_some_and(|s| s != c.manifest.stage) {
            continue;
        }
        let Some(shared) = &c.manifest.shared else {
            return Err(Error::Mismatch(format!(
                "run {run_id:?}, iteration {iter}: stage {} was executed by this run while the other stages are shared with a parent",
                c.manifest.stage
            )));
        };
        let bytes = store
            .get_opt(&Path::from(shared.path.as_str()))
            .await?
            .ok_or_else(|| {
                Error::Mismatch(format!(
                    "stage {}: the manifest it shares, {}, is missing",
                    c.manifest.stage, shared.path
                ))
            })?;
        if manifest::digest(&bytes) != shared.digest {
            return Err(Error::Mismatch(format!(
                "stage {}: the manifest it shares, {}, no longer has the blake3 recorded when the branch was made",
                c.manifest.stage, shared.path
            )));
        }
        let origin: crate::store::manifest::StageManifest = manifest::parse(&bytes, &shared.path)?;
        let mut as_origin = c.manifest.clone();
        as_origin.run_id = origin.run_id.clone();
        as_origin.status = origin.status.clone();
        as_origin.shared = origin.shared.clone();
        if as_origin != origin {
            return Err(Error::Mismatch(format!(
                "stage {}: manifest {} of run {run_id:?} differs from {}, the manifest it says it shares",
                c.manifest.stage, c.path, shared.path
            )));
        }
        origins.insert(shared.run.clone());
    }
    let mut report = Vec::new();
    for origin in origins {
        for mut v in verify_in(store, &origin, iter, only, pipeline).await? {
            v.how = match v.how {
                "replayed" => "shared, replayed",
                "replayed, rows in key order" => "shared, replayed, rows in key order",
                _ => "shared, integrity",
            };
            report.push(v);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: &[u8]) -> manifest::ArtifactFile {
        let digest = manifest::digest(bytes);
        manifest::ArtifactFile {
            name: name.into(),
            path: crate::store::layout::artifact("r", 0, name, &digest).to_string(),
            bytes: bytes.len() as u64,
            digest,
        }
    }

    fn made(items: &[(&str, &[u8])]) -> Vec<(String, bytes::Bytes)> {
        items
            .iter()
            .map(|(n, b)| (n.to_string(), bytes::Bytes::copy_from_slice(b)))
            .collect()
    }

    /// Screenshots are compared by name only; every other artifact byte for byte; a screenshot
    /// missing from either side fails naming it.
    #[test]
    fn screenshots_are_compared_by_name_only() {
        let committed = [
            file("policy", b"weights"),
            file("asset-ab", b"page"),
            file("screenshot-t-0000-0", b"pixels here"),
            file("screenshot-t-0000-1", b"pixels there"),
        ];
        let other_pixels = made(&[
            ("policy", b"weights"),
            ("asset-ab", b"page"),
            ("screenshot-t-0000-0", b"other pixels"),
            ("screenshot-t-0000-1", b"more"),
        ]);
        let report = compare_artifacts("rollout", &committed, other_pixels).unwrap();
        let tables: Vec<&str> = report.iter().map(|v| v.table.as_str()).collect();
        assert_eq!(tables, ["checkpoint:policy", "assets:1", "screenshots:2"]);
        let missing = made(&[
            ("policy", b"weights"),
            ("asset-ab", b"page"),
            ("screenshot-t-0000-0", b"pixels here"),
        ]);
        let e = compare_artifacts("rollout", &committed, missing).unwrap_err();
        assert!(
            e.to_string().contains("screenshot-t-0000-1 was committed"),
            "{e}"
        );
        let mut extra = made(&[
            ("policy", b"weights"),
            ("asset-ab", b"page"),
            ("screenshot-t-0000-0", b"x"),
            ("screenshot-t-0000-1", b"y"),
        ]);
        extra.push(("screenshot-t-0000-2".into(), bytes::Bytes::new()));
        let e = compare_artifacts("rollout", &committed, extra).unwrap_err();
        assert!(
            e.to_string()
                .contains("screenshot-t-0000-2 was replayed but not committed"),
            "{e}"
        );
        // The exclusion is for screenshots only.
        for changed in ["policy", "asset-ab"] {
            let mut p = made(&[
                ("policy", b"weights"),
                ("asset-ab", b"page"),
                ("screenshot-t-0000-0", b"x"),
                ("screenshot-t-0000-1", b"y"),
            ]);
            p.iter_mut().find(|(n, _)| n == changed).unwrap().1 = bytes::Bytes::from_static(b"z");
            let e = compare_artifacts("rollout", &committed, p).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("artifact {changed} differs")),
                "{e}"
            );
        }
    }
}
