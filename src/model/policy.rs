//! The policy: a distribution over the admissible actions. The logit of an action is its
//! sequence log-likelihood under the LM (its tokens as a continuation of the prompt) divided by
//! the temperature; `log π(a|s)` is the log-softmax of those logits over the admissible set.
//! All live decisions are scored in one batch, one packed row each: the prompt is computed once
//! and every admissible action continues it as a leaf of a prefix tree ([`super::tree`]).

use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;

use super::lm::{KvCache, Lm, bool_tensor, float_tensor, int_tensor};
use super::tree::{TreeRow, tree_logprobs};

/// One decision: a prompt and the token ids of its admissible actions.
#[derive(Debug, Clone)]
pub struct Decision {
    pub prompt: Vec<u32>,
    pub actions: Vec<Vec<u32>>,
}

impl Decision {
    /// Its tokens: the prompt and every action.
    pub fn tokens(&self) -> usize {
        self.prompt.len() + self.actions.iter().map(Vec::len).sum::<usize>()
    }

    /// The decision as a prefix tree: the prompt as the stem, every action a scored leaf.
    pub fn tree_row(&self) -> TreeRow {
        TreeRow {
            stem: self.prompt.clone(),
            leaves: self.actions.iter().map(|a| (a.clone(), 0)).collect(),
        }
    }
}

/// `log π(a|s)` for every decision and admissible action: `[decisions, max actions]`; entries
/// past a decision's action count are padding (≈ −1e9 before normalization, never read).
/// `mean`: an action's logit is its mean token log-likelihood instead of the sum (length
/// normalization, `policy.action_score = "mean"`).
pub fn log_probs<B: Backend, M: Lm<B>>(
    model: &M,
    decisions: &[Decision],
    temperature: f64,
    mean: bool,
    device: &B::Device,
) -> Tensor<B, 2> {
    if !model.packs_prefixes() {
        let prompts: Vec<Vec<u32>> = decisions.iter().map(|d| d.prompt.clone()).collect();
        let (last, cache, lens) = model.encode(&prompts, device);
        return log_probs_encoded(
            model,
            decisions,
            (&last, &cache, &lens),
            temperature,
            mean,
            device,
        );
    }
    // One packed row per decision: the prompt, computed once, and every action as a leaf.
    let rows: Vec<TreeRow> = decisions.iter().map(Decision::tree_row).collect();
    let (lp, _) = tree_logprobs(model, &rows, None, 1.0, device);
    normalize(lp.sum_dim(1), decisions, temperature, mean, device)
}

/// [`log_probs`] of decisions whose prompts are already encoded ([`Lm::encode`]'s logits,
/// cache and lengths): every action continues from a copy of its prompt's cache (the small
/// transformer's computation).
fn log_probs_encoded<B: Backend, M: Lm<B>>(
    model: &M,
    decisions: &[Decision],
    encoded: (&Tensor<B, 2>, &KvCache<B>, &[usize]),
    temperature: f64,
    mean: bool,
    device: &B::Device,
) -> Tensor<B, 2> {
    let (last, cache, lens) = encoded;
    let mut rows = Vec::new();
    let mut conts = Vec::new();
    for (i, d) in decisions.iter().enumerate() {
        for a in &d.actions {
            rows.push(i);
            conts.push(a.clone());
        }
    }
    let (lp, _) = model.continuation_logprobs(last, cache, lens, &rows, &conts, None, 1.0, device);
    normalize(lp.sum_dim(1), decisions, temperature, mean, device)
}

/// [`log_probs`] for inference (rollouts, evaluation), each decision's prompt reusing what it
/// shares with `past[i]` (the episode's previous prompt) and all its actions scored in one
/// packed row ([`score_reusing`](super::tree::score_reusing)); also returns each prompt's
/// keys/values for the next step (none for a model that does not
/// [pack prefixes](Lm::packs_prefixes): it computes [`log_probs`]).
pub fn log_probs_reusing<B: Backend, M: Lm<B>>(
    model: &M,
    decisions: &[Decision],
    past: &[Option<&super::tree::SeqCache<B>>],
    temperature: f64,
    mean: bool,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<super::tree::SeqCache<B>>) {
    if !model.packs_prefixes() {
        return (
            log_probs(model, decisions, temperature, mean, device),
            Vec::new(),
        );
    }
    let prompts: Vec<Vec<u32>> = decisions.iter().map(|d| d.prompt.clone()).collect();
    let actions: Vec<Vec<Vec<u32>>> = decisions.iter().map(|d| d.actions.clone()).collect();
    let (lp, _, own) = super::tree::score_reusing(model, &prompts, &actions, past, device);
    (
        normalize(lp.sum_dim(1), decisions, temperature, mean, device),
        own,
    )
}

/// `log π` over each decision's actions from their summed log-likelihoods `[actions, 1]`
/// (decision-major): divided by the action's length when `mean`, by the temperature, padded to
/// `[decisions, max actions]`, log-softmax per decision.
fn normalize<B: Backend>(
    ll: Tensor<B, 2>,
    decisions: &[Decision],
    temperature: f64,
    mean: bool,
    device: &B::Device,
) -> Tensor<B, 2> {
    let n: usize = decisions.iter().map(|d| d.actions.len()).sum();
    let mut ll = ll.reshape([n]);
    if mean {
        let lens: Vec<f32> = decisions
            .iter()
            .flat_map(|d| d.actions.iter().map(|a| a.len() as f32))
            .collect();
        ll = ll.div(float_tensor::<B, 1>(lens, [n], device));
    }
    let amax = decisions
        .iter()
        .map(|d| d.actions.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut idx = Vec::with_capacity(decisions.len() * amax);
    let mut pad = Vec::with_capacity(decisions.len() * amax);
    let mut at = 0usize;
    for d in decisions {
        for k in 0..amax {
            if k < d.actions.len() {
                idx.push((at + k) as i64);
                pad.push(false);
            } else {
                idx.push(0);
                pad.push(true);
            }
        }
        at += d.actions.len();
    }
    let dn = decisions.len();
    let logits = ll
        .select(0, int_tensor::<B, 1>(idx, [dn * amax], device))
        .reshape([dn, amax])
        .div_scalar(temperature)
        .mask_fill(bool_tensor::<B, 2>(pad, [dn, amax], device), -1e9);
    log_softmax(logits, 1)
}

/// A `[rows, cols]` tensor on the host.
/// `log π(chosen | decision)` `[idx.len(), 1]` of the minibatch `idx` (indices into `decisions`
/// and `chosen`), and the tokens it scored (prompts + every admissible action).
#[allow(clippy::too_many_arguments)]
pub fn chosen_log_probs<B: Backend, M: Lm<B>>(
    model: &M,
    decisions: &[Decision],
    chosen: &[usize],
    idx: &[usize],
    temperature: f64,
    mean: bool,
    device: &B::Device,
) -> (Tensor<B, 2>, u64) {
    let decs: Vec<Decision> = idx.iter().map(|i| decisions[*i].clone()).collect();
    let tokens: usize = decs.iter().map(Decision::tokens).sum();
    let pick = int_tensor::<B, 2>(
        idx.iter().map(|i| chosen[*i] as i64).collect(),
        [idx.len(), 1],
        device,
    );
    let lp = log_probs(model, &decs, temperature, mean, device).gather(1, pick);
    (lp, tokens as u64)
}

pub fn to_host<B: Backend>(t: Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [_, cols] = t.dims();
    let flat = t
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 tensor");
    flat.chunks(cols.max(1)).map(<[f32]>::to_vec).collect()
}

/// Sample an index from log-probabilities with a uniform draw `u ∈ [0, 1)`; the last index
/// absorbs rounding.
pub fn sample(logp: &[f32], u: f64) -> usize {
    let mut acc = 0.0f64;
    for (i, lp) in logp.iter().enumerate() {
        acc += f64::from(*lp).exp();
        if u < acc {
            return i;
        }
    }
    logp.len() - 1
}

/// The most likely index (the first on ties).
pub fn greedy(logp: &[f32]) -> usize {
    let mut best = 0;
    for (i, lp) in logp.iter().enumerate() {
        if *lp > logp[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cpu;
    use crate::model::checkpoint::Checkpoint;
    use crate::model::transformer::ModelConfig;

    #[test]
    fn action_distribution_is_normalized_and_batch_independent() {
        let cfg = ModelConfig {
            vocab: 20,
            d_model: 16,
            layers: 2,
            heads: 2,
            context: 32,
        };
        let dev = Default::default();
        let model = Checkpoint::init("policy", &cfg, 5).to_model::<Cpu>(&dev);
        let a = Decision {
            prompt: vec![2, 9, 10, 3, 11, 4],
            actions: vec![vec![12], vec![13, 14], vec![15, 16, 17]],
        };
        let b = Decision {
            prompt: vec![2, 9, 3, 4],
            actions: vec![vec![12], vec![13]],
        };
        let both = to_host(log_probs(&model, &[a.clone(), b.clone()], 1.0, false, &dev));
        let alone = to_host(log_probs(&model, &[a.clone()], 1.0, false, &dev));
        let mean = to_host(log_probs(&model, &[a.clone()], 1.0, true, &dev));
        let total_mean: f64 = mean[0].iter().map(|x| f64::from(*x).exp()).sum();
        assert!((total_mean - 1.0).abs() < 1e-5);
        assert!(
            mean[0] != alone[0],
            "length normalization changes the distribution"
        );
        let total: f64 = both[0].iter().map(|x| f64::from(*x).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        let total_b: f64 = both[1][..2].iter().map(|x| f64::from(*x).exp()).sum();
        assert!((total_b - 1.0).abs() < 1e-5, "{total_b}");
        // Bit for bit, whatever else (and however much padding) shares the batch.
        assert_eq!(both[0][..3], alone[0][..3]);
        let b_alone = to_host(log_probs(
            &model,
            std::slice::from_ref(&b),
            1.0,
            false,
            &dev,
        ));
        assert_eq!(both[1][..2], b_alone[0][..2]);
        // The cached continuation agrees with encoding each prefix from scratch.
        let next_lp = |seq: Vec<u32>, tok: usize| {
            let (last, _, _) = model.encode(&[seq], &dev);
            to_host(log_softmax(last, 1))[0][tok]
        };
        let scratch =
            next_lp(a.prompt.clone(), 13) + next_lp([a.prompt.clone(), vec![13]].concat(), 14);
        let (last, cache, lens) = model.encode(&[a.prompt.clone()], &dev);
        let (lp, valid) = model.continuation_logprobs(
            &last,
            &cache,
            &lens,
            &[0],
            &[vec![13, 14]],
            None,
            1.0,
            &dev,
        );
        assert_eq!(valid, vec![true, true]);
        let cached: f32 = to_host(lp)[0].iter().sum();
        assert!((cached - scratch).abs() < 1e-4, "{cached} vs {scratch}");
        assert_eq!(sample(&[(0.25f32).ln(), (0.75f32).ln()], 0.2), 0);
        assert_eq!(sample(&[(0.25f32).ln(), (0.75f32).ln()], 0.3), 1);
        assert_eq!(greedy(&[-2.0, -0.1, -0.1]), 1);
    }
}
