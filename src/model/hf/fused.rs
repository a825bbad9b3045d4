//! A layer's memory-bound operations as one GPU kernel each: RMSNorm, RoPE, the gated MLP's
//! `silu(gate) · up` and attention's softmax, forward and backward.
//!
//! On a GPU the time of a small model's call is the host's, not the device's: each kernel
//! launched costs ~30 µs of host whatever it computes (docs/src/real-models.md, "Where the time
//! goes"), and burn composes these from element-wise operations — RMSNorm's square, mean, add,
//! square root, division and product, each differentiated operation by operation in the
//! backward pass; RoPE's two halves, concatenation, two products and a sum. Here each is one
//! kernel forward and one backward (`hf::cube`), its backward an autodiff operation of its
//! own with the closed-form gradients:
//!
//! - RMSNorm, `y = x · r · γ` with `r = (mean(x²) + ε)^(−1/2)` per row:
//!   `dx = r · (g ⊙ γ) − x · r³ · mean(g ⊙ γ ⊙ x)`, `dγ = Σ_rows g ⊙ x · r`;
//! - RoPE in the rotate-half layout, `y_j = x_j c_j + x_{ρ(j)} s_j` (`ρ` swaps the halves, `s`
//!   the sine table with its first half negated): `dx_j = g_j c_j + g_{ρ(j)} s_{ρ(j)}`;
//! - `y = silu(a) · u`, `σ = sigmoid(a)`: `du = g · a σ`, `da = g · u σ (1 + a (1 − σ))`;
//! - the softmax: [`softmax`] for inference here, and inside training attention's own autodiff
//!   operation ([`super::recompute`]), whose backward recomputes the probabilities.
//!
//! [`Kernels`] names the operations; [`Reference`] computes them with burn's operations on any
//! backend, the GPU's kernels implement them on burn-cuda (`--features cuda`). The CPU keeps its
//! own paths (burn's RMSNorm, `rla_amx::rope`, [`super::silu`]): its bits and replays are
//! unchanged. The tests check the closed forms and the autodiff operations on the CPU with
//! [`Reference`] (against burn's graph; forced through a whole model: [`force_reference`]);
//! the GPU check compares the kernels with [`Reference`] on the device.
//! `RLA_PIPE_CUDA_KERNELS=off` keeps burn's operations on the GPU (a benchmark knob; also
//! burn's AdamW, `model::adamw`, and greedy picks on the host, [`super::generate`]).

use std::cell::Cell;
use std::marker::PhantomData;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::kernels::{Kernels, Reference};
use crate::model::backend::{Cpu, CpuTrain, cast, cast_back};

fn float<B: Backend, const D: usize>(x: Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    x.into_primitive().tensor()
}

fn tensor<B: Backend, const D: usize>(x: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

#[derive(Debug)]
struct RmsNormOp<K>(PhantomData<fn() -> K>);

impl<B: Backend, K: Kernels<B>> Backward<B, 2> for RmsNormOp<K> {
    /// The input, the scale and each row's `r`.
    type State = (Tensor<B, 2>, Tensor<B, 1>, Tensor<B, 1>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gamma, r) = ops.state;
        let g = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        let (dx, gx) = K::rms_norm_backward(g, x, gamma, r);
        let [to_x, to_gamma] = ops.parents;
        if let Some(node) = to_gamma {
            let d = gx.dims()[1];
            grads.register::<B>(node.id, float(gx.sum_dim(0).reshape([d])));
        }
        if let Some(node) = to_x {
            grads.register::<B>(node.id, float(dx));
        }
    }
}

/// RMSNorm on the training backend `Autodiff<I, C>`, as one tracked operation.
fn rms_norm_tracked<I: Backend, C: CheckpointStrategy, K: Kernels<I>>(
    x: Tensor<Autodiff<I, C>, 2>,
    gamma: Tensor<Autodiff<I, C>, 1>,
    eps: f64,
) -> Tensor<Autodiff<I, C>, 2> {
    let (xi, gi) = (x.clone().inner(), gamma.clone().inner());
    let (y, r) = K::rms_norm(xi.clone(), gi.clone(), eps);
    let prepared = RmsNormOp::<K>(PhantomData)
        .prepare::<C>([float(x).node, float(gamma).node])
        .compute_bound()
        .stateful();
    tensor(match prepared {
        OpsKind::Tracked(prep) => prep.finish((xi, gi, r), float(y)),
        OpsKind::UnTracked(prep) => prep.finish(float(y)),
    })
}

#[derive(Debug)]
struct RopeOp<K>(PhantomData<fn() -> K>);

impl<B: Backend, K: Kernels<B>> Backward<B, 1> for RopeOp<K> {
    /// The tables.
    type State = (Tensor<B, 4>, Tensor<B, 4>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cos, sin) = ops.state;
        let g = tensor::<B, 4>(grads.consume::<B>(&ops.node));
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, float(K::rope(g, cos, sin, true)));
        }
    }
}

/// RoPE on the training backend, as one tracked operation (the tables are constants).
fn rope_tracked<I: Backend, C: CheckpointStrategy, K: Kernels<I>>(
    x: Tensor<Autodiff<I, C>, 4>,
    cos: Tensor<Autodiff<I, C>, 4>,
    sin: Tensor<Autodiff<I, C>, 4>,
) -> Tensor<Autodiff<I, C>, 4> {
    let (ci, si) = (cos.inner(), sin.inner());
    let y = K::rope(x.clone().inner(), ci.clone(), si.clone(), false);
    let prepared = RopeOp::<K>(PhantomData)
        .prepare::<C>([float(x).node])
        .compute_bound()
        .stateful();
    tensor(match prepared {
        OpsKind::Tracked(prep) => prep.finish((ci, si), float(y)),
        OpsKind::UnTracked(prep) => prep.finish(float(y)),
    })
}

#[derive(Debug)]
struct SiluMulOp<K>(PhantomData<fn() -> K>);

impl<B: Backend, K: Kernels<B>> Backward<B, 2> for SiluMulOp<K> {
    /// The gate and up inputs.
    type State = (Tensor<B, 3>, Tensor<B, 3>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up) = ops.state;
        let g = tensor::<B, 3>(grads.consume::<B>(&ops.node));
        let (d_gate, d_up) = K::silu_mul_backward(g, gate, up);
        let [to_gate, to_up] = ops.parents;
        if let Some(node) = to_gate {
            grads.register::<B>(node.id, float(d_gate));
        }
        if let Some(node) = to_up {
            grads.register::<B>(node.id, float(d_up));
        }
    }
}

/// `silu(gate) · up` on the training backend, as one tracked operation.
fn silu_mul_tracked<I: Backend, C: CheckpointStrategy, K: Kernels<I>>(
    gate: Tensor<Autodiff<I, C>, 3>,
    up: Tensor<Autodiff<I, C>, 3>,
) -> Tensor<Autodiff<I, C>, 3> {
    let (gi, ui) = (gate.clone().inner(), up.clone().inner());
    let y = K::silu_mul(gi.clone(), ui.clone());
    let prepared = SiluMulOp::<K>(PhantomData)
        .prepare::<C>([float(gate).node, float(up).node])
        .compute_bound()
        .stateful();
    tensor(match prepared {
        OpsKind::Tracked(prep) => prep.finish((gi, ui), float(y)),
        OpsKind::UnTracked(prep) => prep.finish(float(y)),
    })
}

thread_local! {
    static REFERENCE: Cell<bool> = const { Cell::new(false) };
    static KERNELS: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Turn the GPU's kernels on (`Some(true)`), off, or back to `RLA_PIPE_CUDA_KERNELS`'s choice
/// (`None`) on this thread (the GPU check compares a model with and without them).
#[doc(hidden)]
pub fn force_kernels(on: Option<bool>) {
    KERNELS.with(|f| f.set(on));
}

/// Run the operations with [`Reference`] on the CPU backends too (`true`), on this thread:
/// tests drive a whole model's forward and backward through this module's autodiff
/// operations on the CPU, the path the GPU takes with its kernels.
#[doc(hidden)]
pub fn force_reference(on: bool) {
    REFERENCE.with(|f| f.set(on));
}

/// Whether the GPU runs its kernels (not `RLA_PIPE_CUDA_KERNELS=off`, unless [`force_kernels`];
/// never without `cuda`): this module's, the attention's softmax in [`super::recompute`], the
/// update's AdamW (`model::adamw`) and greedy picks on the device ([`super::generate`]).
pub(crate) fn gpu_kernels() -> bool {
    if !cfg!(feature = "cuda") {
        return false;
    }
    if let Some(on) = KERNELS.with(Cell::get) {
        return on;
    }
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RLA_PIPE_CUDA_KERNELS").map_or(true, |v| v != "off"))
}

/// Whether models on `B` lay out the attention's additive mask once for all key/value heads
/// (`[b, 1, g·t, keys]`, broadcast over them; the GPU's kernels index it so): on the GPU, and
/// anywhere when [`force_reference`]. Elsewhere it is repeated over the heads, as the CPU's
/// committed numbers were computed.
pub(super) fn bias_shared_by_heads<B: Backend>() -> bool {
    crate::model::backend::is_cuda::<B>() || REFERENCE.with(Cell::get)
}

/// Whether models on `B` run this module's operations: on the GPU (unless turned off), or
/// anywhere when [`force_reference`] (a cheap check before any reshaping).
fn applies<B: Backend>() -> bool {
    (crate::model::backend::is_cuda::<B>() && gpu_kernels()) || REFERENCE.with(Cell::get)
}

/// `f` of `args` on the backend of this module's operations: `plain(args)` without autodiff,
/// `train(args)` with it; `Err(args)` where the backend keeps burn's operations (the CPU's,
/// unless [`force_reference`]). One arm per backend, each with its kernels.
macro_rules! dispatch {
    ($args:expr, $T:ident, |$a:ident| plain: $plain:expr, train: $train:expr) => {{
        let args = $args;
        let args = match REFERENCE.with(Cell::get) {
            true => {
                let args = match cast::<_, $T<CpuTrain>>(args) {
                    Ok($a) => {
                        return Ok(cast_back({
                            type K = Reference;
                            $train
                        }));
                    }
                    Err(args) => args,
                };
                match cast::<_, $T<Cpu>>(args) {
                    Ok($a) => {
                        return Ok(cast_back({
                            type K = Reference;
                            $plain
                        }));
                    }
                    Err(args) => args,
                }
            }
            false => args,
        };
        #[cfg(feature = "cuda")]
        let args = {
            use crate::model::backend::{Gpu, GpuTrain, GpuTrainBalanced};
            match gpu_kernels() {
                true => {
                    let args = match cast::<_, $T<Gpu>>(args) {
                        Ok($a) => {
                            return Ok(cast_back({
                                type K = super::cube::Cube;
                                $plain
                            }));
                        }
                        Err(args) => args,
                    };
                    let args = match cast::<_, $T<GpuTrain>>(args) {
                        Ok($a) => {
                            return Ok(cast_back({
                                type K = super::cube::Cube;
                                $train
                            }));
                        }
                        Err(args) => args,
                    };
                    match cast::<_, $T<GpuTrainBalanced>>(args) {
                        Ok($a) => {
                            return Ok(cast_back({
                                type K = super::cube::Cube;
                                $train
                            }));
                        }
                        Err(args) => args,
                    }
                }
                false => args,
            }
        };
        Err(args)
    }};
}

type NormArgs<B> = (Tensor<B, 2>, Tensor<B, 1>);
type RopeArgs<B> = (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);
type SiluArgs<B> = (Tensor<B, 3>, Tensor<B, 3>);

/// RMSNorm of `x [.., d]` over its last dimension, times the scale `gamma [d]`, as one
/// operation where the backend has it (the GPU's kernels); `Err` with the inputs back
/// elsewhere.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: &Param<Tensor<B, 1>>,
    eps: f64,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if !applies::<B>() {
        return Err(x);
    }
    let gamma = gamma.val();
    let dims = x.dims();
    let d = dims[D - 1];
    let rows = dims[..D - 1].iter().product();
    let flat = (x.reshape([rows, d]), gamma);
    let run = || -> Result<Tensor<B, 2>, NormArgs<B>> {
        dispatch!(flat, NormArgs, |a| plain: K::rms_norm(a.0, a.1, eps).0,
            train: rms_norm_tracked::<_, _, K>(a.0, a.1, eps))
    };
    run()
        .map(|y| y.reshape(dims))
        .map_err(|(x, _)| x.reshape(dims))
}

/// RoPE of `x [b, t, n, hd]` from the tables `[b, t, 1, hd]` (see [`Kernels::rope`]) as one
/// operation where the backend has it; `Err(x)` elsewhere.
pub fn rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Result<Tensor<B, 4>, Tensor<B, 4>> {
    if !applies::<B>() {
        return Err(x);
    }
    let all = (x, cos.clone(), sin.clone());
    let run = || -> Result<Tensor<B, 4>, RopeArgs<B>> {
        dispatch!(all, RopeArgs, |a| plain: K::rope(a.0, a.1, a.2, false),
            train: rope_tracked::<_, _, K>(a.0, a.1, a.2))
    };
    run().map_err(|(x, _, _)| x)
}

/// `silu(gate) · up` as one operation where the backend has it; `Err` with both back elsewhere.
pub fn silu_mul<B: Backend>(
    gate: Tensor<B, 3>,
    up: Tensor<B, 3>,
) -> Result<Tensor<B, 3>, (Tensor<B, 3>, Tensor<B, 3>)> {
    if !applies::<B>() {
        return Err((gate, up));
    }
    let all = (gate, up);
    let run = || -> Result<Tensor<B, 3>, SiluArgs<B>> {
        dispatch!(all, SiluArgs, |a| plain: K::silu_mul(a.0, a.1),
            train: silu_mul_tracked::<_, _, K>(a.0, a.1))
    };
    run()
}

/// Attention's probabilities `softmax(scale · s + bias)` over the keys (`s = q kᵀ`, `[b, h,
/// queries, keys]`; `bias` that shape or `[b, 1, queries, keys]`) as one kernel on the GPU's
/// inference backend (decoding and scoring; training attention is [`super::recompute`]'s);
/// `Err` with both back elsewhere.
pub fn softmax<B: Backend>(
    s: Tensor<B, 4>,
    bias: Tensor<B, 4>,
    scale: f64,
) -> Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    if !applies::<B>() || B::ad_enabled(&s.device()) {
        return Err((s, bias));
    }
    let all = (s, bias);
    let all = match REFERENCE.with(Cell::get) {
        true => match cast::<_, (Tensor<Cpu, 4>, Tensor<Cpu, 4>)>(all) {
            Ok((s, b)) => return Ok(cast_back(Reference::softmax(s, b, scale).0)),
            Err(all) => all,
        },
        false => all,
    };
    #[cfg(feature = "cuda")]
    use crate::model::backend::Gpu;
    #[cfg(feature = "cuda")]
    let all = match cast::<_, (Tensor<Gpu, 4>, Tensor<Gpu, 4>)>(all) {
        Ok((s, b)) => return Ok(cast_back(super::cube::Cube::softmax(s, b, scale).0)),
        Err(all) => all,
    };
    Err(all)
}

#[cfg(test)]
mod tests {
    use super::super::kernels::swap_halves;
    use super::*;
    use crate::model::transformer::float_tensor;
    use burn::nn::RmsNorm;

    fn random<B: Backend, const D: usize>(shape: [usize; D], seed: u64) -> Tensor<B, D> {
        let mut rng = crate::determinism::Rng::new(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.unit() as f32 * 2.0 - 1.0).collect();
        float_tensor(v, shape, &Default::default())
    }

    fn host<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
        x.into_data().to_vec().unwrap()
    }

    /// `a` within `tol` of `b`, relative to `b`'s largest entry (not all zero).
    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: sizes");
        let top = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(top > 0.0, "{what}: not all zero");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tol * top,
            "{what}: differ by {worst} (largest {top})"
        );
    }

    type T = CpuTrain;

    /// With each operation forced to [`Reference`] on the CPU, `f`'s values and the gradients
    /// of its inputs; and the same with burn's graph (forced off).
    fn both<const N: usize>(
        f: impl Fn() -> (Tensor<T, 3>, [Tensor<T, 3>; N]),
    ) -> [(Vec<f32>, Vec<Vec<f32>>); 2] {
        [true, false].map(|on| {
            force_reference(on);
            let (y, inputs) = f();
            force_reference(false);
            let weights = random::<T, 3>(y.dims(), 99);
            let grads = (y.clone() * weights).sum().backward();
            let g = inputs
                .iter()
                .map(|x| host(x.grad(&grads).expect("a gradient")))
                .collect();
            (host(y), g)
        })
    }

    /// RMSNorm (`[rows, d]` and a per-head norm's `[b, t, n, hd]`), RoPE and the activation as
    /// this module's autodiff operations (the closed-form gradients of its documentation)
    /// against burn's graph, each operation differentiated: values within 1e-6 and gradients
    /// within 1e-5 of the largest entry (`x · r` against burn's `x / rms`, other orders of
    /// sums). A 1% error in any gradient fails it.
    #[test]
    fn the_closed_forms_train_as_burns_graph() {
        let norm = RmsNorm {
            gamma: burn::module::Param::from_tensor(random::<T, 1>([12], 5).add_scalar(1.0)),
            epsilon: 1e-5,
        };
        let [ours, plain] = both(|| {
            let x = random::<T, 3>([2, 5, 12], 1).require_grad();
            let y = rms_norm(x.clone(), &norm.gamma, 1e-5).unwrap_or_else(|x| norm.forward(x));
            (y, [x])
        });
        close(&ours.0, &plain.0, 1e-6, "rms_norm values");
        close(&ours.1[0], &plain.1[0], 1e-5, "rms_norm: x's gradient");
        // The scale's gradient (a tracked parameter in full fine-tuning).
        let gamma_grad = |on: bool| {
            force_reference(on);
            let gamma = norm.gamma.val().require_grad();
            let x = random::<T, 3>([2, 5, 12], 1);
            let p = burn::module::Param::from_tensor(gamma.clone());
            let y = rms_norm(x.clone(), &p, 1e-5).unwrap_or_else(|x| {
                RmsNorm {
                    gamma: p.clone(),
                    epsilon: 1e-5,
                }
                .forward(x)
            });
            force_reference(false);
            let grads = (y * random::<T, 3>([2, 5, 12], 99)).sum().backward();
            host(gamma.grad(&grads).expect("gamma's gradient"))
        };
        close(
            &gamma_grad(true),
            &gamma_grad(false),
            1e-5,
            "rms_norm: gamma's gradient",
        );

        // RoPE on [b, t, n, hd] with tables [b, t, 1, hd] (sin's first half negated).
        let (b, t, n, hd) = (2, 3, 4, 8);
        let angles = random::<T, 4>([b, t, 1, hd / 2], 3).mul_scalar(3.0);
        let cos = Tensor::cat(vec![angles.clone(), angles.clone()], 3).cos();
        let s = angles.sin();
        let sin = Tensor::cat(vec![s.clone().neg(), s], 3);
        let [ours, plain] = both(|| {
            let x = random::<T, 4>([b, t, n, hd], 4);
            let y = match rope(x.clone(), &cos, &sin) {
                Ok(y) => y,
                Err(x) => {
                    let (c, s) = (cos.clone().repeat_dim(2, n), sin.clone().repeat_dim(2, n));
                    x.clone() * c + swap_halves(x) * s
                }
            };
            (y.reshape([b, t, n * hd]), [])
        });
        close(&ours.0, &plain.0, 1e-6, "rope values");
        let rope_grad = |on: bool| {
            force_reference(on);
            let x = random::<T, 4>([b, t, n, hd], 4).require_grad();
            let y = rope(x.clone(), &cos, &sin).unwrap_or_else(|x| {
                let (c, s) = (cos.clone().repeat_dim(2, n), sin.clone().repeat_dim(2, n));
                x.clone() * c + swap_halves(x) * s
            });
            force_reference(false);
            let grads = (y * random::<T, 4>([b, t, n, hd], 98)).sum().backward();
            host(x.grad(&grads).expect("x's gradient"))
        };
        close(
            &rope_grad(true),
            &rope_grad(false),
            1e-5,
            "rope: x's gradient",
        );

        let [ours, plain] = both(|| {
            let gate = random::<T, 3>([2, 3, 10], 6).mul_scalar(4.0).require_grad();
            let up = random::<T, 3>([2, 3, 10], 7).require_grad();
            let y = match silu_mul(gate.clone(), up.clone()) {
                Ok(y) => y,
                Err((g, u)) => burn::tensor::activation::silu(g) * u,
            };
            (y, [gate, up])
        });
        close(&ours.0, &plain.0, 1e-6, "silu_mul values");
        close(&ours.1[0], &plain.1[0], 1e-5, "silu_mul: gate's gradient");
        close(&ours.1[1], &plain.1[1], 1e-5, "silu_mul: up's gradient");
    }

    /// Off the GPU and unforced, every operation hands its inputs back (the CPU keeps its own
    /// paths and bits).
    #[test]
    fn the_cpu_keeps_its_own_operations() {
        let x = random::<Cpu, 2>([3, 4], 1);
        let gamma = burn::module::Param::from_tensor(random::<Cpu, 1>([4], 2));
        assert!(rms_norm(x.clone(), &gamma, 1e-6).is_err());
        let t = random::<Cpu, 4>([1, 2, 1, 4], 3);
        assert!(rope(random::<Cpu, 4>([1, 2, 3, 4], 4), &t, &t).is_err());
        let g = random::<Cpu, 3>([1, 2, 4], 5);
        assert!(silu_mul(g.clone(), g).is_err());
    }
}
