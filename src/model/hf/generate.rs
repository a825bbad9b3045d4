//! Text generation with the KV cache: a batch of prompts is encoded in one forward, then every
//! live row advances by one token per forward (finished rows are dropped from the batch).
//! Sampling: greedy at temperature 0, else softmax(logits / T) restricted to the top-p nucleus,
//! drawn from a seeded generator per row (equal seeds, equal text).

use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};
use crate::model::lm::{KvCache, Lm, bool_tensor, int_tensor};
use burn::tensor::backend::Backend;

/// How tokens are picked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f64,
    /// Nucleus mass kept (1 = all).
    pub top_p: f64,
    pub max_tokens: usize,
    pub seed: u64,
}

/// `log softmax(logits / T)` of one id (T = 1 when greedy).
fn log_prob(logits: &[f32], id: u32, temperature: f64) -> f64 {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max / t
        + logits
            .iter()
            .map(|&l| ((l as f64 - max) / t).exp())
            .sum::<f64>()
            .ln();
    logits[id as usize] as f64 / t - lse
}

/// The token picked from `logits` (one row).
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.temperature <= 0.0 {
        // Greedy; ties go to the lowest id.
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        return best as u32;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i, ((l as f64 - max) / s.temperature).exp()))
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= total);
    // Highest first, ids ascending among equals: a fixed order for a fixed draw.
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = 0;
    let mut mass = 0.0;
    for p in &probs {
        kept += 1;
        mass += p.1;
        if mass >= s.top_p {
            break;
        }
    }
    let mut u = rng.unit() * mass;
    for p in &probs[..kept] {
        u -= p.1;
        if u <= 0.0 {
            return p.0 as u32;
        }
    }
    probs[kept - 1].0 as u32
}

/// Continue every prompt until one of `eos` (kept in the output) or `max_tokens`; returns the
/// generated ids per prompt. Row `r` samples from `derive_seed(s.seed, ["generate", r])`.
pub fn generate<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    eos: &[u32],
    s: &Sampling,
    device: &B::Device,
) -> Result<Vec<Vec<u32>>> {
    let seeds: Vec<u64> = (0..prompts.len())
        .map(|r| derive_seed(s.seed, &["generate", &r.to_string()]))
        .collect();
    Ok(sample(model, prompts, &seeds, eos, s, device)?
        .into_iter()
        .map(|(ids, _)| ids)
        .collect())
}

/// [`generate`] with one seed per prompt (`s.seed` unused), also returning each reply's
/// log-probability: the sum over its tokens of `log softmax(logits / T)` (T = 1 when greedy).
pub fn sample<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    eos: &[u32],
    s: &Sampling,
    device: &B::Device,
) -> Result<Vec<(Vec<u32>, f64)>> {
    sample_encoded(model, prompts, None, seeds, eos, s, device)
}

/// [`sample`] from prompts already encoded (`encoded`: [`Lm::encode`]'s next-token logits and
/// cache of exactly these prompts, e.g. from
/// [`encode_reusing`](crate::model::tree::encode_reusing)); `None` encodes them here.
pub fn sample_encoded<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    encoded: Option<(burn::tensor::Tensor<B, 2>, KvCache<B>)>,
    seeds: &[u64],
    eos: &[u32],
    s: &Sampling,
    device: &B::Device,
) -> Result<Vec<(Vec<u32>, f64)>> {
    if prompts.iter().any(|p| p.is_empty()) {
        return Err(Error::Model("an empty prompt cannot be continued".into()));
    }
    if seeds.len() != prompts.len() {
        return Err(Error::Model(format!(
            "{} seeds for {} prompts",
            seeds.len(),
            prompts.len()
        )));
    }
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let max = model.context();
    if longest + s.max_tokens > max {
        return Err(Error::Model(format!(
            "prompt ({longest} tokens) + max tokens ({}) exceed the model's context ({max} \
             positions)",
            s.max_tokens
        )));
    }
    let vocab = model.vocab();
    let mut rngs: Vec<Rng> = seeds.iter().map(|&seed| Rng::new(seed)).collect();
    let mut out: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0); prompts.len()];
    if s.max_tokens == 0 || prompts.is_empty() {
        return Ok(out);
    }
    // Encode the right-padded prompts once; t0 is the padded length the cache holds.
    let (last, mut cache) = match encoded {
        Some(e) => e,
        None => {
            let (last, cache, _) = model.encode(prompts, device);
            (last, cache)
        }
    };
    let t0 = cache.layers.first().map_or(0, |(k, _)| k.dims()[2]);
    let logits: Vec<f32> = last
        .into_data()
        .to_vec()
        .map_err(|e| Error::Model(format!("reading logits: {e:?}")))?;
    let mut last: Vec<Vec<f32>> = logits.chunks(vocab).map(|c| c.to_vec()).collect();
    // The prompts still generating, in batch-row order.
    let mut live: Vec<usize> = (0..prompts.len()).collect();
    for step in 0..s.max_tokens {
        let mut next = Vec::with_capacity(live.len());
        let mut keep = Vec::with_capacity(live.len());
        for (slot, &r) in live.iter().enumerate() {
            let tok = pick(&last[slot], s, &mut rngs[r]);
            out[r].0.push(tok);
            out[r].1 += log_prob(&last[slot], tok, s.temperature);
            if !eos.contains(&tok) && step + 1 < s.max_tokens {
                keep.push(slot);
                next.push(tok);
            }
        }
        if keep.is_empty() {
            break;
        }
        if keep.len() != live.len() {
            cache = cache.select_rows(&keep, device);
            live = keep.iter().map(|&slot| live[slot]).collect();
        }
        // Row r's new token sits at position len_r + step and sees its prompt (keys < len_r)
        // and its generated tokens (keys t0 ..= t0 + step).
        let keys = t0 + step + 1;
        let positions: Vec<i64> = live
            .iter()
            .map(|&r| (prompts[r].len() + step) as i64)
            .collect();
        let mut mask = Vec::with_capacity(live.len() * keys);
        for &r in &live {
            for k in 0..keys {
                mask.push(!(k < prompts[r].len() || k >= t0));
            }
        }
        let tokens: Vec<i64> = next.iter().map(|&t| t as i64).collect();
        let n = live.len();
        crate::model::count::record(n, 0);
        let logits = model.forward(
            int_tensor(tokens, [n, 1], device),
            int_tensor(positions, [n, 1], device),
            bool_tensor(mask, [n, 1, keys], device),
            Some(&mut cache),
        );
        let logits: Vec<f32> = logits
            .into_data()
            .to_vec()
            .map_err(|e| Error::Model(format!("reading logits: {e:?}")))?;
        last = logits.chunks(vocab).map(|c| c.to_vec()).collect();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_top_p_keeps_the_nucleus() {
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_tokens: 1,
            seed: 0,
        };
        let mut rng = Rng::new(1);
        assert_eq!(pick(&[0.0, 2.0, 2.0, 1.0], &greedy, &mut rng), 1);
        // p = softmax([10, 9, 0, 0]) ≈ [0.73, 0.27, ~0, ~0]: top_p 0.5 keeps only id 0.
        let nucleus = Sampling {
            temperature: 1.0,
            top_p: 0.5,
            ..greedy.clone()
        };
        for _ in 0..50 {
            assert_eq!(pick(&[10.0, 9.0, 0.0, 0.0], &nucleus, &mut rng), 0);
        }
        // top_p 0.9 keeps ids 0 and 1, both drawn.
        let wider = Sampling {
            top_p: 0.9,
            ..nucleus
        };
        let drawn: std::collections::BTreeSet<u32> = (0..200)
            .map(|_| pick(&[10.0, 9.0, 0.0, 0.0], &wider, &mut rng))
            .collect();
        assert_eq!(drawn.into_iter().collect::<Vec<_>>(), vec![0, 1]);
    }
}
