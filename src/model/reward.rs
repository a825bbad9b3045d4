//! The generative reward model: for a step it writes a short critique (words from
//! [`CRITIQUE`](super::tokenizer::CRITIQUE)) and then a verdict token, `<good>` (+1) or `<bad>`
//! (−1); no verdict within `max_tokens` scores 0 (unparsable). Sampling is restricted to those
//! words, at the RM temperature, m samples per step, each with its own seed; the prompt is
//! encoded once per step and every sample continues from the key/value cache.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::hf::HfTokenizer;
use super::hf::prompt::parse_verdict;
use super::lm::{Lm, bool_tensor, float_tensor, int_tensor};
use super::policy::to_host;
use super::tokenizer::{BAD, GOOD, PAD, Tokenizer};
use crate::determinism::Rng;
use crate::determinism::derive_seed;
use crate::error::Result;

/// One RM sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Generated tokens: critique words, then the verdict if one came.
    pub tokens: Vec<u32>,
    /// The critique words as text.
    pub reasoning: String,
    /// +1 `<good>`, −1 `<bad>`, 0 no verdict.
    pub score: i8,
    /// Sum of the sampled tokens' log-probabilities under the sampling distribution.
    pub logprob: f64,
}

/// What a reward model may write and how its verdict is read: rla-pipe's small model writes
/// critique words then `<good>` / `<bad>`; a pretrained model writes free text through its
/// chat template, ending its turn, with the verdict in `\boxed{±1}`
/// ([`parse_verdict`](super::hf::prompt::parse_verdict)).
#[derive(Clone, Copy)]
pub enum Verdicts<'a> {
    Words(&'a Tokenizer),
    /// A pretrained model, and the text that opens its replies (part of the prompt).
    Text(&'a HfTokenizer, &'a str),
}

impl Verdicts<'_> {
    /// The token ids it may sample (`None`: the whole vocabulary).
    pub fn allowed(&self) -> Option<Vec<u32>> {
        match self {
            Verdicts::Words(t) => Some(allowed_ids(t)),
            Verdicts::Text(..) => None,
        }
    }

    /// Tokens that end a response.
    pub fn stops(&self) -> Vec<u32> {
        match self {
            Verdicts::Words(t) => vec![t.special(GOOD), t.special(BAD)],
            Verdicts::Text(t, _) => t.eos_ids.clone(),
        }
    }

    fn pad(&self) -> u32 {
        match self {
            Verdicts::Words(t) => t.special(PAD),
            Verdicts::Text(t, _) => t.eos_ids.first().copied().unwrap_or(0),
        }
    }

    /// Whether a reply that opened with a reply prefix has closed it (`\boxed{` … `}`): the
    /// verdict is given and generation stops there. Never for a reply of its own.
    pub fn closed(&self, tokens: &[u32]) -> bool {
        match self {
            Verdicts::Text(t, prefix) if prefix.contains('{') => t
                .decode(tokens, true)
                .map(|text| text.contains('}'))
                .unwrap_or(false),
            _ => false,
        }
    }

    /// The reasoning text and the verdict (+1, −1, 0 = none) of generated tokens.
    pub fn judge(&self, tokens: &[u32]) -> (String, i8) {
        match self {
            Verdicts::Words(t) => parse(t, tokens),
            Verdicts::Text(t, prefix) => {
                let text = format!("{prefix}{}", t.decode(tokens, true).unwrap_or_default());
                let score = parse_verdict(&text);
                (text, score)
            }
        }
    }

    /// A response as the `rm_samples.response` column holds it.
    pub fn response_text(&self, tokens: &[u32]) -> String {
        match self {
            Verdicts::Words(t) => tokens
                .iter()
                .map(|id| t.token(*id))
                .collect::<Vec<_>>()
                .join(" "),
            Verdicts::Text(t, _) => t.decode(tokens, false).unwrap_or_default(),
        }
    }

    /// The tokens of an `rm_samples.response` (for a pretrained model: the text re-tokenized,
    /// its canonical tokenization).
    pub fn response_ids(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Verdicts::Words(t) => Ok(t.encode(text)),
            Verdicts::Text(t, _) => t.encode(text, false),
        }
    }

    /// A `[vocab]` bias restricting sampling to [`Self::allowed`] (none when all are allowed).
    pub fn bias<B: Backend>(&self, vocab: usize, device: &B::Device) -> Option<Tensor<B, 1>> {
        self.allowed().map(|ids| {
            let mut bias = vec![-1e9f32; vocab];
            for id in ids {
                bias[id as usize] = 0.0;
            }
            float_tensor(bias, [vocab], device)
        })
    }
}

/// Token ids the RM may generate: the critique words, then `<good>`, `<bad>`.
pub fn allowed_ids(tok: &Tokenizer) -> Vec<u32> {
    let mut v = tok.critique_ids();
    v.push(tok.special(GOOD));
    v.push(tok.special(BAD));
    v
}

/// Per-token log-probabilities `[idx.len(), longest]` of `responses[i]` as continuations of
/// `prompts[i]` for the minibatch `idx` (sampling restricted by `bias`), the validity mask
/// (row-major, `false` past a response's end) and the tokens it scored.
#[allow(clippy::too_many_arguments)]
pub fn response_log_probs<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    idx: &[usize],
    bias: Option<&Tensor<B, 1>>,
    temperature: f64,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<bool>, u64) {
    let p: Vec<&[u32]> = idx.iter().map(|i| prompts[*i].as_slice()).collect();
    let r: Vec<&[u32]> = idx.iter().map(|i| responses[*i].as_slice()).collect();
    let tokens: usize =
        p.iter().map(|x| x.len()).sum::<usize>() + r.iter().map(|x| x.len()).sum::<usize>();
    let (lp, valid) = packed_response_log_probs(model, &p, &r, bias, temperature, device);
    (lp, valid, tokens as u64)
}

/// Samples whose prompts share at least this many leading tokens are packed into one prefix
/// tree (the m samples of a step share their whole prompt; a pretrained model's chat prompts
/// share their system text and task).
pub const TREE_MIN_SHARED: usize = 16;
/// The most tokens one packed row holds (attention is quadratic in it).
pub const TREE_MAX_ROW: usize = 1024;

/// Per-token log-probabilities of `responses[i]` after `prompts[i]`, samples packed into prefix
/// trees ([`super::tree::pack`]) where the model [packs prefixes](Lm::packs_prefixes) (else
/// every response continues from its own encoded prompt): `[n, longest response]` in input
/// order and its validity mask.
pub fn packed_response_log_probs<B: Backend, M: Lm<B>>(
    model: &M,
    prompts: &[&[u32]],
    responses: &[&[u32]],
    bias: Option<&Tensor<B, 1>>,
    temperature: f64,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<bool>) {
    if !model.packs_prefixes() {
        let p: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
        let r: Vec<Vec<u32>> = responses.iter().map(|r| r.to_vec()).collect();
        let (last, cache, lens) = model.encode(&p, device);
        let rows: Vec<usize> = (0..p.len()).collect();
        return model.continuation_logprobs(
            &last,
            &cache,
            &lens,
            &rows,
            &r,
            bias,
            temperature,
            device,
        );
    }
    let (rows, slot) = super::tree::pack(prompts, responses, TREE_MIN_SHARED, TREE_MAX_ROW);
    let (lp, valid) = super::tree::tree_logprobs(model, &rows, bias, temperature, device);
    let n = slot.len();
    let l = valid.len() / n.max(1);
    let mut back = vec![false; n * l];
    for (i, &k) in slot.iter().enumerate() {
        back[i * l..(i + 1) * l].copy_from_slice(&valid[k * l..(k + 1) * l]);
    }
    let order = int_tensor::<B, 1>(slot.iter().map(|k| *k as i64).collect(), [n], device);
    (lp.select(0, order), back)
}

/// The judgement of a response given as tokens (the inverse of generation's bookkeeping).
pub fn parse(tok: &Tokenizer, tokens: &[u32]) -> (String, i8) {
    let (good, bad) = (tok.special(GOOD), tok.special(BAD));
    let mut words = Vec::new();
    for t in tokens {
        if *t == good {
            return (words.join(" "), 1);
        }
        if *t == bad {
            return (words.join(" "), -1);
        }
        words.push(tok.token(*t));
    }
    (words.join(" "), 0)
}

/// The sampling state of `m` judgements per prompt: row `r` is sample `r % m` of prompt
/// `r / m` and draws from `derive_seed(seeds[r / m], r % m)`.
struct Draws<'a> {
    verdicts: Verdicts<'a>,
    allowed: Vec<u32>,
    stops: Vec<u32>,
    temperature: f64,
    rngs: Vec<Rng>,
    /// Per row: tokens so far, their log-probability, finished.
    out: Vec<(Vec<u32>, f64, bool)>,
    m: usize,
}

impl<'a> Draws<'a> {
    fn new(verdicts: Verdicts<'a>, vocab: usize, seeds: &[u64], m: usize, t: f64) -> Self {
        let rngs: Vec<Rng> = (0..seeds.len() * m)
            .map(|r| Rng::new(derive_seed(seeds[r / m], &[&(r % m).to_string()])))
            .collect();
        Draws {
            verdicts,
            allowed: verdicts
                .allowed()
                .unwrap_or_else(|| (0..vocab as u32).collect()),
            stops: verdicts.stops(),
            temperature: t,
            out: vec![(Vec::new(), 0.0, false); rngs.len()],
            rngs,
            m,
        }
    }

    /// One token for every live row from its next-token logits (`logits(r)`); returns what
    /// each row feeds next (the pad token for a finished row).
    fn step<'l>(&mut self, logits: impl Fn(usize) -> &'l [f32]) -> Vec<i64> {
        let pad = self.verdicts.pad() as i64;
        let mut fed = Vec::with_capacity(self.out.len());
        for r in 0..self.out.len() {
            if self.out[r].2 {
                fed.push(pad);
                continue;
            }
            let row = logits(r);
            let z: Vec<f64> = self
                .allowed
                .iter()
                .map(|id| f64::from(row[*id as usize]) / self.temperature)
                .collect();
            let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = mx + z.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
            let u = self.rngs[r].unit();
            let mut acc = 0.0;
            let mut pick = self.allowed.len() - 1;
            for (k, x) in z.iter().enumerate() {
                acc += (x - lse).exp();
                if u < acc {
                    pick = k;
                    break;
                }
            }
            let t = self.allowed[pick];
            fed.push(self.take(r, t, z[pick] - lse));
        }
        fed
    }

    /// Row `r`'s token `t` of log-probability `lp`; returns what the row feeds next.
    fn take(&mut self, r: usize, t: u32, lp: f64) -> i64 {
        let (tokens, sum, done) = &mut self.out[r];
        tokens.push(t);
        *sum += lp;
        *done = self.stops.contains(&t) || self.verdicts.closed(tokens);
        t as i64
    }

    /// [`step`](Self::step) from `logits` (`[rows, vocab]`) left on the device: each live row's
    /// uniform number goes to the device, where its allowed tokens' probabilities are summed in
    /// their order (f32; the host sums in f64) and the token where the running sum first
    /// exceeds the number is taken, with its log-probability; only those two values a row are
    /// read back instead of the vocabulary's logits (a GPU's path,
    /// [`device_picks`](super::hf::generate::device_picks)).
    fn step_on_device<B: Backend>(&mut self, logits: Tensor<B, 2>) -> Vec<i64> {
        let pad = self.verdicts.pad() as i64;
        let [n, vocab] = logits.dims();
        let device = &logits.device();
        if n == 0 || self.live() == 0 {
            return vec![pad; n];
        }
        let units: Vec<f32> = (0..n)
            .map(|r| match self.out[r].2 {
                true => 0.0,
                false => self.rngs[r].unit() as f32,
            })
            .collect();
        let a = self.allowed.len();
        let z = match a == vocab {
            true => logits,
            false => {
                let ids = self.allowed.iter().map(|&t| i64::from(t)).collect();
                logits.select(1, int_tensor(ids, [a], device))
            }
        }
        .div_scalar(self.temperature);
        let max = z.clone().max_dim(1);
        let lse = (z.clone() - max.clone()).exp().sum_dim(1).log() + max;
        let u = float_tensor::<B, 2>(units, [n, 1], device);
        let pick = first_past((z.clone() - lse.clone()).exp(), u).clamp_max(a as i64 - 1);
        let lp = z.gather(1, pick.clone()) - lse;
        let read = to_host(Tensor::cat(vec![pick.float(), lp], 1));
        (0..n)
            .map(|r| match self.out[r].2 {
                true => pad,
                false => {
                    let t = self.allowed[read[r][0] as usize];
                    self.take(r, t, f64::from(read[r][1]))
                }
            })
            .collect()
    }

    /// [`step`](Self::step) from every row's logits (`[rows, vocab]`), on the device where
    /// [`device_picks`](super::hf::generate::device_picks) says so, else read to the host.
    fn step_from<B: Backend>(&mut self, logits: Tensor<B, 2>) -> Vec<i64> {
        match super::hf::generate::device_picks::<B>(true) {
            true => self.step_on_device(logits),
            false => {
                let host = to_host(logits);
                self.step(|r| &host[r])
            }
        }
    }

    fn live(&self) -> usize {
        self.out.iter().filter(|o| !o.2).count()
    }

    /// The judgements, per prompt.
    fn finish(self) -> Vec<Vec<Judgement>> {
        let mut per_prompt: Vec<Vec<Judgement>> = (0..self.out.len() / self.m.max(1))
            .map(|_| Vec::with_capacity(self.m))
            .collect();
        for (r, (tokens, lp, _)) in self.out.into_iter().enumerate() {
            let (reasoning, score) = self.verdicts.judge(&tokens);
            per_prompt[r / self.m].push(Judgement {
                tokens,
                reasoning,
                score,
                logprob: lp,
            });
        }
        per_prompt
    }
}

/// Per row of `p` (`[rows, a]`, non-negative), the first index whose running sum exceeds the
/// row's `u` (`[rows, 1]`), `a` if none: the count of running sums at most `u`. burn-cubecl's
/// running sum computes each entry's prefix alone (a² additions a row), so the row is cut into
/// about √a blocks of about √a: the block where the sum passes `u` is found from the blocks'
/// running sums, then the index within it.
fn first_past<B: Backend>(p: Tensor<B, 2>, u: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    let [rows, a] = p.dims();
    let width = (a as f64).sqrt().ceil().max(1.0) as usize;
    let blocks = a.div_ceil(width);
    let pad = blocks * width - a;
    let device = p.device();
    let p = match pad {
        0 => p,
        _ => Tensor::cat(vec![p, Tensor::zeros([rows, pad], &device)], 1),
    }
    .reshape([rows, blocks, width]);
    let sums = p.clone().sum_dim(2).reshape([rows, blocks]);
    let running = sums.clone().cumsum(1);
    let count = |running: Tensor<B, 2>, u: &Tensor<B, 2>| {
        let [_, c] = running.dims();
        running
            .lower_equal(u.clone().expand([rows, c]))
            .int()
            .sum_dim(1)
    };
    let block = count(running.clone(), &u).clamp_max(blocks as i64 - 1);
    // The sum before that block, and its entries' running sums from there.
    let before = (running - sums).gather(1, block.clone());
    let inside = p
        .gather(
            1,
            block.clone().reshape([rows, 1, 1]).expand([rows, 1, width]),
        )
        .reshape([rows, width])
        .cumsum(1)
        + before;
    block.mul_scalar(width as i64) + count(inside, &u)
}

/// `m` judgements for each prompt; sample `j` of prompt `p` draws from `derive_seed(seeds[p], j)`.
/// The prompt's cache is copied to each of its samples (rla-pipe's small model: the committed
/// numbers of its runs come from this computation); a pretrained model uses
/// [`generate_shared`].
#[allow(clippy::too_many_arguments)]
pub fn generate<B: Backend, M: Lm<B>>(
    model: &M,
    verdicts: Verdicts<'_>,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    m: usize,
    max_tokens: usize,
    temperature: f64,
    device: &B::Device,
) -> Vec<Vec<Judgement>> {
    let (last, cache, lens) = model.encode(prompts, device);
    let rows: Vec<usize> = (0..prompts.len())
        .flat_map(|p| std::iter::repeat_n(p, m))
        .collect();
    let n = rows.len();
    let tp = cache.keys();
    let mut cache = cache.select_rows(&rows, device);
    // Room for the tokens to come, written in place ([`super::kv`]).
    cache.reserve(max_tokens);
    let row_idx = int_tensor::<B, 1>(rows.iter().map(|r| *r as i64).collect(), [n], device);
    let mut logits = last.select(0, row_idx);
    let mut draws = Draws::new(verdicts, model.vocab(), seeds, m, temperature);
    let ctx = model.context();
    for g in 0..max_tokens {
        let fed = draws.step_from(logits.clone());
        if g + 1 == max_tokens || draws.live() == 0 {
            break;
        }
        let mut pos = Vec::with_capacity(n);
        let mut mask = Vec::with_capacity(n * (tp + g + 1));
        for r in 0..n {
            let plen = lens[rows[r]];
            pos.push(((plen + g).min(ctx - 1)) as i64);
            mask.extend((0..tp).map(|k| k >= plen));
            mask.extend(std::iter::repeat_n(false, g + 1));
        }
        let v = model.vocab();
        super::count::record(draws.live(), 0);
        logits = model
            .forward(
                int_tensor(fed, [n, 1], device),
                int_tensor(pos, [n, 1], device),
                bool_tensor(mask, [n, 1, tp + g + 1], device),
                Some(&mut cache),
            )
            .reshape([n, v]);
    }
    draws.finish()
}

/// [`generate`] from prompts already encoded ([`Lm::encode`]'s or
/// [`encode_reusing`](super::tree::encode_reusing)'s next-token logits `[prompts, vocab]`, batch
/// cache and prompt lengths), without copying a prompt's keys per sample: each prompt stays
/// one row, and every step feeds its m samples' tokens side by side, each seeing the prompt and
/// its own earlier tokens (a tree mask over the keys `[prompt | step 0's m tokens | step 1's
/// …]`). Same draws as [`generate`]; the numbers differ from it only in the order of
/// floating-point sums.
#[allow(clippy::too_many_arguments)]
pub fn generate_shared<B: Backend, M: Lm<B>>(
    model: &M,
    verdicts: Verdicts<'_>,
    last: Tensor<B, 2>,
    mut cache: super::lm::KvCache<B>,
    lens: &[usize],
    seeds: &[u64],
    m: usize,
    max_tokens: usize,
    temperature: f64,
    device: &B::Device,
) -> Vec<Vec<Judgement>> {
    let p = lens.len();
    let tp = cache.keys();
    let v = model.vocab();
    let ctx = model.context();
    let mut draws = Draws::new(verdicts, v, seeds, m, temperature);
    if max_tokens == 0 {
        return draws.finish();
    }
    // Room for the m tokens of each step to come, written in place ([`super::kv`]).
    cache.reserve(m * max_tokens);
    // Step 0 reads each prompt's own next-token logits, once for its m samples.
    let mut fed = match super::hf::generate::device_picks::<B>(true) {
        true => {
            let rows = (0..p * m).map(|r| (r / m) as i64).collect();
            draws.step_on_device(last.select(0, int_tensor(rows, [p * m], device)))
        }
        false => {
            let first = to_host(last);
            draws.step(|r| &first[r / m])
        }
    };
    for g in 0..max_tokens.saturating_sub(1) {
        if draws.live() == 0 {
            break;
        }
        let keys = tp + m * (g + 1);
        let mut pos = Vec::with_capacity(p * m);
        let mut mask = vec![true; p * m * keys];
        for (row, &plen) in lens.iter().enumerate() {
            for j in 0..m {
                pos.push(((plen + g).min(ctx - 1)) as i64);
                let at = (row * m + j) * keys;
                mask[at..at + plen].iter_mut().for_each(|x| *x = false);
                (0..=g).for_each(|s| mask[at + tp + s * m + j] = false);
            }
        }
        super::count::record(draws.live(), 0);
        let logits = model
            .forward(
                int_tensor(fed, [p, m], device),
                int_tensor(pos, [p, m], device),
                bool_tensor(mask, [p, m, keys], device),
                Some(&mut cache),
            )
            .reshape([p * m, v]);
        fed = draws.step_from(logits);
    }
    draws.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cpu;
    use crate::model::checkpoint::Checkpoint;
    use crate::model::transformer::ModelConfig;

    #[test]
    fn generation_is_seeded_restricted_and_matches_teacher_forcing() {
        let tok = Tokenizer::words(&["at 1 2 goal north".into()]);
        let cfg = ModelConfig {
            vocab: tok.vocab_size(),
            d_model: 16,
            layers: 1,
            heads: 2,
            context: 32,
        };
        let dev = Default::default();
        let model = Checkpoint::init("rm", &cfg, 9).to_model::<Cpu>(&dev);
        let prompts = vec![
            tok.encode("<bos> at 1 2 <critic>"),
            tok.encode("<bos> goal <critic>"),
        ];
        let v = Verdicts::Words(&tok);
        let a = generate(&model, v, &prompts, &[1, 2], 3, 4, 0.8, &dev);
        let b = generate(&model, v, &prompts[..1], &[1], 3, 4, 0.8, &dev);
        assert_eq!(a[0], b[0], "a prompt's samples do not depend on the batch");
        // Nor on the padding a longer prompt in its batch adds.
        let c = generate(&model, v, &prompts[1..], &[2], 3, 4, 0.8, &dev);
        assert_eq!(
            a[1], c[0],
            "a short prompt's samples do not depend on the batch's padding"
        );
        let allowed = allowed_ids(&tok);
        for j in a.iter().flatten() {
            assert!(j.tokens.iter().all(|t| allowed.contains(t)));
            assert!(!j.tokens.is_empty() && j.tokens.len() <= 4);
            assert_eq!(parse(&tok, &j.tokens), (j.reasoning.clone(), j.score));
            assert_eq!(
                j.score == 0,
                j.tokens.len() == 4
                    && !matches!(*j.tokens.last().unwrap(), t if t == tok.special(GOOD) || t == tok.special(BAD))
            );
        }
        // The recorded log-probability is what teacher forcing computes for the same tokens.
        let (last, cache, lens) = model.encode(&prompts, &dev);
        let bias = v.bias::<Cpu>(cfg.vocab, &dev).unwrap();
        let conts: Vec<Vec<u32>> = a.iter().flatten().map(|j| j.tokens.clone()).collect();
        let rows: Vec<usize> = vec![0, 0, 0, 1, 1, 1];
        let (lp, _) = model.continuation_logprobs(
            &last,
            &cache,
            &lens,
            &rows,
            &conts,
            Some(&bias),
            0.8,
            &dev,
        );
        for (r, row) in to_host(lp).iter().enumerate() {
            let j = &a[rows[r]][r % 3];
            let s: f32 = row.iter().sum();
            assert!(
                (f64::from(s) - j.logprob).abs() < 1e-3,
                "{s} vs {}",
                j.logprob
            );
        }
    }
}
