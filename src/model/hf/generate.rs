//! Text generation with the KV cache: a batch of prompts is encoded in one forward, then every
//! live row advances by one token per forward (finished rows are dropped from the batch).
//! Sampling: greedy at temperature 0, else softmax(logits / T) restricted to the top-p nucleus,
//! drawn from a seeded generator per row (equal seeds, equal text).

use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};
use crate::model::lm::{KvCache, Lm, bool_tensor, int_tensor};
use burn::tensor::Tensor;
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
///
/// At a temperature the draw walks the vocabulary from the most likely token down (ids
/// ascending among equal probabilities): the nucleus is the shortest such prefix whose mass
/// reaches `top_p`, and the token is where a uniform draw over that mass falls. The order is
/// found by sorting the logits' bits (one integer sort of `(logit, id)` keys; the probabilities
/// follow the logits' order, checked, with ties in probability put back in id order), which
/// draws exactly what sorting the probabilities themselves draws ([`pick_by_probabilities`],
/// the definition; equal for every input, `fast_pick_equals_the_definition`) in about a third
/// of the time: over a 49,152-token vocabulary the sort was most of a sampled token's host time.
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
    if logits.len() > u32::MAX as usize || logits.iter().any(|l| !l.is_finite()) {
        return pick_by_probabilities(logits, s, rng);
    }
    let probs = probabilities(logits, s.temperature);
    // Logits descending, ids ascending: the complement of an order-preserving map of the f32
    // bits in the high half, the id in the low half.
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (u64::from(!ordered_bits(l)) << 32) | i as u64)
        .collect();
    keys.sort_unstable();
    let mut order: Vec<usize> = keys.iter().map(|&k| (k as u32) as usize).collect();
    // exp is monotone, so a lower logit never has a higher probability — checked, since the
    // draw must not depend on the platform's exp: an inversion takes the definition's path.
    // Distinct logits can round to one probability; such a run goes back to id order.
    let mut i = 0;
    while i < order.len() {
        let mut j = i + 1;
        while j < order.len() && probs[order[j]] == probs[order[i]] {
            j += 1;
        }
        if j < order.len() && probs[order[j]] > probs[order[i]] {
            return pick_by_probabilities(logits, s, rng);
        }
        if j - i > 1 {
            order[i..j].sort_unstable();
        }
        i = j;
    }
    draw(order.iter().map(|&i| (i, probs[i])), s.top_p, rng)
}

/// The definition of a draw at a temperature: the probabilities sorted highest first, ids
/// ascending among equals, then [`draw`]. [`pick`] takes a faster path to the same token.
pub fn pick_by_probabilities(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    let probs = probabilities(logits, s.temperature);
    let mut sorted: Vec<(usize, f64)> = probs.into_iter().enumerate().collect();
    // Highest first, ids ascending among equals: a fixed order for a fixed draw.
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    draw(sorted.into_iter(), s.top_p, rng)
}

/// softmax(logits / T), normalized by the sum in id order.
fn probabilities(logits: &[f32], temperature: f64) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    probs
}

/// An f32's bits mapped so that unsigned order is the floats' order (finite values).
fn ordered_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 { !b } else { b | 0x8000_0000 }
}

/// The draw over `(id, probability)` in walking order: the nucleus is the shortest prefix whose
/// mass reaches `top_p` (summed in that order), the token where `unit · mass` falls in it.
fn draw(sorted: impl Iterator<Item = (usize, f64)> + Clone, top_p: f64, rng: &mut Rng) -> u32 {
    let mut kept = 0;
    let mut mass = 0.0;
    let mut last = 0;
    for (i, p) in sorted.clone() {
        kept += 1;
        mass += p;
        last = i;
        if mass >= top_p {
            break;
        }
    }
    let mut u = rng.unit() * mass;
    for (i, p) in sorted.take(kept) {
        u -= p;
        if u <= 0.0 {
            return i as u32;
        }
    }
    last as u32
}

/// Each live row's next token and its log-probability: `rows` holds each row's logits and its
/// generator's index in `rngs`. Rows on parallel threads (each row draws from its own
/// generator, so the tokens do not depend on how rows are split).
fn pick_rows(rows: &[(&[f32], usize)], s: &Sampling, rngs: &mut [Rng]) -> Vec<(u32, f64)> {
    let one = |logits: &[f32], rng: &mut Rng| {
        let tok = pick(logits, s, rng);
        (tok, log_prob(logits, tok, s.temperature))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if rows.len() < 2 || threads < 2 {
        return rows
            .iter()
            .map(|&(logits, r)| one(logits, &mut rngs[r]))
            .collect();
    }
    let mut mine: Vec<Rng> = rows.iter().map(|&(_, r)| rngs[r].clone()).collect();
    let per = rows.len().div_ceil(threads);
    let mut out = vec![(0u32, 0.0f64); rows.len()];
    std::thread::scope(|scope| {
        for ((rows, rngs), outs) in rows
            .chunks(per)
            .zip(mine.chunks_mut(per))
            .zip(out.chunks_mut(per))
        {
            scope.spawn(move || {
                for (((logits, _), rng), o) in rows.iter().zip(rngs).zip(outs) {
                    *o = one(logits, rng);
                }
            });
        }
    });
    for (&(_, r), rng) in rows.iter().zip(mine) {
        rngs[r] = rng;
    }
    out
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
    let t0 = cache.keys();
    // Room for every token this call may append: each is then written in place, not the
    // whole cache copied per token ([`crate::model::kv`]).
    cache.reserve(s.max_tokens);
    let mut last = Next::read(last, s, vocab)?;
    // Cache row i continues prompt `rows[i]`; `live` are the cache rows still generating. On
    // the CPU the finished rows leave the cache; on the device layout ([`crate::model::kv`])
    // they stay (their outputs unread), so that every step has the same shapes.
    let compact = !crate::model::kv::device_layout::<B>();
    let mut rows: Vec<usize> = (0..prompts.len()).collect();
    let mut live: Vec<usize> = rows.clone();
    let mut next: Vec<u32> = vec![0; rows.len()];
    for step in 0..s.max_tokens {
        let mut keep = Vec::with_capacity(live.len());
        let picked = match &last {
            Next::Logits(last) => {
                let picking: Vec<(&[f32], usize)> = live
                    .iter()
                    .map(|&slot| (last[slot].as_slice(), rows[slot]))
                    .collect();
                pick_rows(&picking, s, &mut rngs)
            }
            Next::Greedy(picks) => live.iter().map(|&slot| picks[slot]).collect(),
        };
        for (&slot, (tok, lp)) in live.iter().zip(picked) {
            let r = rows[slot];
            out[r].0.push(tok);
            out[r].1 += lp;
            next[slot] = tok;
            if !eos.contains(&tok) && step + 1 < s.max_tokens {
                keep.push(slot);
            }
        }
        if keep.is_empty() {
            break;
        }
        if keep.len() != live.len() && compact {
            cache = cache.select_rows(&keep, device);
            cache.reserve(s.max_tokens - step);
            rows = keep.iter().map(|&slot| rows[slot]).collect();
            next = keep.iter().map(|&slot| next[slot]).collect();
            live = (0..rows.len()).collect();
        } else {
            live = keep;
        }
        // Row r's new token sits at position len_r + step and sees its prompt (keys < len_r)
        // and its generated tokens (keys t0 ..= t0 + step).
        let keys = t0 + step + 1;
        let positions: Vec<i64> = rows
            .iter()
            .map(|&r| (prompts[r].len() + step) as i64)
            .collect();
        let mut mask = Vec::with_capacity(rows.len() * keys);
        for &r in &rows {
            for k in 0..keys {
                mask.push(!(k < prompts[r].len() || k >= t0));
            }
        }
        let tokens: Vec<i64> = next.iter().map(|&t| t as i64).collect();
        let n = rows.len();
        crate::model::count::record(live.len(), 0);
        let logits = model.forward(
            int_tensor(tokens, [n, 1], device),
            int_tensor(positions, [n, 1], device),
            bool_tensor(mask, [n, 1, keys], device),
            Some(&mut cache),
        );
        last = Next::read(logits.reshape([n, vocab]), s, vocab)?;
    }
    Ok(out)
}

thread_local! {
    static DEVICE_GREEDY: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Pick greedy tokens on the device on any backend (`Some(true)`), never, or as the backend
/// chooses (`None`) on this thread (tests: the device's picks equal the host's on the CPU).
#[doc(hidden)]
pub fn force_device_greedy(on: Option<bool>) {
    DEVICE_GREEDY.with(|f| f.set(on));
}

/// The next token of every cache row: its logits read to the host, where [`pick_rows`]
/// samples; or, greedy on a GPU, each row's token and log-probability picked on the device, so
/// that two values a row cross instead of the vocabulary's (`RLA_PIPE_CUDA_KERNELS=off` reads
/// the logits, as before).
enum Next {
    Logits(Vec<Vec<f32>>),
    Greedy(Vec<(u32, f64)>),
}

impl Next {
    fn read<B: Backend>(logits: Tensor<B, 2>, s: &Sampling, vocab: usize) -> Result<Next> {
        let on_device = DEVICE_GREEDY.with(std::cell::Cell::get).unwrap_or_else(|| {
            crate::model::backend::is_cuda::<B>() && super::fused::gpu_kernels()
        });
        if s.temperature <= 0.0 && on_device {
            // A maximum (on ties, the backend's argmax: the host takes the lowest id) and its
            // log-probability, −log Σ exp(l − max); read in one transfer, the ids as f32
            // (exact below 2²⁴, far above any vocabulary).
            let max = logits.clone().max_dim(1);
            let ids = logits.clone().argmax(1).float();
            let lp = (logits - max).exp().sum_dim(1).log().neg();
            let both: Vec<f32> = Tensor::cat(vec![ids, lp], 1)
                .into_data()
                .to_vec()
                .map_err(|e| Error::Model(format!("reading picks: {e:?}")))?;
            let picks = both.chunks(2).map(|p| (p[0] as u32, f64::from(p[1])));
            return Ok(Next::Greedy(picks.collect()));
        }
        let logits: Vec<f32> = logits
            .into_data()
            .to_vec()
            .map_err(|e| Error::Model(format!("reading logits: {e:?}")))?;
        Ok(Next::Logits(
            logits.chunks(vocab).map(|c| c.to_vec()).collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path draws exactly the definition's token (and leaves the generator in the
    /// same state) on every input: logits with repeated values, logits whose probabilities
    /// round to one value or to 0 (a low temperature), narrow and wide nuclei.
    #[test]
    fn fast_pick_equals_the_definition() {
        let mut source = Rng::new(11);
        let mut zeros = 0;
        for case in 0..400 {
            let vocab = 1 + (source.next_u64() % 300) as usize;
            let spread = [0.5, 4.0, 40.0][case % 3];
            let logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    let x = ((source.unit() - 0.5) * spread) as f32;
                    // Every fourth case repeats a few values exactly.
                    if case % 4 == 0 {
                        (x * 2.0).round() / 2.0
                    } else {
                        x
                    }
                })
                .collect();
            let s = Sampling {
                temperature: [1.0, 0.8, 0.05, 0.001][case % 4],
                top_p: [1.0, 0.9, 0.5, 0.05][(case / 4) % 4],
                max_tokens: 1,
                seed: 0,
            };
            let probs = probabilities(&logits, s.temperature);
            zeros += probs.iter().filter(|p| **p == 0.0).count();
            for draw in 0..5u64 {
                let mut a = Rng::new(case as u64 * 31 + draw);
                let mut b = a.clone();
                assert_eq!(
                    pick(&logits, &s, &mut a),
                    pick_by_probabilities(&logits, &s, &mut b),
                    "case {case} draw {draw}: {s:?} {logits:?}"
                );
                assert_eq!(a.next_u64(), b.next_u64());
            }
        }
        assert!(
            zeros > 0,
            "some probabilities round to 0 (ties of distinct logits)"
        );
    }

    /// Rows drawn on parallel threads draw what one thread draws, row by row.
    #[test]
    fn rows_on_threads_draw_what_one_thread_draws() {
        let mut source = Rng::new(5);
        let last: Vec<Vec<f32>> = (0..9)
            .map(|_| (0..500).map(|_| (source.unit() * 12.0) as f32).collect())
            .collect();
        let live: Vec<usize> = vec![3, 0, 8, 1, 5, 2, 7, 4, 6];
        let s = Sampling {
            temperature: 0.8,
            top_p: 0.95,
            max_tokens: 1,
            seed: 0,
        };
        let fresh = || (0..9).map(|r| Rng::new(100 + r)).collect::<Vec<_>>();
        let mut threaded = fresh();
        let rows: Vec<(&[f32], usize)> = live
            .iter()
            .enumerate()
            .map(|(slot, &r)| (last[slot].as_slice(), r))
            .collect();
        let got = pick_rows(&rows, &s, &mut threaded);
        let mut one = fresh();
        for (slot, &r) in live.iter().enumerate() {
            let tok = pick(&last[slot], &s, &mut one[r]);
            assert_eq!(got[slot], (tok, log_prob(&last[slot], tok, s.temperature)));
        }
        for (a, b) in threaded.iter_mut().zip(one.iter_mut()) {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

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
