//! AdamW as one kernel per parameter on the GPU.
//!
//! burn's AdamW composes each parameter's step of element-wise operations — the two moments'
//! products and sums, the square, the bias corrections, the square root, the division, the
//! decay and the update: about fifteen operations, each a kernel on the GPU, per parameter
//! tensor (272 for SmolLM2-135M), every optimizer step. On a GPU bound by launches
//! (docs/src/real-models.md, "Where the time goes") that is of the order of a model call's
//! forward and backward once the layers' memory-bound operations are one kernel each
//! ([`super::hf::fused`]).
//! [`FusedAdamW`] is burn's AdamW (decoupled weight decay, bias-corrected moments; no AMSGrad,
//! no cautious decay, no clipping of its own: `ppo::train` clips the global norm itself) with
//! the whole step of a parameter in one kernel on `cuda`; on every other backend it runs
//! burn's operations in burn's order — the same bits as burn's AdamW (the test), which is also
//! what the kernel is checked against on a device. `ppo::train` uses it on `cuda` only
//! (`PpoSettings::gpu`, unless `RLA_PIPE_CUDA_KERNELS=off`); the CPU keeps burn's optimizer.
//! The global-norm clip's factor is applied inside the step too
//! ([`FusedAdamW::scale_gradients`]), where burn's optimizer needs a pass over every gradient
//! first.

use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamWConfig, AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

/// AdamW's constants ([`AdamWConfig`]'s).
#[derive(Clone, Debug)]
pub struct FusedAdamW {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    /// The factor the next step multiplies every gradient by first (the global-norm clip's,
    /// [`FusedAdamW::scale_gradients`]; f64 bits), shared by the optimizer's clones.
    grad_scale: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FusedAdamW {
    /// AdamW with burn's default moments' decays (0.9, 0.999).
    pub fn new(weight_decay: f64, epsilon: f64) -> FusedAdamW {
        FusedAdamW {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: epsilon as f32,
            weight_decay: weight_decay as f32,
            grad_scale: std::sync::Arc::new(1f64.to_bits().into()),
        }
    }

    /// Multiply the gradients of the steps from now on by `by` inside the step's kernel (the
    /// global-norm clip, which burn's AdamW needs as a pass over every gradient first); 1: as
    /// they are.
    pub fn scale_gradients(&self, by: f64) {
        self.grad_scale
            .store(by.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    fn grad_scale(&self) -> f64 {
        f64::from_bits(self.grad_scale.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// burn's AdamW with the same constants (the CPU's optimizer).
    pub fn burn(&self) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_weight_decay(self.weight_decay)
    }

    /// For a module's parameters.
    pub fn init<B: AutodiffBackend, M: burn::module::AutodiffModule<B>>(
        self,
    ) -> OptimizerAdaptor<FusedAdamW, M, B> {
        OptimizerAdaptor::from(self)
    }
}

/// One step's scalars: what the kernel takes, and burn's operations use in their order.
struct Step {
    time: usize,
    grad_scale: f64,
    factor_1: f32,
    factor_2: f32,
    correct_1: f32,
    correct_2: f32,
    decay: f64,
}

impl FusedAdamW {
    fn scalars(&self, lr: LearningRate, time: usize) -> Step {
        let t = time as i32;
        Step {
            time,
            grad_scale: self.grad_scale(),
            factor_1: 1.0 - self.beta_1,
            factor_2: 1.0 - self.beta_2,
            correct_1: 1f32 - self.beta_1.powi(t),
            correct_2: 1f32 - self.beta_2.powi(t),
            decay: lr * f64::from(self.weight_decay),
        }
    }

    /// The step with burn's operations, in the order of burn's AdamW (its bits).
    fn reference<B: Backend, const D: usize>(
        &self,
        lr: LearningRate,
        p: Tensor<B, D>,
        g: Tensor<B, D>,
        moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
        k: &Step,
    ) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
        // As the clip's pass over the gradients did (`ppo`'s `Scale`).
        let g = match k.grad_scale == 1.0 {
            true => g,
            false => g.mul_scalar(k.grad_scale),
        };
        let (m, v) = match moments {
            Some((m, v)) => (
                m.mul_scalar(self.beta_1)
                    .add(g.clone().mul_scalar(k.factor_1)),
                v.mul_scalar(self.beta_2)
                    .add(g.square().mul_scalar(k.factor_2)),
            ),
            None => (
                g.clone().mul_scalar(k.factor_1),
                g.square().mul_scalar(k.factor_2),
            ),
        };
        let m_hat = m.clone().div_scalar(k.correct_1);
        let v_hat = v.clone().div_scalar(k.correct_2);
        let delta = m_hat.div(v_hat.sqrt().add_scalar(self.epsilon));
        let p = match k.decay == 0.0 {
            true => p,
            false => p.mul_scalar(1.0 - k.decay),
        };
        (p - delta.mul_scalar(lr), m, v)
    }
}

impl<B: Backend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let (time, moments) = match state {
            Some(s) => (
                s.momentum.time + 1,
                Some((s.momentum.moment_1, s.momentum.moment_2)),
            ),
            None => (1, None),
        };
        let k = self.scalars(lr, time);
        let (p, m, v) = self.dispatch(lr, tensor, grad, moments, &k);
        let state = AdamWState::new(AdaptiveMomentumState::new(k.time, m, v));
        (p, Some(state))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        let m = &mut state.momentum;
        m.moment_1 = m.moment_1.clone().to_device(device);
        m.moment_2 = m.moment_2.clone().to_device(device);
        state
    }
}

/// The new parameter and moments.
type Moved<B, const D: usize> = (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>);

impl FusedAdamW {
    /// The kernel on `cuda`, burn's operations elsewhere.
    fn dispatch<B: Backend, const D: usize>(
        &self,
        lr: LearningRate,
        p: Tensor<B, D>,
        g: Tensor<B, D>,
        moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
        k: &Step,
    ) -> Moved<B, D> {
        #[cfg(feature = "cuda")]
        {
            use crate::model::backend::{Gpu, cast, cast_back};
            type Args<B, const D: usize> = (
                Tensor<B, D>,
                Tensor<B, D>,
                Option<(Tensor<B, D>, Tensor<B, D>)>,
            );
            match cast::<Args<B, D>, Args<Gpu, D>>((p, g, moments)) {
                Ok((p, g, moments)) => {
                    let moved: Moved<Gpu, D> = self.kernel(lr, p, g, moments, k);
                    cast_back(moved)
                }
                Err((p, g, moments)) => self.reference(lr, p, g, moments, k),
            }
        }
        #[cfg(not(feature = "cuda"))]
        self.reference(lr, p, g, moments, k)
    }

    #[cfg(feature = "cuda")]
    fn kernel<const D: usize>(
        &self,
        lr: LearningRate,
        p: Tensor<crate::model::backend::Gpu, D>,
        g: Tensor<crate::model::backend::Gpu, D>,
        moments: Option<(
            Tensor<crate::model::backend::Gpu, D>,
            Tensor<crate::model::backend::Gpu, D>,
        )>,
        k: &Step,
    ) -> Moved<crate::model::backend::Gpu, D> {
        crate::model::hf::cube::adamw(
            p,
            g,
            moments,
            crate::model::hf::cube::AdamWScalars {
                beta_1: self.beta_1,
                beta_2: self.beta_2,
                factor_1: k.factor_1,
                factor_2: k.factor_2,
                correct_1: k.correct_1,
                correct_2: k.correct_2,
                epsilon: self.epsilon,
                keep: (1.0 - k.decay) as f32,
                lr: lr as f32,
                grad_scale: k.grad_scale as f32,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::backend::CpuTrain;
    use crate::model::ppo::Adam;
    use burn::module::{Module, Param};
    use burn::optim::GradientsParams;

    #[derive(Module, Debug)]
    struct Two<B: Backend> {
        a: Param<Tensor<B, 2>>,
        b: Param<Tensor<B, 1>>,
    }

    fn values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<u32> {
        let v: Vec<f32> = x.into_data().to_vec().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Four steps of the fused AdamW off the GPU (burn's operations in burn's order) give burn's
    /// AdamW's parameters to the bit, with and without weight decay; and a step with the clip's
    /// factor inside gives burn's on gradients scaled first.
    #[test]
    fn the_fused_adamw_is_burns_off_the_gpu() {
        type B = CpuTrain;
        let device = Default::default();
        for decay in [0.0, 0.01] {
            let start = || Two::<B> {
                a: Param::from_tensor(crate::model::transformer::float_tensor(
                    (0..12).map(|i| (i as f32 * 0.37).sin()).collect(),
                    [3, 4],
                    &device,
                )),
                b: Param::from_tensor(crate::model::transformer::float_tensor(
                    vec![0.5, -1.5, 2.0],
                    [3],
                    &device,
                )),
            };
            let adam = FusedAdamW::new(decay, 1e-8);
            let run = |fused: bool| {
                let mut model = start();
                let mut optim = Adam::<B, Two<B>>::new(&adam, fused);
                for step in 0..4 {
                    let x = model.a.val().sin().sum() * (step as f32 + 1.0)
                        + (model.b.val() * model.b.val()).sum();
                    let grads = GradientsParams::from_grads(x.backward(), &model);
                    model = optim.step(1e-2, model, grads, 1.0);
                }
                (values(model.a.val()), values(model.b.val()))
            };
            let (ours, burn) = (run(true), run(false));
            assert_eq!(ours, burn, "weight decay {decay}");
            // The clip's factor inside the step equals burn's AdamW on scaled gradients (at a
            // second step: Adam's first is invariant to the gradient's scale).
            let scaled = |fused: bool| {
                let mut model = start();
                let mut optim = Adam::<B, Two<B>>::new(&adam, fused);
                for by in [1.0, 0.37] {
                    let x = model.a.val().sin().sum() + (model.b.val() * model.b.val()).sum();
                    let grads = GradientsParams::from_grads(x.backward(), &model);
                    model = optim.step(1e-2, model, grads, by);
                }
                (values(model.a.val()), values(model.b.val()))
            };
            assert_eq!(
                scaled(true),
                scaled(false),
                "scaled gradients, decay {decay}"
            );
            assert_ne!(ours.0, values(start().a.val()), "the parameters moved");
        }
    }
}
