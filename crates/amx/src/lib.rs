//! Matrix products in bf16 on the CPU: `x [m, k] (f32) · W [k, n]` with `x` and `W` rounded to
//! bf16 (round to nearest even) and products summed in f32 — on Intel AMX tiles (`tdpbf16ps`,
//! Sapphire Rapids and later) or, on CPUs without AMX that have AVX512-BF16 (AMD Zen 4 and
//! later, Intel Cooper Lake), with `vdpbf16ps` in AVX-512 registers; on any other CPU
//! emulated: the bf16 values widened to f32 (exactly) and multiplied as f32 matrices (the `gemm`
//! crate, as burn's f32 product) — a product of two bf16 values is exact in f32, so the
//! emulation computes the sums the instructions compute, in its own order of additions. Used
//! for inference (`<section>.inference_dtype = "bf16"`) and for the frozen base under trained
//! adapters (`update.base_dtype = "bf16"`).
//!
//! Layout: `W` is packed once per model load into 16-column panels in VNNI order (per pair of
//! rows `k, k+1`: 16 columns × 2 values, 64 bytes) — the tiles' operand order and one AVX-512
//! register of `vdpbf16ps` alike; `x` is rounded into a bf16 copy in tile order (per 16 rows
//! and 32 columns, one contiguous 1 KiB tile), both zero-padded (rows to 32, `k` to 32, columns
//! to 32). Each task computes a block of 32 × 32 outputs over the whole `k` (four accumulator
//! tiles, or 8 rows × 32 columns at a time in registers), so every output is summed in the
//! same order whatever the number of threads: the result is the same to the bit on every run
//! on the same machine with the same kernel. The two kernels add the same products in other
//! orders: their results differ in the last bits.

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::sync::OnceLock;

use rayon::prelude::*;

/// `wide! { fn name(args) { body } }`: a kernel compiled three times, as is, for AVX2 with FMA
/// and for AVX-512, and run in the widest copy the CPU has ([`avx512`], [`avx2`]): the same
/// arithmetic in wider registers, so the same results to the bit (Rust never fuses a multiply
/// and an add on its own; an explicit `mul_add` is one rounding on every path). The body is a
/// function of its own, always inlined into the copies that carry the target features: a
/// closure handed to such a function (this crate's first way) is compiled without them unless
/// the optimiser chooses to inline it, which it did not for the larger kernels.
macro_rules! wide {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        #[inline]
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($a: $t),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn on_avx512($($a: $t),*) {
                    body($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn on_avx2($($a: $t),*) {
                    body($($a),*)
                }
                if $crate::avx512() {
                    // SAFETY: the CPU has the features (checked once, [`avx512`]).
                    return unsafe { on_avx512($($a),*) };
                }
                if $crate::avx2() {
                    // SAFETY: the CPU has the features (checked once, [`avx2`]).
                    return unsafe { on_avx2($($a),*) };
                }
            }
            body($($a),*)
        }
    };
}

mod attention;
pub use attention::{Heads, Shape, attention};

const TILE_K: usize = 32; // bf16 values per tile row (64 bytes)
const BLOCK: usize = 32; // rows and columns of a task's output block

/// The kernel that multiplies in bf16 on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Intel AMX tiles (`tdpbf16ps`).
    Amx,
    /// AVX512-BF16 (`vdpbf16ps`), where there is no AMX.
    Avx512Bf16,
    /// No bf16 instructions: the bf16 values widened to f32 and multiplied as f32 matrices,
    /// on every CPU ([`Packed::matmul_on`]).
    Emulated,
}

impl Kernel {
    /// Its name in messages and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Amx => "AMX",
            Kernel::Avx512Bf16 => "AVX512-BF16",
            Kernel::Emulated => "emulated",
        }
    }
}

/// The bf16 kernel of this CPU: AMX where the CPU has it and the kernel lets this process use
/// the tiles, else AVX512-BF16, else the emulation. `RLA_AMX_KERNEL=avx512` picks AVX512-BF16
/// on a CPU that has both, `RLA_AMX_KERNEL=emulated` the emulation (to compare them).
pub fn kernel() -> Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    *K.get_or_init(|| {
        let want = match std::env::var("RLA_AMX_KERNEL").as_deref() {
            Ok("avx512") => Some(Kernel::Avx512Bf16),
            Ok("emulated") => Some(Kernel::Emulated),
            _ => None,
        };
        let all = supported();
        want.filter(|k| all.contains(k)).unwrap_or(all[0])
    })
}

/// Every bf16 kernel this CPU can run, AMX first, the emulation last (asked once: the tiles'
/// permission is a system call; tests compare the kernels a CPU has).
pub fn supported() -> &'static [Kernel] {
    static ALL: OnceLock<Vec<Kernel>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all = Vec::new();
        if amx() {
            all.push(Kernel::Amx);
        }
        if avx512_bf16() {
            all.push(Kernel::Avx512Bf16);
        }
        all.push(Kernel::Emulated);
        all
    })
}

/// Whether this CPU multiplies in bf16 in hardware (AMX or AVX512-BF16): where bf16 is faster
/// than f32, and so where the `"auto"` precisions pick it (the emulation is not faster).
pub fn available() -> bool {
    supported()[0] != Kernel::Emulated
}

fn avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has AMX-BF16 and the kernel lets this process use the tiles.
fn amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID.(EAX=7, ECX=0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        let has = r.edx & (1 << 22) != 0 && r.edx & (1 << 24) != 0;
        if !has {
            return false;
        }
        // Linux ≥ 5.16: ask for the tile data state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        let r = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        r == 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// f32 → bf16, rounding to nearest even (NaN stays NaN). Branch-free, so that the loops
/// over rows vectorise.
#[inline(always)]
pub fn bf16(f: f32) -> u16 {
    let u = f.to_bits();
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
    let nan = (u & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (u >> 16) | 0x40 } else { rounded }) as u16
}

/// bf16 → f32: exact (a bf16 value is an f32's high half).
#[inline(always)]
pub fn widen(v: u16) -> f32 {
    f32::from_bits((v as u32) << 16)
}

/// Little-endian f32 bytes (a tensor's buffer) as f32 values: borrowed when aligned.
pub fn f32s(bytes: &[u8]) -> std::borrow::Cow<'_, [f32]> {
    assert_eq!(bytes.len() % 4, 0, "f32 bytes");
    // SAFETY: every bit pattern is an f32; `align_to` only yields aligned values.
    let (head, body, tail) = unsafe { bytes.align_to::<f32>() };
    if head.is_empty() && tail.is_empty() && cfg!(target_endian = "little") {
        return std::borrow::Cow::Borrowed(body);
    }
    std::borrow::Cow::Owned(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// `e^x` in f32 without a library call, so that loops over it vectorise: `2^n · p(r)` with
/// `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, `p` Cephes' degree-5 polynomial (relative error below
/// 2e-7 against `f32::exp`); inputs clamped to ±88 (no infinities, no denormals).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest (even) by adding and removing 1.5·2^23: plain SSE2 arithmetic, no
    // `roundf` call (x86-64's baseline has no rounding instruction), so it vectorises.
    const MAGIC: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    // r = x − n·ln 2 in two parts (Cody–Waite), exact enough for the polynomial.
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Values per parallel task of the element-wise kernels ([`silu_mul`], [`silu_mul_backward`]).
const CHUNK: usize = 1 << 14;

/// `gate ← silu(gate) · up` (the gated MLP's activation: `g · u / (1 + e^−g)`), element by
/// element.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up");
    wide! {
        fn run(g: &mut [f32], u: &[f32]) {
            for (g, u) in g.iter_mut().zip(u) {
                *g = *g * *u / (1.0 + exp(-*g));
            }
        }
    }
    gate.par_chunks_mut(CHUNK)
        .zip(up.par_chunks(CHUNK))
        .for_each(|(g, u)| run(g, u));
}

/// The gradients of [`silu_mul`]'s `silu(gate) · up` from its output's gradient `g`:
/// `(g · up · σ(gate) · (1 + gate · (1 − σ(gate))), g · silu(gate))`, element by element, with
/// the forward's `σ` (`1 / (1 + e^−gate)`, this crate's `exp`).
pub fn silu_mul_backward(g: &[f32], gate: &[f32], up: &[f32]) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(g.len(), gate.len(), "gradient and gate");
    assert_eq!(g.len(), up.len(), "gradient and up");
    let mut d_gate = vec![0f32; g.len()];
    let mut d_up = vec![0f32; g.len()];
    wide! {
        fn run(g: &[f32], gate: &[f32], up: &[f32], d_gate: &mut [f32], d_up: &mut [f32]) {
            for i in 0..g.len() {
                let x = gate[i];
                let s = 1.0 / (1.0 + exp(-x));
                d_up[i] = g[i] * (x * s);
                d_gate[i] = g[i] * up[i] * (s * (1.0 + x * (1.0 - s)));
            }
        }
    }
    d_gate
        .par_chunks_mut(CHUNK)
        .zip(d_up.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, (dg, du))| {
            let (at, n) = (c * CHUNK, dg.len());
            run(&g[at..at + n], &gate[at..at + n], &up[at..at + n], dg, du)
        });
    (d_gate, d_up)
}

/// Whether the CPU runs the AVX2 copies of the kernels ([`wide!`], where it has no AVX-512).
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: OnceLock<bool> = OnceLock::new();
        *AVX2.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU runs the AVX-512 copies of the kernels ([`wide!`]; every CPU with AMX
/// has AVX-512).
pub(crate) fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Attention weights in place: each row of `scores` (`keys` values) becomes
/// `softmax(scale · row)` over the keys its mask leaves visible, 0 on the others (a row with
/// none visible is all 0). Rows are `[batch][per_batch]`, and row `r`'s query is `r mod t`:
/// its mask is `mask[(batch · t + query) · keys ..][..keys]`, non-zero where the key is hidden
/// (a boolean tensor's bytes, `[batch, t, keys]`).
///
/// The scaling, the maximum, the exponentials and the final products run 16 lanes wide; the
/// row's sum runs key by key in order (as [`masked_softmax_reference`] computes it), so the
/// weights are the same to the bit whatever the vector width.
pub fn masked_softmax(
    scores: &mut [f32],
    keys: usize,
    t: usize,
    per_batch: usize,
    mask: &[u8],
    scale: f32,
) {
    assert_eq!(scores.len() % keys, 0, "rows of keys");
    scores
        .par_chunks_mut(keys)
        .enumerate()
        .with_min_len(64)
        .for_each(|(r, row)| {
            let (batch, query) = (r / per_batch, r % t);
            let hidden = &mask[(batch * t + query) * keys..][..keys];
            softmax_row_wide(row, hidden, scale)
        });
}

wide! {
    fn softmax_row_wide(row: &mut [f32], hidden: &[u8], scale: f32) {
        softmax_row(row, hidden, scale)
    }
}

#[inline(always)]
fn softmax_row(row: &mut [f32], hidden: &[u8], scale: f32) {
    if !softmax_exps(row, hidden, scale) {
        return;
    }
    // In key order, one add at a time: the reference's sum. A hidden key adds 0, exactly, so
    // the sum stops at the last visible key (half the row of a causal mask, on average).
    let last = hidden.iter().rposition(|h| *h == 0).map_or(0, |i| i + 1);
    let mut sum = 0.0f32;
    for v in &row[..last] {
        sum += *v;
    }
    softmax_scale(row, sum);
}

/// [`softmax_row`]'s first part: the row scaled, its visible keys' `exp(x − max)`, 0 on the
/// hidden ones; false (the row all 0) when no key is visible.
#[inline(always)]
pub(crate) fn softmax_exps(row: &mut [f32], hidden: &[u8], scale: f32) -> bool {
    const L: usize = 16;
    // The maximum over the visible keys: per lane, then over the lanes (a maximum is the same
    // in any order; NaN is never taken, as with `>`).
    let mut lanes = [f32::NEG_INFINITY; L];
    let (body, rest) = row.split_at_mut(row.len() / L * L);
    let (hb, hr) = hidden.split_at(body.len());
    for (v, h) in body.chunks_exact_mut(L).zip(hb.chunks_exact(L)) {
        for i in 0..L {
            v[i] *= scale;
            let x = if h[i] == 0 { v[i] } else { f32::NEG_INFINITY };
            lanes[i] = if x > lanes[i] { x } else { lanes[i] };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for (v, h) in rest.iter_mut().zip(hr) {
        *v *= scale;
        if *h == 0 && *v > max {
            max = *v;
        }
    }
    for l in lanes {
        if l > max {
            max = l;
        }
    }
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return false;
    }
    for (v, h) in row.iter_mut().zip(hidden) {
        let e = exp(*v - max);
        *v = if *h == 0 { e } else { 0.0 };
    }
    true
}

/// [`softmax_row`]'s last part: the exponentials divided by their `sum`.
#[inline(always)]
pub(crate) fn softmax_scale(row: &mut [f32], sum: f32) {
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// [`masked_softmax`] one key at a time (what it computed before it ran in lanes; tests
/// compare the two bit for bit).
pub fn masked_softmax_reference(
    scores: &mut [f32],
    keys: usize,
    t: usize,
    per_batch: usize,
    mask: &[u8],
    scale: f32,
) {
    assert_eq!(scores.len() % keys, 0, "rows of keys");
    for (r, row) in scores.chunks_mut(keys).enumerate() {
        let (batch, query) = (r / per_batch, r % t);
        let hidden = &mask[(batch * t + query) * keys..][..keys];
        let mut max = f32::NEG_INFINITY;
        for (v, h) in row.iter_mut().zip(hidden) {
            *v *= scale;
            if *h == 0 && *v > max {
                max = *v;
            }
        }
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        let mut sum = 0.0f32;
        for (v, h) in row.iter_mut().zip(hidden) {
            let e = if *h == 0 { exp(*v - max) } else { 0.0 };
            *v = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// The gradient of [`masked_softmax`] from its output `y` (the weights) and the gradient `g` of
/// that output, in place of `g`: per row `scale · y ⊙ (g − Σ g ⊙ y)` (0 where a key was hidden,
/// since `y` is 0 there). Each row's sum runs in a fixed order (16 lanes, then the lanes in
/// order), so the result does not depend on the threads.
pub fn masked_softmax_backward(g: &mut [f32], y: &[f32], keys: usize, scale: f32) {
    assert_eq!(g.len(), y.len(), "one gradient per weight");
    assert_eq!(g.len() % keys.max(1), 0, "rows of keys");
    g.par_chunks_mut(keys)
        .zip(y.par_chunks(keys))
        .with_min_len(64)
        .for_each(|(g, y)| backward_row(g, y, scale));
    wide! {
        fn backward_row(g: &mut [f32], y: &[f32], scale: f32) {
            let mut lanes = [0f32; 16];
            let (gc, gr) = g.split_at(g.len() / 16 * 16);
            let (yc, yr) = y.split_at(gc.len());
            for (a, b) in gc.chunks_exact(16).zip(yc.chunks_exact(16)) {
                for i in 0..16 {
                    lanes[i] += a[i] * b[i];
                }
            }
            let mut dot = lanes.iter().sum::<f32>();
            for (a, b) in gr.iter().zip(yr) {
                dot += a * b;
            }
            for (gv, yv) in g.iter_mut().zip(y) {
                *gv = scale * *yv * (*gv - dot);
            }
        }
    }
}

/// `x [b, a, c, d]` (row-major) with its middle axes swapped: `[b, c, a, d]`, as copies of
/// `d`-long runs (the attention's heads moved before or after the positions: `d` is the head
/// size). Pure data movement: every value is the input's, bit for bit.
pub fn swap_middle(x: &[f32], b: usize, a: usize, c: usize, d: usize) -> Vec<f32> {
    assert_eq!(x.len(), b * a * c * d, "shape");
    let mut out = vec![0f32; x.len()];
    if out.is_empty() {
        return out;
    }
    // One task per output row `[bi, j]`: `a` runs of `d` values, read `c · d` apart.
    out.par_chunks_mut(a * d)
        .enumerate()
        .with_min_len(16)
        .for_each(|(row, o)| {
            let (bi, j) = (row / c, row % c);
            let src = &x[bi * a * c * d..][..a * c * d];
            for (i, run) in o.chunks_exact_mut(d).enumerate() {
                run.copy_from_slice(&src[(i * c + j) * d..][..d]);
            }
        });
    out
}

/// Rotary position embedding of `x [positions, heads, d]` (row-major) with the tables
/// `cos`, `sin` `[positions, d]` (`sin`'s first half negated): `x · cos + rotate_half(x) · sin`,
/// where `rotate_half(x)` is `[x₂, x₁]` of the halves — each product rounded, then their sum,
/// as the three element-wise tensor operations compute it, so the same bits in one pass.
pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], heads: usize, d: usize) -> Vec<f32> {
    assert!(d % 2 == 0 && heads > 0, "an even head size");
    assert_eq!(x.len() % (heads * d), 0, "x [positions, heads, d]");
    let positions = x.len() / (heads * d);
    assert_eq!(cos.len(), positions * d, "cos [positions, d]");
    assert_eq!(sin.len(), positions * d, "sin [positions, d]");
    let h = d / 2;
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(heads * d)
        .zip(x.par_chunks(heads * d))
        .enumerate()
        .with_min_len(16)
        .for_each(|(p, (o, x))| {
            let (c, s) = (&cos[p * d..][..d], &sin[p * d..][..d]);
            for (o, x) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                for i in 0..h {
                    o[i] = x[i] * c[i] + x[i + h] * s[i];
                }
                for i in h..d {
                    o[i] = x[i] * c[i] + x[i - h] * s[i];
                }
            }
        });
    out
}

/// The transpose of a row-major `[k, n]` matrix: `[n, k]`, in 64 × 64 blocks.
pub fn transpose(w: &[f32], k: usize, n: usize) -> Vec<f32> {
    assert_eq!(w.len(), k * n, "matrix shape");
    let mut t = vec![0f32; w.len()];
    const B: usize = 64;
    for i0 in (0..k).step_by(B) {
        for j0 in (0..n).step_by(B) {
            for i in i0..(i0 + B).min(k) {
                for j in j0..(j0 + B).min(n) {
                    t[j * k + i] = w[i * n + j];
                }
            }
        }
    }
    t
}

/// `y[r] += bias` for every row `r` of `y` (rows of `bias.len()` values).
pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    for row in y.chunks_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += *b;
        }
    }
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Input rows `x [m, k]` rounded to bf16 in the tiles' order: per 16 rows and 32 columns, one
/// contiguous 16 × 64-byte tile (rows padded to 32, `k` to 32, with zeros).
pub struct Rounded {
    m: usize,
    k: usize,
    mp: usize,
    tiles: Vec<u16>,
}

impl Rounded {
    /// Round the row-major `[m, k]` values of `x`.
    pub fn new(x: &[f32], m: usize, k: usize) -> Rounded {
        assert_eq!(x.len(), m * k, "input shape");
        let kp = round_up(k.max(1), TILE_K);
        let mp = round_up(m, BLOCK);
        let mut tiles = vec![0u16; mp * kp];
        tiles
            .par_chunks_mut(16 * kp)
            .enumerate()
            .for_each(|(rb, tiles)| {
                for r in 0..16 {
                    let row = rb * 16 + r;
                    if row >= m {
                        break;
                    }
                    let src = &x[row * k..(row + 1) * k];
                    for (kc, chunk) in src.chunks(TILE_K).enumerate() {
                        let at = (kc * 16 + r) * TILE_K;
                        for (d, s) in tiles[at..at + chunk.len()].iter_mut().zip(chunk) {
                            *d = bf16(*s);
                        }
                    }
                }
            });
        Rounded { m, k, mp, tiles }
    }

    /// The rounded rows as f32, row-major `[m, k]` (exactly: a bf16 value is an f32's high
    /// half).
    fn widened(&self) -> Vec<f32> {
        let (m, k) = (self.m, self.k);
        let kp = round_up(k.max(1), TILE_K);
        let mut out = vec![0f32; m * k];
        out.par_chunks_mut(k.max(1))
            .enumerate()
            .for_each(|(row, o)| {
                let tiles = &self.tiles[(row / 16) * 16 * kp..];
                for (kk, v) in o.iter_mut().enumerate() {
                    let at = (kk / TILE_K) * 16 * TILE_K + (row % 16) * TILE_K + kk % TILE_K;
                    *v = widen(tiles[at]);
                }
            });
        out
    }
}

/// A weight matrix `[k, n]` packed for the tiles.
#[derive(Clone)]
pub struct Packed {
    k: usize,
    n: usize,
    kp: usize,
    np: usize,
    data: Vec<u16>,
    /// The values of `data` as f32, row-major `[k, n]`: [`Kernel::Emulated`]'s operand, made
    /// on its first product.
    wide: OnceLock<Vec<f32>>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed([{}, {}] bf16)", self.k, self.n)
    }
}

impl Packed {
    /// Pack a row-major `[k, n]` matrix.
    pub fn new(w: &[f32], k: usize, n: usize) -> Packed {
        assert_eq!(w.len(), k * n, "weight shape");
        let kp = round_up(k.max(1), TILE_K);
        let np = round_up(n.max(1), BLOCK);
        let panel = kp * 16;
        let mut data = vec![0u16; np / 16 * panel];
        data.par_chunks_mut(panel).enumerate().for_each(|(p, out)| {
            for kk in 0..k {
                let row = &w[kk * n..(kk + 1) * n];
                let base = (kk / 2) * 32 + kk % 2;
                for c in 0..16 {
                    let col = p * 16 + c;
                    if col < n {
                        out[base + c * 2] = bf16(row[col]);
                    }
                }
            }
        });
        Packed {
            k,
            n,
            kp,
            np,
            data,
            wide: OnceLock::new(),
        }
    }

    /// Rows and columns.
    pub fn dims(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// `x [m, k] · W → [m, n]` with this CPU's [`kernel`].
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_rounded(&Rounded::new(x, m, self.k))
    }

    /// [`Packed::matmul`] of an input already rounded (one rounding for every matrix that
    /// multiplies the same rows).
    pub fn matmul_rounded(&self, x: &Rounded) -> Vec<f32> {
        self.matmul_on(kernel(), x)
    }

    /// [`Packed::matmul_rounded`] with a given kernel, one of [`supported`].
    pub fn matmul_on(&self, kernel: Kernel, x: &Rounded) -> Vec<f32> {
        assert_eq!(x.k, self.k, "input columns");
        assert!(
            supported().contains(&kernel),
            "{} is not supported here",
            kernel.name()
        );
        let m = x.m;
        if m == 0 {
            return Vec::new();
        }
        if kernel == Kernel::Emulated {
            return self.matmul_emulated(x);
        }
        let (kp, np) = (self.kp, self.np);
        let (a, mp) = (&x.tiles, x.mp);
        // Not zeroed: every kernel stores its tiles (it never adds to `c`), and every row
        // below `m` is stored (the AVX-512 kernel stores a block's rows below `m` only, so the
        // length is set to those rows after the tiles are in).
        let mut c: Vec<f32> = Vec::with_capacity(mp * np);
        let blocks_n = np / BLOCK;
        // Tasks: column blocks (each reads its two panels once per row block); rows inside.
        let work = mp * np * kp;
        let grain = if work < (1 << 22) { blocks_n } else { 1 };
        let cptr = SendPtr(c.as_mut_ptr());
        (0..blocks_n)
            .into_par_iter()
            .with_min_len(grain)
            .for_each(|bn| {
                let cptr = &cptr;
                match kernel {
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Amx => unsafe {
                        let b = self.data.as_ptr().add(bn * 2 * kp * 16);
                        let _tiles = Tiles::configure();
                        for bm in 0..mp / BLOCK {
                            block(
                                a.as_ptr().add(bm * BLOCK * kp),
                                kp,
                                b,
                                kp * 16,
                                cptr.0.add(bm * BLOCK * np + bn * BLOCK),
                                np,
                            );
                        }
                    },
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512Bf16 => unsafe {
                        let b = self.data.as_ptr().add(bn * 2 * kp * 16);
                        for bm in 0..mp / BLOCK {
                            block_avx512(
                                a.as_ptr().add(bm * BLOCK * kp),
                                kp,
                                (m - bm * BLOCK).min(BLOCK),
                                b,
                                kp * 16,
                                cptr.0.add(bm * BLOCK * np + bn * BLOCK),
                                np,
                            );
                        }
                    },
                    _ => unreachable!("{} is not a tile kernel", kernel.name()),
                }
            });
        // SAFETY: the tasks above stored rows 0..m of every column block (see above).
        unsafe { c.set_len(m * np) };
        if np == self.n {
            return c;
        }
        let n = self.n;
        let mut out = Vec::with_capacity(m * n);
        for r in c.chunks(np) {
            out.extend_from_slice(&r[..n]);
        }
        out
    }

    /// [`Kernel::Emulated`]'s product: the rounded rows and W's bf16 values widened to f32
    /// (exactly) and multiplied by the `gemm` crate (burn's f32 product on the CPU: AVX2 and
    /// FMA, or AVX-512, blocked over `k` by cache sizes, its threads splitting rows and columns,
    /// so the same bits on every run on one machine). A product of two bf16 values is exact
    /// in f32, so it computes the sums the bf16 instructions compute, in its own order. W is
    /// widened on first use and kept.
    fn matmul_emulated(&self, x: &Rounded) -> Vec<f32> {
        let (m, k, n) = (x.m, self.k, self.n);
        let w = self.wide.get_or_init(|| {
            let mut w = vec![0f32; k * n];
            w.par_chunks_mut(n.max(1))
                .enumerate()
                .for_each(|(kk, row)| {
                    for (col, v) in row.iter_mut().enumerate() {
                        *v = self.weight(kk, col);
                    }
                });
            w
        });
        let mut c = vec![0f32; m * n];
        if k == 0 {
            return c;
        }
        let xs = x.widened();
        // SAFETY: c is [m, n], xs [m, k] and w [k, n], all row-major, as the strides say.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                xs.as_ptr(),
                1,
                k as isize,
                w.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            )
        };
        c
    }

    /// `W[kk, col]` as packed (bf16, widened to f32): in panel `col / 16`, VNNI row `kk / 2`.
    fn weight(&self, kk: usize, col: usize) -> f32 {
        let (p, c) = (col / 16, col % 16);
        widen(self.data[p * self.kp * 16 + (kk / 2) * 32 + c * 2 + kk % 2])
    }

    /// The same product from the packed values, one output at a time in f64 (tests: the
    /// packing, on any CPU).
    pub fn matmul_reference(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for kk in 0..k {
                    s += widen(bf16(x[i * k + kk])) as f64 * self.weight(kk, j) as f64;
                }
                out[i * n + j] = s as f32;
            }
        }
        out
    }
}

struct SendPtr(*mut f32);
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// The tile configuration of this thread: 8 tiles of 16 rows × 64 bytes; released on drop.
#[cfg(target_arch = "x86_64")]
struct Tiles;

/// `ldtilecfg`'s 64-byte operand (palette 1).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

#[cfg(target_arch = "x86_64")]
impl Tiles {
    unsafe fn configure() -> Tiles {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for i in 0..8 {
            cfg.colsb[i] = 64;
            cfg.rows[i] = 16;
        }
        unsafe { asm!("ldtilecfg [{c}]", c = in(reg) &cfg as *const Config, options(nostack)) };
        Tiles
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Tiles {
    fn drop(&mut self) {
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One 32 × 32 output block: `a` (32 rows, `kp` bf16 each), `b` (two 16-column panels of
/// `kp / 2` VNNI rows, `panel` values apart), into `c` (row stride `ldc` floats).
#[cfg(target_arch = "x86_64")]
unsafe fn block(a: *const u16, kp: usize, b: *const u16, panel: usize, c: *mut f32, ldc: usize) {
    let a1 = unsafe { a.add(16 * kp) };
    let b1 = unsafe { b.add(panel) };
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let mut kc = 0;
        while kc < kp {
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(kc * 16),
                a1 = in(reg) a1.add(kc * 16),
                b0 = in(reg) b.add(kc * 16),
                b1 = in(reg) b1.add(kc * 16),
                sa = in(reg) 64usize,
                sb = in(reg) 64usize,
                options(nostack, readonly),
            );
            kc += TILE_K;
        }
        let sc = ldc * 4;
        asm!(
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c1} + {sc}*1], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c3} + {sc}*1], tmm3",
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            c2 = in(reg) c.add(16 * ldc),
            c3 = in(reg) c.add(16 * ldc + 16),
            sc = in(reg) sc,
            options(nostack),
        );
    }
}

/// One 32 × 32 output block with AVX512-BF16, as [`block`] computes it on the tiles, of which
/// only the first `rows` rows are needed (the rest stay 0): per group of 8 rows, 16
/// accumulators (8 rows × two 16-column panels) over the pairs of `k`, each pair of a row's
/// values broadcast against the panels' VNNI row (`vdpbf16ps`: two products per lane, added in
/// f32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn block_avx512(
    a: *const u16,
    kp: usize,
    rows: usize,
    b: *const u16,
    panel: usize,
    c: *mut f32,
    ldc: usize,
) {
    use std::arch::x86_64::*;
    const G: usize = 8;
    for g in (0..rows).step_by(G) {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        // Row g + r lives in half h = (g + r) / 16 at row (g + r) % 16 of each tile.
        let half = g / 16;
        let base = unsafe { a.add(half * 16 * kp) };
        for kc in (0..kp).step_by(TILE_K) {
            let tile = unsafe { base.add(kc * 16) };
            for j in 0..TILE_K / 2 {
                let kk = kc / 2 + j;
                let b0 = unsafe { (b.add(kk * 32) as *const __m512bh).read_unaligned() };
                let b1 = unsafe { (b.add(panel + kk * 32) as *const __m512bh).read_unaligned() };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row = (g + r) % 16;
                    let pair =
                        unsafe { (tile.add(row * TILE_K + 2 * j) as *const i32).read_unaligned() };
                    let x = unsafe {
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair))
                    };
                    acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            unsafe {
                let out = c.add((g + r) * ldc);
                _mm512_storeu_ps(out, acc[0]);
                _mm512_storeu_ps(out.add(16), acc[1]);
            }
        }
    }
}
