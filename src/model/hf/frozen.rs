//! A frozen matrix in bf16 (the CPU's bf16 kernel: AMX tiles, AVX512-BF16, or emulated), for
//! training (`update.base_dtype = "bf16"`): with low-rank adapters the base weights never
//! change, so each projection and the output head are packed once, as `W` (the forward,
//! `x · W`) and as `Wᵀ` (the backward, `dx = dy · Wᵀ`; a frozen matrix has no gradient of its
//! own). Inputs and output gradients are rounded to bf16 and summed in f32 (`rla-amx`), as
//! mixed-precision training does on a GPU; the adapters, attention, norms and the optimizer
//! stay f32.
//!
//! The product is an autodiff operation of its own on the CPU training backend (burn's
//! `Backward`, as its own matrix product is written), and a plain product on the CPU backend,
//! where the update's snapshot pass runs: both call the same kernel, so the snapshot's
//! log-probabilities equal the first step's to the bit and PPO's ratio still starts at 1.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::model::amx;
use crate::model::backend::{Cpu, CpuTrain, on_cpu};

/// One frozen matrix `[k, n]`, packed both ways.
#[derive(Debug)]
pub struct Frozen {
    /// `W` (`[k, n]`): the forward product.
    w: amx::Packed,
    /// `Wᵀ` (`[n, k]`): the input's gradient.
    wt: amx::Packed,
}

impl Frozen {
    /// Pack `w` (`[k, n]`, row-major f32) both ways.
    pub fn new(w: &[f32], k: usize, n: usize) -> Frozen {
        Frozen {
            w: amx::Packed::new(w, k, n),
            wt: amx::Packed::new(&amx::transpose(w, k, n), n, k),
        }
    }

    pub fn dims(&self) -> [usize; 2] {
        self.w.dims()
    }
}

/// `x · W` on the CPU backend (no autodiff): the inference path's product.
fn product(x: Tensor<Cpu, 2>, w: &amx::Packed) -> Tensor<Cpu, 2> {
    amx::matmul_packed(x, w)
}

#[derive(Debug)]
struct FrozenProduct;

impl Backward<Cpu, 1> for FrozenProduct {
    type State = Arc<Frozen>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let w = ops.state.clone();
        unary::<Cpu, _>(ops.parents, ops.node, grads, |grad| {
            let grad = Tensor::<Cpu, 2>::from_primitive(TensorPrimitive::Float(grad));
            product(grad, &w.wt).into_primitive().tensor()
        });
    }
}

/// `x · W` on the CPU training backend: the same product, its input's gradient `dy · Wᵀ`.
fn tracked(x: Tensor<CpuTrain, 2>, w: &Arc<Frozen>) -> Tensor<CpuTrain, 2> {
    let x = x.into_primitive().tensor();
    let inner = Tensor::<Cpu, 2>::from_primitive(TensorPrimitive::Float(x.primitive.clone()));
    let y = product(inner, &w.w).into_primitive().tensor();
    let out = match FrozenProduct
        .prepare::<BalancedCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(w.clone(), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `x [m, k] · W` with `W` frozen in bf16: differentiable on the CPU training backend, plain on
/// the CPU backend. Other backends have no AMX path (refused where the key is read:
/// [`crate::model::ModelSpec::trainable_model`]).
pub fn frozen_matmul<B: Backend>(x: Tensor<B, 2>, w: &Arc<Frozen>) -> Tensor<B, 2> {
    on_cpu(
        x,
        |x| tracked(x, w),
        |x| product(x, &w.w),
        |_| panic!("bf16 training products run on the CPU backends only"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    /// The product and its input's gradient against f32 (within bf16 rounding), the same bits
    /// with and without autodiff, and on any CPU the packing's transpose is the transpose.
    #[test]
    fn frozen_product_and_gradient_follow_f32() {
        let (m, k, n) = (5, 40, 37);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 60.0)
            .collect();
        let xs: Vec<f32> = (0..m * k)
            .map(|i| ((i * 104_729 % 97) as f32 - 48.0) / 40.0)
            .collect();
        let f = Frozen::new(&w, k, n);
        assert_eq!(f.dims(), [k, n]);
        assert_eq!(f.wt.dims(), [n, k]);
        let f = Arc::new(f);
        let device = Default::default();
        let wt = Tensor::<Cpu, 2>::from_data(TensorData::new(w.clone(), [k, n]), &device);
        let x = Tensor::<CpuTrain, 2>::from_data(TensorData::new(xs.clone(), [m, k]), &device)
            .require_grad();
        let y = frozen_matmul(x.clone(), &f);
        // Weighted sum: the gradient of y is `c`, so x's is `c · Wᵀ`.
        let c: Vec<f32> = (0..m * n).map(|i| ((i % 13) as f32 - 6.0) / 7.0).collect();
        let ct = Tensor::<CpuTrain, 2>::from_data(TensorData::new(c.clone(), [m, n]), &device);
        let grads = (y.clone() * ct).sum().backward();
        let gx = x.grad(&grads).expect("x's gradient");
        let exact_y = Tensor::<Cpu, 2>::from_data(TensorData::new(xs.clone(), [m, k]), &device)
            .matmul(wt.clone());
        let exact_g =
            Tensor::<Cpu, 2>::from_data(TensorData::new(c, [m, n]), &device).matmul(wt.transpose());
        let close = |a: Tensor<Cpu, 2>, b: Tensor<Cpu, 2>, what: &str| {
            let a = a.into_data().into_vec::<f32>().unwrap();
            let b = b.into_data().into_vec::<f32>().unwrap();
            let scale = b.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let worst = a
                .iter()
                .zip(&b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            // bf16 keeps 8 significant bits: each of k products is within 2^-8 relative.
            assert!(worst <= 0.02 * scale, "{what}: max |Δ| {worst} of {scale}");
            assert!(worst > 0.0, "{what}: the bf16 path was not taken");
        };
        close(y.clone().inner(), exact_y, "product");
        close(gx, exact_g, "input gradient");
        // The snapshot's product (no autodiff) is the training forward's, bit for bit.
        let plain = frozen_matmul(
            Tensor::<Cpu, 2>::from_data(TensorData::new(xs, [m, k]), &device),
            &f,
        );
        assert_eq!(
            plain.into_data().into_vec::<f32>().unwrap(),
            y.inner().into_data().into_vec::<f32>().unwrap()
        );
    }
}
