//! The models (burn): one small decoder-only transformer family ([`transformer`]) serves as the
//! policy ([`policy`]) and as the generative reward model ([`reward`]); [`ppo`] trains both.
//!
//! Backends: CPU through burn's `flex` backend (the default, bit-reproducible), CUDA through
//! burn-cuda behind the cargo feature `cuda` (`run.device = "cuda"`). Model code is generic over
//! the backend; [`on_backend!`](crate::on_backend) picks one at run time. The cargo feature
//! `ndarray` adds `run.device = "ndarray"` (burn's ndarray CPU backend), for comparing the two
//! CPU backends on our model (README, Benchmarks).
//!
//! Checkpoints ([`checkpoint`]) are plain bytes with a fixed layout, so equal weights give equal
//! bytes and the engine can store them content-addressed and verify their digests.

pub mod checkpoint;
pub mod config;
pub mod hf;
pub mod lm;
pub mod policy;
pub mod ppo;
pub mod pretrain;
pub mod prompt;
pub mod reward;
pub mod tokenizer;
pub mod transformer;

use crate::error::{Error, Result};
pub use checkpoint::Checkpoint;
pub use config::{
    ActionScore, Device, LogprobTemperature, PolicyConfig, PolicyKind, RewardModelConfig,
    UpdateConfig,
};
pub use lm::Lm;
pub use prompt::{StepRow, Trajectory};
pub use tokenizer::Tokenizer;
pub use transformer::{ModelConfig, Transformer};

/// The CPU backend.
pub type Cpu = burn::backend::Flex;
/// The CPU backend with autodiff (training).
pub type CpuTrain = burn::backend::Autodiff<Cpu>;
/// The CUDA backend.
#[cfg(feature = "cuda")]
pub type Gpu = burn::backend::Cuda;
/// The CUDA backend with autodiff (training).
#[cfg(feature = "cuda")]
pub type GpuTrain = burn::backend::Autodiff<Gpu>;

/// Call a backend-generic function on the backend a [`Device`] names:
/// `on_backend!(device, infer | train, function(args...))`, where the function's first
/// argument is the burn device.
#[macro_export]
macro_rules! on_backend {
    ($device:expr, infer, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $device {
            #[cfg(feature = "cuda")]
            $crate::model::Device::Cuda => $f::<$crate::model::Gpu>(&Default::default(), $($arg),*),
            #[cfg(feature = "ndarray")]
            $crate::model::Device::Ndarray => $f::<burn::backend::NdArray>(&Default::default(), $($arg),*),
            $crate::model::Device::Cpu => $f::<$crate::model::Cpu>(&Default::default(), $($arg),*),
            #[allow(unreachable_patterns)]
            other => Err($crate::model::unavailable(other)),
        }
    };
    ($device:expr, train, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $device {
            #[cfg(feature = "cuda")]
            $crate::model::Device::Cuda => $f::<$crate::model::GpuTrain>(&Default::default(), $($arg),*),
            #[cfg(feature = "ndarray")]
            $crate::model::Device::Ndarray => $f::<burn::backend::Autodiff<burn::backend::NdArray>>(&Default::default(), $($arg),*),
            $crate::model::Device::Cpu => $f::<$crate::model::CpuTrain>(&Default::default(), $($arg),*),
            #[allow(unreachable_patterns)]
            other => Err($crate::model::unavailable(other)),
        }
    };
}

/// The error for a device this build has no backend for.
pub fn unavailable(device: Device) -> Error {
    Error::Config(format!(
        "key `run.device`: {device:?} is not available in this build (cpu{})",
        if cfg!(feature = "cuda") {
            ", cuda"
        } else {
            "; rebuild with --features cuda for cuda"
        }
    ))
}

/// The two model roles.
pub const POLICY: &str = "policy";
pub const RM: &str = "rm";

/// Everything that defines a role's model: its tokenizer and its shape.
pub struct ModelSpec {
    pub role: &'static str,
    pub tokenizer: Tokenizer,
    pub config: ModelConfig,
    pub history: usize,
    /// Policy only: score an action by its mean token log-likelihood (else the sum).
    pub action_mean: bool,
}

impl ModelSpec {
    /// The spec of a role (`policy` or `rm`): its section's shape and tokenizer, over the
    /// environment's vocabulary `words` (for the built-in word-level tokenizer).
    pub fn for_role(
        role: &str,
        policy: &PolicyConfig,
        reward_model: &RewardModelConfig,
        words: &[String],
    ) -> Result<ModelSpec> {
        let (role, path, d, l, h, c, history) = match role {
            POLICY => {
                let p = policy;
                (
                    POLICY,
                    &p.tokenizer,
                    p.d_model,
                    p.layers,
                    p.heads,
                    p.context,
                    p.history,
                )
            }
            RM => {
                let r = reward_model;
                (
                    RM,
                    &r.tokenizer,
                    r.d_model,
                    r.layers,
                    r.heads,
                    r.context,
                    r.history,
                )
            }
            other => return Err(Error::Model(format!("no model role {other:?}"))),
        };
        let tokenizer = Tokenizer::for_config(path, words)?;
        let config = ModelConfig {
            vocab: tokenizer.vocab_size(),
            d_model: d,
            layers: l,
            heads: h,
            context: c,
        };
        config.validate().map_err(Error::Config)?;
        Ok(ModelSpec {
            role,
            tokenizer,
            config,
            history,
            action_mean: role == POLICY && policy.action_score == ActionScore::Mean,
        })
    }

    /// The policy's decision at a step: its prompt (fitted to leave room for the longest
    /// admissible action) and the tokens of every admissible action.
    pub fn decision(
        &self,
        task: &str,
        past: &[(&str, &str)],
        obs: &str,
        admissible: &[String],
    ) -> policy::Decision {
        let actions: Vec<Vec<u32>> = admissible
            .iter()
            .map(|a| prompt::action(&self.tokenizer, a))
            .collect();
        let longest = actions.iter().map(Vec::len).max().unwrap_or(1);
        let budget = self.config.context.saturating_sub(longest).max(2);
        policy::Decision {
            prompt: prompt::policy(&self.tokenizer, self.history, budget, task, past, obs),
            actions,
        }
    }

    /// The reward model's prompt for step `i` of a trajectory, leaving room for `max_tokens`.
    pub fn rm_prompt(&self, max_tokens: usize, t: &Trajectory, i: usize) -> Vec<u32> {
        let s = &t.steps[i];
        let budget = self.config.context.saturating_sub(max_tokens).max(2);
        prompt::reward(
            &self.tokenizer,
            self.history,
            budget,
            t.task(),
            &t.past(i),
            &s.observation,
            &s.action,
            &s.next_observation,
        )
    }

    /// Load a checkpoint of this spec (its shape must match the config).
    pub fn load(&self, bytes: &[u8]) -> Result<Checkpoint> {
        let ck = Checkpoint::decode(bytes)?;
        if ck.config != self.config || ck.role != self.role {
            return Err(Error::Model(format!(
                "checkpoint is a {} model of shape {:?}, the config wants a {} model of shape {:?}",
                ck.role, ck.config, self.role, self.config
            )));
        }
        Ok(ck)
    }
}

/// The seeded initial checkpoint of a spec: the same bytes for the same spec and seed on
/// every machine.
pub fn initial_checkpoint(spec: &ModelSpec, seed: u64) -> bytes::Bytes {
    Checkpoint::init(spec.role, &spec.config, seed).encode()
}
