//! The low-rank adapters a decoder layer carries: their parameters ([`Lora`], [`LayerLora`]) and
//! shape ([`LoraSpec`]). What the decoder ([`super::arch`]) needs of LoRA; attaching, merging
//! and PEFT's adapter files build on both in [`super::lora`].

use crate::model::config::{LORA_TARGETS, LoraConfig};
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// One adapter: `A [in, r]`, `B [r, out]` (PEFT's `lora_A.weight` / `lora_B.weight`
/// transposed, as burn stores linear weights `[in, out]`).
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    pub a: Param<Tensor<B, 2>>,
    pub b: Param<Tensor<B, 2>>,
}

/// The adapters of one decoder layer, by projection (absent: not a target).
#[derive(Module, Debug)]
pub struct LayerLora<B: Backend> {
    pub q_proj: Option<Lora<B>>,
    pub k_proj: Option<Lora<B>>,
    pub v_proj: Option<Lora<B>>,
    pub o_proj: Option<Lora<B>>,
    pub gate_proj: Option<Lora<B>>,
    pub up_proj: Option<Lora<B>>,
    pub down_proj: Option<Lora<B>>,
}

impl<B: Backend> LayerLora<B> {
    pub(super) fn slot(&mut self, target: &str) -> &mut Option<Lora<B>> {
        match target {
            "q_proj" => &mut self.q_proj,
            "k_proj" => &mut self.k_proj,
            "v_proj" => &mut self.v_proj,
            "o_proj" => &mut self.o_proj,
            "gate_proj" => &mut self.gate_proj,
            "up_proj" => &mut self.up_proj,
            "down_proj" => &mut self.down_proj,
            other => unreachable!("not a LoRA target: {other}"),
        }
    }

    pub(super) fn get(&self, target: &str) -> Option<&Lora<B>> {
        match target {
            "q_proj" => self.q_proj.as_ref(),
            "k_proj" => self.k_proj.as_ref(),
            "v_proj" => self.v_proj.as_ref(),
            "o_proj" => self.o_proj.as_ref(),
            "gate_proj" => self.gate_proj.as_ref(),
            "up_proj" => self.up_proj.as_ref(),
            "down_proj" => self.down_proj.as_ref(),
            _ => None,
        }
    }
}

/// What shapes a model's adapters (recorded on the model; not a parameter).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    /// In [`LORA_TARGETS`] order.
    pub targets: Vec<String>,
    /// Adapters on the last this-many decoder layers (0 = every layer).
    pub layers: usize,
}

impl LoraSpec {
    /// The spec of a `lora` section (`None` when off).
    pub fn of(c: &LoraConfig) -> Option<LoraSpec> {
        c.enabled().then(|| LoraSpec {
            rank: c.rank,
            alpha: c.alpha,
            targets: LORA_TARGETS
                .iter()
                .filter(|t| c.targets.iter().any(|x| x == *t))
                .map(|t| t.to_string())
                .collect(),
            layers: c.layers,
        })
    }

    /// Whether decoder layer `l` of a model with `total` layers carries adapters.
    pub fn covers(&self, l: usize, total: usize) -> bool {
        self.layers == 0 || l + self.layers >= total
    }

    /// α / r.
    pub fn scale(&self) -> f32 {
        (self.alpha / self.rank as f64) as f32
    }
}
