//! bf16 matrix products (Intel AMX, AVX512-BF16, or emulated in f32) for inference
//! (`<section>.inference_dtype = "bf16"`) and for adapters' frozen base in training
//! (`update.base_dtype = "bf16"`): the kernels live in the `rla-amx` crate (`crates/amx`),
//! which the dev profile optimises while rla-pipe itself builds unoptimised.

pub use rla_amx::{
    Heads, Packed, Rounded, Shape, add_bias, attention, available, bf16, exp, f32s, masked_softmax,
    masked_softmax_backward, rope, silu_mul, silu_mul_backward, swap_middle, transpose,
};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};

use crate::model::backend::{Cpu, cast, flex};

/// A tensor's values as f32 (read from its bytes in `rla-amx`, which the dev profile
/// optimises: a checked cast here would run unoptimised over every value).
pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> TensorData {
    let data = t.into_data();
    if data.dtype == burn::tensor::DType::F32 {
        data
    } else {
        data.convert::<f32>()
    }
}

/// `f` of a tensor's values as f32, in order. On the CPU backend an f32 tensor whose values lie
/// contiguous is read where it lies: burn-flex's `into_data` copies a buffer that other tensors
/// share (as the autodiff graph's do) out of it, and copies that once more to realign it — two
/// passes over every value, for a read. Otherwise (another layout, dtype or backend) through
/// [`values`]. The same values either way, so the same results to the bit.
pub fn with_f32<B: Backend, const D: usize, R>(t: Tensor<B, D>, f: impl FnOnce(&[f32]) -> R) -> R {
    match cast::<Tensor<B, D>, Tensor<Cpu, D>>(t) {
        Ok(x) => {
            let x = flex(x);
            if x.dtype() == DType::F32
                && let Some((start, end)) = x.layout().contiguous_offsets()
            {
                return f(&f32s(&x.bytes()[start * 4..end * 4]));
            }
            let x = Tensor::<Cpu, D>::from_primitive(TensorPrimitive::Float(x));
            f(&f32s(values(x).as_bytes()))
        }
        Err(t) => f(&f32s(values(t).as_bytes())),
    }
}

/// `x [m, k] · W` with the CPU's bf16 kernel, as a tensor (the CPU backends).
pub fn matmul_packed<B: Backend>(x: Tensor<B, 2>, w: &Packed) -> Tensor<B, 2> {
    let device = x.device();
    let [m, _] = x.dims();
    let y = with_f32(x, |xs| w.matmul(xs, m));
    Tensor::from_data(TensorData::new(y, [m, w.dims()[1]]), &device)
}

// The crate's tests live here, where `cargo test` runs them.
#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as f32 / (1u64 << 31) as f32 - 0.5
            })
            .collect()
    }

    /// In place or through `into_data`, the values a tensor holds, in order: contiguous, shared
    /// with another tensor, a narrowed view at an offset, a transposed (strided) view, on the
    /// training backend.
    #[test]
    fn values_read_in_place_are_the_tensors_values() {
        use crate::model::backend::CpuTrain;
        let device = Default::default();
        let x = Tensor::<Cpu, 2>::from_data(TensorData::new(data(24, 3), [4, 6]), &device);
        let want = |t: Tensor<Cpu, 2>| f32s(values(t).as_bytes()).into_owned();
        let shared = x.clone();
        for t in [
            x.clone(),
            x.clone().narrow(0, 1, 2),
            x.clone().narrow(1, 2, 3),
            x.clone().transpose(),
        ] {
            assert_eq!(with_f32(t.clone(), <[f32]>::to_vec), want(t));
        }
        drop(shared);
        let y = Tensor::<CpuTrain, 2>::from_data(TensorData::new(data(24, 3), [4, 6]), &device)
            .narrow(0, 1, 2);
        assert_eq!(with_f32(y, <[f32]>::to_vec), want(x.narrow(0, 1, 2)));
    }

    #[test]
    fn exp_is_within_2e_7_of_the_library() {
        let mut worst = 0f64;
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite());
        let mut g = vec![-2.0f32, 0.0, 3.0];
        silu_mul(&mut g, &[1.0, 5.0, 2.0]);
        let silu = |x: f64| x / (1.0 + (-x).exp());
        for (got, want) in g.iter().zip([silu(-2.0), 0.0, 2.0 * silu(3.0)]) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn transpose_moves_every_value() {
        for (k, n) in [(1, 1), (3, 130), (65, 7), (128, 64)] {
            let w = data(k * n, 5);
            let t = transpose(&w, k, n);
            for i in 0..k {
                for j in 0..n {
                    assert_eq!(t[j * k + i], w[i * n + j], "{k}x{n} at {i},{j}");
                }
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.0), 0xc000);
        assert!(f32::from_bits((bf16(f32::NAN) as u32) << 16).is_nan());
    }

    /// The masked softmax in lanes gives the weights of the key-by-key version to the bit:
    /// rows of every length around the lane width, masks from none to all hidden (a row with
    /// no visible key is all 0), scores up to ±200 (a row's exponentials clamp), several
    /// batches of queries.
    #[test]
    fn masked_softmax_in_lanes_equals_key_by_key() {
        for &(keys, t, batches, heads) in &[
            (1, 1, 1, 1),
            (15, 3, 2, 2),
            (16, 4, 1, 3),
            (17, 5, 3, 1),
            (70, 9, 2, 4),
            (300, 2, 1, 9),
        ] {
            let rows = batches * heads * t;
            let scores: Vec<f32> = data(rows * keys, keys as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 11 == 0 { v * 400.0 } else { v * 8.0 })
                .collect();
            let mut s = keys as u64 * 31 + t as u64;
            let mask: Vec<u8> = (0..batches * t * keys)
                .map(|i| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Query 0 of each batch sees nothing; the rest about a third hidden.
                    u8::from(i % (t * keys) < keys || (s >> 60) < 5)
                })
                .collect();
            let mut fast = scores.clone();
            masked_softmax(&mut fast, keys, t, heads * t, &mask, 0.37);
            let mut slow = scores;
            rla_amx::masked_softmax_reference(&mut slow, keys, t, heads * t, &mask, 0.37);
            for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "keys {keys}, value {i}: {a} vs {b}"
                );
            }
            // A row with nothing visible is 0, one with something sums to 1.
            for (r, row) in fast.chunks(keys).enumerate() {
                let sum: f32 = row.iter().sum();
                assert!(sum == 0.0 || (sum - 1.0).abs() < 1e-5, "row {r}: {sum}");
            }
        }
    }

    /// The packed layout holds W's bf16 values (checked through the portable reference on
    /// every CPU), and every bf16 kernel the CPU has (AMX tiles, AVX512-BF16, and the emulation
    /// on every CPU) computes the same sums: every output within 1e-4 (absolute, outputs of
    /// order 1) of the f64 sum of the same bf16 products — the kernels add in f32, in their own
    /// orders (2e-4 between two kernels) — and within 0.05 of the f32 product (bf16's 8 bits
    /// over k ≤ 600 terms).
    #[test]
    fn tiles_compute_the_product_of_the_rounded_matrices() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 5, 7),
            (17, 64, 48),
            (33, 70, 100),
            (40, 576, 192),
        ] {
            let x = data(m * k, 1 + m as u64);
            let w = data(k * n, 2 + n as u64);
            let p = Packed::new(&w, k, n);
            assert_eq!(p.dims(), [k, n]);
            let reference = p.matmul_reference(&x, m);
            for i in 0..m {
                for j in 0..n {
                    let exact: f32 = (0..k).map(|kk| x[i * k + kk] * w[kk * n + j]).sum();
                    let got = reference[i * n + j];
                    assert!(
                        (got - exact).abs() < 0.05,
                        "[{m}, {k}, {n}] ({i}, {j}): {got} vs {exact}"
                    );
                }
            }
            // Every kernel this CPU has (AMX and AVX512-BF16 on a Xeon with both), each
            // against the reference and against each other.
            let mut products = Vec::new();
            for &kernel in rla_amx::supported() {
                let got = p.matmul_on(kernel, &rla_amx::Rounded::new(&x, m, k));
                for (g, r) in got.iter().zip(&reference) {
                    assert!(
                        (g - r).abs() < 1e-4,
                        "{kernel:?} [{m}, {k}, {n}]: {g} vs {r}"
                    );
                }
                products.push(got);
            }
            for pair in products.windows(2) {
                for (a, b) in pair[0].iter().zip(&pair[1]) {
                    assert!((a - b).abs() < 2e-4, "the kernels differ: {a} vs {b}");
                }
            }
            let got = p.matmul(&x, m);
            assert_eq!(got.len(), m * n);
            for (g, r) in got.iter().zip(&reference) {
                assert!((g - r).abs() < 1e-4, "[{m}, {k}, {n}]: {g} vs {r}");
            }
            assert_eq!(got, p.matmul(&x, m), "the same bits again");
        }
    }

    /// One row at a time: the scores key by key, [`rla_amx::masked_softmax_reference`], the
    /// values key by key (fused multiply-adds, as the kernel).
    fn reference(q: &[f32], k: &[f32], v: &[f32], mask: &[u8], s: Shape, scale: f32) -> Vec<f32> {
        let Shape {
            b,
            kv,
            g,
            t,
            keys,
            d,
        } = s;
        let rows = g * t;
        let mut out = vec![0f32; b * kv * rows * d];
        for i in 0..b {
            for h in 0..kv {
                let bh = i * kv + h;
                let mut w = vec![0f32; rows * keys];
                for r in 0..rows {
                    for j in 0..keys {
                        let mut acc = 0f32;
                        for c in 0..d {
                            acc =
                                q[(bh * rows + r) * d + c].mul_add(k[(bh * keys + j) * d + c], acc);
                        }
                        w[r * keys + j] = acc;
                    }
                }
                rla_amx::masked_softmax_reference(
                    &mut w,
                    keys,
                    t,
                    rows,
                    &mask[i * t * keys..][..t * keys],
                    scale,
                );
                for r in 0..rows {
                    for c in 0..d {
                        let mut acc = 0f32;
                        for j in 0..keys {
                            acc = w[r * keys + j].mul_add(v[(bh * keys + j) * d + c], acc);
                        }
                        out[(bh * rows + r) * d + c] = acc;
                    }
                }
            }
        }
        out
    }

    /// The fused attention equals the row-by-row reference to the bit (the same sums in the
    /// same order), over shapes with partial blocks, padded dimensions, keys hidden in runs
    /// and rows that see nothing; and a key/value layout with room between the heads.
    #[test]
    fn fused_attention_equals_the_reference_to_the_bit() {
        for (b, kv, g, t, keys, d) in [
            (1, 1, 1, 2, 2, 4),
            (2, 3, 3, 7, 7, 64),
            (3, 2, 2, 5, 13, 8),
            (1, 2, 1, 40, 70, 64),
            (2, 1, 4, 9, 33, 48),
        ] {
            let s = Shape {
                b,
                kv,
                g,
                t,
                keys,
                d,
            };
            let q = data(b * kv * g * t * d, 1);
            let k = data(b * kv * keys * d, 2);
            let v = data(b * kv * keys * d, 3);
            // Causal over the last t keys, a hidden run in the middle, and the last query
            // of batch row 0 seeing nothing.
            let mut mask = vec![0u8; b * t * keys];
            for i in 0..b {
                for x in 0..t {
                    for j in 0..keys {
                        let causal = j > keys - t + x;
                        let run = (3..6).contains(&j) && x % 2 == 1;
                        let none = i == 0 && x == t - 1 && t > 1;
                        mask[(i * t + x) * keys + j] = u8::from(causal || run || none);
                    }
                }
            }
            let scale = 1.0 / (d as f32).sqrt();
            let want = reference(&q, &k, &v, &mask, s, scale);
            // Keys and values with `room` rows per head (the first `keys` of each used).
            let run = |k: &[f32], v: &[f32], room: usize| {
                let heads = |data| Heads {
                    data,
                    batch: kv * room * d,
                    head: room * d,
                };
                attention(&q, heads(k), heads(v), &mask, s, scale)
            };
            let got = run(&k, &v, keys);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{b}x{kv}x{g}x{t}x{keys}x{d}");
            // The same keys and values in a buffer with room for 5 more keys per head.
            let room = keys + 5;
            let spread = |x: &[f32]| {
                let mut y = vec![f32::NAN; b * kv * room * d];
                for bh in 0..b * kv {
                    y[bh * room * d..][..keys * d].copy_from_slice(&x[bh * keys * d..][..keys * d]);
                }
                y
            };
            let (ks, vs) = (spread(&k), spread(&v));
            let roomy = run(&ks, &vs, room);
            assert_eq!(
                bits(&roomy),
                bits(&want),
                "{b}x{kv}x{g}x{t}x{keys}x{d}: with room"
            );
        }
    }
}
