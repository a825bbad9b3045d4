//! The engine: runs a [`Dag`] of stages over a store, commits every output, resumes, replays.
//!
//! It knows stages only through the contract in [`crate::stage`]; the pipeline registry
//! ([`crate::pipeline`]) decides which stages a config runs.

pub mod assets;
pub mod branch;
pub mod checkpoints;
pub mod compute;
pub mod dag;
pub mod exec;
pub mod replay;
pub mod runner;
pub mod shard;
pub mod sort;
pub mod summary;

pub use dag::{Dag, InitialCheckpoint, InputSource, ModelOrigins};
pub use runner::Engine;
