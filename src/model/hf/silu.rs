//! The gated MLP's activation `silu(gate) · up` as one operation on the CPU backends
//! (`rla_amx::silu_mul`: a vectorised `exp`, one pass) — instead of burn's sigmoid (a library
//! `expf` per value), its product and the tensors between them, forward and backward. Its
//! backward (`rla_amx::silu_mul_backward`) is an autodiff operation of its own on the CPU
//! training backend, and a forward without autodiff (inference, the update's snapshot pass)
//! runs the same kernel, so both compute the same bits. The GPU runs its own kernel
//! ([`super::fused`]); other backends keep burn's.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use crate::model::amx;
use crate::model::backend::{Cpu, CpuTrain, cast, cast_back};

/// `f` of a tensor's f32 values, read in place where they lie contiguous (a copy otherwise).
fn with_values<R>(x: &Tensor<Cpu, 3>, f: impl FnOnce(&[f32]) -> R) -> R {
    amx::with_f32(x.clone(), f)
}

/// The forward on the CPU backend.
fn forward(gate: &Tensor<Cpu, 3>, up: &Tensor<Cpu, 3>) -> Tensor<Cpu, 3> {
    let device = gate.device();
    let dims = gate.dims();
    let mut g = with_values(gate, <[f32]>::to_vec);
    with_values(up, |u| amx::silu_mul(&mut g, u));
    Tensor::from_data(TensorData::new(g, dims), &device)
}

#[derive(Debug)]
struct SiluMul;

impl Backward<Cpu, 2> for SiluMul {
    /// The gate and up inputs, as the checkpointer keeps (or recomputes) them.
    type State = (NodeId, NodeId);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let input = |id, c: &mut Checkpointer| {
            Tensor::<Cpu, 3>::from_primitive(TensorPrimitive::Float(c.retrieve_node_output(id)))
        };
        let (gate, up) = (
            input(ops.state.0, checkpointer),
            input(ops.state.1, checkpointer),
        );
        let [to_gate, to_up] = ops.parents;
        let grad = Tensor::<Cpu, 3>::from_primitive(TensorPrimitive::Float(
            grads.consume::<Cpu>(&ops.node),
        ));
        let device = grad.device();
        let dims = grad.dims();
        let (d_gate, d_up) = with_values(&grad, |g| {
            with_values(&gate, |x| {
                with_values(&up, |u| amx::silu_mul_backward(g, x, u))
            })
        });
        let tensor = |v: Vec<f32>| {
            Tensor::<Cpu, 3>::from_data(TensorData::new(v, dims), &device)
                .into_primitive()
                .tensor()
        };
        if let Some(node) = to_gate {
            grads.register::<Cpu>(node.id, tensor(d_gate));
        }
        if let Some(node) = to_up {
            grads.register::<Cpu>(node.id, tensor(d_up));
        }
    }
}

/// The product on the CPU training backend: the forward, its backward from the inputs kept.
fn tracked(gate: Tensor<CpuTrain, 3>, up: Tensor<CpuTrain, 3>) -> Tensor<CpuTrain, 3> {
    let (gate, up) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
    let g = Tensor::<Cpu, 3>::from_primitive(TensorPrimitive::Float(gate.primitive.clone()));
    let u = Tensor::<Cpu, 3>::from_primitive(TensorPrimitive::Float(up.primitive.clone()));
    let y = forward(&g, &u).into_primitive().tensor();
    let out = match SiluMul
        .prepare::<BalancedCheckpointing>([gate.node.clone(), up.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let state = (prep.checkpoint(&gate), prep.checkpoint(&up));
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `silu(gate) · up`, element by element (`[b, t, hidden]` each).
pub fn silu_mul<B: Backend>(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
    // The GPU's kernel ([`super::fused`]).
    let (gate, up) = match super::fused::silu_mul(gate, up) {
        Ok(y) => return y,
        Err(both) => both,
    };
    match (cast::<_, Tensor<CpuTrain, 3>>(gate), cast(up)) {
        (Ok(g), Ok(u)) => cast_back(tracked(g, u)),
        (Err(g), Err(u)) => match (cast::<_, Tensor<Cpu, 3>>(g), cast(u)) {
            (Ok(g), Ok(u)) => cast_back(forward(&g, &u)),
            (Err(g), Err(u)) => silu(g) * u,
            _ => unreachable!("both tensors are of one backend"),
        },
        _ => unreachable!("both tensors are of one backend"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against burn's `silu(gate) · up`: the values and both gradients within 1e-6 (relative to
    /// the largest), the same values with and without autodiff.
    #[test]
    fn fused_silu_mul_and_its_gradients_follow_burn() {
        let dims = [2, 3, 37];
        let n: usize = dims.iter().product();
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 53) as f32 - 26.0) / 4.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 11 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let g: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) / 4.0).collect();
        let device = Default::default();
        let t = |v: &[f32]| {
            Tensor::<CpuTrain, 3>::from_data(TensorData::new(v.to_vec(), dims), &device)
                .require_grad()
        };
        let run = |fused: bool| {
            let (x, u) = (t(&gate), t(&up));
            let y = match fused {
                true => silu_mul(x.clone(), u.clone()),
                false => silu(x.clone()) * u.clone(),
            };
            let gt = Tensor::<CpuTrain, 3>::from_data(TensorData::new(g.clone(), dims), &device);
            let grads = (y.clone() * gt).sum().backward();
            let v = |t: Tensor<Cpu, 3>| t.into_data().into_vec::<f32>().unwrap();
            (
                v(y.inner()),
                v(x.grad(&grads).expect("gate's gradient")),
                v(u.grad(&grads).expect("up's gradient")),
            )
        };
        let (fused, burn) = (run(true), run(false));
        let close = |a: &[f32], b: &[f32], what: &str| {
            let top = b.iter().fold(1f32, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-6 * top, "{what}: {worst}");
        };
        close(&fused.0, &burn.0, "values");
        close(&fused.1, &burn.1, "gate's gradient");
        close(&fused.2, &burn.2, "up's gradient");
        let plain = silu_mul(
            Tensor::<Cpu, 3>::from_data(TensorData::new(gate.clone(), dims), &device),
            Tensor::<Cpu, 3>::from_data(TensorData::new(up.clone(), dims), &device),
        );
        assert_eq!(
            plain.into_data().into_vec::<f32>().unwrap(),
            fused.0,
            "the snapshot's values are the training forward's"
        );
    }
}
