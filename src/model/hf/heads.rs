//! The attention's heads moved between `[b, t, heads, hd]` (what the projections give and the
//! output projection takes) and `[b, heads, t, hd]` (what the attention's products take) as one
//! copy of `hd`-long runs on the CPU backends (`rla-amx`), instead of a strided view that every
//! later `reshape` and `cat` copies again one value at a time. Differentiable on the CPU training
//! backend (the gradient moves back the same way); the values are the input's, bit for bit, so
//! every result is what `swap_dims(1, 2)` gives. Other backends (GPU) keep `swap_dims`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use crate::model::amx;
use crate::model::backend::{Cpu, CpuTrain, on_cpu};

/// `[b, a, c, d]` → `[b, c, a, d]`, contiguous, on the CPU backend.
fn swap(x: Tensor<Cpu, 4>) -> Tensor<Cpu, 4> {
    let device = x.device();
    let [b, a, c, d] = x.dims();
    let out = amx::with_f32(x, |xs| amx::swap_middle(xs, b, a, c, d));
    Tensor::from_data(TensorData::new(out, [b, c, a, d]), &device)
}

#[derive(Debug)]
struct SwapMiddle;

impl Backward<Cpu, 1> for SwapMiddle {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary::<Cpu, _>(ops.parents, ops.node, grads, |grad| {
            let g = Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(grad));
            swap(g).into_primitive().tensor()
        });
    }
}

/// The swap on the CPU training backend: the values moved, the gradient moved back.
fn tracked(x: Tensor<CpuTrain, 4>) -> Tensor<CpuTrain, 4> {
    let x = x.into_primitive().tensor();
    let inner = Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(x.primitive.clone()));
    let y = swap(inner).into_primitive().tensor();
    let out = match SwapMiddle
        .prepare::<BalancedCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `x [b, a, c, d]` as `[b, c, a, d]` in contiguous memory: `x.swap_dims(1, 2)`'s values.
pub fn swap_middle<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    on_cpu(x, tracked, swap, |x| x.swap_dims(1, 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values and the gradient are exactly `swap_dims(1, 2)`'s, on the training backend
    /// and on the plain one; shapes with one head, one position, odd sizes.
    #[test]
    fn swapping_heads_equals_swap_dims_and_so_does_its_gradient() {
        let device = Default::default();
        for &[b, a, c, d] in &[[1, 1, 1, 1], [2, 3, 5, 7], [1, 9, 4, 64], [3, 1, 6, 2]] {
            let n = b * a * c * d;
            let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let ws: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let x = Tensor::<CpuTrain, 4>::from_data(
                TensorData::new(xs.clone(), [b, a, c, d]),
                &device,
            )
            .require_grad();
            // The weights in the swapped layout, so each value's gradient is its own weight.
            let w = Tensor::<CpuTrain, 4>::from_data(
                TensorData::new(ws.clone(), [b, c, a, d]),
                &device,
            );
            let y = swap_middle(x.clone());
            let want = x.clone().swap_dims(1, 2);
            assert_eq!(y.dims(), [b, c, a, d]);
            assert_eq!(
                y.to_data().as_slice::<f32>().unwrap(),
                want.to_data().as_slice::<f32>().unwrap()
            );
            let g = (y * w.clone()).sum().backward();
            let got = x.grad(&g).unwrap();
            let x2 = Tensor::<CpuTrain, 4>::from_data(
                TensorData::new(xs.clone(), [b, a, c, d]),
                &device,
            )
            .require_grad();
            let g2 = (x2.clone().swap_dims(1, 2) * w).sum().backward();
            let want = x2.grad(&g2).unwrap();
            assert_eq!(
                got.to_data().as_slice::<f32>().unwrap(),
                want.to_data().as_slice::<f32>().unwrap()
            );
            let plain = Tensor::<Cpu, 4>::from_data(TensorData::new(xs, [b, a, c, d]), &device);
            assert_eq!(
                swap_middle(plain.clone())
                    .to_data()
                    .as_slice::<f32>()
                    .unwrap(),
                plain.swap_dims(1, 2).to_data().as_slice::<f32>().unwrap()
            );
        }
    }
}
