//! The attention of CPU inference in one pass per block of query rows (`rla_amx::attention`):
//! scores, masked softmax and values per few rows, in the core's cache, over the keys those
//! rows see — instead of `[rows, kv, g·t, keys]` scores and weights in memory per layer and
//! products over every key, hidden or not. Used where a forward is not trained (no autodiff)
//! on the CPU backend with more than one query position per row (prompts, packed prefix trees,
//! the update's snapshot pass); a decoding step (one position) keeps burn's products. The keys
//! and values are read in place, also from a key/value cache with room ([`crate::model::kv`]).
//!
//! Its values are the row-by-row sums in order (the kernel's test: equal to the bit), so a
//! prefix tree's branches get the bits of separate rows; they differ from burn's products in
//! the last bits (other summation orders).

use std::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;

use crate::model::amx;
use crate::model::backend::{Cpu, cast, cast_back, flex};

thread_local! {
    static OFF: Cell<bool> = const { Cell::new(false) };
}

/// Turn the fused attention off (`false`) or on again for forwards on this thread (tests:
/// the fused and burn's attention agree).
#[doc(hidden)]
pub fn set_fused_attention(on: bool) {
    OFF.with(|o| o.set(!on));
}

/// Whether a forward of `t` positions per row on `B` (not training) runs the fused attention.
pub fn applies<B: Backend>(t: usize) -> bool {
    t >= 2 && !OFF.with(Cell::get) && std::any::TypeId::of::<B>() == std::any::TypeId::of::<Cpu>()
}

/// A `[b, h, n, d]` tensor's f32 values where each head's `n` rows of `d` lie contiguous
/// (contiguous, or a key/value cache's view with room): the buffer, its batch and head strides
/// and where it starts. Otherwise a contiguous f32 copy first.
fn heads(x: FlexTensor) -> (FlexTensor, usize, usize, usize) {
    let l = x.layout();
    let d = l.shape()[3];
    let s = l.strides();
    if x.dtype() == DType::F32 && s[3] == 1 && s[2] == d as isize && s[1] >= 0 && s[0] >= 0 {
        let (b, h, off) = (s[0] as usize, s[1] as usize, l.start_offset());
        return (x, b, h, off);
    }
    let (h, n) = (l.shape()[1], l.shape()[2]);
    let x = FlexTensor::from_data(amx::values(Tensor::<Cpu, 4>::from_primitive(
        TensorPrimitive::Float(x),
    )));
    (x, h * n * d, n * d, 0)
}

/// `softmax(scale · q kᵀ, masked) · v`: `q [b, kv, g·t, d]`, `k` and `v` `[b, kv, keys, d]`,
/// `mask` a boolean `[b, t, keys]` tensor's bytes (non-zero: hidden). Only where
/// [`applies`] (the CPU backend).
pub fn attend<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &[u8],
    t: usize,
    scale: f32,
) -> Tensor<B, 4> {
    let (q, k, v): (Tensor<Cpu, 4>, Tensor<Cpu, 4>, Tensor<Cpu, 4>) =
        match (cast(q), cast(k), cast(v)) {
            (Ok(q), Ok(k), Ok(v)) => (q, k, v),
            _ => unreachable!("the fused attention runs on the CPU backend (`applies`)"),
        };
    let [b, kv, rows, d] = q.dims();
    let keys = k.dims()[2];
    let (k, kb, kh, ko) = heads(flex(k));
    let (v, vb, vh, vo) = heads(flex(v));
    let out = amx::with_f32(q, |qs| {
        amx::attention(
            qs,
            amx::Heads {
                data: &k.storage::<f32>()[ko..],
                batch: kb,
                head: kh,
            },
            amx::Heads {
                data: &v.storage::<f32>()[vo..],
                batch: vb,
                head: vh,
            },
            mask,
            amx::Shape {
                b,
                kv,
                g: rows / t,
                t,
                keys,
                d,
            },
            scale,
        )
    });
    cast_back(Tensor::<Cpu, 4>::from_primitive(TensorPrimitive::Float(
        FlexTensor::from_data(TensorData::new(out, [b, kv, rows, d])),
    )))
}
