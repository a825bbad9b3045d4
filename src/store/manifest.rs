//! Stage and iteration manifests: the commit points of the store.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Manifest format version written into every manifest.
pub const FORMAT: u32 = 1;

/// The code version recorded in manifests and `run.json`.
pub fn code_version() -> String {
    format!("rla-pipe {}", env!("CARGO_PKG_VERSION"))
}

/// One committed output file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputFile {
    pub table: String,
    /// Path relative to the store root.
    pub path: String,
    pub bytes: u64,
    pub rows: u64,
    /// blake3 of the file's bytes (hex).
    pub digest: String,
    /// Fingerprint of the Arrow schema the file was written with ([`crate::schema::fingerprint`]);
    /// empty in manifests of builds before it was recorded. A reader whose table schema has a
    /// different fingerprint checks the file's own schema (columns added since read as NULL; a
    /// changed type is an error).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schema: String,
    /// The writer checked, row by row, that the file is in the table's key order. False (absent)
    /// in manifests of builds before 2026-11-24, whose files may not be: DataFusion 55.2 could
    /// drop a stage's final sort (README, Known problem). Readers tell DataFusion that a table's
    /// files are sorted only when all of them are marked ([`crate::store::tables::FileOrder`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sorted: bool,
}

/// One artifact (checkpoint) a stage wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFile {
    pub name: String,
    /// Path relative to the store root (`<run>/artifacts/iter=N/<name>.<digest>.ckpt`).
    pub path: String,
    pub bytes: u64,
    /// blake3 of the artifact's bytes (hex).
    pub digest: String,
}

/// What an input of a stage is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputKind {
    /// Another stage's manifest (the tables it committed).
    Manifest,
    /// A checkpoint another stage wrote.
    Artifact,
    /// The seeded initial checkpoint (`path` is empty, `digest` is that of its bytes).
    Init,
}

/// One input a stage read: another stage's manifest (by its digest) or an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRef {
    /// `manifest`, `artifact` or `init`.
    pub kind: InputKind,
    /// Tables read from this input (manifest inputs).
    #[serde(default)]
    pub tables: Vec<String>,
    /// Path relative to the store root.
    pub path: String,
    /// blake3 of the input manifest's (or artifact's) bytes.
    pub digest: String,
    /// Checkpoint inputs (`init` and `artifact`) of a model not seeded by rla-pipe: the
    /// pretrained weights it builds on (`hf:DIR blake3:…`, the digest of the model directory's
    /// weight files) — an adapter checkpoint needs them to be a model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// The manifest of one committed stage of one iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageManifest {
    pub format: u32,
    pub run_id: String,
    pub iter: u32,
    pub stage: String,
    pub code_version: String,
    /// Config sections this stage depends on, and the hash of their values.
    pub config_sections: Vec<String>,
    pub config_hash: String,
    /// The values of those sections (`dotted.key → JSON`), for replay across config upgrades.
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, String>,
    pub seed: u64,
    pub deterministic: bool,
    pub inputs: Vec<InputRef>,
    pub outputs: Vec<OutputFile>,
    /// Checkpoints written by the stage.
    #[serde(default)]
    pub artifacts: Vec<ArtifactFile>,
    pub started_at: String,
    pub seconds: f64,
    /// Of `seconds`, the time spent storing the outputs: Parquet encoding, blake3 hashing and
    /// uploading the data files (summed over the tables, which are written in parallel with
    /// the computation, so this can exceed the share of wall time it costs), plus hashing and
    /// uploading the checkpoints. Absent in manifests of builds before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_seconds: Option<f64>,
    /// CPU seconds (user + system) the process spent during the stage, all threads: divided by
    /// `seconds`, how many cores it kept busy. Absent before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// The process's peak resident memory during the stage (bytes, Linux: its high-water mark
    /// reset when the stage starts). Absent where the platform cannot reset it, and before it
    /// was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// On a GPU, the largest device memory the stage's models reserved (bytes: cubecl's pages
    /// in use or kept in its pools, noted before each model call and optimizer step hands the
    /// unused ones back). Absent on the CPU and before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<u64>,
    /// Model stages: tokens the models computed, and tokens a shared prefix (a prompt computed
    /// once for its continuations, samples packed into prefix trees) saved them. Absent for
    /// stages without a model and before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenCounts>,
    /// `committed`, or `shared` for a branch run's reference to a parent's stage.
    pub status: String,
    /// In a branch run (`replay --from N --into ID`), the stages of iterations before N are the
    /// parent's: this manifest is then a copy of the committing run's manifest (same files, same
    /// inputs) that names it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<Shared>,
}

/// Tokens a model stage computed and reused ([`StageManifest::tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCounts {
    pub computed: u64,
    pub reused: u64,
}

/// The committed stage a branch run's manifest refers to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// The run that executed and committed the stage (the first ancestor that did).
    pub run: String,
    /// Its manifest (path relative to the store root).
    pub path: String,
    /// blake3 of that manifest's bytes.
    pub digest: String,
}

/// `run.json`'s record of a branch: the run it was made from and how it differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    /// The parent run.
    pub parent: String,
    /// Iterations before this one are the parent's (shared by reference, not copied).
    pub from_iter: u32,
    /// The `--set key=value` overrides applied to the parent's config.
    pub overrides: Vec<String>,
}

/// Written after every stage manifest of an iteration is committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IterationManifest {
    pub format: u32,
    pub run_id: String,
    pub iter: u32,
    pub code_version: String,
    /// (stage, manifest digest) in DAG order.
    pub stages: Vec<StageDigest>,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDigest {
    pub stage: String,
    pub digest: String,
}

/// `run.json`: the resolved config of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunManifest {
    pub format: u32,
    pub run_id: String,
    pub code_version: String,
    pub config_hash: String,
    pub created_at: String,
    pub config: serde_json::Value,
    /// Models the run starts from that rla-pipe did not seed: checkpoint name → `hf:DIR
    /// blake3:…` (the digest of the directory's weight files).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub models: std::collections::BTreeMap<String, String>,
    /// Set for a branch run made by `replay --from N --into ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<Branch>,
}

/// Serialize a manifest (pretty JSON, trailing newline).
pub fn to_bytes<T: Serialize>(m: &T) -> bytes::Bytes {
    let mut s = serde_json::to_string_pretty(m).expect("manifest serializes");
    s.push('\n');
    bytes::Bytes::from(s)
}

/// Parse a manifest, naming its path in the error (truncated or corrupt manifests).
pub fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], path: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::data(format!("corrupt manifest {path}: {e}")))
}

/// blake3 hex digest of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Current UTC time as RFC 3339 (seconds precision), without a date/time dependency.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_output() -> impl Strategy<Value = OutputFile> {
        (
            "[a-z_]{1,12}",
            "[ -~]{0,40}",
            any::<u64>(),
            any::<u64>(),
            "[0-9a-f]{64}",
            any::<bool>(),
        )
            .prop_map(|(table, path, bytes, rows, digest, sorted)| OutputFile {
                schema: String::new(),
                sorted,
                table,
                path,
                bytes,
                rows,
                digest,
            })
    }

    proptest! {
        #[test]
        fn stage_manifest_round_trips(
            run_id in "[a-z0-9-]{1,20}", iter in any::<u32>(), stage in "[a-z_]{1,16}",
            seed in any::<u64>(), secs in 0.0f64..1e6, outputs in proptest::collection::vec(arb_output(), 0..5),
            tables in proptest::collection::vec("[a-z_]{1,10}", 0..4), det in any::<bool>(),
            names in proptest::collection::vec("[a-z]{1,8}", 0..3),
        ) {
            let m = StageManifest {
                format: FORMAT, run_id, iter, stage, code_version: code_version(),
                config_sections: vec!["reward".into()], config_hash: digest(b"x"),
                config: [("reward.lambda".to_string(), "1.0".to_string())].into(), seed, deterministic: det,
                inputs: vec![InputRef { kind: InputKind::Manifest, tables, path: "p".into(), digest: digest(b"y"), source: None }],
                outputs,
                artifacts: names.iter().map(|n| ArtifactFile {
                    name: n.clone(), path: format!("r/artifacts/iter=000000/{n}.{}.ckpt", digest(n.as_bytes())),
                    bytes: n.len() as u64, digest: digest(n.as_bytes()),
                }).collect(),
                started_at: now_rfc3339(), seconds: secs, store_seconds: det.then_some(secs / 2.0), cpu_seconds: det.then_some(secs * 1.5), peak_rss_bytes: det.then_some(seed / 7), peak_device_bytes: det.then_some(seed / 3),
                tokens: det.then_some(TokenCounts { computed: seed % 1000, reused: iter as u64 }), status: "committed".into(),
                shared: None,
            };
            let bytes = to_bytes(&m);
            let back: StageManifest = parse(&bytes, "m.json").unwrap();
            prop_assert_eq!(&back, &m);
            prop_assert_eq!(to_bytes(&back), bytes);
        }
    }

    #[test]
    fn truncated_manifest_is_a_clear_error() {
        let m = IterationManifest {
            format: 1,
            run_id: "r".into(),
            iter: 0,
            code_version: code_version(),
            stages: vec![],
            seconds: 0.0,
        };
        let bytes = to_bytes(&m);
        let e = parse::<IterationManifest>(
            &bytes[..bytes.len() / 2],
            "r/_commits/iter=000000/_iteration.json",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("corrupt manifest r/_commits/iter=000000/_iteration.json"),
            "{e}"
        );
    }

    #[test]
    fn rfc3339_shape() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}
