//! The library's one error type, grouped by kind. The CLI maps every variant to exit code 1
//! (usage errors are clap's and exit 2; an interrupt exits 130).
//!
//! Failures of the libraries below us (DataFusion, Arrow, Parquet, object_store) keep their
//! source error (`std::error::Error::source`), so callers can inspect them; the message of each
//! variant already includes the source's text.

use std::fmt;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the library reports. Messages name the file, key, table or stage involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid configuration: malformed TOML, unknown keys, wrong types, bad values, bad flags.
    #[error("config error: {0}")]
    Config(String),
    /// The store failed or a store URL / run id is invalid.
    #[error("store error: {0}")]
    Store(String),
    /// The object store failed on a path (the source is object_store's error).
    #[error("store error: {context}: {source}{}", credentials_hint(source))]
    ObjectStore {
        context: String,
        #[source]
        source: object_store::Error,
    },
    /// Another writer committed the same manifest first (put-if-absent lost).
    #[error("commit conflict: {0}")]
    CommitConflict(String),
    /// Committed data is missing, truncated or does not match its manifest.
    #[error("data error: {0}")]
    Data(String),
    /// A query failed to plan or execute, or its result was not what a stage expected.
    #[error("SQL error: {0}")]
    Sql(String),
    /// DataFusion failed.
    #[error("SQL error: {}", datafusion_message(.0))]
    DataFusion(#[source] Box<datafusion::error::DataFusionError>),
    /// Arrow failed.
    #[error("SQL error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Parquet failed.
    #[error("SQL error: parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// `replay --verify` found a difference.
    #[error("replay mismatch: {0}")]
    Mismatch(String),
    /// A model (policy / reward model) failure.
    #[error("model error: {0}")]
    Model(String),
    /// An environment failure (built-in or external process).
    #[error("environment error: {0}")]
    Environment(String),
    /// Environment adaptation failed (e.g. the adapter's LLM endpoint is unreachable).
    #[error("adaptation error: {0}")]
    Adapt(String),
    /// A cluster worker is unreachable, runs another build or store, or failed mid-stage.
    #[error("cluster error: {0}")]
    Cluster(String),
    /// The run was interrupted (Ctrl-C) before the current stage committed.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// A command-line value the parser cannot check alone (a range, a table's name, a number's
    /// bounds, a missing choice): exit status 2, as the parser's own usage errors.
    #[error("usage error: {0}")]
    Usage(String),
}

/// What to set when a cloud store failed for want of credentials: with none in the environment,
/// the object store asks the machine's instance metadata service (an address that answers only
/// on a cloud VM with a role), and its failure says nothing about credentials.
fn credentials_hint(e: &object_store::Error) -> &'static str {
    let text = e.to_string();
    if text.contains("/latest/api/token")
        || text.contains("/latest/meta-data")
        || text.contains("169.254.169.254")
        || text.contains("metadata.google.internal")
    {
        "\n  no credentials were found in the environment, so the machine's instance metadata \
         service was asked, and it did not give any. Set them: s3:// AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (AWS_REGION; AWS_ENDPOINT_URL and AWS_ALLOW_HTTP=true for a server \
         of your own); gs:// GOOGLE_SERVICE_ACCOUNT (a key file); az:// AZURE_STORAGE_ACCOUNT_NAME \
         and AZURE_STORAGE_ACCOUNT_KEY"
    } else {
        ""
    }
}

/// DataFusion's message without its own "SQL error: " (the variant's prefix says it once).
pub fn datafusion_message(e: &datafusion::error::DataFusionError) -> String {
    let text = e.to_string();
    match text.strip_prefix("SQL error: ") {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

impl Error {
    /// The message without its kind's prefix (`environment error: `), for a caller that
    /// wraps it in an error of the same kind: one prefix, not two.
    pub fn detail(&self) -> String {
        match self {
            Error::Config(m)
            | Error::Store(m)
            | Error::CommitConflict(m)
            | Error::Data(m)
            | Error::Sql(m)
            | Error::Mismatch(m)
            | Error::Model(m)
            | Error::Environment(m)
            | Error::Adapt(m)
            | Error::Cluster(m)
            | Error::Interrupted(m)
            | Error::Usage(m) => m.clone(),
            other => other.to_string(),
        }
    }
    pub fn usage(msg: impl fmt::Display) -> Self {
        Error::Usage(msg.to_string())
    }
    pub fn config(msg: impl fmt::Display) -> Self {
        Error::Config(msg.to_string())
    }
    pub fn store(msg: impl fmt::Display) -> Self {
        Error::Store(msg.to_string())
    }
    pub fn data(msg: impl fmt::Display) -> Self {
        Error::Data(msg.to_string())
    }
    pub fn sql(msg: impl fmt::Display) -> Self {
        Error::Sql(msg.to_string())
    }
    /// An object_store failure on `context` (a URL or path), its source kept.
    pub fn object_store(context: impl fmt::Display, source: object_store::Error) -> Self {
        Error::ObjectStore {
            context: context.to_string(),
            source,
        }
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    /// A DataFusion error; one that carries one of ours (raised inside a stream a stage fed to
    /// DataFusion) gives it back, so its kind survives the trip.
    fn from(e: datafusion::error::DataFusionError) -> Self {
        match e {
            datafusion::error::DataFusionError::External(inner) => {
                match inner.downcast::<Error>() {
                    Ok(ours) => *ours,
                    Err(other) => Error::DataFusion(Box::new(
                        datafusion::error::DataFusionError::External(other),
                    )),
                }
            }
            other => Error::DataFusion(Box::new(other)),
        }
    }
}

/// Collects the semantic checks of a config section: every failure names its dotted key, and
/// all of them are reported at once.
#[derive(Debug, Default)]
pub struct Checks(Vec<String>);

impl Checks {
    /// Record `msg` for `key` unless `ok`.
    pub fn check(&mut self, ok: bool, key: &str, msg: impl fmt::Display) {
        if !ok {
            self.0.push(format!("key `{key}`: {msg}"));
        }
    }

    /// `Ok` if every check passed, else one config error listing the failures.
    pub fn finish(self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(self.0.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_errors_come_back_out_of_datafusion() {
        let wrapped = datafusion::error::DataFusionError::External(Box::new(
            Error::CommitConflict("x".into()),
        ));
        assert!(matches!(Error::from(wrapped), Error::CommitConflict(_)));
        let plain = datafusion::error::DataFusionError::Plan("bad plan".into());
        let e = Error::from(plain);
        assert!(e.to_string().contains("bad plan"), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn checks_name_every_failed_key() {
        let mut c = Checks::default();
        c.check(true, "a.b", "fine");
        c.check(false, "a.c", "must be positive");
        c.check(false, "d", "bad");
        let e = c.finish().unwrap_err().to_string();
        assert_eq!(e, "config error: key `a.c`: must be positive; key `d`: bad");
    }
}
