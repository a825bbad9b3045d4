//! rla-pipe: RLAnything-style reinforcement learning as a staged dataflow.
//!
//! Modules, by concern:
//! - [`config`]: `iteration.toml`, validation, `--set`, canonical hashing.
//! - [`store`]: object_store URLs, the layout, manifests, deterministic Parquet.
//! - [`engine`]: the DAG, the runner (resume), replay, reading committed state.
//! - [`stages`]: one file per stage; relational stages keep their SQL beside them.
//! - [`env`]: environments (the `Environment` trait, gridnav, household, external).
//! - [`model`]: burn models: the transformer, tokenizer, policy, reward model and PPO.
//! - [`schema`]: the Arrow schema of every table (documented in `schemas/`).
//! - [`sql`]: the read-only query session of `rla-pipe sql`.
//! - [`cli`]: clap only.

pub mod adapt;
pub mod cli;
pub mod config;
pub mod engine;
pub mod env;
pub mod error;
pub mod model;
pub mod report;
pub mod schema;
pub mod sql;
pub mod stages;
pub mod store;

pub use error::{Error, Result};
