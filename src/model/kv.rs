//! The key/value cache grown in place while generating: on the CPU backend and on a GPU.
//!
//! Each generated token appends one key and one value per layer to the cache. With
//! `Tensor::cat` that copies the whole cache every token: for 16 rows of a 609-token prompt on
//! SmolLM2 (30 layers, 3 key/value heads of 64) ~0.7 GB a token, 2.5× the cost of a token after a
//! 19-token prompt (docs/src/performance.md). [`with_room`] lays a layer's keys out once in a
//! buffer with room for `extra` more, as a view of its first `n` keys (the same values, shape
//! and meaning: every reader sees `[b, h, n, d]`); [`append`] then writes the new keys after
//! them and widens the view — no copy, when the buffer has room and the view is its only owner.
//! Otherwise (no room left, a shared buffer; other backends: below) [`append`] is `Tensor::cat`.
//! Attention reads the view in place: burn-flex's products take strided operands.
//!
//! **On a GPU** (every backend but the CPU's, [`device_layout`]) the cache is a buffer per
//! layer of a bucketed number of keys ([`capacity`]), zeros past the keys it holds: the model
//! writes each step's keys into it with one `slice_assign` (in place: cubecl writes into a
//! buffer it alone holds) and attends over the whole buffer, the keys past the filled ones
//! hidden by the mask. Every decoding step of a call then has the same shapes, so its kernels
//! are compiled once and its allocations are the same sizes step after step (with `cat`, every
//! token allocated a cache one key longer, per layer, for keys and values). Set
//! `RLA_PIPE_DEVICE_KV=cat` to grow the cache by concatenation there instead (a benchmark knob).

use std::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorData, TensorPrimitive};
use burn_flex::{FlexTensor, Layout};

use crate::model::backend::{Cpu, CpuTrain, cast, cast_back, flex};

/// Keys per bucket of a device cache's buffers ([`capacity`]).
pub const BUCKET: usize = 128;

/// The keys a device cache's buffers hold room for when `keys` are needed: the next multiple
/// of [`BUCKET`].
pub fn capacity(keys: usize) -> usize {
    keys.max(1).next_multiple_of(BUCKET)
}

thread_local! {
    static FORCED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Force the device layout on (`Some(true)`), off, or back to the backend's choice (`None`)
/// for forwards on this thread (tests: the layout on the CPU equals the CPU's own).
#[doc(hidden)]
pub fn force_device_layout(on: Option<bool>) {
    FORCED.with(|f| f.set(on));
}

/// Whether caches of models on `B` take the device layout (see the module's documentation):
/// every backend but the CPU's (inference and training), unless `RLA_PIPE_DEVICE_KV=cat`.
pub fn device_layout<B: Backend>() -> bool {
    if let Some(on) = FORCED.with(Cell::get) {
        return on;
    }
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Cpu>() || id == std::any::TypeId::of::<CpuTrain>() {
        return false;
    }
    static CAT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*CAT.get_or_init(|| std::env::var("RLA_PIPE_DEVICE_KV").is_ok_and(|v| v == "cat"))
}

/// `x [b, h, n, d]` followed by zeros up to `cap` keys (`x` itself when it has as many).
pub fn padded<B: Backend>(x: Tensor<B, 4>, cap: usize) -> Tensor<B, 4> {
    let [b, h, n, d] = x.dims();
    if cap <= n {
        return x;
    }
    let zeros = Tensor::zeros([b, h, cap - n, d], &x.device());
    Tensor::cat(vec![x, zeros], 2)
}

fn tensor(x: FlexTensor) -> Tensor<Cpu, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// The strides of `[b, h, n, d]` keys in a buffer with room for `cap` keys per head.
fn strides(h: usize, cap: usize, d: usize) -> Vec<isize> {
    vec![(h * cap * d) as isize, (cap * d) as isize, d as isize, 1]
}

/// `x [b, h, n, d]` with room for `extra` more keys after its `n` (on the CPU backend, f32):
/// the same values and shape, laid out in a buffer of `n + extra` keys per head. Elsewhere `x`.
pub fn with_room<B: Backend>(x: Tensor<B, 4>, extra: usize) -> Tensor<B, 4> {
    let x: Tensor<Cpu, 4> = match cast(x) {
        Ok(x) => x,
        Err(x) => return x,
    };
    let [b, h, n, d] = x.dims();
    let x = flex(x);
    if x.dtype() != DType::F32 || extra == 0 {
        return cast_back(tensor(x));
    }
    let cap = n + extra;
    let src = x.to_contiguous();
    let src: &[f32] = src.storage();
    let mut buf = vec![0f32; b * h * cap * d];
    for row in 0..b * h {
        buf[row * cap * d..row * cap * d + n * d]
            .copy_from_slice(&src[row * n * d..(row + 1) * n * d]);
    }
    let full = FlexTensor::from_data(TensorData::new(buf, [b, h, cap, d]));
    let view = full.with_layout(Layout::new(
        Shape::from(vec![b, h, n, d]),
        strides(h, cap, d),
        0,
    ));
    cast_back(tensor(view))
}

/// `Tensor::cat(vec![cached, new], 2)`'s values: `cached [b, h, n, d]` followed by `new [b, h, t,
/// d]` along the keys. Written in place after the `n` keys when `cached` is a view
/// [`with_room`] made (or an earlier `append` widened) with room for `t` more and the only owner
/// of its buffer; the result is then the same buffer's view of `n + t` keys.
pub fn append<B: Backend>(cached: Tensor<B, 4>, new: Tensor<B, 4>) -> Tensor<B, 4> {
    let (cached, new): (Tensor<Cpu, 4>, Tensor<Cpu, 4>) = match (cast(cached), cast(new)) {
        (Ok(c), Ok(x)) => (c, x),
        // Both tensors are of B: either both are the CPU backend's or neither is.
        (Err(c), Err(x)) => return Tensor::cat(vec![c, x], 2),
        _ => unreachable!("both tensors are of one backend"),
    };
    cast_back(match in_place(flex(cached), new) {
        Ok(grown) => tensor(grown),
        Err((cached, new)) => Tensor::cat(vec![tensor(cached), new], 2),
    })
}

/// [`append`] on the CPU backend: the widened view, or both inputs back when the buffer has no
/// room for them (or is shared, or is not f32).
fn in_place(
    mut cached: FlexTensor,
    new: Tensor<Cpu, 4>,
) -> Result<FlexTensor, (FlexTensor, Tensor<Cpu, 4>)> {
    let shape = cached.layout().shape();
    let [b, h, n, d] = [shape[0], shape[1], shape[2], shape[3]];
    let [b2, h2, t, d2] = new.dims();
    let stride = cached.layout().strides()[1];
    let cap = if d > 0 { stride.max(0) as usize / d } else { 0 };
    let fits = cached.dtype() == DType::F32
        && (b, h, d) == (b2, h2, d2)
        && d > 0
        && n + t <= cap
        && cached.layout().start_offset() == 0
        && cached.layout().strides() == strides(h, cap, d).as_slice()
        && cached.bytes().len() == b * h * cap * d * 4
        && cached.is_unique();
    if !fits {
        return Err((cached, new));
    }
    let new = flex(new);
    let src = new.to_contiguous();
    if src.dtype() != DType::F32 {
        return Err((cached, tensor(new)));
    }
    let src: &[f32] = src.storage();
    let dst: &mut [f32] = cached
        .try_storage_mut()
        .expect("checked: the view owns its buffer");
    for row in 0..b * h {
        let at = (row * cap + n) * d;
        dst[at..at + t * d].copy_from_slice(&src[row * t * d..(row + 1) * t * d]);
    }
    Ok(cached.with_layout(Layout::new(
        Shape::from(vec![b, h, n + t, d]),
        strides(h, cap, d),
        0,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::float_tensor;

    fn values(x: Tensor<Cpu, 4>) -> Vec<u32> {
        x.into_data()
            .into_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    fn random(shape: [usize; 4], seed: u64) -> Tensor<Cpu, 4> {
        let mut rng = crate::determinism::Rng::new(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.unit() as f32 - 0.5).collect();
        float_tensor(v, shape, &Default::default())
    }

    /// Growing a cache with room, token by token, gives `cat`'s values at every step (within
    /// the room and past it), and the attention's products over the view equal those over the
    /// copy to the bit.
    #[test]
    fn appending_in_place_equals_cat() {
        let (b, h, n, d) = (3, 2, 5, 4);
        let start = random([b, h, n, d], 1);
        let mut roomy = with_room(start.clone(), 3);
        let mut plain = start;
        assert_eq!(values(roomy.clone()), values(plain.clone()), "same values");
        for step in 0..5 {
            let new = random([b, h, 1, d], 10 + step);
            roomy = append(roomy, new.clone());
            plain = Tensor::cat(vec![plain, new], 2);
            assert_eq!(roomy.dims(), [b, h, n + step as usize + 1, d]);
            assert_eq!(values(roomy.clone()), values(plain.clone()), "step {step}");
            let q = random([b, h, 2, d], 30 + step);
            let scores = |k: &Tensor<Cpu, 4>| values(q.clone().matmul(k.clone().swap_dims(2, 3)));
            assert_eq!(
                scores(&roomy),
                scores(&plain),
                "q·kᵀ over the view, step {step}"
            );
            let w = random([b, h, 2, n + step as usize + 1], 50 + step);
            assert_eq!(
                values(w.clone().matmul(roomy.clone())),
                values(w.matmul(plain.clone())),
                "weights · v over the view, step {step}"
            );
        }
    }

    /// Without clones held, appends within the room keep the one buffer.
    #[test]
    fn appends_within_the_room_keep_the_buffer() {
        let mut k = with_room(random([2, 3, 4, 8], 2), 4);
        let ptr = |k: &Tensor<Cpu, 4>| flex(k.clone()).bytes().as_ptr() as usize;
        let first = ptr(&k);
        for step in 0..4 {
            k = append(k, random([2, 3, 1, 8], 3 + step));
            assert_eq!(ptr(&k), first, "step {step}: in place");
        }
        k = append(k, random([2, 3, 1, 8], 9));
        assert_ne!(ptr(&k), first, "past the room: a new buffer");
        assert_eq!(k.dims(), [2, 3, 9, 8]);
    }
}
