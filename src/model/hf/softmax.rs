//! The attention's masked softmax as one operation on the CPU backends (`rla-amx`): the scores
//! scaled, the hidden keys dropped by the mask's bytes, a vectorised `exp`, one pass — instead
//! of an additive `[rows, heads, t, keys]` bias tensor and burn's five-pass softmax with a
//! scalar `exp` per value. Used where the model's products run on AMX (bf16 inference,
//! `update.base_dtype = "bf16"`); its backward (`scale · y ⊙ (g − Σ g ⊙ y)`) is an autodiff
//! operation of its own on the CPU training backend, and the snapshot pass (no autodiff) calls
//! the same forward, so both compute the same bits.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;

use crate::model::amx;
use crate::model::backend::{Cpu, CpuTrain, on_cpu};

/// A tensor's values as f32.
fn values<const D: usize>(x: Tensor<Cpu, D>) -> Vec<f32> {
    amx::with_f32(x, <[f32]>::to_vec)
}

/// The forward on the CPU backend: the weights.
fn forward(scores: Tensor<Cpu, 4>, mask: &[u8], t: usize, scale: f32) -> Tensor<Cpu, 4> {
    let device = scores.device();
    let dims = scores.dims();
    let [_, heads, rows, keys] = dims;
    let mut w = values(scores);
    amx::masked_softmax(&mut w, keys, t, heads * rows, mask, scale);
    Tensor::from_data(TensorData::new(w, dims), &device)
}

#[derive(Debug)]
struct MaskedSoftmax;

impl Backward<Cpu, 1> for MaskedSoftmax {
    /// The weights (the forward's output itself: its buffer, shared, which copy-on-write keeps
    /// as it is), keys per row, the scale.
    type State = (FlexTensor, usize, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (y, keys, scale) = ops.state;
        let y = Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(y));
        unary::<Cpu, _>(ops.parents, ops.node, grads, |grad| {
            let g = Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(grad));
            let device = g.device();
            let dims = g.dims();
            let mut g = values(g);
            amx::with_f32(y, |y| amx::masked_softmax_backward(&mut g, y, keys, scale));
            Tensor::<Cpu, 4>::from_data(TensorData::new(g, dims), &device)
                .into_primitive()
                .tensor()
        });
    }
}

/// Attention weights from raw scores `[b, heads, rows, keys]`: `softmax(scale · scores)` over
/// the keys that `mask` (a boolean `[b, t, keys]` tensor's bytes, non-zero = hidden) leaves
/// visible to row `r`'s query `r mod t`, 0 on the others. Differentiable on the CPU training
/// backend, plain on the CPU backend; no other backend calls it.
pub fn masked_softmax<B: Backend>(
    scores: Tensor<B, 4>,
    mask: &[u8],
    t: usize,
    scale: f32,
) -> Tensor<B, 4> {
    on_cpu(
        scores,
        |x| tracked(x, mask, t, scale),
        |x| forward(x, mask, t, scale),
        |_| panic!("the fused masked softmax runs on the CPU backends only"),
    )
}

/// The weights on the CPU training backend: the forward, its backward from the weights kept.
fn tracked(x: Tensor<CpuTrain, 4>, mask: &[u8], t: usize, scale: f32) -> Tensor<CpuTrain, 4> {
    let keys = x.dims()[3];
    let x = x.into_primitive().tensor();
    let inner = Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(x.primitive.clone()));
    let y = forward(inner, mask, t, scale).into_primitive().tensor();
    let out = match MaskedSoftmax
        .prepare::<BalancedCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((y.clone(), keys, scale), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::softmax;

    /// Against burn's softmax over an additive mask: the weights and the scores' gradient
    /// within f32 rounding, the same weights with and without autodiff.
    #[test]
    fn fused_masked_softmax_and_its_gradient_follow_burn() {
        let (b, h, t, keys) = (2, 3, 4, 6);
        let rows = 2 * t; // two query heads per key head, folded into the rows
        let n = b * h * rows * keys;
        let scores: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let mut mask = vec![0u8; b * t * keys];
        for (i, m) in mask.iter_mut().enumerate() {
            let (q, k) = ((i / keys) % t, i % keys);
            *m = u8::from(k > q + 2); // causal-like, every row keeps a key
        }
        let g: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) / 4.0).collect();
        let scale = 0.125f32;
        let device = Default::default();

        let x = Tensor::<CpuTrain, 4>::from_data(
            TensorData::new(scores.clone(), [b, h, rows, keys]),
            &device,
        )
        .require_grad();
        let y = masked_softmax(x.clone(), &mask, t, scale);
        let gt = Tensor::<CpuTrain, 4>::from_data(
            TensorData::new(g.clone(), [b, h, rows, keys]),
            &device,
        );
        let grads = (y.clone() * gt).sum().backward();
        let gx = x.grad(&grads).expect("the scores' gradient");

        // burn: scale, an additive -inf bias where hidden, softmax.
        let bias: Vec<f32> = (0..n)
            .map(|i| {
                let k = i % keys;
                let r = (i / keys) % rows;
                let batch = i / (h * rows * keys);
                if mask[(batch * t + r % t) * keys + k] != 0 {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let xr = Tensor::<CpuTrain, 4>::from_data(
            TensorData::new(scores.clone(), [b, h, rows, keys]),
            &device,
        )
        .require_grad();
        let bt =
            Tensor::<CpuTrain, 4>::from_data(TensorData::new(bias, [b, h, rows, keys]), &device);
        let yr = softmax(xr.clone().mul_scalar(scale) + bt, 3);
        let gt = Tensor::<CpuTrain, 4>::from_data(TensorData::new(g, [b, h, rows, keys]), &device);
        let grads_r = (yr.clone() * gt).sum().backward();
        let gr = xr.grad(&grads_r).expect("the reference gradient");

        let v = |t: Tensor<Cpu, 4>| t.into_data().into_vec::<f32>().unwrap();
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max)
        };
        let (y, yr, gx, gr) = (v(y.inner()), v(yr.inner()), v(gx), v(gr));
        assert!(worst(&y, &yr) <= 1e-6, "weights: {}", worst(&y, &yr));
        assert!(worst(&gx, &gr) <= 1e-6, "gradient: {}", worst(&gx, &gr));
        let plain = masked_softmax(
            Tensor::<Cpu, 4>::from_data(TensorData::new(scores, [b, h, rows, keys]), &device),
            &mask,
            t,
            scale,
        );
        assert_eq!(
            v(plain),
            y,
            "the snapshot's weights are the training forward's"
        );
    }
}
