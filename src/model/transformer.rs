//! One small decoder-only transformer family for the policy and the reward model: token and
//! learned position embeddings, pre-norm blocks (RMSNorm → causal multi-head attention → RMSNorm
//! → SiLU MLP), a final RMSNorm and an untied output head. Generic over the burn backend.
//!
//! Every parameter is a 2-D tensor created by [`Transformer::build`] in one fixed order, which
//! is also the order [`Transformer::params`] lists them in: that is the checkpoint format (see
//! [`super::checkpoint`]), independent of burn's record ids (which are random).
//!
//! Attention takes an explicit boolean mask (`true` = masked out) and an optional key/value
//! cache, so a batch of right-padded prompts is encoded once and then continued (admissible
//! actions scored, RM critiques generated) without recomputing the prompt.

use burn::module::{Module, Param};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};

use super::lm::Lm;
pub use super::lm::{KvCache, bool_tensor, float_tensor, int_tensor};

/// Shape of a transformer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    /// Maximum sequence length (learned positions).
    pub context: usize,
}

impl ModelConfig {
    /// Parameter shapes in checkpoint order, with their names.
    pub fn param_shapes(&self) -> Vec<(String, [usize; 2])> {
        let (v, d, c) = (self.vocab, self.d_model, self.context);
        let mut out = vec![
            ("tok_emb".to_string(), [v, d]),
            ("pos_emb".to_string(), [c, d]),
        ];
        for l in 0..self.layers {
            for (n, s) in [
                ("norm1", [1, d]),
                ("wq", [d, d]),
                ("wk", [d, d]),
                ("wv", [d, d]),
                ("wo", [d, d]),
                ("norm2", [1, d]),
                ("w1", [d, 4 * d]),
                ("w2", [4 * d, d]),
            ] {
                out.push((format!("blocks.{l}.{n}"), s));
            }
        }
        out.push(("norm_f".to_string(), [1, d]));
        out.push(("head".to_string(), [d, v]));
        out
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.d_model == 0 || self.heads == 0 || self.d_model % self.heads != 0 {
            return Err(format!(
                "d_model ({}) must be a positive multiple of heads ({})",
                self.d_model, self.heads
            ));
        }
        if self.layers == 0 || self.context < 8 || self.vocab == 0 {
            return Err("layers must be ≥ 1 and context ≥ 8".into());
        }
        Ok(())
    }
}

#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    norm1: Param<Tensor<B, 2>>,
    wq: Param<Tensor<B, 2>>,
    wk: Param<Tensor<B, 2>>,
    wv: Param<Tensor<B, 2>>,
    wo: Param<Tensor<B, 2>>,
    norm2: Param<Tensor<B, 2>>,
    w1: Param<Tensor<B, 2>>,
    w2: Param<Tensor<B, 2>>,
}

#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    tok_emb: Param<Tensor<B, 2>>,
    pos_emb: Param<Tensor<B, 2>>,
    blocks: Vec<Block<B>>,
    norm_f: Param<Tensor<B, 2>>,
    head: Param<Tensor<B, 2>>,
    heads: usize,
}

/// The additive attention bias of a mask (`true` = hidden): 0, or −∞ where hidden. Every query
/// sees at least itself, so no softmax row is all −∞; a hidden score's weight is then exactly 0,
/// as it was with the −1e9 of earlier builds (same results, bit for bit), but `exp(−∞)` is
/// libm's fast path where `exp(−1e9)` took its underflow path (14% of the update's time).
pub fn attention_bias<B: Backend>(mask: Tensor<B, 3, Bool>) -> Tensor<B, 3> {
    Tensor::zeros(mask.dims(), &mask.device()).mask_fill(mask, f32::NEG_INFINITY)
}

fn rms_norm<B: Backend>(x: Tensor<B, 3>, gamma: &Param<Tensor<B, 2>>) -> Tensor<B, 3> {
    let rms = x.clone().powi_scalar(2).mean_dim(2).add_scalar(1e-6).sqrt();
    x.div(rms).mul(gamma.val().unsqueeze_dim(0))
}

fn linear<B: Backend>(x: Tensor<B, 3>, w: &Param<Tensor<B, 2>>) -> Tensor<B, 3> {
    let [b, t, d] = x.dims();
    let w = w.val();
    let out = w.dims()[1];
    x.reshape([b * t, d]).matmul(w).reshape([b, t, out])
}

impl<B: Backend> Transformer<B> {
    /// Build a model, asking `param(name, shape)` for every parameter in checkpoint order.
    pub fn build(
        cfg: &ModelConfig,
        mut param: impl FnMut(&str, [usize; 2]) -> Tensor<B, 2>,
    ) -> Transformer<B> {
        let mut p = |name: &str, shape: [usize; 2]| Param::from_tensor(param(name, shape));
        let (v, d, c) = (cfg.vocab, cfg.d_model, cfg.context);
        let tok_emb = p("tok_emb", [v, d]);
        let pos_emb = p("pos_emb", [c, d]);
        let blocks = (0..cfg.layers)
            .map(|l| Block {
                norm1: p(&format!("blocks.{l}.norm1"), [1, d]),
                wq: p(&format!("blocks.{l}.wq"), [d, d]),
                wk: p(&format!("blocks.{l}.wk"), [d, d]),
                wv: p(&format!("blocks.{l}.wv"), [d, d]),
                wo: p(&format!("blocks.{l}.wo"), [d, d]),
                norm2: p(&format!("blocks.{l}.norm2"), [1, d]),
                w1: p(&format!("blocks.{l}.w1"), [d, 4 * d]),
                w2: p(&format!("blocks.{l}.w2"), [4 * d, d]),
            })
            .collect();
        let norm_f = p("norm_f", [1, d]);
        let head = p("head", [d, v]);
        Transformer {
            tok_emb,
            pos_emb,
            blocks,
            norm_f,
            head,
            heads: cfg.heads,
        }
    }

    /// Every parameter in checkpoint order.
    pub fn params(&self) -> Vec<&Param<Tensor<B, 2>>> {
        let mut out = vec![&self.tok_emb, &self.pos_emb];
        for b in &self.blocks {
            out.extend([&b.norm1, &b.wq, &b.wk, &b.wv, &b.wo, &b.norm2, &b.w1, &b.w2]);
        }
        out.extend([&self.norm_f, &self.head]);
        out
    }

    pub fn context(&self) -> usize {
        self.pos_emb.dims()[0]
    }

    pub fn vocab(&self) -> usize {
        self.tok_emb.dims()[0]
    }

    /// Logits `[batch, len, vocab]` for `tokens` at `positions` (both `[batch, len]`).
    /// `mask` is `[batch, len, cached + len]`, `true` where a query must not see a key. With a
    /// cache, the new keys and values are appended to it.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        linear(self.hidden(tokens, positions, mask, cache), &self.head)
    }

    /// The final normed hidden states `[batch, len, d_model]` ([`Self::forward`] before the
    /// head).
    pub fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let d = self.tok_emb.dims()[1];
        let h = self.heads;
        let hd = d / h;
        let tok = self.tok_emb.val().select(0, tokens.reshape([b * t]));
        let pos = self.pos_emb.val().select(0, positions.reshape([b * t]));
        let mut x = (tok + pos).reshape([b, t, d]);
        // An additive bias (0 or −∞) materialized once per forward for all heads, so every
        // layer adds two contiguous tensors of the same shape. (Broadcasting it, or filling an
        // expanded boolean mask, takes flex's strided path: 13% of all update time, measured.)
        let bias = attention_bias(mask).unsqueeze_dim::<4>(1).repeat_dim(1, h);
        let scale = 1.0 / (hd as f64).sqrt();
        let mut fresh = Vec::with_capacity(self.blocks.len());
        let cached = cache
            .as_ref()
            .filter(|c| !c.layers.is_empty())
            .map(|c| c.layers.clone());
        for (l, blk) in self.blocks.iter().enumerate() {
            let normed = rms_norm(x.clone(), &blk.norm1);
            let heads = |w: &Param<Tensor<B, 2>>| {
                linear(normed.clone(), w)
                    .reshape([b, t, h, hd])
                    .swap_dims(1, 2)
            };
            let (q, mut k, mut v) = (heads(&blk.wq), heads(&blk.wk), heads(&blk.wv));
            if let Some(layers) = &cached {
                let (ck, cv) = &layers[l];
                k = Tensor::cat(vec![ck.clone(), k], 2);
                v = Tensor::cat(vec![cv.clone(), v], 2);
            }
            fresh.push((k.clone(), v.clone()));
            let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale) + bias.clone();
            let att = softmax(scores, 3)
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([b, t, d]);
            x = x + linear(att, &blk.wo);
            let hidden = silu(linear(rms_norm(x.clone(), &blk.norm2), &blk.w1));
            x = x + linear(hidden, &blk.w2);
        }
        if let Some(c) = cache {
            c.layers = fresh;
        }
        rms_norm(x, &self.norm_f)
    }
}

impl<B: Backend> Lm<B> for Transformer<B> {
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        Transformer::hidden(self, tokens, positions, mask, cache)
    }

    fn head(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        hidden.matmul(self.head.val())
    }

    fn vocab(&self) -> usize {
        Transformer::vocab(self)
    }

    fn context(&self) -> usize {
        Transformer::context(self)
    }
}
