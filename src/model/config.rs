//! The models' settings sections: `[policy]`, `[reward_model]`, `[update]` and the backend
//! (`run.device`), with their defaults and their own checks.

use serde::{Deserialize, Serialize};

use crate::error::Checks;

/// `policy.kind`: which policy acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// The learned transformer policy.
    Transformer,
    /// Uniform over the admissible actions, never trained: the floor for ablations.
    Uniform,
}

/// `policy.action_score`: an action's logit from its token log-likelihoods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionScore {
    /// Their sum (DESIGN.md).
    Sum,
    /// Their mean (length normalization: an untrained LM otherwise strongly prefers the
    /// shortest commands).
    Mean,
}

/// `policy.action_mode`: how the policy picks an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionMode {
    /// Score every admissible action as the reply's continuation; sample among them.
    Score,
    /// Generate a reply (optionally reasoning, then `\boxed{index}` of an admissible action),
    /// as the reference does; PPO over the generated tokens. Needs a pretrained model.
    Generate,
}

/// `<section>.inference_dtype`: the precision of a pretrained model's matrix products when it
/// acts or judges (rollout, evaluation, RM scoring); training stays f32 whatever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InferenceDtype {
    /// f32 throughout (burn's kernels).
    #[default]
    F32,
    /// The projections and the output head in bf16 on Intel AMX tiles (inputs and weights
    /// rounded to bf16, sums in f32; attention, norms and activations stay f32), as rollout
    /// engines serve models in bf16. Needs a CPU with AMX-BF16 and `run.device = "cpu"`;
    /// reproducible to the bit on the same machine type.
    Bf16,
    /// `bf16` where it runs — a pretrained model (with adapters, for `update.base_dtype`),
    /// `run.device = "cpu"`, a CPU with AMX-BF16 or AVX512-BF16 — and `f32` elsewhere. Resolved
    /// when the config is loaded ([`crate::config::Config::resolve_auto`]), so a run's committed
    /// config names the precision it ran in, and its replay elsewhere asks for the same.
    Auto,
}

impl InferenceDtype {
    /// `Auto` made concrete: `bf16` when `applies` (a pretrained model on the CPU backend) and
    /// this CPU has a bf16 product kernel, else `f32`; the others unchanged.
    pub fn resolve(self, applies: bool) -> InferenceDtype {
        match self {
            InferenceDtype::Auto if applies && super::amx::available() => InferenceDtype::Bf16,
            InferenceDtype::Auto => InferenceDtype::F32,
            other => other,
        }
    }
}

/// `run.device`: where the models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// burn's flex backend: bit-reproducible.
    Cpu,
    /// burn-cuda (a build with `--features cuda`).
    Cuda,
    /// burn's ndarray backend (a build with `--features ndarray`), for the backend comparison.
    Ndarray,
}

impl Device {
    /// Whether model stages on this device are bit-reproducible (replay re-executes them):
    /// only the default flex CPU backend is checked to be.
    pub fn is_deterministic(self) -> bool {
        self == Device::Cpu
    }

    /// The section's own check (key `run.device`): the backend must be in this build.
    pub fn validate(self, c: &mut Checks) {
        c.check(
            self != Device::Ndarray || cfg!(feature = "ndarray"),
            "run.device",
            "must be \"cpu\" or \"cuda\"",
        );
        c.check(
            self != Device::Cuda || cfg!(feature = "cuda"),
            "run.device",
            "this build has no CUDA backend: rebuild with `cargo build --release --features cuda`",
        );
    }
}

/// `[policy]`: the acting policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// `transformer` (the learned policy) or `uniform` (uniform over admissible actions, never
    /// trained: the floor for ablations).
    pub kind: PolicyKind,
    /// Sampling temperature during training rollouts (evaluation is greedy).
    pub temperature: f64,
    /// Width of the transformer.
    pub d_model: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads (must divide d_model).
    pub heads: usize,
    /// Maximum prompt + action length in tokens (older history is dropped first).
    pub context: usize,
    /// Previous (observation, action) pairs kept in the prompt.
    pub history: usize,
    /// A Hugging Face `tokenizer.json`; empty: the environment's word-level vocabulary.
    pub tokenizer: String,
    /// An action's logit: `sum` of its token log-likelihoods (DESIGN.md) or their `mean` (length
    /// normalization: an untrained LM otherwise strongly prefers the shortest commands).
    pub action_score: ActionScore,
    /// Where the weights start: `""` (rla-pipe's small transformer, seeded from `run.seed`;
    /// shape from `d_model`, `layers`, `heads`) or `"hf:DIR"` (a Hugging Face Llama / Qwen2 /
    /// Qwen3 model directory: its architecture, weights, tokenizer and chat template).
    pub init: String,
    /// `score` (score the admissible actions) or `generate` (write a reply; pretrained models).
    pub action_mode: ActionMode,
    /// `generate`: the most tokens of a reply (a reply without a parsable action within it is
    /// invalid: "Nothing happens.").
    pub max_tokens: usize,
    /// `generate`: nucleus sampling mass (1 = the whole distribution).
    pub top_p: f64,
    /// `generate`: ask for step-by-step reasoning before the `\boxed{index}` answer (the
    /// reference's prompt); `false` asks for the answer alone.
    pub reasoning: bool,
    /// Low-rank adapters (a pretrained model; off by default).
    pub lora: LoraConfig,
    /// `f32` or `bf16`: a pretrained policy's matrix products when it acts (rollout,
    /// evaluation) — `bf16` on Intel AMX, several times faster; the update stays f32.
    pub inference_dtype: InferenceDtype,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::Transformer,
            temperature: 1.0,
            d_model: 32,
            layers: 2,
            heads: 4,
            context: 64,
            history: 0,
            tokenizer: String::new(),
            action_score: ActionScore::Sum,
            init: String::new(),
            action_mode: ActionMode::Score,
            max_tokens: 256,
            top_p: 1.0,
            reasoning: true,
            lora: LoraConfig::default(),
            inference_dtype: InferenceDtype::F32,
        }
    }
}

/// `[reward_model]`: the generative reward model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardModelConfig {
    /// `false`: outcome-only reward (R = O) and no RM training.
    pub enabled: bool,
    /// m: verdict samples per step.
    pub samples: u32,
    /// Sampling temperature of the RM.
    pub temperature: f64,
    /// Most tokens generated per sample (critique words, then the verdict); a sample without a
    /// verdict within the limit scores 0.
    pub max_tokens: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub context: usize,
    /// Previous (observation, action) pairs kept in the prompt.
    pub history: usize,
    /// A Hugging Face `tokenizer.json`; empty: the environment's word-level vocabulary.
    pub tokenizer: String,
    /// Where the weights start: `""` (the small transformer) or `"hf:DIR"` (a pretrained
    /// Hugging Face model directory), as `policy.init`.
    pub init: String,
    /// A pretrained reward model only: text that opens its reply, appended to the prompt after
    /// the chat template's assistant header (not sampled, not trained). `"\\boxed{"` in TOML
    /// makes the verdict come first: a small model that does not reach a verdict within
    /// `max_tokens` then gives one on nearly every sample; a prefix that opens a brace ends the
    /// reply where the model closes it. Empty (default): the reply is the model's own, as in
    /// the reference implementation.
    pub reply_prefix: String,
    /// Low-rank adapters (a pretrained model; off by default), as `policy.lora`.
    pub lora: LoraConfig,
    /// `f32` or `bf16`: a pretrained reward model's matrix products when it judges (RM
    /// scoring), as `policy.inference_dtype`.
    pub inference_dtype: InferenceDtype,
}

impl Default for RewardModelConfig {
    fn default() -> Self {
        RewardModelConfig {
            enabled: true,
            samples: 3,
            temperature: 0.8,
            max_tokens: 4,
            d_model: 32,
            layers: 2,
            heads: 4,
            context: 96,
            history: 0,
            tokenizer: String::new(),
            init: String::new(),
            reply_prefix: String::new(),
            lora: LoraConfig::default(),
            inference_dtype: InferenceDtype::F32,
        }
    }
}

/// `policy.lora` / `reward_model.lora`: low-rank adapters on a pretrained model (off while
/// `rank` is 0). Only the adapters train; the base weights stay frozen (no gradients, no
/// optimizer state) and the store's checkpoints are the adapters alone (PEFT's key names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// r, the adapters' rank (0 = off: full fine-tuning).
    pub rank: usize,
    /// α: an adapter's output is scaled by α / r (PEFT's `lora_alpha`).
    pub alpha: f64,
    /// Must be 0: rla-pipe trains adapters without dropout (a replay re-executes every step).
    pub dropout: f64,
    /// The projections that get an adapter, by their Hugging Face names.
    pub targets: Vec<String>,
    /// Adapters on the last this-many decoder layers only (0 = every layer; PEFT's
    /// `layers_to_transform`). The layers below stay frozen and outside the autodiff graph:
    /// the update and the warm start differentiate through the top layers alone.
    pub layers: usize,
}

/// The projections [`LoraConfig::targets`] may name.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 0,
            alpha: 16.0,
            dropout: 0.0,
            targets: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
            layers: 0,
        }
    }
}

impl LoraConfig {
    /// Whether adapters are on.
    pub fn enabled(&self) -> bool {
        self.rank > 0
    }

    /// The section's own checks (keys `<section>.lora.*`); `pretrained`: the role starts from
    /// a pretrained model.
    pub fn validate(&self, section: &str, pretrained: bool, c: &mut Checks) {
        if !self.enabled() {
            return;
        }
        c.check(
            pretrained,
            &format!("{section}.lora.rank"),
            format!("adapters need a pretrained model ({section}.init = \"hf:DIR\")"),
        );
        c.check(
            self.rank <= 1024,
            &format!("{section}.lora.rank"),
            "must be 0 (off) or 1..=1024",
        );
        c.check(
            self.alpha > 0.0 && self.alpha.is_finite(),
            &format!("{section}.lora.alpha"),
            "must be positive",
        );
        c.check(
            self.dropout == 0.0,
            &format!("{section}.lora.dropout"),
            "must be 0: adapters train without dropout, so that a replay re-executes every step",
        );
        let unknown: Vec<&String> = self
            .targets
            .iter()
            .filter(|t| !LORA_TARGETS.contains(&t.as_str()))
            .collect();
        c.check(
            unknown.is_empty() && !self.targets.is_empty(),
            &format!("{section}.lora.targets"),
            format!(
                "{unknown:?}: each must be one of {LORA_TARGETS:?}, and at least one is needed"
            ),
        );
    }
}

/// A model's starting point (`policy.init`, `reward_model.init`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Init {
    /// rla-pipe's small transformer, seeded.
    Small,
    /// A Hugging Face model directory.
    Hf(std::path::PathBuf),
}

impl Init {
    /// Parse `init` (key `<section>.init`); `tokenizer` must then be empty (a pretrained model
    /// brings its own).
    /// Errors are `(key, message)`.
    pub fn parse(
        section: &str,
        init: &str,
        tokenizer: &str,
    ) -> std::result::Result<Init, (String, String)> {
        if init.is_empty() {
            return Ok(Init::Small);
        }
        let key = format!("{section}.init");
        let Some(dir) = init.strip_prefix("hf:") else {
            return Err((
                key,
                format!("{init:?} is not \"\" (the small transformer) or \"hf:DIR\""),
            ));
        };
        if dir.is_empty() {
            return Err((key, "\"hf:\" needs a model directory".into()));
        }
        if !tokenizer.is_empty() {
            return Err((
                format!("{section}.tokenizer"),
                format!(
                    "a pretrained model ({key} = {init:?}) brings its own tokenizer; leave it empty"
                ),
            ));
        }
        Ok(Init::Hf(dir.into()))
    }
}

/// `<section>.inference_dtype`: bf16 is for pretrained models.
fn validate_dtype(section: &str, dtype: InferenceDtype, pretrained: bool, c: &mut Checks) {
    c.check(
        dtype == InferenceDtype::F32 || pretrained,
        &format!("{section}.inference_dtype"),
        format!(
            "\"bf16\" is for pretrained models ({section}.init = \"hf:DIR\"); the small transformer runs in f32"
        ),
    );
}

/// The shape checks both models share (keys `<section>.*`).
fn validate_shape(
    section: &str,
    (d, l, h, ctx, t): (usize, usize, usize, usize, f64),
    c: &mut Checks,
) {
    c.check(
        d > 0 && h > 0 && d % h == 0 && d <= 4096,
        &format!("{section}.d_model"),
        "must be a positive multiple of heads (at most 4096)",
    );
    c.check(
        (1..=64).contains(&l),
        &format!("{section}.layers"),
        "must be 1..=64",
    );
    c.check(
        (16..=8192).contains(&ctx),
        &format!("{section}.context"),
        "must be 16..=8192",
    );
    c.check(
        t > 0.0 && t <= 100.0,
        &format!("{section}.temperature"),
        "must be in (0, 100]",
    );
}

impl PolicyConfig {
    /// Whether the policy is a pretrained Hugging Face model (`init = "hf:DIR"`).
    pub fn pretrained(&self) -> bool {
        self.init.starts_with("hf:")
    }

    /// The section's own checks (keys `policy.*`).
    pub fn validate(&self, c: &mut Checks) {
        if let Err((key, msg)) = Init::parse("policy", &self.init, &self.tokenizer) {
            c.check(false, &key, msg);
        }
        c.check(
            self.action_mode == ActionMode::Score || self.pretrained(),
            "policy.action_mode",
            "\"generate\" needs a pretrained model (policy.init = \"hf:DIR\"): the small transformer only scores actions",
        );
        c.check(
            (1..=8192).contains(&self.max_tokens),
            "policy.max_tokens",
            "must be 1..=8192",
        );
        c.check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "policy.top_p",
            "must be in (0, 1]",
        );
        self.lora.validate("policy", self.pretrained(), c);
        validate_dtype("policy", self.inference_dtype, self.pretrained(), c);
        validate_shape(
            "policy",
            (
                self.d_model,
                self.layers,
                self.heads,
                self.context,
                self.temperature,
            ),
            c,
        );
    }
}

impl RewardModelConfig {
    /// Whether the reward model is a pretrained Hugging Face model (`init = "hf:DIR"`).
    pub fn pretrained(&self) -> bool {
        self.init.starts_with("hf:")
    }

    /// The section's own checks (keys `reward_model.*`).
    pub fn validate(&self, c: &mut Checks) {
        if let Err((key, msg)) = Init::parse("reward_model", &self.init, &self.tokenizer) {
            c.check(false, &key, msg);
        }
        validate_shape(
            "reward_model",
            (
                self.d_model,
                self.layers,
                self.heads,
                self.context,
                self.temperature,
            ),
            c,
        );
        c.check(
            self.samples >= 1,
            "reward_model.samples",
            "must be at least 1",
        );
        // rla-pipe's small model writes a few critique words; a pretrained one may reason (and
        // writes whole unit tests in the coding setting).
        let most = if self.pretrained() { 8192 } else { 64 };
        c.check(
            (1..=most).contains(&self.max_tokens),
            "reward_model.max_tokens",
            format!("must be 1..={most}"),
        );
        c.check(
            self.max_tokens < self.context / 2,
            "reward_model.max_tokens",
            "must be less than half of reward_model.context",
        );
        c.check(
            self.reply_prefix.is_empty() || self.pretrained(),
            "reward_model.reply_prefix",
            "needs a pretrained reward model (reward_model.init = \"hf:DIR\")",
        );
        self.lora.validate("reward_model", self.pretrained(), c);
        validate_dtype("reward_model", self.inference_dtype, self.pretrained(), c);
    }
}

/// How the optimizer steps cover the samples (`update.schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// `steps` steps, each on a minibatch of `minibatch` samples of a seeded shuffle, cycled.
    Fixed,
    /// Exactly one pass over a seeded shuffle of the samples, split into `steps` equal parts;
    /// each part is one optimizer step whose gradient is accumulated over micro-batches of
    /// `minibatch` samples (the reference: 4 accumulated steps, one epoch).
    OnePass,
}

/// `[update]`: the PPO optimizer (both models; ε and β are in `[reward]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpdateConfig {
    /// `fixed`: `*_steps` optimizer steps, each on a minibatch of a seeded shuffle of the
    /// included samples (cycled); `one_pass` (the reference): exactly one pass over the included
    /// samples as `*_steps` accumulated optimizer steps.
    pub schedule: Schedule,
    /// Policy optimizer steps per iteration.
    pub policy_steps: u32,
    /// Reward-model optimizer steps per iteration.
    pub rm_steps: u32,
    /// Samples per minibatch (`fixed`) or per accumulated micro-batch (`one_pass`).
    pub minibatch: u32,
    /// AdamW learning rate of the policy.
    pub policy_lr: f64,
    /// AdamW learning rate of the reward model.
    pub rm_lr: f64,
    pub weight_decay: f64,
    /// AdamW's ε (the reference: 1e-8).
    pub adam_eps: f64,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// The log-ratio is clamped to ±this before exponentiating.
    pub log_ratio_clamp: f64,
    /// The temperature of the log-probabilities PPO trains on: `one` (plain T = 1 logits, as
    /// the reference; the sampling temperature is for sampling only) or `sampling` (the
    /// temperature the rollouts / RM samples were drawn at).
    pub logprob_temperature: LogprobTemperature,
    /// Most tokens per backward pass (prompts + continuations of the samples in it): larger
    /// minibatches are split into micro-batches whose gradients are accumulated (the same
    /// gradient up to float summation order; the warm start too). Bounds the autodiff graph's
    /// memory. 0: no limit (each minibatch in one pass).
    pub micro_batch_tokens: usize,
    /// `micro_batch_tokens` when `run.device = "cuda"` (the warm start's too): a GPU has the
    /// memory for larger backward passes, and each pass launches the same kernels whatever its
    /// size. The SmolLM2 household update on an H200: 56 model calls with 512 tokens, 9 with
    /// 0 — optimizer steps 2.9× (policy) and 3.6× (RM) faster, peak device memory 14.3 → 28.0
    /// GB (docs/src/real-models.md, "The GPU path"). 0: no limit; set a bound on a smaller GPU.
    pub cuda_micro_batch_tokens: usize,
    /// `f32` or `bf16`: a pretrained model's frozen base in training when it has adapters
    /// (`lora.rank > 0`; the update, the warm start and their snapshot passes): `bf16` packs the
    /// base's projections and head once as bf16 tiles for Intel AMX, both for the forward and
    /// for the input gradients (a frozen matrix has no gradient of its own); the adapters,
    /// attention, norms and optimizer stay f32 — mixed precision, as GPU training does. Needs a
    /// CPU with AMX-BF16 and `run.device = "cpu"`; reproducible to the bit on one machine type.
    pub base_dtype: InferenceDtype,
    /// Micro-batches differentiated at once, one per thread (each on its own copy of the
    /// parameters' autodiff leaves; gradients summed in micro-batch order, so the update is the
    /// same to the last bit for any value). More keeps more cores busy through the backward
    /// pass's single-threaded work and holds that many autodiff graphs in memory. On `cuda`
    /// the micro-batches run one after another whatever this says (one device queue).
    pub threads: usize,
    /// How a fully fine-tuned pretrained model's checkpoints are stored: `f32` (exact) or
    /// `bf16` (half the bytes; the next iteration and a replay start from the rounded weights,
    /// so a run stays replayable, but updates smaller than bf16's resolution, ~0.4% of a
    /// weight, are lost at every checkpoint). Adapters (`*.lora`) are always f32.
    pub checkpoint_dtype: CheckpointDtype,
    /// Early stop of each model's update: it ends before an optimizer step whose minibatch's
    /// KL to the pre-update snapshot exceeds 1.5 × this (Stable-Baselines3's `target_kl`
    /// rule; the KL is the k3 estimate `update_metrics.kl` reports, measured by the step's own
    /// forward before it moves anything). Bounds how far a few samples reused by several
    /// `fixed` steps can move the policy in one iteration. 0: off (every planned step). Not
    /// written when 0, so runs made before the key existed keep their config hash.
    #[serde(skip_serializing_if = "is_zero")]
    pub target_kl: f64,
    /// Whether a pretrained model's training attention recomputes its probabilities in the
    /// backward pass instead of keeping `[rows, heads, queries, keys]` tensors per layer for it
    /// (`model::hf::recompute`): less memory, one more `q kᵀ` product per layer backward, and
    /// gradients equal up to the order of sums (f32 attention; with `base_dtype = "bf16"` the
    /// CPU's fused masked softmax keeps its own). `auto`: on `run.device = "cuda"` (where those
    /// tensors are most of the update's memory), not on the CPU (whose balanced checkpointing
    /// keeps only the scores, and where the product costs time). Not written when `auto`, so
    /// runs made before the key existed keep their config hash.
    #[serde(skip_serializing_if = "Switch::is_auto")]
    pub recompute_attention: Switch,
    /// Whether a pretrained model's training calls keep only each layer's input and recompute
    /// the layer in its backward pass (`model::hf::checkpointed`), instead of keeping every
    /// layer's activations until the backward pass: memory for the layers' activations falls
    /// to one `[tokens, hidden]` tensor per layer, for one more forward pass of the layers;
    /// gradients equal up to the order of sums. `auto`: on `run.device = "cuda"` (where one
    /// backward pass per minibatch holds tens of thousands of tokens' activations), not on the
    /// CPU (whose 512-token passes and balanced checkpointing keep them small, and whose
    /// committed updates keep their bits). Not written when `auto`, so runs made before the key
    /// existed keep their config hash.
    #[serde(skip_serializing_if = "Switch::is_auto")]
    pub checkpoint_layers: Switch,
}

/// `auto`, `on` or `off` (`update.recompute_attention`, `update.checkpoint_layers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    #[default]
    Auto,
    On,
    Off,
}

impl Switch {
    fn is_auto(&self) -> bool {
        *self == Switch::Auto
    }

    /// On or off, `auto` being `default`.
    pub fn or(self, default: bool) -> bool {
        match self {
            Switch::Auto => default,
            Switch::On => true,
            Switch::Off => false,
        }
    }
}

/// `update.target_kl` at its default (off).
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// `update.checkpoint_dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointDtype {
    F32,
    Bf16,
}

/// `update.logprob_temperature`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogprobTemperature {
    One,
    Sampling,
}

impl LogprobTemperature {
    /// The temperature training uses for a model sampled at `sampling`.
    pub fn resolve(self, sampling: f64) -> f64 {
        match self {
            LogprobTemperature::One => 1.0,
            LogprobTemperature::Sampling => sampling,
        }
    }
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            schedule: Schedule::Fixed,
            policy_steps: 48,
            rm_steps: 48,
            minibatch: 256,
            policy_lr: 3e-3,
            rm_lr: 3e-3,
            weight_decay: 0.0,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            log_ratio_clamp: 10.0,
            logprob_temperature: LogprobTemperature::One,
            micro_batch_tokens: 0,
            cuda_micro_batch_tokens: 0,
            base_dtype: InferenceDtype::F32,
            threads: 1,
            checkpoint_dtype: CheckpointDtype::F32,
            target_kl: 0.0,
            recompute_attention: Switch::Auto,
            checkpoint_layers: Switch::Auto,
        }
    }
}

impl UpdateConfig {
    /// The most tokens per backward pass on `device` (`micro_batch_tokens`, or
    /// `cuda_micro_batch_tokens` on a GPU); 0: no limit.
    pub fn micro_tokens(&self, device: Device) -> usize {
        match device {
            Device::Cuda => self.cuda_micro_batch_tokens,
            _ => self.micro_batch_tokens,
        }
    }

    /// Whether training attention recomputes its probabilities on `device`
    /// (`recompute_attention`; `auto`: on `cuda` only).
    pub fn recomputes_attention(&self, device: Device) -> bool {
        self.recompute_attention.or(device == Device::Cuda)
    }

    /// Whether training calls checkpoint their layers on `device` (`checkpoint_layers`;
    /// `auto`: on `cuda` only).
    pub fn checkpoints_layers(&self, device: Device) -> bool {
        self.checkpoint_layers.or(device == Device::Cuda)
    }

    /// The section's own checks (keys `update.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            self.minibatch >= 1,
            "update.minibatch",
            "must be at least 1",
        );
        c.check(
            (1..=64).contains(&self.threads),
            "update.threads",
            "must be between 1 and 64",
        );
        c.check(
            self.policy_lr >= 0.0 && self.policy_lr < 1.0,
            "update.policy_lr",
            "must be in [0, 1)",
        );
        c.check(
            self.rm_lr >= 0.0 && self.rm_lr < 1.0,
            "update.rm_lr",
            "must be in [0, 1)",
        );
        c.check(self.grad_clip > 0.0, "update.grad_clip", "must be positive");
        c.check(
            self.adam_eps > 0.0 && self.adam_eps < 1.0,
            "update.adam_eps",
            "must be in (0, 1)",
        );
        c.check(
            self.log_ratio_clamp > 0.0,
            "update.log_ratio_clamp",
            "must be positive",
        );
        c.check(
            (0.0..1.0).contains(&self.weight_decay),
            "update.weight_decay",
            "must be in [0, 1)",
        );
        c.check(
            self.target_kl >= 0.0 && self.target_kl.is_finite(),
            "update.target_kl",
            "must be a non-negative number (0: off)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_takes_its_own_micro_batch_budget() {
        let u = UpdateConfig {
            micro_batch_tokens: 512,
            cuda_micro_batch_tokens: 4096,
            ..UpdateConfig::default()
        };
        assert_eq!(u.micro_tokens(Device::Cpu), 512);
        assert_eq!(u.micro_tokens(Device::Ndarray), 512);
        assert_eq!(u.micro_tokens(Device::Cuda), 4096);
        assert_eq!(UpdateConfig::default().cuda_micro_batch_tokens, 0);
    }

    fn errors(p: &PolicyConfig) -> String {
        let mut c = Checks::default();
        p.validate(&mut c);
        c.finish().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn init_and_action_mode_are_checked_by_key() {
        assert_eq!(Init::parse("policy", "", ""), Ok(Init::Small));
        assert_eq!(
            Init::parse("policy", "hf:models/x", ""),
            Ok(Init::Hf("models/x".into()))
        );
        let (key, msg) = Init::parse("reward_model", "models/x", "").unwrap_err();
        assert_eq!(key, "reward_model.init");
        assert!(msg.contains("hf:DIR"), "{msg}");
        let (key, _) = Init::parse("policy", "hf:", "").unwrap_err();
        assert_eq!(key, "policy.init");
        let (key, _) = Init::parse("policy", "hf:m", "tok.json").unwrap_err();
        assert_eq!(key, "policy.tokenizer");

        let generate = PolicyConfig {
            action_mode: ActionMode::Generate,
            ..PolicyConfig::default()
        };
        assert!(errors(&generate).contains("key `policy.action_mode`"));
        let ok = PolicyConfig {
            init: "hf:models/x".into(),
            ..generate.clone()
        };
        assert_eq!(errors(&ok), "");
        let bad = PolicyConfig {
            top_p: 0.0,
            max_tokens: 0,
            ..ok
        };
        let e = errors(&bad);
        assert!(
            e.contains("policy.top_p") && e.contains("policy.max_tokens"),
            "{e}"
        );
    }

    #[test]
    fn lora_settings_are_checked_by_key() {
        let on = LoraConfig {
            rank: 8,
            ..LoraConfig::default()
        };
        let small = PolicyConfig {
            lora: on.clone(),
            ..PolicyConfig::default()
        };
        let e = errors(&small);
        assert!(
            e.contains("key `policy.lora.rank`") && e.contains("pretrained"),
            "{e}"
        );
        let ok = PolicyConfig {
            init: "hf:models/x".into(),
            ..small
        };
        assert_eq!(errors(&ok), "");
        let bad = PolicyConfig {
            lora: LoraConfig {
                dropout: 0.1,
                targets: vec!["q_proj".into(), "qkv".into()],
                alpha: 0.0,
                ..on
            },
            ..ok
        };
        let e = errors(&bad);
        for key in [
            "policy.lora.dropout",
            "policy.lora.targets",
            "policy.lora.alpha",
        ] {
            assert!(e.contains(&format!("key `{key}`")), "{key}: {e}");
        }
        assert!(e.contains("\"qkv\""), "{e}");
        // Off by default, and off is never an error.
        assert!(!LoraConfig::default().enabled());
        let mut c = Checks::default();
        RewardModelConfig::default().validate(&mut c);
        assert!(c.finish().is_ok());
    }
}
