//! Text generation with the KV cache: a batch of prompts is encoded in one forward, then every
//! live row advances by one token per forward (finished rows are dropped from the batch).
//! Sampling: greedy at temperature 0, else softmax(logits / T) restricted to the top-p nucleus,
//! drawn from a seeded generator per row (equal seeds, equal text).

use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};
use crate::model::lm::{KvCache, Lm, bool_tensor, int_tensor};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

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
/// ascending among equal probabilities): below `top_p = 1` the nucleus is the shortest such
/// prefix whose mass reaches `top_p`, at 1 it is the whole vocabulary (mass 1), and the token
/// is where a uniform draw over that mass falls ([`draw`]). Most draws end within a row's first
/// few tokens, so the walk first orders only the 64 most likely (one linear-time selection of
/// `(logit, id)` keys, their probabilities following the logits' order, checked, with ties in
/// probability put back in id order) and goes on to 1,024 and then to the whole vocabulary only
/// when the draw reaches past them: exactly the token that sorting every probability draws
/// ([`pick_by_probabilities`], the definition; equal on every input,
/// `fast_pick_equals_the_definition`). Over a 49,152-token vocabulary the sort was most of a
/// sampled token's host time.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.temperature <= 0.0 {
        return greedy(logits);
    }
    pick_at(logits, s, rng.unit(), &HOST_LEADS).0
}

/// The greedy token: the first maximum (ties go to the lowest id).
fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// How many of a row's most likely tokens [`pick`] orders first, then next; past the last, all.
const HOST_LEADS: [usize; 2] = [64, 1024];

/// The draw at a temperature with the uniform number `unit`, ordering the `leads[i]` most likely
/// tokens in turn until the draw ends among them ([`pick`]); with the number of tokens ordered.
fn pick_at(logits: &[f32], s: &Sampling, unit: f64, leads: &[usize]) -> (u32, usize) {
    if logits.len() > u32::MAX as usize || logits.iter().any(|l| !l.is_finite()) {
        return (definition(logits, s, unit), logits.len());
    }
    let probs = probabilities(logits, s.temperature);
    let n = logits.len();
    // Logits descending, ids ascending: the complement of an order-preserving map of the f32
    // bits in the high half, the id in the low half.
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (u64::from(!ordered_bits(l)) << 32) | i as u64)
        .collect();
    for k in leads.iter().copied().filter(|&k| k > 0 && k < n).chain([n]) {
        if k < n {
            keys.select_nth_unstable(k);
        }
        keys[..k].sort_unstable();
        let mut order: Vec<usize> = keys[..k].iter().map(|&key| (key as u32) as usize).collect();
        // The largest probability past the first k (none when they are all).
        let rest = keys[k..]
            .iter()
            .map(|&key| probs[(key as u32) as usize])
            .fold(f64::NEG_INFINITY, f64::max);
        // exp is monotone, so a lower logit never has a higher probability — checked, since
        // the draw must not depend on the platform's exp: an inversion takes the definition's
        // path. Distinct logits can round to one probability; such a run goes back to id order.
        let mut i = 0;
        while i < order.len() {
            let mut j = i + 1;
            while j < order.len() && probs[order[j]] == probs[order[i]] {
                j += 1;
            }
            let below = if j < order.len() {
                probs[order[j]]
            } else {
                rest
            };
            if below > probs[order[i]] {
                return (definition(logits, s, unit), n);
            }
            if j - i > 1 {
                order[i..j].sort_unstable();
            }
            i = j;
        }
        // Tokens as likely as one past the first k may follow it in id order: the walk's
        // known part is the tokens strictly more likely than every other.
        let known = order.iter().take_while(|&&i| probs[i] > rest).count();
        let lead = order[..known].iter().map(|&i| (i, probs[i]));
        if let Some(token) = draw(lead, k == n, s.top_p, unit) {
            return (token, k);
        }
    }
    unreachable!("the whole vocabulary decides every draw")
}

/// The definition of a draw at a temperature: the probabilities sorted highest first, ids
/// ascending among equals, then [`draw`]. [`pick`] takes a faster path to the same token.
pub fn pick_by_probabilities(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    definition(logits, s, rng.unit())
}

fn definition(logits: &[f32], s: &Sampling, unit: f64) -> u32 {
    let probs = probabilities(logits, s.temperature);
    let mut sorted: Vec<(usize, f64)> = probs.into_iter().enumerate().collect();
    // Highest first, ids ascending among equals: a fixed order for a fixed draw.
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    draw(sorted.into_iter(), true, s.top_p, unit).expect("the whole vocabulary decides a draw")
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

/// The draw over `(id, probability)` in walking order with the uniform number `unit`: below
/// `top_p = 1` the nucleus is the shortest prefix whose mass reaches `top_p` (summed in that
/// order), at 1 every token with mass 1; the token is where `unit · mass` falls in it (the
/// nucleus's last if rounding leaves the walk short). `lead` is the whole walk when `whole`,
/// else only its start: then `None` when the draw depends on a token past it.
fn draw(
    lead: impl Iterator<Item = (usize, f64)> + Clone,
    whole: bool,
    top_p: f64,
    unit: f64,
) -> Option<u32> {
    let (kept, mass) = if top_p < 1.0 {
        let mut kept = 0;
        let mut mass = 0.0;
        for (_, p) in lead.clone() {
            kept += 1;
            mass += p;
            if mass >= top_p {
                break;
            }
        }
        if mass < top_p && !whole {
            return None;
        }
        (kept, mass)
    } else {
        (usize::MAX, 1.0)
    };
    let mut u = unit * mass;
    let mut last = None;
    for (i, p) in lead.take(kept) {
        u -= p;
        if u <= 0.0 {
            return Some(i as u32);
        }
        last = Some(i as u32);
    }
    if whole || kept != usize::MAX {
        last
    } else {
        None
    }
}

/// Each row's next token and its log-probability from its logits and, at a temperature, its
/// uniform number (`units`, one per row; empty when greedy). Rows on parallel threads: each
/// row's draw is its own, so the tokens do not depend on how rows are split.
fn pick_rows(rows: &[&[f32]], units: &[f64], s: &Sampling) -> Vec<(u32, f64)> {
    let one = |r: usize| {
        let logits = rows[r];
        let tok = match units.get(r) {
            Some(&unit) => pick_at(logits, s, unit, &HOST_LEADS).0,
            None => greedy(logits),
        };
        (tok, log_prob(logits, tok, s.temperature))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if rows.len() < 2 || threads < 2 {
        return (0..rows.len()).map(one).collect();
    }
    let per = rows.len().div_ceil(threads);
    let mut out = vec![(0u32, 0.0f64); rows.len()];
    std::thread::scope(|scope| {
        for (c, outs) in out.chunks_mut(per).enumerate() {
            let one = &one;
            scope.spawn(move || {
                for (j, o) in outs.iter_mut().enumerate() {
                    *o = one(c * per + j);
                }
            });
        }
    });
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
    // Draws made, and those a device's leading tokens did not decide (their rows read whole).
    let (mut draws, mut far) = (0usize, 0usize);
    for step in 0..s.max_tokens {
        let mut keep = Vec::with_capacity(live.len());
        // One uniform number per live row at a temperature, from the row's own generator.
        let units: Vec<f64> = match s.temperature > 0.0 {
            true => live.iter().map(|&slot| rngs[rows[slot]].unit()).collect(),
            false => Vec::new(),
        };
        let picked = last.pick(&live, &units, s, vocab, &mut far)?;
        draws += live.len();
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
    if matches!(last, Next::Leads(..)) {
        tracing::debug!(draws, far, "sampled from the device's leading tokens");
    }
    Ok(out)
}

thread_local! {
    static DEVICE_PICKS: std::cell::Cell<(Option<bool>, Option<usize>)> =
        const { std::cell::Cell::new((None, None)) };
}

/// Pick tokens on the device on any backend (`Some(true)`), never, or as the backend chooses
/// (`None`) on this thread, with `lead` leading tokens read per row when sampling (`None`: the
/// device's count) (tests: the device's picks equal the host's on the CPU).
#[doc(hidden)]
pub fn force_device_picks(on: Option<bool>, lead: Option<usize>) {
    DEVICE_PICKS.with(|f| f.set((on, lead)));
}

/// How many of a row's most likely tokens a draw on the device reads ([`Next::Leads`]): at a
/// temperature of 1 a small model's next token is most often among them; a draw that reaches
/// past them reads that row's logits.
const DEVICE_LEAD: usize = 32;

/// Whether models on `B` pick their tokens on the device on this thread, greedy or `sampled`
/// at a temperature: as forced ([`force_device_picks`]; `RLA_PIPE_DEVICE_PICKS=on` forces them
/// on any backend, to see on a CPU what a GPU reads), else on a GPU unless its kernels are off
/// (`RLA_PIPE_CUDA_KERNELS=off`) or, for draws at a temperature, device sampling is
/// (`RLA_PIPE_DEVICE_SAMPLING=off`: every row's logits read, as before).
pub(crate) fn device_picks<B: Backend>(sampled: bool) -> bool {
    static SAMPLING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        (std::env::var("RLA_PIPE_DEVICE_PICKS").as_deref() == Ok("on")).then_some(true)
    });
    let thread = DEVICE_PICKS.with(std::cell::Cell::get).0;
    thread.or(*forced).unwrap_or_else(|| {
        crate::model::backend::is_cuda::<B>()
            && super::fused::gpu_kernels()
            && (!sampled
                || *SAMPLING.get_or_init(|| {
                    std::env::var("RLA_PIPE_DEVICE_SAMPLING").map_or(true, |v| v != "off")
                }))
    })
}

/// The next token of every cache row: its logits read to the host, where [`pick_rows`]
/// draws; or, on a GPU, only what decides the pick: greedy, each row's token and
/// log-probability picked on the device (two values a row cross instead of the vocabulary's);
/// at a temperature, each row's [`DEVICE_LEAD`] most likely tokens with their logits and the
/// row's softmax sum ([`device_picks`] says which).
enum Next<B: Backend> {
    Logits(Vec<Vec<f32>>),
    Greedy(Vec<(u32, f64)>),
    /// Per row, the tokens whose place in the walk is known; the logits stay on the device for
    /// a draw that reaches past them.
    Leads(Vec<Lead>, Tensor<B, 2>),
}

/// A row's most likely tokens in walking order (probability descending, ids ascending among
/// equals), each more likely than any token not read: `(id, probability, log-probability)`.
struct Lead(Vec<(usize, f64, f64)>);

impl Lead {
    /// From the `k` largest logits of a row (`logits`, their `ids`; any order) and the row's
    /// `Σ exp((l − max) / T)` summed on the device (`total`): the probabilities relative to that
    /// sum, so within f32's rounding of the host's, which sums in f64.
    fn new(logits: &[f32], ids: &[f32], total: f32, temperature: f64) -> Lead {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let ln_total = f64::from(total).ln();
        let mut all: Vec<(usize, f64, f64)> = logits
            .iter()
            .zip(ids)
            .map(|(&l, &id)| {
                let z = (l as f64 - max) / temperature;
                (id as usize, z.exp() / f64::from(total), z - ln_total)
            })
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        // No token not read has a larger logit than the least read one, so none is more
        // likely: the known walk is the tokens strictly more likely than that one.
        let rest = all.last().map_or(f64::INFINITY, |t| t.1);
        all.retain(|t| t.1 > rest);
        Lead(all)
    }
}

impl<B: Backend> Next<B> {
    fn read(logits: Tensor<B, 2>, s: &Sampling, vocab: usize) -> Result<Next<B>> {
        let lead = DEVICE_PICKS.with(std::cell::Cell::get).1;
        if s.temperature <= 0.0 && device_picks::<B>(false) {
            // A maximum (on ties, the backend's argmax: the host takes the lowest id) and its
            // log-probability, −log Σ exp(l − max); read in one transfer, the ids as f32
            // (exact below 2²⁴, far above any vocabulary).
            let max = logits.clone().max_dim(1);
            let ids = logits.clone().argmax(1).float();
            let lp = (logits - max).exp().sum_dim(1).log().neg();
            let both = to_vec(Tensor::cat(vec![ids, lp], 1), "picks")?;
            let picks = both.chunks(2).map(|p| (p[0] as u32, f64::from(p[1])));
            return Ok(Next::Greedy(picks.collect()));
        }
        let k = lead.unwrap_or(DEVICE_LEAD).min(vocab.saturating_sub(1));
        if s.temperature > 0.0 && device_picks::<B>(true) && k > 0 {
            // The k largest logits and their ids, and Σ exp((l − max) / T): one transfer.
            let max = logits.clone().max_dim(1);
            let total = (logits.clone() - max)
                .div_scalar(s.temperature)
                .exp()
                .sum_dim(1);
            let ids = leading(logits.clone(), k);
            let values = logits.clone().gather(1, ids.clone());
            let read = to_vec(Tensor::cat(vec![values, ids.float(), total], 1), "leads")?;
            let leads = read
                .chunks(2 * k + 1)
                .map(|r| Lead::new(&r[..k], &r[k..2 * k], r[2 * k], s.temperature));
            return Ok(Next::Leads(leads.collect(), logits));
        }
        let logits = to_vec(logits, "logits")?;
        Ok(Next::Logits(
            logits.chunks(vocab).map(|c| c.to_vec()).collect(),
        ))
    }

    /// The token and log-probability of each of the cache rows `live` (not greedy on the
    /// device), drawn with `units` (one per live row; none when greedy). A draw from a row's
    /// leading tokens that reaches past them reads the row's logits and draws on the host with
    /// the same number; `far` counts those.
    fn pick(
        &self,
        live: &[usize],
        units: &[f64],
        s: &Sampling,
        vocab: usize,
        far: &mut usize,
    ) -> Result<Vec<(u32, f64)>> {
        match self {
            Next::Greedy(picks) => Ok(live.iter().map(|&slot| picks[slot]).collect()),
            Next::Logits(last) => {
                let rows: Vec<&[f32]> = live.iter().map(|&slot| last[slot].as_slice()).collect();
                Ok(pick_rows(&rows, units, s))
            }
            Next::Leads(leads, logits) => {
                let mut picked: Vec<Option<(u32, f64)>> = live
                    .iter()
                    .zip(units)
                    .map(|(&slot, &unit)| {
                        let known = &leads[slot].0;
                        let tok = draw(known.iter().map(|t| (t.0, t.1)), false, s.top_p, unit)?;
                        known
                            .iter()
                            .find(|t| t.0 == tok as usize)
                            .map(|t| (tok, t.2))
                    })
                    .collect();
                let past: Vec<usize> = (0..live.len()).filter(|&j| picked[j].is_none()).collect();
                if past.is_empty() {
                    return Ok(picked.into_iter().flatten().collect());
                }
                *far += past.len();
                let which: Vec<i64> = past.iter().map(|&j| live[j] as i64).collect();
                let which = int_tensor(which, [past.len()], &logits.device());
                let rows = logits.clone().select(0, which);
                let rows = to_vec(rows, "logits")?;
                let rows: Vec<&[f32]> = rows.chunks(vocab).collect();
                let units: Vec<f64> = past.iter().map(|&j| units[j]).collect();
                for (&j, p) in past.iter().zip(pick_rows(&rows, &units, s)) {
                    picked[j] = Some(p);
                }
                Ok(picked.into_iter().flatten().collect())
            }
        }
    }
}

/// The ids of each row's `k` largest values (`x [rows, n]`, `k < n`; in no particular order,
/// ties taken either way). burn-cubecl's top-k runs a row on one unit, so a vocabulary's row is
/// cut into blocks of `8k` first: each block's `k` largest on a unit of its own, then the `k`
/// largest of those.
fn leading<B: Backend>(x: Tensor<B, 2>, k: usize) -> Tensor<B, 2, Int> {
    let [rows, n] = x.dims();
    let width = 8 * k;
    let blocks = n.div_ceil(width);
    if blocks < 2 {
        return top(x, k);
    }
    let device = x.device();
    // The last block padded with the lowest value (never above a real one: `k < n`).
    let pad = blocks * width - n;
    let x = match pad {
        0 => x,
        _ => Tensor::cat(vec![x, Tensor::full([rows, pad], f32::MIN, &device)], 1),
    }
    .reshape([rows * blocks, width]);
    let first = top(x.clone(), k);
    let values = x.gather(1, first.clone()).reshape([rows, blocks * k]);
    // Each block's ids in its row: the offset of its block added.
    let offsets: Vec<i64> = (0..rows * blocks)
        .map(|b| ((b % blocks) * width) as i64)
        .collect();
    let ids = (first + int_tensor::<B, 2>(offsets, [rows * blocks, 1], &device))
        .reshape([rows, blocks * k]);
    ids.gather(1, top(values, k))
}

/// The ids of each row's `k` largest values: burn's top-k on a GPU; a sort elsewhere (the CPU's
/// backend has no top-k; tests).
fn top<B: Backend>(x: Tensor<B, 2>, k: usize) -> Tensor<B, 2, Int> {
    match crate::model::backend::is_cuda::<B>() {
        true => x.argtopk(k, 1),
        false => x.sort_descending_with_indices(1).1.narrow(1, 0, k),
    }
}

/// A tensor's values on the host.
fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>, what: &str) -> Result<Vec<f32>> {
    t.into_data()
        .to_vec()
        .map_err(|e| Error::Model(format!("reading {what}: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path draws exactly the definition's token (and leaves the generator in the
    /// same state) on every input: logits with repeated values, logits whose probabilities
    /// round to one value or to 0 (a low temperature), narrow and wide nuclei.
    #[test]
    fn fast_pick_equals_the_definition() {
        let mut zeros = 0;
        for (case, (logits, s)) in rows(11, 400).into_iter().enumerate() {
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

    /// Rows drawn on parallel threads draw what one thread draws, row by row, each with its
    /// own uniform number.
    #[test]
    fn rows_on_threads_draw_what_one_thread_draws() {
        let mut source = Rng::new(5);
        let last: Vec<Vec<f32>> = (0..9)
            .map(|_| (0..500).map(|_| (source.unit() * 12.0) as f32).collect())
            .collect();
        let s = Sampling {
            temperature: 0.8,
            top_p: 0.95,
            max_tokens: 1,
            seed: 0,
        };
        let rows: Vec<&[f32]> = last.iter().map(|r| r.as_slice()).collect();
        let units: Vec<f64> = (0..9).map(|r| Rng::new(100 + r).unit()).collect();
        let got = pick_rows(&rows, &units, &s);
        for r in 0..9 {
            let tok = pick(&last[r], &s, &mut Rng::new(100 + r as u64));
            assert_eq!(got[r], (tok, log_prob(&last[r], tok, s.temperature)));
        }
        let greedy = Sampling {
            temperature: 0.0,
            ..s
        };
        for (r, (tok, _)) in pick_rows(&rows, &[], &greedy).into_iter().enumerate() {
            assert_eq!(tok, pick(&last[r], &greedy, &mut Rng::new(0)));
        }
    }

    /// Random rows of logits (some values repeated, some probabilities rounding to 0) and
    /// samplings, as [`fast_pick_equals_the_definition`] draws them.
    fn rows(seed: u64, n: usize) -> Vec<(Vec<f32>, Sampling)> {
        let mut source = Rng::new(seed);
        (0..n)
            .map(|case| {
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
                (logits, s)
            })
            .collect()
    }

    /// Ordering only the leading tokens first draws the definition's token whatever their
    /// number: one, a few, the host's counts, and draws that end past them (so that every path
    /// is taken: decided among the leading tokens, and gone on to the next count).
    #[test]
    fn drawing_from_the_leading_tokens_draws_the_definitions_token() {
        let (mut within, mut past) = (0, 0);
        for (case, (logits, s)) in rows(12, 300).into_iter().enumerate() {
            for draw in 0..4u64 {
                let unit = Rng::new(case as u64 * 7 + draw).unit();
                let want = definition(&logits, &s, unit);
                for leads in [&[1][..], &[2, 8], &[5], &HOST_LEADS] {
                    let (got, ordered) = pick_at(&logits, &s, unit, leads);
                    assert_eq!(got, want, "case {case} leads {leads:?}: {s:?} {logits:?}");
                    if leads == [5] && logits.len() > 5 {
                        match ordered {
                            5 => within += 1,
                            _ => past += 1,
                        }
                    }
                }
            }
        }
        assert!(within > 0 && past > 0);
    }

    /// A draw from a row's leading tokens as the device reads them ([`Lead`]: the k largest
    /// logits and an f32 softmax sum) draws the host's token whenever it is decided among
    /// them, with the host's log-probability within 1e-6; it is undecided (`None`, the row
    /// then read whole) only when the walk reaches past them, and at k = 1 (no known token)
    /// always.
    #[test]
    fn the_devices_leading_tokens_draw_the_hosts_token() {
        let (mut decided, mut undecided) = (0, 0);
        for (case, (logits, s)) in rows(13, 300).into_iter().enumerate() {
            if logits.len() < 2 {
                continue;
            }
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = logits
                .iter()
                .map(|&l| ((l - max) / s.temperature as f32).exp())
                .sum();
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            for k in [1, 4, 32] {
                let k = k.min(logits.len() - 1);
                let top: Vec<f32> = order[..k].iter().map(|&i| logits[i]).collect();
                let ids: Vec<f32> = order[..k].iter().map(|&i| i as f32).collect();
                let lead = Lead::new(&top, &ids, total, s.temperature);
                if k == 1 {
                    assert!(lead.0.is_empty());
                }
                for draw in 0..4u64 {
                    let unit = Rng::new(case as u64 * 5 + draw).unit();
                    let known = lead.0.iter().map(|t| (t.0, t.1));
                    match super::draw(known, false, s.top_p, unit) {
                        Some(tok) => {
                            decided += 1;
                            assert_eq!(tok, definition(&logits, &s, unit), "case {case} k {k}");
                            let lp = lead.0.iter().find(|t| t.0 == tok as usize).unwrap().2;
                            let host = log_prob(&logits, tok, s.temperature);
                            assert!((lp - host).abs() <= 1e-6 * host.abs().max(1.0));
                        }
                        None => undecided += 1,
                    }
                }
            }
        }
        assert!(decided > 100 && undecided > 100, "{decided} {undecided}");
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
