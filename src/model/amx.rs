//! Matrix products in bf16 on Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and
//! later): `x [m, k] (f32) · W [k, n]` with `x` and `W` rounded to bf16 (round to nearest
//! even) and products summed in f32 by the tiles' `tdpbf16ps`. Used for inference only
//! (`<section>.inference_dtype = "bf16"`), never for training.
//!
//! Layout: `W` is packed once per model load into 16-column panels in the tiles' VNNI order
//! (per pair of rows `k, k+1`: 16 columns × 2 values, 64 bytes); `x` is rounded into a
//! row-major bf16 copy, both zero-padded (rows to 32, `k` to 32, columns to 32). Each task
//! computes a block of 32 × 32 outputs in four accumulator tiles over the whole `k`, so every
//! output is summed in the same order whatever the number of threads: the result is the same
//! to the bit on every run on the same machine.

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::sync::OnceLock;

use rayon::prelude::*;

const TILE_K: usize = 32; // bf16 values per tile row (64 bytes)
const BLOCK: usize = 32; // rows and columns of a task's output block

/// Whether this CPU has AMX-BF16 and the kernel lets this process use the tiles (asked once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
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
    })
}

/// f32 → bf16, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if f.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// A weight matrix `[k, n]` packed for the tiles.
#[derive(Clone)]
pub struct Packed {
    k: usize,
    n: usize,
    kp: usize,
    np: usize,
    data: Vec<u16>,
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
        Packed { k, n, kp, np, data }
    }

    /// Rows and columns.
    pub fn dims(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// `x [m, k] · W → [m, n]` on the tiles. Callers check [`available`] first (a model is
    /// packed only then).
    #[cfg(target_arch = "x86_64")]
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "input shape");
        assert!(available(), "AMX is not available");
        if m == 0 {
            return Vec::new();
        }
        let (k, kp, np) = (self.k, self.kp, self.np);
        let mp = round_up(m, BLOCK);
        // `x` in tile order: per 16 rows, per 32 columns, one contiguous 16 × 64-byte tile.
        let mut a = vec![0u16; mp * kp];
        a.par_chunks_mut(16 * kp)
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
        let mut c = vec![0f32; mp * np];
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
                unsafe {
                    let _tiles = Tiles::configure();
                    for bm in 0..mp / BLOCK {
                        block(
                            a.as_ptr().add(bm * BLOCK * kp),
                            kp,
                            self.data.as_ptr().add(bn * 2 * kp * 16),
                            kp * 16,
                            cptr.0.add(bm * BLOCK * np + bn * BLOCK),
                            np,
                        );
                    }
                }
            });
        if np == self.n {
            c.truncate(m * np);
            return c;
        }
        let n = self.n;
        let mut out = vec![0f32; m * n];
        out.chunks_mut(n)
            .zip(c.chunks(np))
            .for_each(|(o, r)| o.copy_from_slice(&r[..n]));
        out
    }

    /// Without AMX (not x86-64): never called, a model is packed only where [`available`].
    #[cfg(not(target_arch = "x86_64"))]
    pub fn matmul(&self, _x: &[f32], _m: usize) -> Vec<f32> {
        unreachable!("AMX is x86-64 only")
    }

    /// The same product from the packed values, one output at a time in f64 (tests: the
    /// packing, on any CPU).
    pub fn matmul_reference(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let w = |kk: usize, col: usize| {
            let (p, c) = (col / 16, col % 16);
            let v = self.data[p * self.kp * 16 + (kk / 2) * 32 + c * 2 + kk % 2];
            f32::from_bits((v as u32) << 16) as f64
        };
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for kk in 0..k {
                    s += f32::from_bits((bf16(x[i * k + kk]) as u32) << 16) as f64 * w(kk, j);
                }
                out[i * n + j] = s as f32;
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
struct SendPtr(*mut f32);
#[cfg(target_arch = "x86_64")]
unsafe impl Sync for SendPtr {}
#[cfg(target_arch = "x86_64")]
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

    /// The packed layout holds W's bf16 values (checked through the portable reference on
    /// every CPU), and on a CPU with AMX the tiles compute the same sums: every output within
    /// 1e-4 (absolute, outputs of order 1) of the f64 sum of the same bf16 products — the tiles
    /// add in f32 — and within 0.05 of the f32 product (bf16's 8 bits over k ≤ 600 terms).
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
            if !available() {
                eprintln!("no AMX on this CPU: the tiles' own product is not checked here");
                continue;
            }
            let got = p.matmul(&x, m);
            assert_eq!(got.len(), m * n);
            for (g, r) in got.iter().zip(&reference) {
                assert!((g - r).abs() < 1e-4, "[{m}, {k}, {n}]: {g} vs {r}");
            }
            assert_eq!(got, p.matmul(&x, m), "the same bits again");
        }
    }
}
