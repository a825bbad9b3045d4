//! The flags several commands share (the store, the cluster, output formats) and the value
//! types of the commands' flags, declared once.

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::model::Device;
use crate::store::Store;

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum ModelRole {
    Policy,
    Rm,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum SchemaFormat {
    Md,
    Json,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum TextOrJson {
    Text,
    Json,
}

/// `run.device`'s values, for commands without a config.
#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum DeviceArg {
    Cpu,
    Cuda,
    Ndarray,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Device {
        match d {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
            DeviceArg::Ndarray => Device::Ndarray,
        }
    }
}

/// The store a read command opens (declared once, flattened into each command).
#[derive(Args, Debug)]
pub(super) struct StoreArgs {
    /// Store URL: a path, file://PATH, memory://, s3://bucket/prefix, gs://, az://.
    #[arg(long = "store", env = "RLA_PIPE_STORE", default_value = "./runs")]
    url: String,
}

/// The workers a command runs on (`run`: rollouts, RM scoring and the relational stages,
/// overriding `run.cluster`; `sql`: the query).
#[derive(Args, Debug)]
pub(super) struct ClusterArgs {
    /// Run on these workers (`rla-pipe worker`), comma-separated host:port (`run`: the same
    /// bytes as in this process; `sql`: float sums may differ in the last bits).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "HOST:PORT,...",
        env = "RLA_PIPE_CLUSTER"
    )]
    cluster: Vec<String>,
}

impl ClusterArgs {
    /// The addresses given, blanks dropped (`RLA_PIPE_CLUSTER=` set empty is no cluster).
    pub(super) fn addresses(self) -> Vec<String> {
        self.cluster
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect()
    }
}

impl StoreArgs {
    /// The store, which must exist (read commands never create one).
    pub(super) fn open(&self) -> Result<Store> {
        Ok(Store::open_existing(&self.url)?)
    }
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum Format {
    Table,
    Csv,
    Json,
}

/// `--set`'s value parser: KEY=VALUE, or a usage error (exit 2).
pub(super) fn key_value(s: &str) -> std::result::Result<String, String> {
    match s.split_once('=') {
        Some((k, _)) if !k.trim().is_empty() => Ok(s.to_string()),
        _ => Err(format!(
            "expected KEY=VALUE, e.g. --set reward.lambda=0.5 (got {s:?})"
        )),
    }
}
