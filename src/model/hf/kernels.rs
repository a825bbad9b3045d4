//! The operations of [`super::fused`] by name ([`Kernels`]), composed of burn's on any backend
//! ([`Reference`]: the closed forms the GPU's kernels, `hf::cube`, are checked against).

use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;

/// The operations, on a backend without autodiff.
pub trait Kernels<B: Backend>: std::fmt::Debug + 'static {
    /// `x [rows, d]` over its rows' root mean square, times `gamma [d]`; and each row's
    /// `r = (mean(x²) + eps)^(−1/2)` (`[rows]`).
    fn rms_norm(x: Tensor<B, 2>, gamma: Tensor<B, 1>, eps: f64) -> (Tensor<B, 2>, Tensor<B, 1>);
    /// From the output's gradient `g`: the input's gradient and `g ⊙ x · r` (`[rows, d]`
    /// each; summed over the rows, the gradient of `gamma`).
    fn rms_norm_backward(
        g: Tensor<B, 2>,
        x: Tensor<B, 2>,
        gamma: Tensor<B, 1>,
        r: Tensor<B, 1>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>);
    /// RoPE of `x [b, t, n, hd]` from the tables `cos`, `sin` (`[b, t, 1, hd]`, `sin`'s first
    /// half negated); `transpose`: the backward map (a gradient in, the input's gradient out).
    fn rope(x: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>, transpose: bool)
    -> Tensor<B, 4>;
    /// `silu(gate) · up`, element by element.
    fn silu_mul(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3>;
    /// The gradients of gate and up from the output's gradient `g`.
    fn silu_mul_backward(
        g: Tensor<B, 3>,
        gate: Tensor<B, 3>,
        up: Tensor<B, 3>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>);
    /// Attention's probabilities from the products `s = q kᵀ` (`[b, h, queries, keys]`) and
    /// the additive mask `bias` (that shape, or `[b, 1, queries, keys]` shared by the heads;
    /// −∞ hides a key): `softmax(scale · s + bias)` over the keys, with each query row's max
    /// and sum of exponentials (`[b, h, queries, 1]`).
    fn softmax(
        s: Tensor<B, 4>,
        bias: Tensor<B, 4>,
        scale: f64,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);
    /// The same probabilities again from the rows' max and sum (the backward pass of training
    /// attention that keeps no probabilities, [`super::recompute`]).
    fn softmax_again(
        s: Tensor<B, 4>,
        bias: Tensor<B, 4>,
        max: Tensor<B, 4>,
        sum: Tensor<B, 4>,
        scale: f64,
    ) -> Tensor<B, 4>;
    /// The products' gradient `scale · P ⊙ (dP − row)` (`row`: `rowsum(dO ⊙ O)`, `[b, h,
    /// queries, 1]`).
    fn softmax_backward(
        p: Tensor<B, 4>,
        dp: Tensor<B, 4>,
        row: Tensor<B, 4>,
        scale: f64,
    ) -> Tensor<B, 4>;
}

/// The operations composed of burn's, on any backend (the closed forms of the module's
/// documentation; what the GPU's kernels are checked against).
#[derive(Debug)]
pub struct Reference;

/// `x` with the halves of its last dimension swapped (`ρ`).
pub fn swap_halves<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let lo = x.clone().narrow(3, 0, d / 2);
    let hi = x.narrow(3, d / 2, d / 2);
    Tensor::cat(vec![hi, lo], 3)
}

impl<B: Backend> Kernels<B> for Reference {
    fn rms_norm(x: Tensor<B, 2>, gamma: Tensor<B, 1>, eps: f64) -> (Tensor<B, 2>, Tensor<B, 1>) {
        let rows = x.dims()[0];
        let r = (x.clone().square().mean_dim(1) + eps).sqrt().recip();
        let y = x * r.clone() * gamma.unsqueeze_dim(0);
        (y, r.reshape([rows]))
    }

    fn rms_norm_backward(
        g: Tensor<B, 2>,
        x: Tensor<B, 2>,
        gamma: Tensor<B, 1>,
        r: Tensor<B, 1>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let d = x.dims()[1];
        let r = r.unsqueeze_dim::<2>(1);
        let gg = g.clone() * gamma.unsqueeze_dim(0);
        let mean = (gg.clone() * x.clone()).sum_dim(1).div_scalar(d as f64);
        let k = r.clone() * r.clone() * r.clone() * mean;
        let dx = gg * r.clone() - x.clone() * k;
        (dx, g * x * r)
    }

    fn rope(
        x: Tensor<B, 4>,
        cos: Tensor<B, 4>,
        sin: Tensor<B, 4>,
        transpose: bool,
    ) -> Tensor<B, 4> {
        match transpose {
            false => x.clone() * cos + swap_halves(x) * sin,
            true => x.clone() * cos + swap_halves(x * sin),
        }
    }

    fn silu_mul(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        gate.clone() * sigmoid(gate) * up
    }

    fn silu_mul_backward(
        g: Tensor<B, 3>,
        gate: Tensor<B, 3>,
        up: Tensor<B, 3>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let s = sigmoid(gate.clone());
        let d_up = g.clone() * gate.clone() * s.clone();
        let slope = (s.clone().neg() + 1.0) * gate + 1.0;
        (g * up * s * slope, d_up)
    }

    /// The operations burn's autodiff differentiates for its `softmax`, in their order (so
    /// [`super::recompute`]'s forward on the CPU is the plain graph's, to the bit).
    fn softmax(
        s: Tensor<B, 4>,
        bias: Tensor<B, 4>,
        scale: f64,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let x = s.mul_scalar(scale) + bias;
        let max = x.clone().detach().max_dim(3);
        let exp = (x - max.clone()).exp();
        let sum = exp.clone().sum_dim(3);
        (exp / sum.clone(), max, sum)
    }

    fn softmax_again(
        s: Tensor<B, 4>,
        bias: Tensor<B, 4>,
        max: Tensor<B, 4>,
        sum: Tensor<B, 4>,
        scale: f64,
    ) -> Tensor<B, 4> {
        (s.mul_scalar(scale) + bias - max).exp() / sum
    }

    fn softmax_backward(
        p: Tensor<B, 4>,
        dp: Tensor<B, 4>,
        row: Tensor<B, 4>,
        scale: f64,
    ) -> Tensor<B, 4> {
        (p * (dp - row)).mul_scalar(scale)
    }
}
