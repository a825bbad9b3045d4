//! The kernels of [`super::fused`] ([`super::kernels::Kernels`]) and of the update's AdamW
//! (`model::adamw`) on burn-cuda, written in cubecl (compiled at run time by NVRTC, cached on
//! disk with the other kernels).
//!
//! Each reads and writes contiguous f32 tensors (its inputs made contiguous first: a no-op for
//! the layouts the model passes). RMSNorm's and the softmax's are one plane (a warp of 32
//! units) per row, each unit taking every 32nd value of the row (SmolLM2's 576, a head's 64,
//! a row's keys), the plane reducing the sums and the max; the others one unit per value. They
//! are plain, not tuned: what they save is launches (one kernel where burn launched five to
//! fifteen), the GPU's bound at a 135M model's sizes.

use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::CubeCount;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::kernels::Kernels;
use crate::model::backend::Gpu;

type Runtime = cubecl::cuda::CudaRuntime;

/// The kernels on [`Gpu`].
#[derive(Debug)]
pub struct Cube;

/// The kernels (cubecl's `Tensor`, not burn's).
mod kernel {
    use cubecl::prelude::*;

    /// RMSNorm: one cube of `lanes` units (one plane, 32 on CUDA) per row, each unit taking
    /// every `lanes`-th value; the plane sums the squares.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_kernel<F: Float + CubeElement>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        y: &mut Tensor<F>,
        r: &mut Tensor<F>,
        d: usize,
        lanes: usize,
        inv_d: F,
        eps: F,
    ) {
        let row = CUBE_POS_X as usize;
        let lane = UNIT_POS_X as usize;
        let base = row * d;
        let mut squares = F::new(0.0);
        let mut j = lane;
        while j < d {
            let v = x[base + j];
            squares += v * v;
            j += lanes;
        }
        let total = plane_sum(squares);
        let scale = F::new(1.0) / F::sqrt(total * inv_d + eps);
        let mut k = lane;
        while k < d {
            y[base + k] = x[base + k] * scale * gamma[k];
            k += lanes;
        }
        if lane == 0 {
            r[row] = scale;
        }
    }

    /// RMSNorm's backward pass, laid out as the forward.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_backward_kernel<F: Float + CubeElement>(
        g: &Tensor<F>,
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        r: &Tensor<F>,
        dx: &mut Tensor<F>,
        gx: &mut Tensor<F>,
        d: usize,
        lanes: usize,
        inv_d: F,
    ) {
        let row = CUBE_POS_X as usize;
        let lane = UNIT_POS_X as usize;
        let base = row * d;
        let scale = r[row];
        let mut dot = F::new(0.0);
        let mut j = lane;
        while j < d {
            dot += g[base + j] * gamma[j] * x[base + j];
            j += lanes;
        }
        let total = plane_sum(dot);
        let c = scale * scale * scale * total * inv_d;
        let mut k = lane;
        while k < d {
            let gk = g[base + k];
            let xk = x[base + k];
            dx[base + k] = gk * gamma[k] * scale - xk * c;
            gx[base + k] = gk * xk * scale;
            k += lanes;
        }
    }

    /// Attention's softmax over a row of `keys` scores: one cube of `lanes` units per row, the
    /// plane's max and sum; writes the probabilities and the row's max and sum. The bias's rows
    /// repeat over the heads when it has fewer: batch row `r`'s `span` score rows read its
    /// `bspan` bias rows in turn ([`bias_row`]).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_kernel<F: Float + CubeElement>(
        s: &Tensor<F>,
        bias: &Tensor<F>,
        p: &mut Tensor<F>,
        max: &mut Tensor<F>,
        sum: &mut Tensor<F>,
        keys: usize,
        lanes: usize,
        span: usize,
        bspan: usize,
        scale: F,
    ) {
        let row = CUBE_POS_X as usize;
        let lane = UNIT_POS_X as usize;
        let base = row * keys;
        let at = bias_row(row, span, bspan) * keys;
        let mut m = s[base] * scale + bias[at];
        let mut j = lane;
        while j < keys {
            m = F::max(m, s[base + j] * scale + bias[at + j]);
            j += lanes;
        }
        let top = plane_max(m);
        let mut part = F::new(0.0);
        let mut k = lane;
        while k < keys {
            let e = F::exp(s[base + k] * scale + bias[at + k] - top);
            p[base + k] = e;
            part += e;
            k += lanes;
        }
        let total = plane_sum(part);
        let mut i = lane;
        while i < keys {
            p[base + i] = p[base + i] / total;
            i += lanes;
        }
        if lane == 0 {
            max[row] = top;
            sum[row] = total;
        }
    }

    /// The row of a bias of `bspan` rows per batch row that score row `row` reads, with
    /// `span` score rows per batch row (`bspan` divides `span`; equal when the bias has a row
    /// per score row).
    #[cube]
    pub fn bias_row(row: usize, span: usize, bspan: usize) -> usize {
        (row / span) * bspan + row % bspan
    }

    /// The probabilities again from each row's max and sum: one unit per value (the bias as in
    /// [`softmax_kernel`]).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_again_kernel<F: Float + CubeElement>(
        s: &Tensor<F>,
        bias: &Tensor<F>,
        max: &Tensor<F>,
        sum: &Tensor<F>,
        p: &mut Tensor<F>,
        n: usize,
        keys: usize,
        span: usize,
        bspan: usize,
        scale: F,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        let row = i / keys;
        let b = bias_row(row, span, bspan) * keys + i % keys;
        p[i] = F::exp(s[i] * scale + bias[b] - max[row]) / sum[row];
    }

    /// `scale · P ⊙ (dP − row)`: one unit per value.
    #[cube(launch)]
    pub fn softmax_backward_kernel<F: Float + CubeElement>(
        p: &Tensor<F>,
        dp: &Tensor<F>,
        row: &Tensor<F>,
        ds: &mut Tensor<F>,
        n: usize,
        keys: usize,
        scale: F,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        ds[i] = p[i] * (dp[i] - row[i / keys]) * scale;
    }

    /// AdamW's step of one parameter, one unit per value (`first`: no moments yet).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn adamw_kernel<F: Float + CubeElement>(
        p: &Tensor<F>,
        g: &Tensor<F>,
        m: &Tensor<F>,
        v: &Tensor<F>,
        p_out: &mut Tensor<F>,
        m_out: &mut Tensor<F>,
        v_out: &mut Tensor<F>,
        n: usize,
        beta_1: F,
        beta_2: F,
        factor_1: F,
        factor_2: F,
        correct_1: F,
        correct_2: F,
        epsilon: F,
        keep: F,
        lr: F,
        grad_scale: F,
        #[comptime] first: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        let gi = g[i] * grad_scale;
        let m1 = if first {
            gi * factor_1
        } else {
            m[i] * beta_1 + gi * factor_1
        };
        let m2 = if first {
            gi * gi * factor_2
        } else {
            v[i] * beta_2 + gi * gi * factor_2
        };
        m_out[i] = m1;
        v_out[i] = m2;
        let delta = (m1 / correct_1) / (F::sqrt(m2 / correct_2) + epsilon);
        p_out[i] = p[i] * keep - delta * lr;
    }

    /// RoPE, rotate-half: `y_i = x_i c_j + x_ρ(i) s_j` (`j = i mod hd`, `ρ` swaps the halves of
    /// a head); `transpose`: `y_i = x_i c_j + x_ρ(i) s_ρ(j)`.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kernel<F: Float + CubeElement>(
        x: &Tensor<F>,
        cos: &Tensor<F>,
        sin: &Tensor<F>,
        y: &mut Tensor<F>,
        n: usize,
        heads_width: usize,
        hd: usize,
        #[comptime] transpose: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        let j = i % hd;
        let half = hd / 2;
        let jr = (j + half) % hd;
        let partner = i - j + jr;
        let table = (i / heads_width) * hd;
        let s = if transpose {
            sin[table + jr]
        } else {
            sin[table + j]
        };
        y[i] = x[i] * cos[table + j] + x[partner] * s;
    }

    #[cube(launch)]
    pub fn silu_mul_kernel<F: Float + CubeElement>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        y: &mut Tensor<F>,
        n: usize,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        let a = gate[i];
        let s = F::new(1.0) / (F::new(1.0) + F::exp(-a));
        y[i] = a * s * up[i];
    }

    #[cube(launch)]
    pub fn silu_mul_backward_kernel<F: Float + CubeElement>(
        g: &Tensor<F>,
        gate: &Tensor<F>,
        up: &Tensor<F>,
        d_gate: &mut Tensor<F>,
        d_up: &mut Tensor<F>,
        n: usize,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n {
            terminate!();
        }
        let a = gate[i];
        let gi = g[i];
        let s = F::new(1.0) / (F::new(1.0) + F::exp(-a));
        d_up[i] = gi * a * s;
        d_gate[i] = gi * up[i] * s * (F::new(1.0) + a * (F::new(1.0) - s));
    }
}

/// Units per cube of the element-wise kernels.
const UNITS: u32 = 256;

/// Units per cube of the row kernels: one plane (a warp) per row.
const LANES: u32 = 32;

/// Score rows and bias rows per batch row for a bias of shape `bias` added to scores of
/// shape `scores` (`[b, h, q, keys]`): a bias per score (`[b, h, q, keys]`), or one shared by
/// the heads (`[b, 1, q, keys]`).
fn spans(scores: [usize; 4], bias: [usize; 4]) -> (usize, usize) {
    let [b, h, q, keys] = scores;
    assert!(
        bias[0] == b && (bias[1] == h || bias[1] == 1) && bias[2] == q && bias[3] == keys,
        "a bias {bias:?} per score {scores:?} or shared by its heads"
    );
    (h * q, bias[1] * q)
}

/// One cube of [`LANES`] units per row (at least one row: the callers return before an
/// empty launch).
fn per_row(rows: usize) -> (CubeCount, CubeDim) {
    let rows = u32::try_from(rows).expect("fewer than 2³² rows");
    (CubeCount::Static(rows, 1, 1), CubeDim::new_1d(LANES))
}

/// A tensor's storage, contiguous.
fn storage<const D: usize>(x: Tensor<Gpu, D>) -> CubeTensor<Runtime> {
    let x = into_contiguous(x.into_primitive().tensor());
    assert_eq!(x.dtype, DType::F32, "the kernels compute in f32");
    x
}

/// A new contiguous tensor of `shape` on `like`'s device.
fn empty(like: &CubeTensor<Runtime>, shape: &[usize]) -> CubeTensor<Runtime> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape.to_vec()),
        DType::F32,
    )
}

fn tensor<const D: usize>(x: CubeTensor<Runtime>) -> Tensor<Gpu, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// The cubes of `units` units.
fn cubes(like: &CubeTensor<Runtime>, units: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(UNITS);
    (calculate_cube_count_elemwise(&like.client, units, dim), dim)
}

impl Kernels<Gpu> for Cube {
    fn rms_norm(
        x: Tensor<Gpu, 2>,
        gamma: Tensor<Gpu, 1>,
        eps: f64,
    ) -> (Tensor<Gpu, 2>, Tensor<Gpu, 1>) {
        let [rows, d] = x.dims();
        let (x, gamma) = (storage(x), storage(gamma));
        let (y, r) = (empty(&x, &[rows, d]), empty(&x, &[rows]));
        if rows * d == 0 {
            return (tensor(y), tensor(r));
        }
        let (count, dim) = per_row(rows);
        kernel::rms_norm_kernel::launch::<f32, Runtime>(
            &x.client.clone(),
            count,
            dim,
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            r.clone().into_tensor_arg(),
            d,
            LANES as usize,
            1.0 / d as f32,
            eps as f32,
        );
        (tensor(y), tensor(r))
    }

    fn rms_norm_backward(
        g: Tensor<Gpu, 2>,
        x: Tensor<Gpu, 2>,
        gamma: Tensor<Gpu, 1>,
        r: Tensor<Gpu, 1>,
    ) -> (Tensor<Gpu, 2>, Tensor<Gpu, 2>) {
        let [rows, d] = x.dims();
        let (g, x, gamma, r) = (storage(g), storage(x), storage(gamma), storage(r));
        let (dx, gx) = (empty(&x, &[rows, d]), empty(&x, &[rows, d]));
        if rows * d == 0 {
            return (tensor(dx), tensor(gx));
        }
        let (count, dim) = per_row(rows);
        kernel::rms_norm_backward_kernel::launch::<f32, Runtime>(
            &x.client.clone(),
            count,
            dim,
            g.into_tensor_arg(),
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            r.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            gx.clone().into_tensor_arg(),
            d,
            LANES as usize,
            1.0 / d as f32,
        );
        (tensor(dx), tensor(gx))
    }

    fn rope(
        x: Tensor<Gpu, 4>,
        cos: Tensor<Gpu, 4>,
        sin: Tensor<Gpu, 4>,
        transpose: bool,
    ) -> Tensor<Gpu, 4> {
        let dims = x.dims();
        let [b, t, heads, hd] = dims;
        assert_eq!(cos.dims(), [b, t, 1, hd], "a table row per position");
        let (x, cos, sin) = (storage(x), storage(cos), storage(sin));
        let n = b * t * heads * hd;
        let y = empty(&x, &dims);
        if n == 0 {
            return tensor(y);
        }
        let (count, dim) = cubes(&x, n);
        kernel::rope_kernel::launch::<f32, Runtime>(
            &x.client.clone(),
            count,
            dim,
            x.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            n,
            heads * hd,
            hd,
            transpose,
        );
        tensor(y)
    }

    fn silu_mul(gate: Tensor<Gpu, 3>, up: Tensor<Gpu, 3>) -> Tensor<Gpu, 3> {
        let dims = gate.dims();
        let n = dims.iter().product();
        let (gate, up) = (storage(gate), storage(up));
        let y = empty(&gate, &dims);
        if n == 0 {
            return tensor(y);
        }
        let (count, dim) = cubes(&gate, n);
        kernel::silu_mul_kernel::launch::<f32, Runtime>(
            &gate.client.clone(),
            count,
            dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            n,
        );
        tensor(y)
    }

    fn silu_mul_backward(
        g: Tensor<Gpu, 3>,
        gate: Tensor<Gpu, 3>,
        up: Tensor<Gpu, 3>,
    ) -> (Tensor<Gpu, 3>, Tensor<Gpu, 3>) {
        let dims = gate.dims();
        let n = dims.iter().product();
        let (g, gate, up) = (storage(g), storage(gate), storage(up));
        let (d_gate, d_up) = (empty(&gate, &dims), empty(&gate, &dims));
        if n == 0 {
            return (tensor(d_gate), tensor(d_up));
        }
        let (count, dim) = cubes(&gate, n);
        kernel::silu_mul_backward_kernel::launch::<f32, Runtime>(
            &gate.client.clone(),
            count,
            dim,
            g.into_tensor_arg(),
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            d_gate.clone().into_tensor_arg(),
            d_up.clone().into_tensor_arg(),
            n,
        );
        (tensor(d_gate), tensor(d_up))
    }

    fn softmax(
        s: Tensor<Gpu, 4>,
        bias: Tensor<Gpu, 4>,
        scale: f64,
    ) -> (Tensor<Gpu, 4>, Tensor<Gpu, 4>, Tensor<Gpu, 4>) {
        let dims = s.dims();
        let [b, h, q, keys] = dims;
        let (span, bspan) = spans(dims, bias.dims());
        let rows = b * h * q;
        let (s, bias) = (storage(s), storage(bias));
        let p = empty(&s, &dims);
        let (max, sum) = (empty(&s, &[b, h, q, 1]), empty(&s, &[b, h, q, 1]));
        if rows * keys == 0 {
            return (tensor(p), tensor(max), tensor(sum));
        }
        let (count, dim) = per_row(rows);
        kernel::softmax_kernel::launch::<f32, Runtime>(
            &s.client.clone(),
            count,
            dim,
            s.into_tensor_arg(),
            bias.into_tensor_arg(),
            p.clone().into_tensor_arg(),
            max.clone().into_tensor_arg(),
            sum.clone().into_tensor_arg(),
            keys,
            LANES as usize,
            span,
            bspan,
            scale as f32,
        );
        (tensor(p), tensor(max), tensor(sum))
    }

    fn softmax_again(
        s: Tensor<Gpu, 4>,
        bias: Tensor<Gpu, 4>,
        max: Tensor<Gpu, 4>,
        sum: Tensor<Gpu, 4>,
        scale: f64,
    ) -> Tensor<Gpu, 4> {
        let dims = s.dims();
        let n = dims.iter().product();
        let (span, bspan) = spans(dims, bias.dims());
        let (s, bias, max, sum) = (storage(s), storage(bias), storage(max), storage(sum));
        let p = empty(&s, &dims);
        if n == 0 {
            return tensor(p);
        }
        let (count, dim) = cubes(&s, n);
        kernel::softmax_again_kernel::launch::<f32, Runtime>(
            &s.client.clone(),
            count,
            dim,
            s.into_tensor_arg(),
            bias.into_tensor_arg(),
            max.into_tensor_arg(),
            sum.into_tensor_arg(),
            p.clone().into_tensor_arg(),
            n,
            dims[3],
            span,
            bspan,
            scale as f32,
        );
        tensor(p)
    }

    fn softmax_backward(
        p: Tensor<Gpu, 4>,
        dp: Tensor<Gpu, 4>,
        row: Tensor<Gpu, 4>,
        scale: f64,
    ) -> Tensor<Gpu, 4> {
        let dims = p.dims();
        let n = dims.iter().product();
        let (p, dp, row) = (storage(p), storage(dp), storage(row));
        let ds = empty(&p, &dims);
        if n == 0 {
            return tensor(ds);
        }
        let (count, dim) = cubes(&p, n);
        kernel::softmax_backward_kernel::launch::<f32, Runtime>(
            &p.client.clone(),
            count,
            dim,
            p.into_tensor_arg(),
            dp.into_tensor_arg(),
            row.into_tensor_arg(),
            ds.clone().into_tensor_arg(),
            n,
            dims[3],
            scale as f32,
        );
        tensor(ds)
    }
}

/// AdamW's scalars for [`adamw`] (`model::adamw`: `factor`s are `1 − β`, `correct`s the bias
/// corrections `1 − βᵗ`, `keep` the decay `1 − lr · weight_decay`).
pub struct AdamWScalars {
    pub beta_1: f32,
    pub beta_2: f32,
    pub factor_1: f32,
    pub factor_2: f32,
    pub correct_1: f32,
    pub correct_2: f32,
    pub epsilon: f32,
    pub keep: f32,
    pub lr: f32,
    /// The gradient's factor (the global-norm clip's; 1: none).
    pub grad_scale: f32,
}

/// One parameter's AdamW step in one kernel: the new parameter and moments.
pub fn adamw<const D: usize>(
    p: Tensor<Gpu, D>,
    g: Tensor<Gpu, D>,
    moments: Option<(Tensor<Gpu, D>, Tensor<Gpu, D>)>,
    k: AdamWScalars,
) -> (Tensor<Gpu, D>, Tensor<Gpu, D>, Tensor<Gpu, D>) {
    let dims = p.dims();
    let n = dims.iter().product();
    let first = moments.is_none();
    let (p, g) = (storage(p), storage(g));
    // The first step reads no moments: the gradient stands in for them.
    let (m, v) = match moments {
        Some((m, v)) => (storage(m), storage(v)),
        None => (g.clone(), g.clone()),
    };
    let (p_out, m_out, v_out) = (empty(&p, &dims), empty(&p, &dims), empty(&p, &dims));
    if n == 0 {
        return (tensor(p_out), tensor(m_out), tensor(v_out));
    }
    let (count, dim) = cubes(&p, n);
    kernel::adamw_kernel::launch::<f32, Runtime>(
        &p.client.clone(),
        count,
        dim,
        p.into_tensor_arg(),
        g.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        p_out.clone().into_tensor_arg(),
        m_out.clone().into_tensor_arg(),
        v_out.clone().into_tensor_arg(),
        n,
        k.beta_1,
        k.beta_2,
        k.factor_1,
        k.factor_2,
        k.correct_1,
        k.correct_2,
        k.epsilon,
        k.keep,
        k.lr,
        k.grad_scale,
        first,
    );
    (tensor(p_out), tensor(m_out), tensor(v_out))
}
