//! PPO for both models (DESIGN.md, Formulas): clipped surrogate with ε on every response token
//! (for the policy the response is one decision: the chosen admissible action), log-ratio
//! clamped, k3 KL estimator against the pre-update snapshot with coefficient β, token mean per
//! sample then batch mean; AdamW; the gradient clipped to a global norm.
//!
//! The snapshot is the checkpoint the iteration's rollouts (or RM samples) came from, so it
//! supplies both the "old" log-probabilities of the ratio and the KL reference; they are
//! recomputed here with the same code path as training, so the first step's ratio is exactly 1.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::determinism::Rng;
use crate::model::count::{counting, record};

/// PPO settings (from `[reward]` and `[update]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoSettings {
    pub clip_eps: f64,
    pub kl_beta: f64,
    pub log_ratio_clamp: f64,
    pub lr: f64,
    pub weight_decay: f64,
    /// AdamW's ε.
    pub adam_eps: f64,
    pub grad_clip: f64,
    /// Optimizer steps.
    pub steps: u32,
    /// Samples per minibatch (`Fixed`) or per accumulated micro-batch (`OnePass`).
    pub minibatch: usize,
    pub schedule: Schedule,
    /// Most tokens per backward pass (`update.micro_batch_tokens`): a minibatch whose samples
    /// hold more is split into micro-batches whose gradients are accumulated — the same
    /// gradient up to the order of float sums, with the autodiff graph of one micro-batch in
    /// memory at a time. 0: no limit.
    pub micro_tokens: usize,
    /// Micro-batches whose forward and backward passes run at once, one per thread
    /// (`update.threads`): each thread differentiates its own copy of the parameters (the same
    /// values), and the gradients are summed in micro-batch order, so the result is the same
    /// to the last bit as one at a time; memory holds that many autodiff graphs.
    pub threads: usize,
    /// Early stop (`update.target_kl`): the update ends before a step whose minibatch's KL to
    /// the pre-update snapshot (measured by that step's forward, before it moves anything)
    /// exceeds 1.5 × this — Stable-Baselines3's rule. 0: every planned step is taken.
    pub target_kl: f64,
    /// The update runs on a GPU (`run.device = "cuda"`): the gradient norm's squared sums stay
    /// on the device and cross to the host at once (one synchronisation per step,
    /// [`global_norm`]), and AdamW's step is one kernel per parameter
    /// ([`super::adamw::FusedAdamW`], unless `RLA_PIPE_CUDA_KERNELS=off`); otherwise each
    /// parameter's sum is read in turn and burn's AdamW steps (the CPU's bits).
    pub gpu: bool,
    /// A pretrained model's training calls keep only their layers' inputs, and each layer's
    /// backward pass recomputes it (`update.checkpoint_layers`,
    /// [`super::hf::checkpointed`]): less memory for one more forward pass of the layers.
    pub checkpoint_layers: bool,
}

pub use super::config::Schedule;

/// The samples of every optimizer step, as micro-batches whose gradients are summed (weighted
/// by size) before the step.
pub fn plan(n: usize, s: &PpoSettings, seed: u64) -> Vec<Vec<Vec<usize>>> {
    if n == 0 || s.steps == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(seed);
    for i in (1..n).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mb = s.minibatch.clamp(1, n);
    match s.schedule {
        Schedule::Fixed => {
            let mut at = 0usize;
            (0..s.steps)
                .map(|_| {
                    let batch: Vec<usize> = (0..mb).map(|k| order[(at + k) % n]).collect();
                    at = (at + mb) % n;
                    vec![batch]
                })
                .collect()
        }
        Schedule::OnePass => {
            let k = (s.steps as usize).min(n);
            (0..k)
                .map(|j| {
                    order[j * n / k..(j + 1) * n / k]
                        .chunks(mb)
                        .map(<[usize]>::to_vec)
                        .collect()
                })
                .collect()
        }
    }
}

/// What one optimizer step reports (a row of `update_metrics`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMetrics {
    pub loss: f64,
    pub kl: f64,
    pub clip_frac: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub samples: u32,
    /// Response tokens in the minibatch.
    pub tokens: u64,
}

/// Loss, mean k3 KL and clip fraction (scalars) of per-token log-probabilities `[n, len]`.
/// `valid` is 1 for real tokens and 0 for padding; `adv` is `[n, 1]`.
pub fn ppo_loss<B: Backend>(
    new: Tensor<B, 2>,
    old: Tensor<B, 2>,
    reference: Tensor<B, 2>,
    adv: Tensor<B, 2>,
    valid: Tensor<B, 2>,
    s: &PpoSettings,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let c = s.log_ratio_clamp;
    let ratio = (new.clone() - old).clamp(-c, c).exp();
    let pg1 = -(ratio.clone() * adv.clone());
    let pg2 = -(ratio.clamp(1.0 - s.clip_eps, 1.0 + s.clip_eps) * adv);
    let clipped = pg2.clone().greater(pg1.clone()).float();
    let pg = pg1.max_pair(pg2);
    let d = (reference - new).clamp(-c, c);
    let k3 = d.clone().exp() - d - 1.0;
    let count = valid.clone().sum_dim(1);
    let token_mean = |x: Tensor<B, 2>| (x * valid.clone()).sum_dim(1).div(count.clone()).mean();
    let loss = token_mean(pg + k3.clone().mul_scalar(s.kl_beta));
    (loss, token_mean(k3), token_mean(clipped))
}

/// The samples whose old (snapshot) log-probabilities a pass must compute before training, in
/// index order. A model that packs shared prefixes (a pretrained one) takes them from step 0's
/// own forward pass for the samples step 0 holds (its model is the snapshot), so the pass
/// covers only the samples a later step reaches and step 0 does not — not the samples no step
/// of this update reaches at all (with `steps × minibatch` below the samples, most of them).
/// The small transformer's pass covers every sample, the computation its committed numbers
/// were made with. No step, no pass.
pub fn before_training(n: usize, s: &PpoSettings, seed: u64, packs_prefixes: bool) -> Vec<usize> {
    let plan = plan(n, s, seed);
    let Some(first) = plan.first() else {
        return Vec::new();
    };
    if !packs_prefixes {
        return (0..n).collect();
    }
    let mut at_first = vec![false; n];
    for &i in first.iter().flatten() {
        at_first[i] = true;
    }
    let mut later = vec![false; n];
    for &i in plan[1..].iter().flatten().flatten() {
        later[i] = !at_first[i];
    }
    (0..n).filter(|&i| later[i]).collect()
}

/// The old (snapshot) log-probabilities of every sample (`T`: a sample's values): computed
/// before training ([`before_training`]), or taken from step 0's own forward pass as each
/// micro-batch reaches it (its model is the snapshot: ratio 1 at step 0, the same values to
/// the last bits but for the order of float sums in a batch of other samples). Shared by the threads
/// of [`train`]'s micro-batches.
pub struct OldLogprobs<T>(std::sync::Mutex<Vec<Option<T>>>);

impl<T: Clone> OldLogprobs<T> {
    /// Old values from a pass before training (`None`: to be taken at step 0).
    pub fn new(values: Vec<Option<T>>) -> Self {
        OldLogprobs(std::sync::Mutex::new(values))
    }

    /// The old values of the samples `idx`; if any is not known yet (step 0 of a reusing
    /// update, whose model is the snapshot), they are `fresh()`: the micro-batch's own values,
    /// one per sample in `idx`'s order.
    pub fn get_or_fill(&self, idx: &[usize], fresh: impl FnOnce() -> Vec<T>) -> Vec<T> {
        let mut old = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idx.iter().any(|i| old[*i].is_none()) {
            for (i, v) in idx.iter().zip(fresh()) {
                old[*i].get_or_insert(v);
            }
        }
        idx.iter()
            .map(|i| old[*i].clone().expect("filled above"))
            .collect()
    }

    /// Every sample's old values (`None` for a sample no step reached).
    pub fn into_vec(self) -> Vec<Option<T>> {
        self.0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Run the optimizer steps [`plan`] lays out over the samples (`sizes[i]`: sample `i`'s tokens),
/// each micro-batch split further to at most `s.micro_tokens` tokens ([`split_by_tokens`]).
/// `loss_of(model, indices)` returns a micro-batch's (loss, kl, clip_frac, tokens); a step's
/// gradient is the size-weighted sum of its micro-batches' gradients (one micro-batch: exactly
/// its gradient).
pub fn train<B: AutodiffBackend, M: AutodiffModule<B>>(
    mut model: M,
    sizes: &[usize],
    s: &PpoSettings,
    seed: u64,
    loss_of: impl Fn(&M, &[usize]) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>, u64) + Sync,
) -> (M, Vec<StepMetrics>) {
    let mut metrics = Vec::new();
    let steps: Vec<Vec<Vec<usize>>> = plan(sizes.len(), s, seed)
        .into_iter()
        .map(|micro| split_by_tokens(micro, sizes, s.micro_tokens))
        .collect();
    if steps.is_empty() {
        return (model, metrics);
    }
    let adam = super::adamw::FusedAdamW::new(s.weight_decay, s.adam_eps);
    let mut optim = Adam::new(&adam, s.gpu && super::hf::fused::gpu_kernels());
    let threads = s.threads.max(1);
    for micro in steps {
        let total: usize = micro.iter().map(Vec::len).sum();
        let (mut loss_v, mut kl_v, mut clip_v, mut tokens) = (0.0, 0.0, 0.0, 0u64);
        let mut summed = GradientsParams::new();
        for group in micro.chunks(threads) {
            let one = |m: &M, batch: &[usize]| {
                let w = batch.len() as f64 / total as f64;
                let w = (micro.len() > 1).then_some(w);
                micro_batch(m, batch, w, s.checkpoint_layers, &loss_of)
            };
            // Each result is added to the sum as soon as it is there (in micro-batch order), so
            // at most one micro-batch's gradients wait beside the sum.
            let mut absorb = |batch: &[usize], r: MicroResult| {
                let w = batch.len() as f64 / total as f64;
                loss_v += w * r.loss;
                kl_v += w * r.kl;
                clip_v += w * r.clip;
                tokens += r.tokens;
                model.visit(&mut Accumulate::<B> {
                    grads: r.grads,
                    into: &mut summed,
                    _b: std::marker::PhantomData,
                });
            };
            if group.len() == 1 {
                absorb(&group[0], one(&model, &group[0]));
            } else {
                // Each other thread differentiates a fork of the parameters: fresh autodiff
                // leaves with the same ids and values, so the graphs stay apart.
                let device = model.devices().into_iter().next();
                std::thread::scope(|sc| {
                    let others: Vec<_> = group[1..]
                        .iter()
                        .map(|batch| {
                            let mine = match &device {
                                Some(d) => model.clone().fork(d),
                                None => model.clone(),
                            };
                            sc.spawn(move || counting(|| one(&mine, batch)))
                        })
                        .collect();
                    absorb(&group[0], one(&model, &group[0]));
                    for (h, batch) in others.into_iter().zip(&group[1..]) {
                        let (r, counted) = h.join().expect("an update thread panicked");
                        record(counted.computed as usize, counted.reused as usize);
                        absorb(batch, r);
                    }
                })
            }
        }
        // The policy has moved far enough from the snapshot on these samples: stop before
        // stepping on them (the step's forward already measured its KL).
        if s.target_kl > 0.0 && kl_v > 1.5 * s.target_kl {
            break;
        }
        let norm = global_norm(&model, &summed, s.gpu);
        let by = match norm > s.grad_clip {
            true => s.grad_clip / (norm + 1e-6),
            false => 1.0,
        };
        model = optim.step(s.lr, model, summed, by);
        // A GPU backend's memory pools keep every page they once allocated, and the
        // micro-batches' shapes all differ: hand back the pages no tensor uses any more (a
        // no-op on the CPU).
        if let Some(d) = model.devices().first() {
            super::device_memory::note_gpu_reserved::<B>();
            B::memory_cleanup(d);
        }
        metrics.push(StepMetrics {
            loss: loss_v,
            kl: kl_v,
            clip_frac: clip_v,
            grad_norm: norm,
            samples: total as u32,
            tokens,
        });
    }
    (model, metrics)
}

/// The optimizer: burn's AdamW, or on the GPU the same step as one kernel per parameter (with
/// the handle that sets the clip's factor inside it).
pub enum Adam<B: AutodiffBackend, M: AutodiffModule<B>> {
    Burn(OptimizerAdaptor<AdamW, M, B>),
    Fused(
        OptimizerAdaptor<super::adamw::FusedAdamW, M, B>,
        super::adamw::FusedAdamW,
    ),
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Adam<B, M> {
    /// `adam`'s optimizer for `M`: its fused step (`fused`), or burn's AdamW with its settings.
    pub fn new(adam: &super::adamw::FusedAdamW, fused: bool) -> Self {
        match fused {
            true => Adam::Fused(adam.clone().init::<B, M>(), adam.clone()),
            false => Adam::Burn(adam.burn().init::<B, M>()),
        }
    }

    /// One step on the gradients scaled by `by` (the global-norm clip's factor): the fused step
    /// scales each gradient itself, burn's takes a pass over them first (none at 1).
    pub fn step(&mut self, lr: f64, model: M, mut grads: GradientsParams, by: f64) -> M {
        match self {
            Adam::Burn(o) => {
                if by != 1.0 {
                    scale_gradients(&model, &mut grads, by);
                }
                o.step(lr, model, grads)
            }
            Adam::Fused(o, adam) => {
                adam.scale_gradients(by);
                o.step(lr, model, grads)
            }
        }
    }
}

/// One micro-batch's loss terms and its gradient (weighted by `w` when the step has several).
struct MicroResult {
    loss: f64,
    kl: f64,
    clip: f64,
    tokens: u64,
    grads: GradientsParams,
}

fn micro_batch<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    batch: &[usize],
    w: Option<f64>,
    checkpoint_layers: bool,
    loss_of: &impl Fn(&M, &[usize]) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>, u64),
) -> MicroResult {
    let scalar = |t: Tensor<B, 1>| f64::from(t.into_scalar().elem::<f32>());
    let ((loss, kl, clip, tokens), deferred) = match checkpoint_layers {
        true => super::tape::record(|| loss_of(model, batch)),
        false => (loss_of(model, batch), Vec::new()),
    };
    let (loss_v, kl, clip) = (scalar(loss.clone()), scalar(kl), scalar(clip));
    let loss = match w {
        Some(w) => loss.mul_scalar(w),
        None => loss,
    };
    MicroResult {
        loss: loss_v,
        kl,
        clip,
        tokens,
        grads: gradients(model, loss, deferred),
    }
}

/// The gradients of `loss` for `model`'s parameters: its backward pass, then the deferred
/// passes of the checkpointed calls that made it ([`super::tape`]), summed in.
pub fn gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    loss: Tensor<B, 1>,
    deferred: Vec<super::tape::Deferred>,
) -> GradientsParams {
    let mut grads = loss.backward();
    // Each part is summed in as soon as it is there: one layer's gradients wait beside the sum.
    let mut summed = GradientsParams::new();
    let add = |part: GradientsParams, into: &mut GradientsParams| {
        model.visit(&mut Accumulate::<B> {
            grads: part,
            into,
            _b: std::marker::PhantomData,
        })
    };
    for pass in deferred {
        for part in pass(&mut grads) {
            add(part, &mut summed);
        }
    }
    add(GradientsParams::from_grads(grads, model), &mut summed);
    summed
}

/// Adds a micro-batch's gradient of every float parameter to `into` (parameter order, so
/// sums are formed in the same order on every run).
struct Accumulate<'a, B> {
    grads: GradientsParams,
    into: &'a mut GradientsParams,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Accumulate<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let sum = match self.into.remove::<B::InnerBackend, D>(param.id) {
                Some(a) => a + g,
                None => g,
            };
            self.into.register(param.id, sum);
        }
    }
}

/// The squared global norm of the gradients, summed in parameter order.
/// Each (prompt, response) sample's tokens, as [`train`] takes them.
pub fn sample_tokens(prompts: &[Vec<u32>], responses: &[Vec<u32>]) -> Vec<usize> {
    prompts
        .iter()
        .zip(responses)
        .map(|(p, r)| p.len() + r.len())
        .collect()
}

/// Split micro-batches so that none holds more than `budget` tokens (`sizes[i]` per sample; a
/// sample over the budget goes alone); 0 = no limit.
pub fn split_by_tokens(micro: Vec<Vec<usize>>, sizes: &[usize], budget: usize) -> Vec<Vec<usize>> {
    if budget == 0 {
        return micro;
    }
    let mut out = Vec::new();
    for batch in micro {
        let mut cur: Vec<usize> = Vec::new();
        let mut tokens = 0;
        for i in batch {
            if !cur.is_empty() && tokens + sizes[i] > budget {
                out.push(std::mem::take(&mut cur));
                tokens = 0;
            }
            tokens += sizes[i];
            cur.push(i);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

/// Elements from which burn-flex's `sum` runs in parallel (`sum_f32_contiguous`).
const PARALLEL_SUM: usize = 4 * 1024 * 1024;

/// The global norm of a model's gradients: [`SquaredNorm`] on the CPU; on a GPU
/// (`on_device`) every parameter's squared sum stays on the device and all of them cross to the
/// host at once ([`DeviceNorm`]: one synchronisation per optimizer step instead of one per
/// parameter, 272 for SmolLM2-135M, and no copy of the embedding's gradient), summed there in
/// parameter order in f64 as on the CPU.
fn global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
    on_device: bool,
) -> f64 {
    if !on_device {
        let mut norm = SquaredNorm { grads, sq: 0.0 };
        model.visit(&mut norm);
        return norm.sq.sqrt();
    }
    device_norm(model, grads)
}

/// [`global_norm`]'s GPU path, on any backend (a test runs it on the CPU's).
fn device_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> f64 {
    let mut norm = DeviceNorm::<B> {
        grads,
        sums: Vec::new(),
    };
    model.visit(&mut norm);
    if norm.sums.is_empty() {
        return 0.0;
    }
    let sums: Vec<f32> = Tensor::cat(norm.sums, 0)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap_or_default();
    sums.iter().map(|x| f64::from(*x)).sum::<f64>().sqrt()
}

/// Each parameter's squared gradient sum, on the device, in parameter order.
struct DeviceNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sums: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for DeviceNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.sums.push(g.powi_scalar(2).sum());
        }
    }
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sq: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            // burn-flex sums a tensor of ≥ 4M elements with rayon's adaptive reduction, whose
            // association order (and so last bits) depends on thread timing: a pretrained
            // model's embedding gradient made the clip scale, and the checkpoint, differ
            // between a run and its replay on a busy machine. Those are summed on the host in
            // f64, in order; smaller tensors as before (bit for bit with earlier builds).
            if g.shape().num_elements() >= PARALLEL_SUM {
                let v: Vec<f32> = g
                    .into_data()
                    .convert::<f32>()
                    .into_vec()
                    .unwrap_or_default();
                self.sq += v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>();
            } else {
                self.sq += f64::from(g.powi_scalar(2).sum().into_scalar().elem::<f32>());
            }
        }
    }
}

/// Multiply every gradient of `model`'s parameters in `grads` by `by` (the global-norm clip's
/// pass over them, before burn's AdamW steps).
fn scale_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    by: f64,
) {
    model.visit(&mut Scale { grads, by });
}

/// Multiplies every gradient by `by` (global-norm clipping).
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    by: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.by));
        }
    }
}

/// The inner-backend (no autodiff) copy of a model, for the snapshot's log-probabilities.
pub fn snapshot<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> M::InnerModule {
    model.valid()
}

use burn::tensor::ElementConversion as _;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CpuTrain;
    use crate::model::transformer::float_tensor;

    fn settings() -> PpoSettings {
        PpoSettings {
            clip_eps: 0.2,
            kl_beta: 0.01,
            log_ratio_clamp: 10.0,
            lr: 1e-3,
            weight_decay: 0.0,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            steps: 1,
            minibatch: 8,
            schedule: Schedule::Fixed,
            micro_tokens: 0,
            threads: 1,
            target_kl: 0.0,
            gpu: false,
            checkpoint_layers: false,
        }
    }

    /// Fixed: `steps` minibatches of a cycled shuffle. One pass: every sample exactly once,
    /// in `steps` parts of sizes differing by at most one, each split into micro-batches.
    #[test]
    fn micro_batches_keep_to_the_token_budget() {
        let sizes = [5, 3, 9, 2, 2, 12];
        let split = split_by_tokens(vec![vec![0, 1, 2, 3], vec![4, 5]], &sizes, 10);
        assert_eq!(split, vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5]]);
        let none = split_by_tokens(vec![vec![0, 1, 2]], &sizes, 0);
        assert_eq!(none, vec![vec![0, 1, 2]]);
    }

    #[test]
    fn schedules_cover_the_samples() {
        let mut s = settings();
        s.steps = 3;
        s.minibatch = 4;
        let fixed = plan(10, &s, 1);
        assert_eq!(fixed.len(), 3);
        assert!(fixed.iter().all(|m| m.len() == 1 && m[0].len() == 4));
        let seen: Vec<usize> = fixed.iter().flatten().flatten().copied().collect();
        assert_eq!(&seen[10..], &seen[..2], "the shuffle is cycled");
        s.schedule = Schedule::OnePass;
        let pass = plan(10, &s, 1);
        let sizes: Vec<Vec<usize>> = pass
            .iter()
            .map(|m| m.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(sizes, vec![vec![3], vec![3], vec![4]]);
        let mut all: Vec<usize> = pass.iter().flatten().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>(), "exactly one pass");
        s.minibatch = 2;
        let sizes: Vec<Vec<usize>> = plan(10, &s, 1)
            .iter()
            .map(|m| m.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(sizes, vec![vec![2, 1], vec![2, 1], vec![2, 2]]);
        s.steps = 50;
        assert_eq!(plan(10, &s, 1).len(), 10, "never more steps than samples");
        assert!(plan(0, &s, 1).is_empty());
    }

    /// The GPU's gradient norm (the parameters' squared sums on the device, one transfer)
    /// equals the CPU's (per parameter, the largest summed on the host) within 1e-6 relative,
    /// on a model with a parameter above the CPU's host-sum threshold and small ones.
    #[test]
    fn the_device_gradient_norm_follows_the_hosts() {
        let dev = Default::default();
        let big = burn::nn::LinearConfig::new(2048, 2049).init::<CpuTrain>(&dev);
        assert!(big.weight.val().shape().num_elements() >= PARALLEL_SUM);
        let x = Tensor::<CpuTrain, 2>::ones([3, 2048], &dev).mul_scalar(0.01);
        let loss = big.forward(x).powi_scalar(2).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &big);
        let host = global_norm(&big, &grads, false);
        let device = device_norm(&big, &grads);
        assert!(host > 0.0);
        assert!((host - device).abs() <= 1e-6 * host, "{host} vs {device}");
        let empty = GradientsParams::new();
        assert_eq!(device_norm(&big, &empty), 0.0);
    }

    /// The tiny policy the update tests train: a 4 → 3 linear map with fixed weights, no bias.
    fn tiny_linear() -> burn::nn::Linear<CpuTrain> {
        let mut lin: burn::nn::Linear<CpuTrain> =
            burn::nn::LinearConfig::new(4, 3).init(&Default::default());
        let w0: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) / 10.0).collect();
        lin.bias = None;
        lin.weight = Param::from_tensor(float_tensor(w0, [4, 3], &Default::default()));
        lin
    }

    /// Class 0's log-probability `[rows, 1]` under `m` for rows `idx` of ten fixed inputs.
    fn tiny_logprobs(m: &burn::nn::Linear<CpuTrain>, idx: &[usize]) -> Tensor<CpuTrain, 2> {
        let xs: Vec<f32> = (0..40)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x: Vec<f32> = idx
            .iter()
            .flat_map(|i| xs[i * 4..i * 4 + 4].to_vec())
            .collect();
        let x = float_tensor::<CpuTrain, 2>(x, [idx.len(), 4], &Default::default());
        burn::tensor::activation::log_softmax(m.forward(x), 1).narrow(1, 0, 1)
    }

    /// The update tests' micro-batch loss: PPO on class 0's log-probability of rows `idx`, with
    /// advantages `i − 4.5`, against the old log-probabilities `old(lp)` makes.
    #[allow(clippy::type_complexity)]
    fn tiny_loss(
        m: &burn::nn::Linear<CpuTrain>,
        idx: &[usize],
        s: &PpoSettings,
        old: impl FnOnce(Tensor<CpuTrain, 2>) -> Tensor<CpuTrain, 2>,
    ) -> (
        Tensor<CpuTrain, 1>,
        Tensor<CpuTrain, 1>,
        Tensor<CpuTrain, 1>,
        u64,
    ) {
        let b = idx.len();
        let lp = tiny_logprobs(m, idx);
        let old = old(lp.clone());
        let adv: Vec<f32> = idx.iter().map(|i| *i as f32 - 4.5).collect();
        let adv = float_tensor::<CpuTrain, 2>(adv, [b, 1], &Default::default());
        let valid = float_tensor::<CpuTrain, 2>(vec![1.0; b], [b, 1], &Default::default());
        let (l, k, c) = ppo_loss(lp, old.clone(), old, adv, valid, s);
        (l, k, c, b as u64)
    }

    /// Micro-batches differentiated on several threads give the same parameters and metrics,
    /// to the last bit, as one at a time (gradients summed in micro-batch order).
    #[test]
    fn threads_change_nothing() {
        use burn::nn::Linear;
        let run = |threads: usize| {
            let lin = tiny_linear();
            let mut s = settings();
            s.steps = 3;
            s.minibatch = 6;
            s.micro_tokens = 2;
            s.threads = threads;
            let sizes = vec![1; 10];
            let (lin, m) = train(lin, &sizes, &s, 7, |m: &Linear<CpuTrain>, idx| {
                tiny_loss(m, idx, &s, |lp| lp.detach().add_scalar(0.1))
            });
            let w = lin.weight.val().into_data().into_vec::<f32>().unwrap();
            let bits: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
            let metrics: Vec<u64> = m.iter().map(|m| m.loss.to_bits()).collect();
            (bits, metrics, m.iter().map(|m| m.tokens).sum::<u64>())
        };
        let one = run(1);
        assert_eq!(one.2, 18, "3 steps of 6 samples");
        assert_eq!(run(2), one);
        let moved = one.0.iter().enumerate();
        assert!(
            moved
                .filter(|(i, b)| f32::from_bits(**b) != (*i as f32 - 5.5) / 10.0)
                .count()
                > 6,
            "the update moves the weights"
        );
        assert_eq!(run(2), one);
        assert_eq!(run(3), one);
    }

    /// `target_kl`: the update takes the planned steps up to the first whose minibatch has
    /// drifted more than 1.5 × target_kl from the snapshot, and not that one — the steps it
    /// takes are the unconstrained update's first ones, to the bit.
    #[test]
    fn target_kl_stops_before_the_step_that_drifts_too_far() {
        use burn::nn::Linear;
        let dev = Default::default();
        let all: Vec<usize> = (0..10).collect();
        let snapshot: Vec<f32> = tiny_logprobs(&tiny_linear(), &all)
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let run = |target_kl: f64| {
            let mut s = settings();
            s.steps = 10;
            s.minibatch = 10;
            s.lr = 0.05;
            s.target_kl = target_kl;
            let (lin, m) = train(
                tiny_linear(),
                &[1; 10],
                &s,
                7,
                |m: &Linear<CpuTrain>, idx| {
                    tiny_loss(m, idx, &s, |_| {
                        let old: Vec<f32> = idx.iter().map(|i| snapshot[*i]).collect();
                        float_tensor::<CpuTrain, 2>(old, [idx.len(), 1], &dev)
                    })
                },
            );
            let w = lin.weight.val().into_data().into_vec::<f32>().unwrap();
            (w, m)
        };
        let (free_w, free) = run(0.0);
        assert_eq!(free.len(), 10, "no target: every planned step");
        assert_eq!(free[0].kl, 0.0, "the first step is at the snapshot");
        // KL 0, 0.011, 0.048, 0.075, 0.095, 0.099, then the clip holds it back.
        assert!(
            free[..6].windows(2).all(|p| p[1].kl > p[0].kl),
            "the policy drifts"
        );
        let target = free[4].kl / 1.5 * 0.999;
        let (w, stopped) = run(target);
        assert_eq!(stopped.len(), 4, "stops before step 4 (KL {})", free[4].kl);
        assert_eq!(stopped[..], free[..4]);
        assert!(stopped.iter().all(|m| m.kl <= 1.5 * target));
        assert_ne!(w, free_w);
        assert_eq!(run(1e9).0, free_w, "a target never reached changes nothing");
    }

    /// Old log-probabilities taken from step 0's forward pass give the update a pass before
    /// training gives (here to the last bit: each row's values do not depend on its batch);
    /// with a minibatch at least as large as the samples the pass is empty.
    #[test]
    fn old_logprobs_from_the_first_step_equal_a_snapshot_pass() {
        let mut s = settings();
        s.steps = 3;
        s.minibatch = 10;
        s.micro_tokens = 3;
        assert!(before_training(10, &s, 7, true).is_empty());
        assert_eq!(
            before_training(10, &s, 7, false),
            (0..10).collect::<Vec<_>>()
        );
        let mut fewer = s.clone();
        fewer.minibatch = 6;
        assert!(!before_training(10, &fewer, 7, true).is_empty());
        assert!(before_training(0, &s, 7, true).is_empty());
        same_update_with_and_without_a_full_pass(&s, 10);
    }

    /// With fewer samples per step than samples, the pass before training covers exactly the
    /// samples a later step reaches and step 0 does not, never one no step reaches; the update
    /// is the one a pass over every sample gives. No step, no pass.
    #[test]
    fn a_pass_before_training_covers_only_what_step_0_does_not() {
        let mut s = settings();
        s.steps = 2;
        s.minibatch = 3;
        s.micro_tokens = 3;
        let plan = plan(10, &s, 7);
        let at = |k: usize| -> Vec<usize> { plan[k].iter().flatten().copied().collect() };
        let before = before_training(10, &s, 7, true);
        let mut want: Vec<usize> = at(1).into_iter().filter(|i| !at(0).contains(i)).collect();
        want.sort();
        assert_eq!(before, want);
        assert!(
            before.len() < 10 - at(0).len(),
            "4 samples no step reaches: {before:?}"
        );
        s.steps = 0;
        assert!(before_training(10, &s, 7, true).is_empty());
        assert!(before_training(10, &s, 7, false).is_empty());
        s.steps = 4;
        same_update_with_and_without_a_full_pass(&s, 10);
    }

    /// Train the tiny model on `n` samples twice — old values from a pass over every sample,
    /// and from a pass over [`before_training`]'s samples plus step 0's forward — and check
    /// the weights, losses and old values the steps used agree to the last bit.
    fn same_update_with_and_without_a_full_pass(s: &PpoSettings, n: usize) {
        use burn::nn::Linear;
        let dev = Default::default();
        let run = |old: OldLogprobs<f32>| {
            let (lin, m) = train(
                tiny_linear(),
                &vec![1; n],
                s,
                7,
                |m: &Linear<CpuTrain>, idx| {
                    let b = idx.len();
                    let lp = tiny_logprobs(m, idx);
                    let fresh = || lp.clone().into_data().into_vec::<f32>().unwrap();
                    let old_t =
                        float_tensor::<CpuTrain, 2>(old.get_or_fill(idx, fresh), [b, 1], &dev);
                    let adv: Vec<f32> = idx.iter().map(|i| *i as f32 - 4.5).collect();
                    let adv = float_tensor::<CpuTrain, 2>(adv, [b, 1], &dev);
                    let valid = float_tensor::<CpuTrain, 2>(vec![1.0; b], [b, 1], &dev);
                    let (l, k, c) = ppo_loss(lp, old_t.clone(), old_t, adv, valid, s);
                    (l, k, c, b as u64)
                },
            );
            let w = lin.weight.val().into_data().into_vec::<f32>().unwrap();
            let losses: Vec<f64> = m.iter().map(|m| m.loss).collect();
            (w, losses, old.into_vec())
        };
        let all: Vec<usize> = (0..n).collect();
        let snapshot: Vec<f32> = tiny_logprobs(&tiny_linear(), &all)
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let (w_snap, l_snap, o_snap) = run(OldLogprobs::new(
            snapshot.iter().copied().map(Some).collect(),
        ));
        let mut partial = vec![None; n];
        for i in before_training(n, s, 7, true) {
            partial[i] = Some(snapshot[i]);
        }
        let (w_reuse, l_reuse, o_reuse) = run(OldLogprobs::new(partial));
        // Every value a step used is the snapshot's; samples no step reached have none.
        for (i, v) in o_reuse.iter().enumerate() {
            if let Some(v) = v {
                assert_eq!(Some(*v), o_snap[i], "sample {i}");
            }
        }
        assert_eq!(l_reuse, l_snap);
        assert_eq!(w_reuse, w_snap);
        assert!(
            w_snap
                .iter()
                .enumerate()
                .any(|(i, w)| *w != (i as f32 - 5.5) / 10.0)
        );
    }

    /// One token, hand-computed: old = ref = ln 0.5, new = ln 0.6, A = +1.
    /// ratio 1.2 is at the clip edge (not clipped): pg = −1.2, d(pg)/d(new) = −ratio = −1.2.
    /// k3 = e^d − d − 1 with d = ln(0.5/0.6): 0.8333… + 0.18232… − 1 = 0.015655…;
    /// d(k3)/d(new) = 1 − e^d = 0.1666…; total gradient −1.2 + 0.01 × 0.1666… = −1.198333….
    #[test]
    fn loss_and_gradient_on_a_hand_computed_case() {
        let dev = Default::default();
        let new = float_tensor::<CpuTrain, 2>(vec![0.6f32.ln()], [1, 1], &dev).require_grad();
        let old = float_tensor::<CpuTrain, 2>(vec![0.5f32.ln()], [1, 1], &dev);
        let adv = float_tensor::<CpuTrain, 2>(vec![1.0], [1, 1], &dev);
        let valid = float_tensor::<CpuTrain, 2>(vec![1.0], [1, 1], &dev);
        let (loss, kl, clip) = ppo_loss(new.clone(), old.clone(), old, adv, valid, &settings());
        let k3 = (0.5f64 / 0.6).ln();
        let k3 = k3.exp() - k3 - 1.0;
        assert!((k3 - 0.015_655).abs() < 1e-5);
        let lv = f64::from(loss.clone().into_scalar());
        assert!((lv - (-1.2 + 0.01 * k3)).abs() < 1e-5, "{lv}");
        assert!((f64::from(kl.into_scalar()) - k3).abs() < 1e-6);
        assert_eq!(clip.into_scalar(), 0.0);
        let grads = loss.backward();
        let g = new.grad(&grads).unwrap().into_scalar();
        assert!(
            (f64::from(g) - (-1.2 + 0.01 * (1.0 - 0.5 / 0.6))).abs() < 1e-5,
            "{g}"
        );
    }

    /// Past the clip (ratio 1.5, A > 0) the surrogate is flat: only the KL term has a gradient;
    /// with A < 0 the unclipped branch is kept. Token mean per sample, then batch mean.
    #[test]
    fn clipping_and_token_means() {
        let dev = Default::default();
        let new = float_tensor::<CpuTrain, 2>(vec![0.75f32.ln(), 0.75f32.ln()], [2, 1], &dev)
            .require_grad();
        let old = float_tensor::<CpuTrain, 2>(vec![0.5f32.ln(), 0.5f32.ln()], [2, 1], &dev);
        let adv = float_tensor::<CpuTrain, 2>(vec![1.0, -1.0], [2, 1], &dev);
        let valid = float_tensor::<CpuTrain, 2>(vec![1.0, 1.0], [2, 1], &dev);
        let mut s = settings();
        s.kl_beta = 0.0;
        let (loss, _, clip) = ppo_loss(new.clone(), old.clone(), old, adv, valid, &s);
        // Sample 1: −min(1.5, 1.2) = −1.2 (clipped); sample 2: −min(−1.5, −1.2) = 1.5.
        assert!((f64::from(loss.clone().into_scalar()) - (-1.2 + 1.5) / 2.0).abs() < 1e-5);
        assert!((f64::from(clip.into_scalar()) - 0.5).abs() < 1e-6);
        let g = new
            .grad(&loss.backward())
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        assert!(g[0].abs() < 1e-7, "clipped sample has no gradient: {g:?}");
        assert!((g[1] - 0.75).abs() < 1e-5, "{g:?}");
        // Two tokens in one sample, one padded away in the other.
        let new = float_tensor::<CpuTrain, 2>(vec![0.0, -1.0, 0.0, 5.0], [2, 2], &dev);
        let zero = float_tensor::<CpuTrain, 2>(vec![0.0; 4], [2, 2], &dev);
        let adv = float_tensor::<CpuTrain, 2>(vec![1.0, 1.0], [2, 1], &dev);
        let valid = float_tensor::<CpuTrain, 2>(vec![1.0, 1.0, 1.0, 0.0], [2, 2], &dev);
        let (loss, _, _) = ppo_loss(new, zero.clone(), zero, adv, valid, &s);
        // Sample 1: tokens −1 and −e^−1 → mean; sample 2: −1 (padding ignored).
        let want = ((-1.0 - (-1.0f64).exp()) / 2.0 - 1.0) / 2.0;
        assert!((f64::from(loss.into_scalar()) - want).abs() < 1e-5);
    }
}
