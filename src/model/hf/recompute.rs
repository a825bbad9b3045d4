//! Training attention that keeps no `[rows, heads, queries, keys]` tensor for its backward
//! pass: `softmax(scale · q kᵀ + bias) · v` as one autodiff operation whose backward recomputes
//! the probabilities from `q`, `k`, the bias and each query row's max and sum (kept from the
//! forward), instead of the graph keeping `exp(·)` and the probabilities (burn's operations,
//! without checkpointing: the GPU's training backend) or the scores (balanced checkpointing:
//! the CPU's) — per layer, for the whole backward pass. That is most of a long packed row's
//! memory in training: with 8M attention entries a call (the GPU's budget,
//! [`crate::model::tree`]) and SmolLM2's 9 heads, up to 288 MB per tensor per layer, 30
//! layers. What it keeps is the size of `q`, `k` and `v`. The price: one more `q kᵀ` product
//! and its softmax per layer in the backward pass.
//!
//! The forward runs burn's operations of [`burn::tensor::activation::softmax`] in its order, so
//! its values equal the plain graph's to the bit; the gradients use the closed form
//! `dS = P ⊙ (dP − rowsum(dO ⊙ O))` instead of differentiating each operation, equal up to the
//! order of floating-point sums (the test: 1e-5 relative to the largest entry).
//! `update.recompute_attention` turns it on (by default on `cuda`). On `cuda` the softmax, its
//! recomputation and `dS` are one kernel each ([`super::fused`], [`super::kernels`]); the
//! CPU runs [`super::kernels::Reference`], burn's operations in the order above.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::kernels::{Kernels, Reference};
use crate::model::backend::{CpuTrain, cast, cast_back};
use std::marker::PhantomData;

/// The forward's values, and what the backward needs: each query row's max and sum of exps.
struct Forward<B: Backend> {
    out: Tensor<B, 4>,
    max: Tensor<B, 4>,
    sum: Tensor<B, 4>,
}

/// `scale · q kᵀ + bias`: the scores.
fn scores<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    bias: &Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    q.clone()
        .matmul(k.clone().swap_dims(2, 3))
        .mul_scalar(scale)
        + bias.clone()
}

/// `q kᵀ`.
fn products<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>) -> Tensor<B, 4> {
    q.clone().matmul(k.clone().swap_dims(2, 3))
}

/// The attention on a training backend's inner backend. With [`Reference`], the operations
/// burn's autodiff differentiates for [`burn::tensor::activation::softmax`], in their order
/// (the plain graph's bits; a backend's own softmax, as the CPU's, may round otherwise); on the
/// GPU the softmax is one kernel ([`super::fused`]).
fn forward<B: Backend, K: Kernels<B>>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    bias: &Tensor<B, 4>,
    scale: f64,
) -> Forward<B> {
    let (p, max, sum) = K::softmax(products(q, k), bias.clone(), scale);
    let out = p.matmul(v.clone());
    Forward { out, max, sum }
}

/// What the backward pass keeps: the inputs (the bias is the model call's, shared by its
/// layers), the output and the softmax's row statistics — no tensor over queries × keys.
#[derive(Debug, Clone)]
struct Kept<B: Backend> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Tensor<B, 4>,
    out: Tensor<B, 4>,
    max: Tensor<B, 4>,
    sum: Tensor<B, 4>,
}

#[derive(Debug)]
struct Attention<K> {
    scale: f64,
    kernels: PhantomData<fn() -> K>,
}

impl<B: Backend, K: Kernels<B>> Backward<B, 3> for Attention<K> {
    type State = Kept<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Kept {
            q,
            k,
            v,
            bias,
            out,
            max,
            sum,
        } = ops.state;
        let d_out =
            Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
        // The forward's probabilities, recomputed with its operations (the same bits).
        let p = K::softmax_again(products(&q, &k), bias, max, sum, self.scale);
        let [to_q, to_k, to_v] = ops.parents;
        let tensor = |g: Tensor<B, 4>| g.into_primitive().tensor();
        if let Some(node) = to_v {
            let d_v = p.clone().swap_dims(2, 3).matmul(d_out.clone());
            grads.register::<B>(node.id, tensor(d_v));
        }
        // dS = P ⊙ (dP − rowsum(dP ⊙ P)), with rowsum(dP ⊙ P) = rowsum(dO ⊙ O).
        let row = (d_out.clone() * out).sum_dim(3);
        let d_p = d_out.matmul(v.swap_dims(2, 3));
        let d_s = K::softmax_backward(p, d_p, row, self.scale);
        if let Some(node) = to_q {
            grads.register::<B>(node.id, tensor(d_s.clone().matmul(k)));
        }
        if let Some(node) = to_k {
            grads.register::<B>(node.id, tensor(d_s.swap_dims(2, 3).matmul(q)));
        }
    }
}

/// The attention on the training backend `Autodiff<I, C>`, as one tracked operation.
fn tracked<I: Backend, C: CheckpointStrategy, K: Kernels<I>>(
    q: Tensor<Autodiff<I, C>, 4>,
    k: Tensor<Autodiff<I, C>, 4>,
    v: Tensor<Autodiff<I, C>, 4>,
    bias: Tensor<Autodiff<I, C>, 4>,
    scale: f64,
) -> Tensor<Autodiff<I, C>, 4> {
    let inner = |x: &Tensor<Autodiff<I, C>, 4>| x.clone().inner();
    let (qi, ki, vi, bi) = (inner(&q), inner(&k), inner(&v), inner(&bias));
    let f = forward::<I, K>(&qi, &ki, &vi, &bi, scale);
    let node = |x: Tensor<Autodiff<I, C>, 4>| x.into_primitive().tensor().node;
    let attention = Attention::<K> {
        scale,
        kernels: PhantomData,
    };
    let prepared = attention
        .prepare::<C>([node(q), node(k), node(v)])
        .compute_bound()
        .stateful();
    let out = match prepared {
        OpsKind::Tracked(prep) => prep.finish(
            Kept {
                q: qi,
                k: ki,
                v: vi,
                bias: bi,
                out: f.out.clone(),
                max: f.max,
                sum: f.sum,
            },
            f.out.into_primitive().tensor(),
        ),
        OpsKind::UnTracked(prep) => prep.finish(f.out.into_primitive().tensor()),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `softmax(scale · q kᵀ + bias) · v` (`q [b, kv, g·t, d]`, `k` and `v` `[b, kv, keys, d]`,
/// `bias [b, kv, g·t, keys]` or `[b, 1, g·t, keys]`, constant): on a training backend (the CPU's, the GPU's) one
/// operation whose backward recomputes the probabilities; elsewhere burn's operations.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    type T<B> = Tensor<B, 4>;
    let all = (q, k, v, bias);
    let all = match cast::<_, (T<CpuTrain>, T<CpuTrain>, T<CpuTrain>, T<CpuTrain>)>(all) {
        Ok((q, k, v, b)) => return cast_back(tracked::<_, _, Reference>(q, k, v, b, scale)),
        Err(all) => all,
    };
    #[cfg(feature = "cuda")]
    let all = {
        use super::cube::Cube;
        use crate::model::backend::{GpuTrain, GpuTrainBalanced as Balanced};
        let on = super::fused::gpu_kernels();
        let all = match cast::<_, (T<GpuTrain>, T<GpuTrain>, T<GpuTrain>, T<GpuTrain>)>(all) {
            Ok((q, k, v, b)) if on => return cast_back(tracked::<_, _, Cube>(q, k, v, b, scale)),
            Ok((q, k, v, b)) => return cast_back(tracked::<_, _, Reference>(q, k, v, b, scale)),
            Err(all) => all,
        };
        match cast::<_, (T<Balanced>, T<Balanced>, T<Balanced>, T<Balanced>)>(all) {
            Ok((q, k, v, b)) if on => return cast_back(tracked::<_, _, Cube>(q, k, v, b, scale)),
            Ok((q, k, v, b)) => return cast_back(tracked::<_, _, Reference>(q, k, v, b, scale)),
            Err(all) => all,
        }
    };
    let (q, k, v, bias) = all;
    burn::tensor::activation::softmax(scores(&q, &k, &bias, scale), 3).matmul(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::float_tensor;
    use burn::tensor::activation::softmax;

    fn random<B: Backend>(shape: [usize; 4], seed: u64) -> Tensor<B, 4> {
        let mut rng = crate::determinism::Rng::new(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.unit() as f32 * 2.0 - 1.0).collect();
        float_tensor(v, shape, &Default::default())
    }

    fn host<B: Backend>(x: Tensor<B, 4>) -> Vec<f32> {
        x.into_data().to_vec().unwrap()
    }

    /// Against burn's graph (`softmax(scale · q kᵀ + bias) · v`, each operation differentiated):
    /// the output to the bit, and the gradients of q, k and v within 1e-5 of the largest entry
    /// (another order of sums), with grouped query heads, a mask that hides keys (−∞) and
    /// a weighted loss.
    #[test]
    fn recomputed_attention_follows_burns_graph() {
        type B = CpuTrain;
        let (b, kv, g, t, keys, d) = (2, 2, 3, 5, 7, 4);
        let scale = 1.0 / (d as f64).sqrt();
        let mut rng = crate::determinism::Rng::new(9);
        // Each query row sees a random subset of the keys, never none.
        let bias: Vec<f32> = (0..b * kv * g * t)
            .flat_map(|_| {
                let seen = rng.range(0, keys as u32) as usize;
                (0..keys)
                    .map(|k| {
                        if k == seen || rng.unit() < 0.6 {
                            0.0
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let bias = float_tensor::<B, 4>(bias, [b, kv, g * t, keys], &Default::default());
        let weights = random::<B>([b, kv, g * t, d], 4);
        let run = |recompute: bool| {
            let q = random::<B>([b, kv, g * t, d], 1).require_grad();
            let k = random::<B>([b, kv, keys, d], 2).require_grad();
            let v = random::<B>([b, kv, keys, d], 3).require_grad();
            let out = if recompute {
                attention(q.clone(), k.clone(), v.clone(), bias.clone(), scale)
            } else {
                let s = q
                    .clone()
                    .matmul(k.clone().swap_dims(2, 3))
                    .mul_scalar(scale)
                    + bias.clone();
                softmax(s, 3).matmul(v.clone())
            };
            let grads = (out.clone() * weights.clone()).sum().backward();
            let grad = |x: &Tensor<B, 4>| host(x.grad(&grads).unwrap());
            (host(out), [grad(&q), grad(&k), grad(&v)])
        };
        let (plain, plain_grads) = run(false);
        let (ours, our_grads) = run(true);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&plain), "the output, to the bit");
        for (name, (a, b)) in ["q", "k", "v"]
            .iter()
            .zip(our_grads.iter().zip(&plain_grads))
        {
            let top = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(top > 0.0, "{name}: a gradient");
            assert!(
                worst <= 1e-5 * top,
                "{name}: gradients differ by {worst} (largest {top})"
            );
        }
    }

    /// Without autodiff (inference, the snapshot pass), burn's softmax and products: the same bits.
    #[test]
    fn untracked_attention_is_the_plain_forward() {
        type B = crate::model::Cpu;
        let (q, k, v) = (
            random::<B>([1, 2, 4, 8], 1),
            random::<B>([1, 2, 6, 8], 2),
            random::<B>([1, 2, 6, 8], 3),
        );
        let bias = Tensor::<B, 4>::zeros([1, 2, 4, 6], &Default::default());
        let s = q.clone().matmul(k.clone().swap_dims(2, 3)).mul_scalar(0.5) + bias.clone();
        let want = host(softmax(s, 3).matmul(v.clone()));
        assert_eq!(host(attention(q, k, v, bias, 0.5)), want);
    }
}
