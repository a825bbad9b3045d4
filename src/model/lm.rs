//! The one interface the policy, the reward model and PPO need from a language model
//! ([`Lm`]): a causal forward over right-padded batches with an explicit mask and a key/value
//! cache. Prompt encoding and continuation scoring are written once on top of it, for every
//! model family: rla-pipe's small [`Transformer`](super::Transformer) and the pretrained
//! Hugging Face decoders ([`CausalLm`](super::hf::CausalLm)), both built on this file (which
//! names neither: [`AnyLm`](super::AnyLm) holds either). With it, what every family speaks in:
//! the key/value cache and tensors from host values.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// Keys and values of every layer for the positions seen so far: `[batch, heads, len, head_dim]`
/// (on the device layout, [`super::kv`], `len` is the buffer's room and `filled` the keys).
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    pub layers: Vec<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// On the device layout ([`super::kv::device_layout`]): the keys the buffers hold, zeros
    /// past them. `None`: the tensors hold exactly their keys.
    pub filled: Option<usize>,
    /// The keys [`Self::reserve`] asked room for, taken on the device layout when the model next
    /// appends (a model that does not write in place ignores it).
    pub want: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache of these layers' keys and values (no room reserved).
    pub fn new(layers: Vec<(Tensor<B, 4>, Tensor<B, 4>)>) -> KvCache<B> {
        KvCache {
            layers,
            filled: None,
            want: 0,
        }
    }

    /// The keys the cache holds.
    pub fn keys(&self) -> usize {
        self.filled
            .or_else(|| self.layers.first().map(|(k, _)| k.dims()[2]))
            .unwrap_or(0)
    }

    /// Room for `extra` more keys per layer, so that the next tokens' keys and values are
    /// written in place instead of copying the whole cache every token ([`super::kv`]). The
    /// cached values stay as they are; on the CPU backend their shapes too, on the device
    /// layout the model lays the buffers out when it next appends.
    pub fn reserve(&mut self, extra: usize) {
        if super::kv::device_layout::<B>() {
            self.want = self.want.max(self.keys() + extra);
            return;
        }
        for (k, v) in &mut self.layers {
            *k = super::kv::with_room(k.clone(), extra);
            *v = super::kv::with_room(v.clone(), extra);
        }
    }

    /// On the device layout ([`super::kv::device_layout`]), once [`Self::reserve`] asked for
    /// room or the buffers are laid out: room for `t` new keys (the buffers laid out, or grown
    /// by a bucket), counted as filled; returns where they go (the keys held before them) and
    /// the keys the buffers hold room for. `None`: the tensors hold exactly their keys, and the
    /// new ones are appended.
    pub fn device_slot(&mut self, t: usize) -> Option<(usize, usize)> {
        if self.layers.is_empty()
            || (self.filled.is_none() && self.want == 0)
            || !super::kv::device_layout::<B>()
        {
            return None;
        }
        let n = self.keys();
        let room = self.layers[0].0.dims()[2];
        let need = (n + t).max(self.want);
        if self.filled.is_none() || need > room {
            let cap = super::kv::capacity(need);
            for (k, v) in &mut self.layers {
                *k = super::kv::padded(k.clone(), cap);
                *v = super::kv::padded(v.clone(), cap);
            }
        }
        self.filled = Some(n + t);
        Some((n, self.layers[0].0.dims()[2]))
    }

    /// The cache with its batch rows reordered / repeated: row r of the result is row
    /// `rows[r]` of this cache.
    pub fn select_rows(&self, rows: &[usize], device: &B::Device) -> KvCache<B> {
        let idx = int_tensor::<B, 1>(
            rows.iter().map(|r| *r as i64).collect(),
            [rows.len()],
            device,
        );
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone().select(0, idx.clone()),
                        v.clone().select(0, idx.clone()),
                    )
                })
                .collect(),
            filled: self.filled,
            want: self.want,
        }
    }
}

/// An Int tensor from host values.
pub fn int_tensor<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A Bool tensor from host values.
pub fn bool_tensor<B: Backend, const D: usize>(
    values: Vec<bool>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Bool> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A Float tensor from host values.
pub fn float_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Tokens, positions and the causal mask (`true` = hidden) of right-padded sequences, row-major:
/// `(tokens [b·t], positions [b·t], mask [b·t·t], b, t)`. Position `i` of a row sees positions
/// `≤ i` within the row's length; padding repeats the last position.
pub fn padded_inputs(seqs: &[Vec<u32>]) -> (Vec<i64>, Vec<i64>, Vec<bool>, usize, usize) {
    let b = seqs.len();
    let lens: Vec<usize> = seqs.iter().map(|s| s.len().max(1)).collect();
    let t = lens.iter().copied().max().unwrap_or(1);
    let mut tokens = Vec::with_capacity(b * t);
    let mut positions = Vec::with_capacity(b * t);
    let mut mask = Vec::with_capacity(b * t * t);
    for (s, &len) in seqs.iter().zip(&lens) {
        for i in 0..t {
            tokens.push(s.get(i).copied().unwrap_or(0) as i64);
            positions.push(i.min(len - 1) as i64);
            for k in 0..t {
                mask.push(!(k <= i && k < len));
            }
        }
    }
    (tokens, positions, mask, b, t)
}

/// A causal language model.
pub trait Lm<B: Backend> {
    /// The final (normed) hidden states `[batch, len, d_model]` for `tokens` at `positions`
    /// (both `[batch, len]`). `mask` is `[batch, len, cached + len]`, `true` where a query must
    /// not see a key. With a cache, the new keys and values are appended to it.
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3>;

    /// The output head: logits `[n, vocab]` of hidden states `[n, d_model]`. Callers that need
    /// the logits of a few positions select their hidden states first (the head of a
    /// 49k-token vocabulary costs a fifth of a small model's forward per position).
    fn head(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2>;

    /// Logits `[batch, len, vocab]`: [`Lm::hidden`] then [`Lm::head`] at every position.
    fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let x = self.hidden(tokens, positions, mask, cache);
        let [b, t, d] = x.dims();
        self.head(x.reshape([b * t, d]))
            .reshape([b, t, self.vocab()])
    }

    /// Vocabulary size (logits per position).
    fn vocab(&self) -> usize;

    /// Whether the stages compute what samples share once with this model: prefix trees in
    /// scoring and training, an episode's keys/values reused across steps, the head applied
    /// only where logits are read ([`super::tree`]). Pretrained models do; rla-pipe's small
    /// transformer keeps the computation its committed numbers were made with, so that stores
    /// written by earlier builds still replay bit for bit (its prompts are short: little to
    /// share).
    fn packs_prefixes(&self) -> bool {
        false
    }

    /// The largest position + 1 the model takes (later positions are clamped to the last).
    fn context(&self) -> usize;

    /// Encode right-padded prompts: the raw next-token logits after each prompt (`[batch,
    /// vocab]`, at its last real token), the cache, and the prompt lengths.
    fn encode(
        &self,
        prompts: &[Vec<u32>],
        device: &B::Device,
    ) -> (Tensor<B, 2>, KvCache<B>, Vec<usize>) {
        let (toks, pos, mask, b, t) = padded_inputs(prompts);
        let lens: Vec<usize> = prompts.iter().map(|p| p.len().max(1)).collect();
        super::count::record(lens.iter().sum(), 0);
        let mut cache = KvCache::new(Vec::new());
        let (tokens, positions, mask) = (
            int_tensor(toks, [b, t], device),
            int_tensor(pos, [b, t], device),
            bool_tensor(mask, [b, t, t], device),
        );
        let last = int_tensor::<B, 1>(
            lens.iter()
                .enumerate()
                .map(|(r, l)| (r * t + l - 1) as i64)
                .collect(),
            [b],
            device,
        );
        if !self.packs_prefixes() {
            let logits = self.forward(tokens, positions, mask, Some(&mut cache));
            let v = self.vocab();
            return (logits.reshape([b * t, v]).select(0, last), cache, lens);
        }
        let x = self.hidden(tokens, positions, mask, Some(&mut cache));
        let d = x.dims()[2];
        (
            self.head(x.reshape([b * t, d]).select(0, last)),
            cache,
            lens,
        )
    }

    /// Per-token log-probabilities of continuations after encoded prompts.
    ///
    /// `rows[r]` names the prompt continuation `r` follows, `conts[r]` its tokens (non-empty).
    /// `last` are the prompts' raw next-token logits from [`Lm::encode`];
    /// `bias` (`[vocab]`, optional) is added to every logit before `log_softmax` (−∞-like
    /// entries restrict the vocabulary) and `temperature` divides the logits.
    /// Returns `[n, max_len]` log-probabilities and the `[n, max_len]` validity mask (host).
    #[allow(clippy::too_many_arguments)]
    fn continuation_logprobs(
        &self,
        last: &Tensor<B, 2>,
        cache: &KvCache<B>,
        prompt_lens: &[usize],
        rows: &[usize],
        conts: &[Vec<u32>],
        bias: Option<&Tensor<B, 1>>,
        temperature: f64,
        device: &B::Device,
    ) -> (Tensor<B, 2>, Vec<bool>) {
        let n = rows.len();
        let v = self.vocab();
        let lmax = conts.iter().map(|c| c.len()).max().unwrap_or(1).max(1);
        let mut valid = vec![false; n * lmax];
        for (r, c) in conts.iter().enumerate() {
            for j in 0..c.len() {
                valid[r * lmax + j] = true;
            }
        }
        let norm = |logits: Tensor<B, 2>| {
            let mut l = logits;
            if temperature != 1.0 {
                l = l.div_scalar(temperature);
            }
            if let Some(bias) = bias {
                l = l + bias.clone().unsqueeze_dim(0);
            }
            log_softmax(l, 1)
        };
        let row_idx = int_tensor::<B, 1>(rows.iter().map(|r| *r as i64).collect(), [n], device);
        // First token: from the prompt's last position.
        let first_lp = norm(last.clone().select(0, row_idx));
        let first_tok =
            int_tensor::<B, 2>(conts.iter().map(|c| c[0] as i64).collect(), [n, 1], device);
        let mut parts = vec![first_lp.gather(1, first_tok)];
        if lmax > 1 {
            super::count::record(conts.iter().map(|c| c.len() - 1).sum(), 0);
            let tp = cache.keys();
            let t = lmax - 1;
            let mut toks = Vec::with_capacity(n * t);
            let mut pos = Vec::with_capacity(n * t);
            let mut mask = Vec::with_capacity(n * t * (tp + t));
            let mut next = Vec::with_capacity(n * t);
            for (r, c) in conts.iter().enumerate() {
                let plen = prompt_lens[rows[r]];
                for j in 0..t {
                    toks.push(c.get(j).copied().unwrap_or(0) as i64);
                    next.push(c.get(j + 1).copied().unwrap_or(0) as i64);
                    pos.push(((plen + j).min(self.context() - 1)) as i64);
                    for k in 0..tp {
                        mask.push(k >= plen);
                    }
                    for k in 0..t {
                        mask.push(k > j);
                    }
                }
            }
            let mut c = cache.select_rows(rows, device);
            let logits = self.forward(
                int_tensor(toks, [n, t], device),
                int_tensor(pos, [n, t], device),
                bool_tensor(mask, [n, t, tp + t], device),
                Some(&mut c),
            );
            let lp = norm(logits.reshape([n * t, v]));
            let next = int_tensor::<B, 2>(next, [n * t, 1], device);
            parts.push(lp.gather(1, next).reshape([n, t]));
        }
        let all = Tensor::cat(parts, 1);
        let mask = bool_tensor::<B, 2>(valid.iter().map(|v| !v).collect(), [n, lmax], device);
        (all.mask_fill(mask, 0.0), valid)
    }
}
