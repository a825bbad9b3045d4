//! The models (burn): rla-pipe's small decoder-only transformer ([`transformer`]) or a
//! pretrained Hugging Face decoder ([`hf`]: Llama, Qwen2, Qwen3) serves as the policy
//! ([`policy`]) and as the generative reward model ([`reward`]), through one interface
//! ([`lm::Lm`]; [`AnyLm`] holds either); [`ppo`] trains both, [`pretrain`] warm-starts them.
//!
//! Backends: CPU through burn's `flex` backend (the default, bit-reproducible), CUDA through
//! burn-cuda behind the cargo feature `cuda` (`run.device = "cuda"`). Model code is generic over
//! the backend; [`on_backend!`](crate::on_backend) picks one at run time. The cargo feature
//! `ndarray` adds `run.device = "ndarray"` (burn's ndarray CPU backend), for comparing the two
//! CPU backends on our model (README, Benchmarks).
//!
//! Checkpoints ([`checkpoint`] for the small model, f32 (or bf16) safetensors in the Hugging Face
//! layout for fully fine-tuned pretrained ones, PEFT adapter files for adapters: [`Weights`])
//! are bytes with a fixed layout, so equal weights give equal bytes and the engine can store
//! them content-addressed and verify their digests.

pub mod adamw;
pub mod amx;
pub mod any_lm;
pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod count;
pub mod device_memory;
pub mod hf;
pub mod kv;
pub mod lm;
pub mod policy;
pub mod ppo;
pub mod pretrain;
pub mod prompt;
pub mod reward;
pub mod tape;
pub mod tokenizer;
pub mod transformer;
pub mod tree;

use crate::error::{Error, Result};
pub use any_lm::AnyLm;
pub use backend::{Cpu, CpuTrain, unavailable};
#[cfg(feature = "cuda")]
pub use backend::{Gpu, GpuTrain};
pub use checkpoint::Checkpoint;
pub use config::{
    ActionMode, ActionScore, CheckpointDtype, Device, InferenceDtype, Init, LogprobTemperature,
    LoraConfig, PolicyConfig, PolicyKind, RewardModelConfig, UpdateConfig,
};
pub use lm::Lm;
pub use prompt::{StepRow, Trajectory};
pub use tokenizer::Tokenizer;
pub use transformer::{ModelConfig, Transformer};

/// The two model roles.
pub const POLICY: &str = "policy";
pub const RM: &str = "rm";

/// A pretrained model a role starts from (`<section>.init = "hf:DIR"`).
pub struct HfSpec {
    pub dir: std::path::PathBuf,
    pub arch: hf::HfArch,
    pub tokenizer: hf::HfTokenizer,
    /// blake3 of the directory's weight files: the identity of the starting weights.
    pub digest: String,
}

/// Everything that defines a role's model: its tokenizer and its shape, or the pretrained
/// model it starts from.
pub struct ModelSpec {
    pub role: &'static str,
    /// The word-level tokenizer (the small transformer's).
    pub tokenizer: Tokenizer,
    /// The small transformer's shape; for a pretrained model only `context` (the prompt +
    /// response token budget) is used.
    pub config: ModelConfig,
    pub history: usize,
    /// Policy only: score an action by its mean token log-likelihood (else the sum).
    pub action_mean: bool,
    /// The pretrained model, when the role starts from one.
    pub hf: Option<HfSpec>,
    /// Policy in `generate` mode: how replies are written.
    pub generate: Option<GenerateSettings>,
    /// Reward model with a pretrained model: text that opens its reply, part of the prompt
    /// (`reward_model.reply_prefix`); empty otherwise.
    pub reply_prefix: String,
    /// A pretrained model with low-rank adapters (`<section>.lora`): only they train, and its
    /// checkpoints are the adapters alone.
    pub lora: Option<hf::lora::LoraSpec>,
    /// How a fully fine-tuned pretrained model's checkpoints are stored
    /// (`update.checkpoint_dtype`).
    pub checkpoint_dtype: CheckpointDtype,
    /// A pretrained model's matrix products in inference (`<section>.inference_dtype`).
    pub inference_dtype: InferenceDtype,
    /// A pretrained model's frozen base in training (`update.base_dtype`, with adapters).
    pub train_dtype: InferenceDtype,
    /// A pretrained model's training attention recomputes its probabilities in the backward
    /// pass (`update.recompute_attention`, [`hf::recompute`]).
    pub recompute_attention: bool,
}

/// `policy.action_mode = "generate"`: the policy writes a reply that names its action.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateSettings {
    pub max_tokens: usize,
    pub top_p: f64,
    pub reasoning: bool,
}

/// A role's weights as the store holds them.
pub enum Weights {
    Small(Checkpoint),
    /// f32 (or bf16) safetensors in the Hugging Face key layout.
    Hf {
        arch: hf::HfArch,
        /// Shared with the store's bytes it was loaded from (no copy).
        bytes: bytes::Bytes,
    },
    /// Low-rank adapters (a PEFT adapter file) over the pretrained model in `dir`.
    Lora {
        arch: hf::HfArch,
        dir: std::path::PathBuf,
        spec: hf::lora::LoraSpec,
        adapter: bytes::Bytes,
    },
}

impl Weights {
    /// The model on `device`, for inference: adapters are merged into the weights
    /// (`W + (α/r)·A·B`, one matrix product per projection instead of three).
    pub fn to_model<B: burn::tensor::backend::Backend>(
        &self,
        device: &B::Device,
    ) -> Result<AnyLm<B>> {
        Ok(match self.to_trainable(device)? {
            AnyLm::Hf(m) if m.lora.is_some() => AnyLm::Hf(hf::lora::merge(m)),
            other => other,
        })
    }

    /// The model on `device`, for training: with adapters, the base weights frozen and the
    /// adapters apart.
    pub fn to_trainable<B: burn::tensor::backend::Backend>(
        &self,
        device: &B::Device,
    ) -> Result<AnyLm<B>> {
        Ok(match self {
            Weights::Small(ck) => AnyLm::Small(ck.to_model(device)),
            Weights::Hf { arch, bytes } => {
                AnyLm::Hf(hf::weights::load_bytes(arch, bytes, "checkpoint", device)?)
            }
            Weights::Lora {
                arch,
                dir,
                spec,
                adapter,
            } => {
                let files = hf::weights::weight_files(dir)?;
                let base = hf::weights::load::<B>(arch, &files, device)?;
                AnyLm::Hf(hf::lora::attach_bytes(
                    base,
                    spec,
                    adapter,
                    "checkpoint",
                    device,
                )?)
            }
        })
    }

    /// The bytes the store keeps.
    pub fn encode(&self) -> bytes::Bytes {
        match self {
            Weights::Small(ck) => ck.encode(),
            Weights::Hf { bytes, .. } => bytes.clone(),
            Weights::Lora { adapter, .. } => adapter.clone(),
        }
    }
}

/// Whether a key set to `"bf16"` can run here: on the CPU backends (`on_cpu`), with the CPU's
/// bf16 kernel (AMX, AVX512-BF16, or on any other CPU the emulation: the same products, no
/// faster than f32); else the configuration error naming `key`.
fn bf16_usable(key: &str, on_cpu: bool) -> Result<()> {
    if !on_cpu {
        return Err(Error::Config(format!(
            "key `{key}`: \"bf16\" runs on the CPU backend (AMX, AVX512-BF16 or emulated); with run.device = \"cuda\" set it to \"f32\""
        )));
    }
    Ok(())
}

impl ModelSpec {
    /// The spec of a role (`policy` or `rm`): its section's shape and tokenizer, over the
    /// environment's vocabulary `words` (for the built-in word-level tokenizer), or the
    /// pretrained model its `init` names.
    pub fn for_role(
        role: &str,
        policy: &PolicyConfig,
        reward_model: &RewardModelConfig,
        words: &[String],
    ) -> Result<ModelSpec> {
        let (role, section, path, init, d, l, h, c, history) = match role {
            POLICY => {
                let p = policy;
                (
                    POLICY,
                    "policy",
                    &p.tokenizer,
                    &p.init,
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
                    "reward_model",
                    &r.tokenizer,
                    &r.init,
                    r.d_model,
                    r.layers,
                    r.heads,
                    r.context,
                    r.history,
                )
            }
            other => return Err(Error::Model(format!("no model role {other:?}"))),
        };
        let action_mean = role == POLICY && policy.action_score == ActionScore::Mean;
        let init = Init::parse(section, init, path)
            .map_err(|(key, msg)| Error::Config(format!("key `{key}`: {msg}")))?;
        if let Init::Hf(dir) = init {
            let arch = hf::HfArch::from_dir(&dir)?;
            let tokenizer = hf::HfTokenizer::from_dir(&dir, &arch)?;
            if !tokenizer.has_chat_template() {
                return Err(Error::Model(format!(
                    "{}: the model has no chat template (tokenizer_config.json `chat_template`); \
                     rla-pipe prompts pretrained models through it",
                    dir.display()
                )));
            }
            let digest = hf::directory_digest(&dir)?;
            let lora = hf::lora::LoraSpec::of(if role == POLICY {
                &policy.lora
            } else {
                &reward_model.lora
            });
            if let Some(l) = lora.as_ref().filter(|l| l.layers > arch.layers) {
                return Err(Error::Config(format!(
                    "key `{section}.lora.layers`: {} layers asked, the model in {} has {}",
                    l.layers,
                    dir.display(),
                    arch.layers
                )));
            }
            let generate = (role == POLICY && policy.action_mode == ActionMode::Generate)
                .then_some(GenerateSettings {
                    max_tokens: policy.max_tokens,
                    top_p: policy.top_p,
                    reasoning: policy.reasoning,
                });
            return Ok(ModelSpec {
                role,
                tokenizer: Tokenizer::words(words),
                config: ModelConfig {
                    vocab: arch.vocab,
                    d_model: arch.hidden,
                    layers: arch.layers,
                    heads: arch.heads,
                    context: c,
                },
                history,
                action_mean,
                hf: Some(HfSpec {
                    dir,
                    arch,
                    tokenizer,
                    digest,
                }),
                generate,
                reply_prefix: if role == RM {
                    reward_model.reply_prefix.clone()
                } else {
                    String::new()
                },
                lora,
                checkpoint_dtype: CheckpointDtype::F32,
                inference_dtype: if role == POLICY {
                    policy.inference_dtype
                } else {
                    reward_model.inference_dtype
                },
                train_dtype: InferenceDtype::F32,
                recompute_attention: false,
            });
        }
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
            action_mean,
            hf: None,
            generate: None,
            reply_prefix: String::new(),
            lora: None,
            checkpoint_dtype: CheckpointDtype::F32,
            inference_dtype: InferenceDtype::F32,
            train_dtype: InferenceDtype::F32,
            recompute_attention: false,
        })
    }

    /// The role's model for inference (rollout, evaluation, RM scoring) from `weights`:
    /// adapters merged, and with `<section>.inference_dtype = "bf16"` its projections and head
    /// packed for the CPU's bf16 kernel ([`amx`]). bf16 needs the CPU backend; on `cuda` it is
    /// refused naming the key.
    pub fn inference_model<B: burn::tensor::backend::Backend>(
        &self,
        weights: &Weights,
        device: &B::Device,
    ) -> Result<AnyLm<B>> {
        let model = weights.to_model::<B>(device)?;
        if self.inference_dtype == InferenceDtype::F32 {
            return Ok(model);
        }
        let key = format!(
            "{}.inference_dtype",
            if self.role == POLICY {
                "policy"
            } else {
                "reward_model"
            }
        );
        bf16_usable(
            &key,
            std::any::TypeId::of::<B>() == std::any::TypeId::of::<Cpu>(),
        )?;
        Ok(match model {
            AnyLm::Hf(m) => AnyLm::Hf(m.pack_bf16()),
            other => other,
        })
    }

    /// The role's model for training from `weights` ([`Weights::to_trainable`]): with
    /// `update.base_dtype = "bf16"` and adapters, its frozen base packed for AMX
    /// ([`hf::frozen`]). bf16 needs the CPU backend; on `cuda` it is refused naming the key.
    pub fn trainable_model<B: burn::tensor::backend::Backend>(
        &self,
        weights: &Weights,
        device: &B::Device,
    ) -> Result<AnyLm<B>> {
        let model = match weights.to_trainable::<B>(device)? {
            AnyLm::Hf(mut m) => {
                m.recompute_attention = self.recompute_attention;
                AnyLm::Hf(m)
            }
            other => other,
        };
        if self.train_dtype == InferenceDtype::F32 {
            return Ok(model);
        }
        let id = std::any::TypeId::of::<B>();
        bf16_usable(
            "update.base_dtype",
            id == std::any::TypeId::of::<CpuTrain>() || id == std::any::TypeId::of::<Cpu>(),
        )?;
        Ok(match model {
            AnyLm::Hf(m) if m.lora.is_some() => AnyLm::Hf(m.freeze_bf16()),
            other => other,
        })
    }

    /// `generate` mode's settings and pretrained model (`None` in `score` mode).
    pub fn generating(&self) -> Option<(&GenerateSettings, &HfSpec)> {
        self.generate.as_ref().zip(self.hf.as_ref())
    }

    /// `generate` mode: the policy's prompt at a step (leaving room for `policy.max_tokens`).
    pub fn reply_prompt(
        &self,
        task: &str,
        past: &[(&str, &str)],
        obs: &str,
        admissible: &[String],
    ) -> Result<Vec<u32>> {
        let Some((g, h)) = self.generating() else {
            return Err(Error::Config(
                "key `policy.action_mode`: \"generate\" needs a pretrained policy (policy.init = \"hf:DIR\")".into(),
            ));
        };
        let budget = self.config.context.saturating_sub(g.max_tokens).max(2);
        hf::prompt::policy_generate(
            &h.tokenizer,
            self.history,
            budget,
            task,
            past,
            obs,
            admissible,
            g.reasoning,
        )
    }

    /// The policy's decision at a step: its prompt (fitted to leave room for the longest
    /// admissible action) and the tokens of every admissible action.
    pub fn decision(
        &self,
        task: &str,
        past: &[(&str, &str)],
        obs: &str,
        admissible: &[String],
    ) -> Result<policy::Decision> {
        let actions: Vec<Vec<u32>> = match &self.hf {
            Some(h) => admissible
                .iter()
                .map(|a| hf::prompt::action(&h.tokenizer, a))
                .collect::<Result<_>>()?,
            None => admissible
                .iter()
                .map(|a| prompt::action(&self.tokenizer, a))
                .collect(),
        };
        let longest = actions.iter().map(Vec::len).max().unwrap_or(1);
        let budget = self.config.context.saturating_sub(longest).max(2);
        let prompt = match &self.hf {
            Some(h) => hf::prompt::policy(
                &h.tokenizer,
                self.history,
                budget,
                task,
                past,
                obs,
                admissible,
            )?,
            None => prompt::policy(&self.tokenizer, self.history, budget, task, past, obs),
        };
        Ok(policy::Decision { prompt, actions })
    }

    /// The reward model's prompt for step `i` of a trajectory, leaving room for `max_tokens`.
    pub fn rm_prompt(&self, max_tokens: usize, t: &Trajectory, i: usize) -> Result<Vec<u32>> {
        let s = &t.steps[i];
        let budget = self.config.context.saturating_sub(max_tokens).max(2);
        let past = t.past(i);
        Ok(match &self.hf {
            Some(h) => hf::prompt::reward(
                &h.tokenizer,
                &self.reply_prefix,
                self.history,
                budget,
                t.task(),
                &past,
                &s.observation,
                &s.action,
                &s.next_observation,
            )?,
            None => prompt::reward(
                &self.tokenizer,
                self.history,
                budget,
                t.task(),
                &past,
                &s.observation,
                &s.action,
                &s.next_observation,
            ),
        })
    }

    /// What the reward model may write and how its verdict is read.
    pub fn verdicts(&self) -> reward::Verdicts<'_> {
        match &self.hf {
            Some(h) => reward::Verdicts::Text(&h.tokenizer, &self.reply_prefix),
            None => reward::Verdicts::Words(&self.tokenizer),
        }
    }

    /// The reward model's taught answer for a verdict (the warm start): `progress <good>` /
    /// `wasted <bad>` (the verdict alone when `max_tokens` < 2), or `\boxed{1}` / `\boxed{-1}`
    /// ending the turn for a pretrained model (less the reply prefix its prompt ends with).
    pub fn taught_verdict(&self, good: bool, max_tokens: usize) -> Result<Vec<u32>> {
        if let Some(h) = &self.hf {
            return hf::prompt::verdict(&h.tokenizer, good, &self.reply_prefix);
        }
        let tok = &self.tokenizer;
        let (word, verdict) = if good {
            ("progress", tokenizer::GOOD)
        } else {
            ("wasted", tokenizer::BAD)
        };
        let mut v: Vec<u32> = if max_tokens >= 2 {
            tok.encode(word)
        } else {
            vec![]
        };
        v.push(tok.special(verdict));
        Ok(v)
    }

    /// Load a checkpoint of this spec (its shape must match the config).
    pub fn load(&self, bytes: &bytes::Bytes) -> Result<Weights> {
        if let Some(h) = &self.hf {
            if bytes.starts_with(b"RLAPIPE-CKPT") {
                return Err(Error::Model(format!(
                    "checkpoint is a small-transformer {} model, the config wants {} ({})",
                    self.role,
                    h.arch.architecture.hf_name(),
                    h.dir.display()
                )));
            }
            if let Some(spec) = &self.lora {
                let (_, base) = hf::lora::decode(bytes, "checkpoint")?;
                if base != h.digest {
                    return Err(Error::Model(format!(
                        "the {} checkpoint is an adapter trained on base weights blake3:{}; {} \
                         now holds blake3:{} — restore the base model the run started from",
                        self.role,
                        if base.is_empty() {
                            "(not recorded: not an adapter)"
                        } else {
                            &base
                        },
                        h.dir.display(),
                        h.digest
                    )));
                }
                return Ok(Weights::Lora {
                    arch: h.arch.clone(),
                    dir: h.dir.clone(),
                    spec: spec.clone(),
                    adapter: bytes.clone(),
                });
            }
            let mut headers = std::collections::BTreeMap::new();
            hf::weights::check_bytes(bytes, &mut headers)?;
            hf::weights::check_tensors(&h.arch, &headers)?;
            return Ok(Weights::Hf {
                arch: h.arch.clone(),
                bytes: bytes.clone(),
            });
        }
        let ck = Checkpoint::decode(bytes)?;
        if ck.config != self.config || ck.role != self.role {
            return Err(Error::Model(format!(
                "checkpoint is a {} model of shape {:?}, the config wants a {} model of shape {:?}",
                ck.role, ck.config, self.role, self.config
            )));
        }
        Ok(Weights::Small(ck))
    }

    /// The weights of a trained model of this spec.
    pub fn weights_of<B: burn::tensor::backend::Backend>(
        &self,
        model: &AnyLm<B>,
    ) -> Result<Weights> {
        Ok(match (model, &self.hf) {
            (AnyLm::Small(m), _) => {
                Weights::Small(Checkpoint::from_model(self.role, &self.config, m))
            }
            (AnyLm::Hf(m), Some(h)) if m.lora.is_some() => Weights::Lora {
                arch: m.arch.clone(),
                dir: h.dir.clone(),
                spec: m.lora.clone().expect("checked"),
                adapter: hf::lora::to_bytes(m, &h.digest)?.into(),
            },
            (AnyLm::Hf(m), _) => Weights::Hf {
                arch: m.arch.clone(),
                bytes: match self.checkpoint_dtype {
                    CheckpointDtype::F32 => hf::weights::to_safetensors(m)?,
                    CheckpointDtype::Bf16 => {
                        hf::weights::to_bf16(&hf::weights::to_safetensors(m)?)?
                    }
                }
                .into(),
            },
        })
    }
}

/// The initial checkpoint of a spec: the seeded small transformer (the same bytes for the same
/// spec and seed on every machine), the pretrained model's weights as f32 safetensors, or —
/// with adapters — fresh adapters seeded from `seed` (the model they start is the pretrained
/// one: `B = 0`).
pub fn initial_checkpoint(spec: &ModelSpec, seed: u64) -> Result<bytes::Bytes> {
    match &spec.hf {
        Some(h) => {
            let files = hf::weights::weight_files(&h.dir)?;
            let dev = Default::default();
            if let Some(lora) = &spec.lora {
                let model = hf::weights::load::<Cpu>(&h.arch, &files, &dev)?;
                let model = hf::lora::attach_fresh(model, lora, seed, &dev);
                return Ok(bytes::Bytes::from(hf::lora::to_bytes(&model, &h.digest)?));
            }
            // The bytes `to_safetensors` of the loaded model would give, without building it.
            Ok(bytes::Bytes::from(hf::weights::canonical(&h.arch, &files)?))
        }
        None => Ok(Checkpoint::init(spec.role, &spec.config, seed).encode()),
    }
}
