//! Prefix trees: continuations that share a token prefix are scored in ONE sequence, the prefix
//! computed once.
//!
//! A [`TreeRow`] is a stem (the shared prefix) and its leaves (each a continuation of the stem).
//! It becomes one packed row `[stem | leaf₀ | leaf₁ | …]` with a tree attention mask: a stem token
//! sees the stem up to itself, a leaf token sees the whole stem and its own leaf up to itself —
//! never another leaf. A leaf's positions continue the stem's (`stem.len() + j`), so every
//! leaf token computes exactly what it computes in its own sequence `stem ++ leaf`, up to the
//! order of floating-point sums (tested to ≤ 1e-5 relative against independent sequences for
//! the small transformer and Llama, Qwen2, Qwen3, log-probabilities, loss and gradients:
//! `tests/it/prefix.rs`). Nothing is copied per leaf: with autodiff the stem's keys and values are
//! one tensor whose gradient collects every leaf's contribution.
//!
//! Scoring needs only the logits at the positions that predict a scored token, so the hidden
//! states of those positions are selected before the output head ([`Lm::head`]).
//!
//! [`pack`] groups (prompt, response) samples into rows: samples whose prompts share at least
//! `min_shared` leading tokens become the leaves of one stem (their longest common prefix).

use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;

use super::count::record;
use super::lm::{KvCache, Lm, bool_tensor, int_tensor};

/// One stem and its leaves. A leaf is `(tokens, scored_from)`: its tokens continue the stem,
/// and `tokens[scored_from..]` are scored (at least one token).
#[derive(Debug, Clone, PartialEq)]
pub struct TreeRow {
    pub stem: Vec<u32>,
    pub leaves: Vec<(Vec<u32>, usize)>,
}

impl TreeRow {
    /// Tokens fed to the model: the stem, then every leaf but its last token (whose logits
    /// predict nothing scored).
    pub fn packed_len(&self) -> usize {
        self.stem.len()
            + self
                .leaves
                .iter()
                .map(|(l, _)| l.len().saturating_sub(1))
                .sum::<usize>()
    }

    /// Tokens the same samples cost as independent sequences (`stem ++ leaf`, the last token
    /// of each unfed).
    pub fn unpacked_len(&self) -> usize {
        self.leaves
            .iter()
            .map(|(l, _)| self.stem.len() + l.len().saturating_sub(1))
            .sum()
    }
}

/// Attention entries (rows × packed length²) one model call may hold: its scores, per head and
/// layer, dominate the memory of a training step (as in a padded batch of the same length).
pub const ATTENTION_BUDGET: usize = 1 << 21;

/// The budget on a GPU: 4× the CPU's. The SmolLM2 household update on an H200 (with
/// `update.cuda_micro_batch_tokens = 0`): 9 → 8 model calls, the RM's optimizer steps 1.22 →
/// 0.84 s, peak device memory 28.0 → 29.8 GB (docs/src/real-models.md, "The GPU path").
pub const CUDA_ATTENTION_BUDGET: usize = 1 << 23;

/// The attention entries one model call on backend `B` may hold: [`ATTENTION_BUDGET`] on the
/// CPU, [`CUDA_ATTENTION_BUDGET`] on a GPU (every call launches the same kernels whatever its
/// size), or the environment's `RLA_PIPE_ATTENTION_BUDGET` (a benchmark knob; other values
/// group rows otherwise, so they move the last bits).
pub fn attention_budget<B: Backend>() -> usize {
    static BUDGET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let set = *BUDGET.get_or_init(|| {
        std::env::var("RLA_PIPE_ATTENTION_BUDGET")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0)
    });
    set.unwrap_or(if super::backend::is_cuda::<B>() {
        CUDA_ATTENTION_BUDGET
    } else {
        ATTENTION_BUDGET
    })
}

/// Per-token log-probabilities of every leaf's scored tokens, rows in (row, leaf) order:
/// `[leaves, longest scored]`, zero past a leaf's end, and the validity mask (host, row-major).
/// `bias` (`[vocab]`) is added to the logits and `temperature` divides them before
/// `log_softmax`, as [`Lm::continuation_logprobs`] does. Rows go to the model in consecutive
/// chunks of at most [`attention_budget`] attention entries.
pub fn tree_logprobs<B: Backend, M: Lm<B>>(
    model: &M,
    rows: &[TreeRow],
    bias: Option<&Tensor<B, 1>>,
    temperature: f64,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<bool>) {
    let lmax = rows
        .iter()
        .flat_map(|r| r.leaves.iter().map(|(l, from)| l.len() - from))
        .max()
        .unwrap_or(1)
        .max(1);
    let budget = attention_budget::<B>();
    let mut valid = Vec::new();
    let mut parts = Vec::new();
    let mut from = 0;
    while from < rows.len() {
        let mut to = from + 1;
        let mut t = rows[from].packed_len();
        while to < rows.len() {
            let t2 = t.max(rows[to].packed_len());
            if (to + 1 - from) * t2 * t2 > budget {
                break;
            }
            t = t2;
            to += 1;
        }
        let (part, v) = tree_chunk(model, &rows[from..to], bias, temperature, lmax, device);
        parts.push(part);
        valid.extend(v);
        from = to;
    }
    let out = if parts.len() == 1 {
        parts.pop().expect("one part")
    } else {
        Tensor::cat(parts, 0)
    };
    (out, valid)
}

/// [`tree_logprobs`] of one chunk of rows: `[leaves, lmax]` and its validity mask.
fn tree_chunk<B: Backend, M: Lm<B>>(
    model: &M,
    rows: &[TreeRow],
    bias: Option<&Tensor<B, 1>>,
    temperature: f64,
    lmax: usize,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<bool>) {
    let b = rows.len();
    let t = rows
        .iter()
        .map(TreeRow::packed_len)
        .max()
        .unwrap_or(1)
        .max(1);
    let ctx = model.context();
    let mut tokens = Vec::with_capacity(b * t);
    let mut positions = Vec::with_capacity(b * t);
    let mut mask = vec![true; b * t * t];
    // Per scored token: the flat index of the position that predicts it, and the token.
    let mut at = Vec::new();
    let mut target = Vec::new();
    // Per leaf: how many scored tokens.
    let mut scored = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        assert!(!row.stem.is_empty(), "a tree row needs a non-empty stem");
        let s = row.stem.len();
        let base = r * t;
        let m = |q: usize, k: usize| base * t + q * t + k;
        let mut fed: Vec<u32> = row.stem.clone();
        let mut pos: Vec<usize> = (0..s).collect();
        for q in 0..s {
            for k in 0..=q {
                mask[m(q, k)] = false;
            }
        }
        for (leaf, from) in &row.leaves {
            assert!(*from < leaf.len(), "a leaf needs a scored token");
            let start = fed.len();
            // Every token but the last is fed (the last one's logits predict nothing scored).
            for (j, &tok) in leaf[..leaf.len() - 1].iter().enumerate() {
                let q = start + j;
                fed.push(tok);
                pos.push(s + j);
                for k in 0..s {
                    mask[m(q, k)] = false;
                }
                for k in start..=q {
                    mask[m(q, k)] = false;
                }
            }
            for (j, &tok) in leaf.iter().enumerate().skip(*from) {
                let q = if j == 0 { s - 1 } else { start + j - 1 };
                at.push((base + q) as i64);
                target.push(tok as i64);
            }
            scored.push(leaf.len() - from);
        }
        let used = fed.len();
        for q in 0..t {
            tokens.push(fed.get(q).copied().unwrap_or(0) as i64);
            positions.push(pos.get(q).copied().unwrap_or(0).min(ctx - 1) as i64);
            if q >= used {
                // Padding sees itself only (no softmax row is all hidden); nothing reads it.
                mask[m(q, q)] = false;
            }
        }
    }
    let packed: usize = rows.iter().map(TreeRow::packed_len).sum();
    let unpacked: usize = rows.iter().map(TreeRow::unpacked_len).sum();
    record(packed, unpacked.saturating_sub(packed));
    // One line per model call (benches/gpu_profile.py counts them per stage: on a GPU each call
    // launches the same kernels whatever its size).
    tracing::debug!(rows = b, len = t, leaves = scored.len(), "model call");
    let x = model.hidden(
        int_tensor(tokens, [b, t], device),
        int_tensor(positions, [b, t], device),
        bool_tensor(mask, [b, t, t], device),
        None,
    );
    let d = x.dims()[2];
    let scoring = Scored {
        at,
        target,
        counts: scored,
    };
    scoring.log_probs(
        model,
        x.reshape([b * t, d]),
        bias,
        temperature,
        lmax,
        device,
    )
}

/// The scored tokens of a packed forward: per token, the flat position whose logits predict it
/// and the token; per leaf, how many tokens it scored (leaf-major).
struct Scored {
    at: Vec<i64>,
    target: Vec<i64>,
    counts: Vec<usize>,
}

impl Scored {
    /// Their log-probabilities from the hidden states `x` (`[positions, d_model]`): the head at
    /// the predicting positions only, `/ temperature`, `+ bias`, `log_softmax`, laid out as
    /// `[leaves, lmax]` (zero past a leaf's end) with the validity mask (row-major).
    fn log_probs<B: Backend, M: Lm<B>>(
        self,
        model: &M,
        x: Tensor<B, 2>,
        bias: Option<&Tensor<B, 1>>,
        temperature: f64,
        lmax: usize,
        device: &B::Device,
    ) -> (Tensor<B, 2>, Vec<bool>) {
        let n_tok = self.at.len();
        let picked = x.select(0, int_tensor::<B, 1>(self.at, [n_tok], device));
        let mut logits = model.head(picked);
        if temperature != 1.0 {
            logits = logits.div_scalar(temperature);
        }
        if let Some(bias) = bias {
            logits = logits + bias.clone().unsqueeze_dim(0);
        }
        let lp =
            log_softmax(logits, 1).gather(1, int_tensor::<B, 2>(self.target, [n_tok, 1], device));
        let n = self.counts.len();
        let mut valid = vec![false; n * lmax];
        let mut idx = Vec::with_capacity(n * lmax);
        let mut flat = 0usize;
        for (i, &c) in self.counts.iter().enumerate() {
            valid[i * lmax..i * lmax + c]
                .iter_mut()
                .for_each(|v| *v = true);
            // Past a leaf's end: any of its scored tokens, masked to zero below.
            idx.extend((0..lmax).map(|j| (flat + j.min(c - 1)) as i64));
            flat += c;
        }
        let hide = bool_tensor::<B, 2>(valid.iter().map(|v| !v).collect(), [n, lmax], device);
        let out = lp
            .reshape([n_tok])
            .select(0, int_tensor::<B, 1>(idx, [n * lmax], device))
            .reshape([n, lmax])
            .mask_fill(hide, 0.0);
        (out, valid)
    }
}

/// The length of the longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Group `(prompt, response)` samples into tree rows. Samples are taken in the order of their
/// prompts (ties in index order); a sample joins the current row when its prompt shares at
/// least `min_shared` tokens (and at least one) and at least half of its own and the row's
/// first prompt with the row's stem, the stem shrinking to the common prefix, and the row
/// stays within `max_row` packed tokens. Each sample's leaf is the
/// rest of its prompt and its response, scored from the response on. Returns the rows and, for
/// each sample in input order, its leaf's index in the rows' (row, leaf) order.
pub fn pack(
    prompts: &[&[u32]],
    responses: &[&[u32]],
    min_shared: usize,
    max_row: usize,
) -> (Vec<TreeRow>, Vec<usize>) {
    let n = prompts.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| prompts[a].cmp(prompts[b]).then(a.cmp(&b)));
    // Groups of sample indices with their stem length.
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in &order {
        let p = prompts[i];
        if let Some((stem, members)) = groups.last_mut() {
            let shared = common_prefix(&prompts[members[0]][..*stem], p).min(p.len());
            // The shrunken row: its stem, then every member's rest of prompt + response.
            let fed = |i: usize| prompts[i].len() - shared + responses[i].len() - 1;
            let len = shared + members.iter().map(|&m| fed(m)).sum::<usize>() + fed(i);
            // Worth it only when the shared part is at least half of every member's prompt:
            // the leaves' attention over a longer row costs what the shared tokens save.
            let half = 2 * shared >= p.len().max(prompts[members[0]].len());
            if shared >= min_shared.max(1) && half && len <= max_row {
                *stem = shared;
                members.push(i);
                continue;
            }
        }
        groups.push((p.len(), vec![i]));
    }
    let mut slot = vec![0usize; n];
    let mut rows = Vec::with_capacity(groups.len());
    let mut k = 0;
    for (stem, members) in groups {
        // A stem must leave no leaf empty of prompt tokens AND be non-empty: when a prompt is
        // the whole stem, its leaf starts with the response.
        let stem_tokens = prompts[members[0]][..stem].to_vec();
        let leaves = members
            .iter()
            .map(|&i| {
                slot[i] = k;
                k += 1;
                let rest = &prompts[i][stem..];
                ([rest, responses[i]].concat(), rest.len())
            })
            .collect();
        rows.push(TreeRow {
            stem: stem_tokens,
            leaves,
        });
    }
    (rows, slot)
}

/// The keys and values a sequence left in a model's cache: `tokens` and, per layer, `[1,
/// kv_heads, tokens.len(), head_dim]`. An episode keeps its prompt's between steps.
#[derive(Debug, Clone)]
pub struct SeqCache<B: Backend> {
    pub tokens: Vec<u32>,
    pub layers: Vec<(Tensor<B, 4>, Tensor<B, 4>)>,
}

/// [`Lm::encode`], reusing what each prompt shares with the sequence its cache holds: row `r`
/// computes only `prompts[r][k..]`, where `k` is the common prefix of the prompt and
/// `past[r]`'s tokens — checked token by token, and at most `len − 1` so that the prompt's
/// last token is computed (its logits are the next token's). A prompt that shares nothing (a
/// history window moved, a truncation) is encoded afresh. Returns the next-token logits
/// `[batch, vocab]`, the batch cache in [`Lm::encode`]'s layout (prompt `r` at keys `0 ..
/// len_r`, right-padded), the prompt lengths, and each prompt's own cache for the next step.
/// Rows without a cache whose prompts are equal (the n rollouts of a task at their first step)
/// are computed once.
#[allow(clippy::type_complexity)]
pub fn encode_reusing<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    past: &[Option<&SeqCache<B>>],
    device: &B::Device,
) -> (Tensor<B, 2>, KvCache<B>, Vec<usize>, Vec<SeqCache<B>>) {
    let none: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    let (src, unique) = dedupe(prompts, &none, past);
    let u_prompts: Vec<Vec<u32>> = unique.iter().map(|&r| prompts[r].clone()).collect();
    let u_past: Vec<Option<&SeqCache<B>>> = unique.iter().map(|&r| past[r]).collect();
    let out = forward_reusing(
        model,
        &u_prompts,
        &none[..unique.len()],
        &u_past,
        true,
        device,
    );
    let batch = out.batch.expect("asked for the batch cache");
    let lens = prompts.iter().map(Vec::len).collect();
    if unique.len() == prompts.len() {
        return (out.last, batch, lens, out.own);
    }
    let idx = int_tensor::<B, 1>(src.iter().map(|u| *u as i64).collect(), [src.len()], device);
    (
        out.last.select(0, idx),
        batch.select_rows(&src, device),
        lens,
        src.iter().map(|&u| out.own[u].clone()).collect(),
    )
}

/// Per-token log-probabilities (T = 1) of every decision's actions after its prompt, each
/// prompt reusing its cached prefix as in [`encode_reusing`], in ONE forward: per decision a
/// packed row `[new prompt tokens | action₀ | action₁ | …]` over the reused keys, a tree mask
/// keeping the actions apart (nothing is copied per action). Returns `[actions, longest]`
/// (decision-major, zero past an action's end), the validity mask, and each prompt's own cache.
/// Rows without a cache with equal prompts and actions are computed once.
#[allow(clippy::type_complexity)]
pub fn score_reusing<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    actions: &[Vec<Vec<u32>>],
    past: &[Option<&SeqCache<B>>],
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<bool>, Vec<SeqCache<B>>) {
    let (src, unique) = dedupe(prompts, actions, past);
    let u_prompts: Vec<Vec<u32>> = unique.iter().map(|&r| prompts[r].clone()).collect();
    let u_actions: Vec<Vec<Vec<u32>>> = unique.iter().map(|&r| actions[r].clone()).collect();
    let u_past: Vec<Option<&SeqCache<B>>> = unique.iter().map(|&r| past[r]).collect();
    let out = forward_reusing(model, &u_prompts, &u_actions, &u_past, false, device);
    let (lp, valid) = out.leaves.expect("actions were scored");
    if unique.len() == prompts.len() {
        return (lp, valid, out.own);
    }
    // Expand the unique rows' actions back to every row.
    let lmax = valid.len() / u_actions.iter().map(Vec::len).sum::<usize>().max(1);
    let mut first = Vec::with_capacity(unique.len());
    let mut at = 0;
    for a in &u_actions {
        first.push(at);
        at += a.len();
    }
    let mut idx = Vec::new();
    let mut back = Vec::new();
    for &u in &src {
        for k in 0..u_actions[u].len() {
            let row = first[u] + k;
            idx.push(row as i64);
            back.extend_from_slice(&valid[row * lmax..(row + 1) * lmax]);
        }
    }
    let n = idx.len();
    (
        lp.select(0, int_tensor::<B, 1>(idx, [n], device)),
        back,
        src.iter().map(|&u| out.own[u].clone()).collect(),
    )
}

/// Rows without a cache that equal an earlier one (prompt and leaves): each row's index among
/// the unique rows, and the unique rows. Records the prompt tokens a duplicate saves.
fn dedupe<B: Backend>(
    prompts: &[Vec<u32>],
    leaves: &[Vec<Vec<u32>>],
    past: &[Option<&SeqCache<B>>],
) -> (Vec<usize>, Vec<usize>) {
    let mut first: std::collections::HashMap<(&[u32], &[Vec<u32>]), usize> = Default::default();
    let mut unique = Vec::with_capacity(prompts.len());
    let mut src = Vec::with_capacity(prompts.len());
    let mut saved = 0;
    for (r, p) in prompts.iter().enumerate() {
        if past[r].is_none() {
            let key = (p.as_slice(), leaves[r].as_slice());
            if let Some(&u) = first.get(&key) {
                src.push(u);
                saved += p.len() + leaves[r].iter().map(|l| l.len() - 1).sum::<usize>();
                continue;
            }
            first.insert(key, unique.len());
        }
        src.push(unique.len());
        unique.push(r);
    }
    record(0, saved);
    (src, unique)
}

/// What [`forward_reusing`] computed.
struct Reused<B: Backend> {
    /// Next-token logits after each prompt, `[rows, vocab]`.
    last: Tensor<B, 2>,
    /// The prompts' keys/values in [`Lm::encode`]'s layout (when asked for).
    batch: Option<KvCache<B>>,
    /// Each prompt's own keys/values.
    own: Vec<SeqCache<B>>,
    /// The leaves' per-token log-probabilities and validity (when there are leaves).
    leaves: Option<(Tensor<B, 2>, Vec<bool>)>,
}

/// One forward over every row's new prompt tokens (after its reused prefix) and its leaves
/// (continuations of the whole prompt, scored token by token at T = 1).
fn forward_reusing<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    leaves: &[Vec<Vec<u32>>],
    past: &[Option<&SeqCache<B>>],
    want_batch: bool,
    device: &B::Device,
) -> Reused<B> {
    let b = prompts.len();
    assert!(prompts.iter().all(|p| !p.is_empty()), "empty prompt");
    assert!(leaves.iter().flatten().all(|l| !l.is_empty()), "empty leaf");
    let reuse: Vec<usize> = prompts
        .iter()
        .zip(past)
        .map(|(p, c)| c.map_or(0, |c| common_prefix(&c.tokens, p).min(p.len() - 1)))
        .collect();
    let lc = reuse.iter().copied().max().unwrap_or(0);
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let sfx: Vec<usize> = lens.iter().zip(&reuse).map(|(l, k)| l - k).collect();
    let row_len: Vec<usize> = (0..b)
        .map(|r| sfx[r] + leaves[r].iter().map(|l| l.len() - 1).sum::<usize>())
        .collect();
    let t = row_len.iter().copied().max().unwrap_or(1);
    let alone: usize = (0..b)
        .map(|r| {
            if leaves[r].is_empty() {
                lens[r]
            } else {
                leaves[r].iter().map(|l| lens[r] + l.len() - 1).sum()
            }
        })
        .sum();
    let fed: usize = row_len.iter().sum();
    record(fed, alone.saturating_sub(fed));
    // The reused keys/values, right-padded to `lc`.
    let mut cache = KvCache::new(Vec::new());
    if lc > 0 {
        let shape = past
            .iter()
            .flatten()
            .next()
            .map(|c| (c.layers.len(), c.layers[0].0.dims()))
            .expect("a reused prefix has a cache");
        let (n_layers, [_, kv, _, hd]) = shape;
        for l in 0..n_layers {
            let mut ks = Vec::with_capacity(b);
            let mut vs = Vec::with_capacity(b);
            for (r, c) in past.iter().enumerate() {
                let keep = reuse[r];
                let mut k_parts = Vec::new();
                let mut v_parts = Vec::new();
                if keep > 0 {
                    let (k, v) = &c.expect("reused").layers[l];
                    k_parts.push(k.clone().narrow(2, 0, keep));
                    v_parts.push(v.clone().narrow(2, 0, keep));
                }
                if keep < lc {
                    k_parts.push(Tensor::zeros([1, kv, lc - keep, hd], device));
                    v_parts.push(Tensor::zeros([1, kv, lc - keep, hd], device));
                }
                ks.push(Tensor::cat(k_parts, 2));
                vs.push(Tensor::cat(v_parts, 2));
            }
            cache.layers.push((Tensor::cat(ks, 0), Tensor::cat(vs, 0)));
        }
    }
    let ctx = model.context();
    let mut tokens = Vec::with_capacity(b * t);
    let mut positions = Vec::with_capacity(b * t);
    let mut mask = vec![true; b * t * (lc + t)];
    let keys = lc + t;
    // Scored leaf tokens: the flat position predicting each, its token; tokens per leaf.
    let mut at = Vec::new();
    let mut target = Vec::new();
    let mut scored = Vec::new();
    for r in 0..b {
        let m = |q: usize, k: usize| (r * t + q) * keys + k;
        let mut fed: Vec<u32> = prompts[r][reuse[r]..].to_vec();
        let mut pos: Vec<usize> = (reuse[r]..lens[r]).collect();
        for q in 0..sfx[r] {
            (0..reuse[r]).for_each(|k| mask[m(q, k)] = false);
            (0..=q).for_each(|k| mask[m(q, lc + k)] = false);
        }
        for leaf in &leaves[r] {
            let start = fed.len();
            for (j, &tok) in leaf[..leaf.len() - 1].iter().enumerate() {
                let q = start + j;
                fed.push(tok);
                pos.push(lens[r] + j);
                (0..reuse[r]).for_each(|k| mask[m(q, k)] = false);
                (0..sfx[r]).for_each(|k| mask[m(q, lc + k)] = false);
                (start..=q).for_each(|k| mask[m(q, lc + k)] = false);
            }
            for (j, &tok) in leaf.iter().enumerate() {
                let q = if j == 0 { sfx[r] - 1 } else { start + j - 1 };
                at.push((r * t + q) as i64);
                target.push(tok as i64);
            }
            scored.push(leaf.len());
        }
        for q in 0..t {
            tokens.push(fed.get(q).copied().unwrap_or(0) as i64);
            positions.push(pos.get(q).copied().unwrap_or(0).min(ctx - 1) as i64);
            if q >= fed.len() {
                // Padding sees itself only; nothing reads it.
                mask[m(q, lc + q)] = false;
            }
        }
    }
    let x = model.hidden(
        int_tensor(tokens, [b, t], device),
        int_tensor(positions, [b, t], device),
        bool_tensor(mask, [b, t, keys], device),
        Some(&mut cache),
    );
    let d = x.dims()[2];
    let x = x.reshape([b * t, d]);
    let last_at: Vec<i64> = (0..b).map(|r| (r * t + sfx[r] - 1) as i64).collect();
    let last = model.head(
        x.clone()
            .select(0, int_tensor::<B, 1>(last_at, [b], device)),
    );
    let leaf_lp = (!scored.is_empty()).then(|| {
        let lmax = scored.iter().copied().max().unwrap_or(1);
        let scoring = Scored {
            at,
            target,
            counts: scored,
        };
        scoring.log_probs(model, x, None, 1.0, lmax, device)
    });
    // Each prompt's own keys/values: its reused prefix, then its computed suffix.
    let mut own: Vec<SeqCache<B>> = prompts
        .iter()
        .map(|p| SeqCache {
            tokens: p.clone(),
            layers: Vec::with_capacity(cache.layers.len()),
        })
        .collect();
    for (k, v) in &cache.layers {
        for (r, o) in own.iter_mut().enumerate() {
            let row = |t: &Tensor<B, 4>| {
                let t = t.clone().narrow(0, r, 1);
                let fresh = t.clone().narrow(2, lc, sfx[r]);
                if reuse[r] > 0 {
                    Tensor::cat(vec![t.narrow(2, 0, reuse[r]), fresh], 2)
                } else {
                    fresh
                }
            };
            o.layers.push((row(k), row(v)));
        }
    }
    let batch = want_batch.then(|| batch_cache(&own.iter().collect::<Vec<_>>(), device));
    Reused {
        last,
        batch,
        own,
        leaves: leaf_lp,
    }
}

/// Sequences' own caches side by side in [`Lm::encode`]'s layout: row `r` holds `own[r]`'s
/// keys at `0 .. len_r`, right-padded with zeros to the longest.
pub fn batch_cache<B: Backend>(own: &[&SeqCache<B>], device: &B::Device) -> KvCache<B> {
    let tmax = own.iter().map(|o| o.tokens.len()).max().unwrap_or(1);
    let n_layers = own.first().map_or(0, |o| o.layers.len());
    let mut batch = KvCache::new(Vec::new());
    for l in 0..n_layers {
        let pad = |t: &Tensor<B, 4>| {
            let [_, kv, len, hd] = t.dims();
            if len < tmax {
                Tensor::cat(
                    vec![t.clone(), Tensor::zeros([1, kv, tmax - len, hd], device)],
                    2,
                )
            } else {
                t.clone()
            }
        };
        let ks = own.iter().map(|o| pad(&o.layers[l].0)).collect();
        let vs = own.iter().map(|o| pad(&o.layers[l].1)).collect();
        batch.layers.push((Tensor::cat(ks, 0), Tensor::cat(vs, 0)));
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attention_budget_follows_the_backend() {
        // (`RLA_PIPE_ATTENTION_BUDGET` is never set by the tests.)
        assert_eq!(attention_budget::<crate::model::Cpu>(), ATTENTION_BUDGET);
        assert!(!crate::model::backend::is_cuda::<crate::model::Cpu>());
        assert!(!crate::model::backend::is_cuda::<crate::model::CpuTrain>());
        #[cfg(feature = "cuda")]
        {
            assert!(crate::model::backend::is_cuda::<crate::model::Gpu>());
            assert!(crate::model::backend::is_cuda::<crate::model::GpuTrain>());
            assert_eq!(
                attention_budget::<crate::model::GpuTrain>(),
                CUDA_ATTENTION_BUDGET
            );
        }
    }

    #[test]
    fn pack_groups_shared_prompts_and_keeps_every_sample_once() {
        let p1: &[u32] = &[1, 2, 3, 4];
        let p2: &[u32] = &[1, 2, 3, 5, 6];
        let p3: &[u32] = &[9, 9];
        let r: &[u32] = &[7, 8];
        let prompts = [p1, p3, p2, p1];
        let responses = [r, r, r, &[7][..]];
        let (rows, slot) = pack(&prompts, &responses, 2, 1000);
        // [1,2,3,4] ×2 and [1,2,3,5,6] share [1,2,3]; [9,9] is alone.
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].stem, vec![1, 2, 3]);
        assert_eq!(
            rows[0].leaves,
            vec![(vec![4, 7, 8], 1), (vec![4, 7], 1), (vec![5, 6, 7, 8], 2)]
        );
        assert_eq!(rows[1].stem, vec![9, 9]);
        assert_eq!(rows[1].leaves, vec![(vec![7, 8], 0)]);
        assert_eq!(slot, vec![0, 3, 2, 1]);
        // Packed: 3 + 2 + 1 + 3 = 9 fed tokens for the first row; unpacked 3·3 + 2 + 1 + 3.
        assert_eq!(rows[0].packed_len(), 9);
        assert_eq!(rows[0].unpacked_len(), 15);
        // A high threshold keeps identical prompts together only.
        let (rows, _) = pack(&prompts, &responses, 4, 1000);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].stem, vec![1, 2, 3, 4]);
        assert_eq!(rows[0].leaves, vec![(vec![7, 8], 0), (vec![7], 0)]);
        // A row cap splits groups.
        let (rows, _) = pack(&prompts, &responses, 1, 5);
        assert!(
            rows.iter()
                .all(|r| r.packed_len() <= 5 || r.leaves.len() == 1)
        );
    }
}
