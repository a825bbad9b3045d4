//! The library's one error type, grouped by kind. The CLI maps every variant to exit code 1
//! (usage errors are clap's and exit 2).

use std::fmt;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the library reports. Messages name the file, key, table or stage involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid configuration: malformed TOML, unknown keys, wrong types, bad values, bad flags.
    #[error("config error: {0}")]
    Config(String),
    /// The object store failed or a store URL / run id is invalid.
    #[error("store error: {0}")]
    Store(String),
    /// Another writer committed the same manifest first (put-if-absent lost).
    #[error("commit conflict: {0}")]
    CommitConflict(String),
    /// Committed data is missing, truncated or does not match its manifest.
    #[error("data error: {0}")]
    Data(String),
    /// A DataFusion / Arrow / Parquet failure while planning or executing a query.
    #[error("SQL error: {0}")]
    Sql(String),
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
    /// The run was interrupted (Ctrl-C) before the current stage committed.
    #[error("interrupted: {0}")]
    Interrupted(String),
}

impl Error {
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
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        Error::Sql(e.to_string())
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::Sql(e.to_string())
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::Sql(format!("parquet: {e}"))
    }
}
