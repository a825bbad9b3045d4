//! The Llama / Qwen2 / Qwen3 decoder in burn, generic over the backend.
//!
//! Module and field names are the Hugging Face tensor names (`model.layers.3.self_attn.q_proj`,
//! …), so burn-store maps a checkpoint onto the model by path; only the RMSNorm scale is
//! renamed (`weight` in the checkpoint, burn's `gamma`) and linear weights transposed (`[out,
//! in]` there, `[in, out]` in burn), see [`super::weights`].
//!
//! Layout choices checked against the checkpoints' own (the parity test compares logits with an
//! independent numpy forward, `tests/hf/reference.py`):
//! - RoPE in the rotate-half layout (the first and second halves of a head are the pair, not
//!   interleaved neighbours as burn-nn's `RotaryEncoding`), angles `position × inv_freq`
//!   computed on the host in f64;
//! - grouped-query attention without repeating keys: the `g = heads / kv_heads` query heads of
//!   a key/value head are folded into its rows (`[b, kv, g·t, d]`), so the cache holds only the
//!   `kv_heads` (query head `h` reads key/value head `h / g`, as Hugging Face's `repeat_kv`);
//! - Qwen3's q/k RMSNorm per head before RoPE; Qwen2's q/k/v biases; tied embeddings.
//! - optionally ([`CausalLm::pack_bf16`]) the projections and the head as bf16 on AMX tiles.

use super::adapter::{LayerLora, LoraSpec};
use super::config::HfArch;
use super::frozen::{Frozen, frozen_matmul};
use crate::model::amx::{self, matmul_packed, values};
use crate::model::config::LORA_TARGETS;
pub use crate::model::lm::KvCache;
use crate::model::lm::{bool_tensor, float_tensor, int_tensor, padded_inputs};
use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
}

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
    /// Low-rank adapters on this layer's projections ([`super::lora`]).
    pub lora: Option<LayerLora<B>>,
}

#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
}

/// A causal language model: `model` (the decoder) and `lm_head` (absent when tied to the
/// embeddings).
#[derive(Module, Debug)]
pub struct CausalLm<B: Backend> {
    pub model: Decoder<B>,
    pub lm_head: Option<Linear<B>>,
    #[module(skip)]
    pub arch: HfArch,
    /// The adapters' shape when the layers carry them ([`super::lora`]).
    #[module(skip)]
    pub lora: Option<LoraSpec>,
    /// bf16 copies of the projections and the head for AMX ([`CausalLm::pack_bf16`]):
    /// inference with `<section>.inference_dtype = "bf16"`.
    #[module(skip)]
    pub packed: Option<std::sync::Arc<PackedWeights>>,
    /// The frozen base's projections and head in bf16 for training with adapters
    /// ([`CausalLm::freeze_bf16`]): `update.base_dtype = "bf16"`.
    #[module(skip)]
    pub frozen: Option<std::sync::Arc<FrozenWeights>>,
    /// Training attention that recomputes its probabilities in the backward pass instead of
    /// keeping them ([`super::recompute`]): `update.recompute_attention`.
    #[module(skip)]
    pub recompute_attention: bool,
}

/// The most bytes of attention scores one call of CPU inference with burn's attention (a
/// decoding step; a prompt runs the fused attention, [`super::attention`], which keeps no
/// scores) computes at once: its batch is split into chunks under it ([`CausalLm::hidden`]).
/// Below glibc's 32 MiB mmap threshold.
static ATTENTION_CHUNK_BYTES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(16 << 20);

/// Set the bound of [`ATTENTION_CHUNK_BYTES`] (tests: chunked and whole attention give the
/// same values; `usize::MAX`: one call per layer).
#[doc(hidden)]
pub fn set_attention_chunk_bytes(bytes: usize) {
    ATTENTION_CHUNK_BYTES.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// What every layer of one model call shares ([`CausalLm::call`]): its shapes, RoPE's tables
/// (and, where [`rotary`] needs them, the tables repeated over the heads), the attention's mask
/// as an additive bias or as bytes, how the attention runs, and the adapters' scale.
pub(super) struct Call<B: Backend> {
    b: usize,
    t: usize,
    /// Keys each query row may see: the cache's and this call's (on the device layout, the
    /// buffers' room).
    keys: usize,
    tables: (Tensor<B, 4>, Tensor<B, 4>),
    rope_q: std::cell::OnceCell<(Tensor<B, 4>, Tensor<B, 4>)>,
    rope_k: std::cell::OnceCell<(Tensor<B, 4>, Tensor<B, 4>)>,
    bias: Option<Tensor<B, 4>>,
    hidden_keys: Option<TensorData>,
    /// The CPU's fused inference attention ([`super::attention`]).
    fused: bool,
    /// Batch rows per attention call (CPU inference), when split.
    chunk: Option<usize>,
    slot: Option<(usize, usize)>,
    scale: f64,
    lora_scale: f32,
}

/// A model's frozen projections (per layer, in [`crate::model::config::LORA_TARGETS`] order)
/// and output head, packed for training ([`super::frozen`]).
#[derive(Debug)]
pub struct FrozenWeights {
    layers: Vec<Vec<std::sync::Arc<Frozen>>>,
    head: std::sync::Arc<Frozen>,
}

/// A model's projections (per layer, in [`crate::model::config::LORA_TARGETS`] order) and
/// output head as bf16 tiles ([`crate::model::amx`]).
#[derive(Debug)]
pub struct PackedWeights {
    layers: Vec<Vec<amx::Packed>>,
    head: amx::Packed,
}

/// `x [b, t, in] · W` on the tiles, plus the bias.
fn apply_packed<B: Backend>(
    x: Tensor<B, 3>,
    w: &amx::Packed,
    bias: Option<&Param<Tensor<B, 1>>>,
) -> Tensor<B, 3> {
    let [b, t, _] = x.dims();
    let y = matmul_packed(x.reshape([b * t, w.dims()[0]]), w);
    let y = match bias {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    };
    let out = w.dims()[1];
    y.reshape([b, t, out])
}

/// The gated MLP on the tiles, `down(silu(gate(x)) · up(x))`, its activation in `rla-amx`
/// (a vectorised `exp`, no tensors in between); `packed` holds gate, up and down.
fn mlp_packed<B: Backend>(x: Tensor<B, 3>, mlp: &Mlp<B>, packed: &[amx::Packed]) -> Tensor<B, 3> {
    let device = x.device();
    let [b, t, d] = x.dims();
    let m = b * t;
    // Gate and up multiply the same rows: rounded to bf16 once.
    let xs = amx::with_f32(x.reshape([m, d]), |xs| amx::Rounded::new(xs, m, d));
    let bias = |l: &Linear<B>, y: &mut Vec<f32>| {
        if let Some(bias) = &l.bias {
            amx::with_f32(bias.val(), |b| amx::add_bias(y, b));
        }
    };
    let mut gate = packed[0].matmul_rounded(&xs);
    bias(&mlp.gate_proj, &mut gate);
    let mut up = packed[1].matmul_rounded(&xs);
    bias(&mlp.up_proj, &mut up);
    amx::silu_mul(&mut gate, &up);
    let mut y = packed[2].matmul(&gate, m);
    bias(&mlp.down_proj, &mut y);
    Tensor::from_data(TensorData::new(y, [b, t, d]), &device)
}

/// A projection's weight `[k, n]` as f32 values, leaving a 1 × 1 zero tensor in its place (a
/// packed forward reads only the bias, so the model keeps one copy of the weights, not two).
fn take_weight<B: Backend>(l: &mut Linear<B>) -> (Vec<f32>, usize, usize) {
    let [k, n] = l.weight.dims();
    let w = l.weight.val();
    let device = w.device();
    let values = amx::f32s(values(w).as_bytes()).into_owned();
    l.weight = Param::from_tensor(Tensor::zeros([1, 1], &device));
    (values, k, n)
}

fn zeros<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::zeros(shape, device))
}

fn linear<B: Backend>(d_in: usize, d_out: usize, bias: bool, device: &B::Device) -> Linear<B> {
    Linear {
        weight: zeros([d_in, d_out], device),
        bias: bias.then(|| zeros([d_out], device)),
    }
}

fn rms_norm<B: Backend>(d: usize, eps: f64, device: &B::Device) -> RmsNorm<B> {
    RmsNorm {
        gamma: Param::from_tensor(Tensor::ones([d], device)),
        epsilon: eps,
    }
}

/// `x [b, t, in] · W [in, out] (+ bias)` as one 2-D matmul (flex's fast path).
fn apply<B: Backend>(x: Tensor<B, 3>, l: &Linear<B>) -> Tensor<B, 3> {
    let [b, t, d] = x.dims();
    let w = l.weight.val();
    let out = w.dims()[1];
    let y = x.reshape([b * t, d]).matmul(w);
    let y = match &l.bias {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    };
    y.reshape([b, t, out])
}

/// The adapter `(x·A)·B·scale` of a layer's target, if it has one.
pub fn delta<B: Backend>(
    layer: &DecoderLayer<B>,
    target: &str,
    x: Tensor<B, 2>,
    scale: f32,
) -> Option<Tensor<B, 2>> {
    let l = layer.lora.as_ref()?.get(target)?;
    Some(x.matmul(l.a.val()).matmul(l.b.val()).mul_scalar(scale))
}

/// [`apply`] plus the layer's adapter on `target`, if any.
fn proj<B: Backend>(
    x: Tensor<B, 3>,
    l: &Linear<B>,
    layer: &DecoderLayer<B>,
    target: &str,
    scale: f32,
) -> Tensor<B, 3> {
    if layer.lora.is_none() {
        return apply(x, l);
    }
    let [b, t, d] = x.dims();
    let y = apply(x.clone(), l);
    match delta(layer, target, x.reshape([b * t, d]), scale) {
        Some(dy) => {
            let out = y.dims()[2];
            y + dy.reshape([b, t, out])
        }
        None => y,
    }
}

/// [`proj`] with the base product frozen in bf16 ([`super::frozen`]).
fn proj_frozen<B: Backend>(
    x: Tensor<B, 3>,
    l: &Linear<B>,
    w: &std::sync::Arc<Frozen>,
    layer: &DecoderLayer<B>,
    target: &str,
    scale: f32,
) -> Tensor<B, 3> {
    let [b, t, d] = x.dims();
    let x = x.reshape([b * t, d]);
    let mut y = frozen_matmul(x.clone(), w);
    if let Some(bias) = &l.bias {
        y = y + bias.val().unsqueeze_dim(0);
    }
    if let Some(dy) = delta(layer, target, x, scale) {
        y = y + dy;
    }
    let out = w.dims()[1];
    y.reshape([b, t, out])
}

/// Hugging Face's `rotate_half` RoPE on `[b, t, n, d]`: `x · cos + rotate_half(x) · sin`, with
/// `rotate_half(x) = [−x₂, x₁]`. `cos` and `sin` have `x`'s shape (no broadcasting: burn-flex
/// multiplies broadcast operands element by element through a strided index, a twentieth of a
/// forward pass), and `sin`'s first half is negated already ([`CausalLm::rope_tables`]):
/// `x₂ · (−s)` is `(−x₂) · s` to the bit, without a pass negating a strided half.
fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let x1 = x.clone().narrow(3, 0, d / 2);
    let x2 = x.clone().narrow(3, d / 2, d / 2);
    let rotated = Tensor::cat(vec![x2, x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

/// RMSNorm over the last dimension: one kernel on the GPU ([`super::fused`]), burn's
/// operations elsewhere.
fn norm<B: Backend, const D: usize>(n: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    super::fused::rms_norm(x, &n.gamma, n.epsilon).unwrap_or_else(|x| n.forward(x))
}

/// [`rope`] as one kernel on the GPU ([`super::fused`]), or in one pass on the CPU backend
/// (`rla_amx::rope`, from the tables `[b, t, 1, hd]`: the same products and sum, so the same
/// bits), instead of a concatenation and three element-wise operations; the CPU's training
/// backend (and the GPU with `RLA_PIPE_CUDA_KERNELS=off`) keeps [`rope`], with the tables
/// repeated over the heads (`repeated`: computed only there).
fn rotary<B: Backend>(
    x: Tensor<B, 4>,
    tables: &(Tensor<B, 4>, Tensor<B, 4>),
    repeated: impl FnOnce() -> (Tensor<B, 4>, Tensor<B, 4>),
) -> Tensor<B, 4> {
    use crate::model::backend::{Cpu, cast, cast_back};
    let x = match super::fused::rope(x, &tables.0, &tables.1) {
        Ok(y) => return y,
        Err(x) => x,
    };
    match cast::<Tensor<B, 4>, Tensor<Cpu, 4>>(x) {
        Ok(x) => {
            let device = x.device();
            let [b, t, n, d] = x.dims();
            let cos: Tensor<Cpu, 4> = cast_back(tables.0.clone());
            let sin: Tensor<Cpu, 4> = cast_back(tables.1.clone());
            let out = amx::with_f32(x, |x| {
                amx::with_f32(cos, |c| amx::with_f32(sin, |s| amx::rope(x, c, s, n, d)))
            });
            cast_back(Tensor::<Cpu, 4>::from_data(
                TensorData::new(out, [b, t, n, d]),
                &device,
            ))
        }
        Err(x) => {
            let (cos, sin) = repeated();
            rope(x, &cos, &sin)
        }
    }
}

impl<B: Backend> CausalLm<B> {
    /// A model of this shape with zero weights and unit norms (weights come from a checkpoint).
    pub fn init(arch: &HfArch, device: &B::Device) -> CausalLm<B> {
        let a = arch;
        let (q, kv) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        let layers = (0..a.layers)
            .map(|_| DecoderLayer {
                input_layernorm: rms_norm(a.hidden, a.rms_eps, device),
                self_attn: Attention {
                    q_proj: linear(a.hidden, q, a.qkv_bias, device),
                    k_proj: linear(a.hidden, kv, a.qkv_bias, device),
                    v_proj: linear(a.hidden, kv, a.qkv_bias, device),
                    o_proj: linear(q, a.hidden, a.o_bias, device),
                    q_norm: a.qk_norm.then(|| rms_norm(a.head_dim, a.rms_eps, device)),
                    k_norm: a.qk_norm.then(|| rms_norm(a.head_dim, a.rms_eps, device)),
                },
                post_attention_layernorm: rms_norm(a.hidden, a.rms_eps, device),
                mlp: Mlp {
                    gate_proj: linear(a.hidden, a.intermediate, a.mlp_bias, device),
                    up_proj: linear(a.hidden, a.intermediate, a.mlp_bias, device),
                    down_proj: linear(a.intermediate, a.hidden, a.mlp_bias, device),
                },
                lora: None,
            })
            .collect();
        CausalLm {
            model: Decoder {
                embed_tokens: Embedding {
                    weight: zeros([a.vocab, a.hidden], device),
                },
                layers,
                norm: rms_norm(a.hidden, a.rms_eps, device),
            },
            lm_head: (!a.tied).then(|| linear(a.hidden, a.vocab, false, device)),
            arch: arch.clone(),
            lora: None,
            packed: None,
            frozen: None,
            recompute_attention: false,
        }
    }

    /// `f` of every layer's projections, in [`LORA_TARGETS`] order.
    fn map_projections<T>(&mut self, mut f: impl FnMut(&mut Linear<B>) -> T) -> Vec<Vec<T>> {
        self.model
            .layers
            .iter_mut()
            .map(|layer| {
                let (att, mlp) = (&mut layer.self_attn, &mut layer.mlp);
                [
                    &mut att.q_proj,
                    &mut att.k_proj,
                    &mut att.v_proj,
                    &mut att.o_proj,
                    &mut mlp.gate_proj,
                    &mut mlp.up_proj,
                    &mut mlp.down_proj,
                ]
                .into_iter()
                .map(&mut f)
                .collect()
            })
            .collect()
    }

    /// The tied head, the embeddings transposed: `[hidden, vocab]` values, hidden, vocab (the
    /// embeddings themselves stay: the forward looks tokens up in them).
    fn tied_head(&self) -> (Vec<f32>, usize, usize) {
        let e = self.model.embed_tokens.weight.val();
        let [vocab, hidden] = e.dims();
        let t = values(e.transpose());
        (amx::f32s(t.as_bytes()).into_owned(), hidden, vocab)
    }

    /// This model, for training with adapters, with its frozen projections and head as bf16
    /// for the CPU's bf16 kernel ([`super::frozen`]; their f32 weights dropped): the forward
    /// and the input gradients of those products round to bf16 and sum in f32; the adapters,
    /// attention, norms and activations stay f32. Call only on the CPU backends (the CPU's bf16
    /// kernel, [`amx::kernel`]).
    pub fn freeze_bf16(mut self) -> CausalLm<B> {
        assert!(
            self.lora.is_some(),
            "only a model with adapters has a frozen base"
        );
        let freeze = |l: &mut Linear<B>| {
            let (w, k, n) = take_weight(l);
            std::sync::Arc::new(Frozen::new(&w, k, n))
        };
        let layers = self.map_projections(&freeze);
        let head = match &mut self.lm_head {
            Some(head) => freeze(head),
            None => {
                let (t, hidden, vocab) = self.tied_head();
                std::sync::Arc::new(Frozen::new(&t, hidden, vocab))
            }
        };
        self.frozen = Some(std::sync::Arc::new(FrozenWeights { layers, head }));
        self
    }

    /// This model with its projections and head as bf16 for the CPU's bf16 kernel (their f32
    /// weights dropped): its forward then rounds each projection's input and weights to bf16
    /// and sums in f32 (attention, norms and activations stay f32). For inference only, after
    /// adapters are merged. Call only on the CPU backends.
    pub fn pack_bf16(mut self) -> CausalLm<B> {
        assert!(
            self.lora.is_none(),
            "adapters are merged before packing (the packed path has none)"
        );
        let pack = |l: &mut Linear<B>| {
            let (w, k, n) = take_weight(l);
            amx::Packed::new(&w, k, n)
        };
        let layers = self.map_projections(&pack);
        let head = match &mut self.lm_head {
            Some(head) => pack(head),
            None => {
                let (t, hidden, vocab) = self.tied_head();
                amx::Packed::new(&t, hidden, vocab)
            }
        };
        self.packed = Some(std::sync::Arc::new(PackedWeights { layers, head }));
        self
    }

    pub fn vocab(&self) -> usize {
        self.arch.vocab
    }

    /// RoPE `cos`, `sin` (`[b, 1, t, head_dim]`) at `positions` (`[b, t]`): f32 angles
    /// `position × inv_freq`, as Hugging Face computes them.
    fn rope_tables(&self, positions: Tensor<B, 2, Int>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let device = positions.device();
        let f: Vec<f32> = self.arch.inv_freq.iter().map(|&w| w as f32).collect();
        let half = f.len();
        let freq = float_tensor::<B, 3>(f, [1, 1, half], &device);
        let angles = positions.float().unsqueeze_dim::<3>(2) * freq;
        // `[b, t, 1, head_dim]`: applied to `[b, t, heads, head_dim]` before the heads move
        // to dimension 1, so rotating touches contiguous memory. `sin`'s first half negated
        // (see [`rope`]).
        let sin = angles.clone().sin();
        let sin = Tensor::cat(vec![sin.clone().neg(), sin], 2).unsqueeze_dim::<4>(2);
        let angles = Tensor::cat(vec![angles.clone(), angles], 2).unsqueeze_dim::<4>(2);
        (angles.cos(), sin)
    }

    /// Logits `[b, t, vocab]` for `tokens` at `positions` (both `[b, t]`). `mask` is `[b, t,
    /// cached + t]`, `true` where a query must not see a key. With a cache, the new keys and
    /// values are appended to it.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let x = self.hidden(tokens, positions, mask, cache);
        let [b, t, d] = x.dims();
        self.head(x.reshape([b * t, d]))
            .reshape([b, t, self.arch.vocab])
    }

    /// The output head: logits `[n, vocab]` of final hidden states `[n, hidden]` (`lm_head`,
    /// or the transposed embeddings when tied).
    pub fn head(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if let Some(frozen) = &self.frozen {
            let y = frozen_matmul(x, &frozen.head);
            return match self.lm_head.as_ref().and_then(|h| h.bias.as_ref()) {
                Some(bias) => y + bias.val().unsqueeze_dim(0),
                None => y,
            };
        }
        if let Some(packed) = &self.packed {
            let y = matmul_packed(x, &packed.head);
            return match self.lm_head.as_ref().and_then(|h| h.bias.as_ref()) {
                Some(bias) => y + bias.val().unsqueeze_dim(0),
                None => y,
            };
        }
        match &self.lm_head {
            Some(head) => {
                let y = x.matmul(head.weight.val());
                match &head.bias {
                    Some(bias) => y + bias.val().unsqueeze_dim(0),
                    None => y,
                }
            }
            None => x.matmul(self.model.embed_tokens.weight.val().transpose()),
        }
    }

    /// The final normed hidden states `[b, t, hidden]` ([`Self::forward`] before the head).
    /// (As an [`Lm`](crate::model::lm::Lm), [`super::checkpointed`]: while an update records
    /// its micro-batch, a training call there keeps only its layers' inputs.)
    pub fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        // The device layout ([`crate::model::kv`]): this call's keys are written at `slot`, the
        // cache's keys so far, in buffers of `cap` keys; the mask hides the keys past them.
        let slot = cache.as_mut().and_then(|c| c.device_slot(t));
        let call = self.call(positions, mask, b, t, slot);
        let mut x = self.embed(tokens);
        // The cached keys and values are taken (not cloned), so that a cache with room
        // ([`KvCache::reserve`]) owns its buffers and takes the new ones in place.
        let mut old = cache
            .as_mut()
            .filter(|c| !c.layers.is_empty())
            .map(|c| std::mem::take(&mut c.layers).into_iter());
        let mut fresh = Vec::with_capacity(self.arch.layers);
        for l in 0..self.model.layers.len() {
            let cached = old
                .as_mut()
                .map(|o| o.next().expect("a cached layer per layer"));
            let (y, kv) = self.layer(l, x, &call, cached);
            x = y;
            fresh.push(kv);
        }
        if let Some(c) = cache {
            c.layers = fresh;
        }
        norm(&self.model.norm, x)
    }

    /// The embeddings of `tokens` (`[b, t]`): `[b, t, hidden]`.
    pub(super) fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        self.model
            .embed_tokens
            .weight
            .val()
            .select(0, tokens.reshape([b * t]))
            .reshape([b, t, self.arch.hidden])
    }

    /// What every layer of a call of `b` rows of `t` tokens shares ([`Call`]), from the call's
    /// positions and mask and, on the device layout, where its keys go in the cache.
    pub(super) fn call(
        &self,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        b: usize,
        t: usize,
        slot: Option<(usize, usize)>,
    ) -> Call<B> {
        let a = &self.arch;
        let (kv, hd) = (a.kv_heads, a.head_dim);
        let g = a.heads / kv;
        let device = positions.device();
        let mut mask = mask;
        if let Some((n, cap)) = slot {
            let keys = mask.dims()[2];
            assert_eq!(
                keys,
                n + t,
                "the mask covers the cached keys and the new ones"
            );
            if cap > keys {
                let hidden = vec![true; b * t * (cap - keys)];
                let pad = bool_tensor::<B, 3>(hidden, [b, t, cap - keys], &device);
                mask = Tensor::cat(vec![mask, pad], 2);
            }
        }
        let keys = mask.dims()[2];
        // The tables, and where [`rotary`] needs them, repeated over the query heads and over
        // the key heads, once per call.
        let tables = self.rope_tables(positions);
        // Additive mask `[b, kv, g·t, keys]`: the g query heads of a key/value head share it;
        // on the GPU `[b, 1, g·t, keys]`, broadcast over the key/value heads, a kv-th of the
        // memory (a call's mask is kept until its backward pass).
        // With the tiles (inference or training), the mask's bytes instead: the fused masked
        // softmax reads them ([`super::softmax`]).
        // CPU inference over more than one position: the fused attention, which reads the
        // mask's bytes too ([`super::attention`]).
        let fused = super::attention::applies::<B>(t);
        let (bias, hidden_keys) = match self.packed.is_none() && self.frozen.is_none() && !fused {
            true => {
                let bias = crate::model::transformer::attention_bias(mask)
                    .unsqueeze_dim::<4>(1)
                    .repeat_dim(1, g)
                    .reshape([b, 1, g * t, keys]);
                let bias = match super::fused::bias_shared_by_heads::<B>() {
                    true => bias,
                    false => bias.repeat_dim(1, kv),
                };
                (Some(bias), None)
            }
            false => {
                let hidden = mask.into_data();
                assert_eq!(
                    hidden.as_bytes().len(),
                    b * t * keys,
                    "one byte per mask value"
                );
                (None, Some(hidden))
            }
        };
        // Inference on the CPU with burn's attention (decoding steps; prompts run the fused
        // one): the attention in batch chunks whose scores (`[rows, kv, g·t,
        // keys]` f32, and the weights beside them) stay under glibc's mmap threshold (32 MiB,
        // `main.rs`), so their buffers are reused from the heap instead of arriving as fresh
        // zeroed pages from the kernel every layer (long prompts: a third of the encoding's
        // CPU time was page faults). Each batch row's products are the same calls on the same
        // operands either way, so the values are too. Training (autodiff) and GPUs keep one call.
        let most = ATTENTION_CHUNK_BYTES.load(std::sync::atomic::Ordering::Relaxed);
        let chunk = (!B::ad_enabled(&device) && !crate::model::backend::is_cuda::<B>())
            .then(|| (most / (kv * g * t * keys * 4).max(1)).max(1));
        Call {
            b,
            t,
            keys,
            tables,
            rope_q: std::cell::OnceCell::new(),
            rope_k: std::cell::OnceCell::new(),
            bias,
            hidden_keys,
            fused,
            chunk,
            slot,
            scale: 1.0 / (hd as f64).sqrt(),
            lora_scale: self.lora.as_ref().map_or(0.0, LoraSpec::scale),
        }
    }

    /// Layer `l` of a call on its input `x` (`[b, t, hidden]`): its output, and the keys and
    /// values of this call's positions (with `cached`, the cache's keys and values before
    /// them, those that came before them).
    pub(super) fn layer(
        &self,
        l: usize,
        x: Tensor<B, 3>,
        c: &Call<B>,
        cached: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    ) -> (Tensor<B, 3>, (Tensor<B, 4>, Tensor<B, 4>)) {
        let a = &self.arch;
        let (h, kv, hd) = (a.heads, a.kv_heads, a.head_dim);
        let g = h / kv;
        let (b, t, keys) = (c.b, c.t, c.keys);
        let layer = &self.model.layers[l];
        let att = &layer.self_attn;
        let over = |n: usize| {
            (
                c.tables.0.clone().repeat_dim(2, n),
                c.tables.1.clone().repeat_dim(2, n),
            )
        };
        let normed = norm(&layer.input_layernorm, x.clone());
        // `[b, t, n·hd]` → `[b, n, t, hd]`, normed and rotated (RoPE) while still
        // `[b, t, n, hd]`, then moved in one copy ([`super::heads`]).
        let split = |y: Tensor<B, 3>, n: usize, qk_norm: &Option<RmsNorm<B>>, rotate: bool| {
            let y = y.reshape([b, t, n, hd]);
            let y = match qk_norm {
                Some(n) => norm(n, y),
                None => y,
            };
            let y = match rotate {
                true => {
                    let cell = if n == h { &c.rope_q } else { &c.rope_k };
                    rotary(y, &c.tables, || cell.get_or_init(|| over(n)).clone())
                }
                false => y,
            };
            super::heads::swap_middle(y)
        };
        let packed = self.packed.as_ref().map(|p| &p.layers[l]);
        let frozen = self.frozen.as_ref().map(|f| &f.layers[l]);
        let p = |x: Tensor<B, 3>, lin: &Linear<B>, target: &str| {
            let i = || {
                LORA_TARGETS
                    .iter()
                    .position(|t| *t == target)
                    .expect("a target")
            };
            match (packed, frozen) {
                (Some(packed), _) => apply_packed(x, &packed[i()], lin.bias.as_ref()),
                (None, Some(frozen)) => {
                    proj_frozen(x, lin, &frozen[i()], layer, target, c.lora_scale)
                }
                (None, None) => proj(x, lin, layer, target, c.lora_scale),
            }
        };
        let q = split(
            p(normed.clone(), &att.q_proj, "q_proj"),
            h,
            &att.q_norm,
            true,
        );
        let mut k = split(
            p(normed.clone(), &att.k_proj, "k_proj"),
            kv,
            &att.k_norm,
            true,
        );
        let mut v = split(p(normed, &att.v_proj, "v_proj"), kv, &None, false);
        if let Some((ck, cv)) = cached {
            match c.slot {
                Some((n, _)) => {
                    k = ck.slice_assign([0..b, 0..kv, n..n + t, 0..hd], k);
                    v = cv.slice_assign([0..b, 0..kv, n..n + t, 0..hd], v);
                }
                None => {
                    k = crate::model::kv::append(ck, k);
                    v = crate::model::kv::append(cv, v);
                }
            }
        }
        let kv_out = (k.clone(), v.clone());
        // Query head j·g + i reads key/value head j: fold the g heads into the rows.
        let q = q.reshape([b, kv, g * t, hd]);
        let scale = c.scale;
        // The attention of batch rows `r0..r1`: `[r1 − r0, kv, g·t, hd]`, before the heads
        // move back.
        let attend = |q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, r0: usize, r1: usize| {
            let rows = |bias: &Tensor<B, 4>| match r1 - r0 == b {
                true => bias.clone(),
                false => bias.clone().narrow(0, r0, r1 - r0),
            };
            match (&c.bias, &c.hidden_keys) {
                (Some(bias), _) if self.recompute_attention => {
                    super::recompute::attention(q, k, v, rows(bias), scale)
                }
                (Some(bias), _) => {
                    let scores = q.matmul(k.swap_dims(2, 3));
                    // One kernel on the GPU ([`super::fused`]).
                    super::fused::softmax(scores, rows(bias), scale)
                        .unwrap_or_else(|(s, b)| softmax(s.mul_scalar(scale) + b, 3))
                        .matmul(v)
                }
                (None, Some(hidden)) => super::softmax::masked_softmax(
                    q.matmul(k.swap_dims(2, 3)),
                    &hidden.as_bytes()[r0 * t * keys..r1 * t * keys],
                    t,
                    scale as f32,
                )
                .matmul(v),
                (None, None) => unreachable!("a bias or a mask"),
            }
        };
        let attended = match (&c.hidden_keys, c.chunk) {
            (Some(hidden), _) if c.fused => {
                super::attention::attend(q, k, v, hidden.as_bytes(), t, scale as f32)
            }
            (_, Some(rows)) if rows < b => {
                let parts: Vec<Tensor<B, 4>> = (0..b)
                    .step_by(rows)
                    .map(|r0| {
                        let n = rows.min(b - r0);
                        attend(
                            q.clone().narrow(0, r0, n),
                            k.clone().narrow(0, r0, n),
                            v.clone().narrow(0, r0, n),
                            r0,
                            r0 + n,
                        )
                    })
                    .collect();
                Tensor::cat(parts, 0)
            }
            _ => attend(q, k, v, 0, b),
        };
        let out =
            super::heads::swap_middle(attended.reshape([b, h, t, hd])).reshape([b, t, h * hd]);
        let x = x + p(out, &att.o_proj, "o_proj");
        let normed = norm(&layer.post_attention_layernorm, x.clone());
        let mlp = &layer.mlp;
        if let Some(packed) = packed {
            return (x + mlp_packed(normed, mlp, &packed[4..7]), kv_out);
        }
        let hidden = super::silu::silu_mul(
            p(normed.clone(), &mlp.gate_proj, "gate_proj"),
            p(normed, &mlp.up_proj, "up_proj"),
        );
        (x + p(hidden, &mlp.down_proj, "down_proj"), kv_out)
    }

    /// The final RMSNorm, of the last layer's output.
    pub(super) fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        norm(&self.model.norm, x)
    }

    /// Logits `[b, t, vocab]` of whole right-padded sequences (no cache): position `i` of row
    /// `r` sees positions `≤ i` that are within the row's length.
    pub fn forward_full(&self, seqs: &[Vec<u32>], device: &B::Device) -> Tensor<B, 3> {
        let (tokens, positions, mask, b, t) = padded_inputs(seqs);
        self.forward(
            int_tensor(tokens, [b, t], device),
            int_tensor(positions, [b, t], device),
            bool_tensor(mask, [b, t, t], device),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::backend::Cpu;

    /// The CPU backend's one-pass RoPE gives burn's element-wise RoPE (with the tables
    /// repeated over the heads) to the bit.
    #[test]
    fn rotary_in_one_pass_is_burns_rope_to_the_bit() {
        let device = Default::default();
        let (b, t, n, d) = (2, 5, 3, 8);
        let tensor = |shape: [usize; 4], seed: u64| {
            let mut s = seed;
            let v: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (s >> 33) as f32 / (1u64 << 30) as f32 - 1.0
                })
                .collect();
            Tensor::<Cpu, 4>::from_data(TensorData::new(v, shape), &device)
        };
        let x = tensor([b, t, n, d], 7);
        let (cos, sin) = (tensor([b, t, 1, d], 11), tensor([b, t, 1, d], 13));
        let bits = |y: Tensor<Cpu, 4>| -> Vec<u32> {
            let v = y.into_data().to_vec::<f32>().expect("f32 values");
            v.into_iter().map(f32::to_bits).collect()
        };
        let want = rope(
            x.clone(),
            &cos.clone().repeat_dim(2, n),
            &sin.clone().repeat_dim(2, n),
        );
        let got = rotary(x, &(cos, sin), || {
            unreachable!("the CPU backend rotates in one pass")
        });
        assert_eq!(bits(got), bits(want));
    }
}
