//! Attention in one pass per block of query rows, for inference on the CPU: the scores of a few
//! rows against the keys they see, their masked softmax and the weighted sum of the values,
//! with the rows' scores in a small buffer that stays in the core's cache — never a
//! `[rows, keys]` tensor per head in memory, and no product over keys that every row of a
//! block has hidden (half the keys of a causal row on average, more in a packed prefix tree).
//!
//! Every output is summed in one fixed order: a score `q · k` over the head's dimensions in
//! order, the softmax as [`crate::masked_softmax`], a value over the visible keys in order.
//! A hidden key contributes nothing (its weight is 0 and its term is skipped or adds 0), so a
//! row's values depend only on the keys it sees and on their order — not on the block sizes,
//! the threads, nor on other rows' keys packed between them (a prefix tree's branches give
//! the same bits as separate rows). The products' terms are fused multiply-adds
//! (`f32::mul_add`, one rounding each: the same bits on every CPU, one instruction where the
//! CPU has FMA — `wide!`'s copies — and a library call where it has not).

use rayon::prelude::*;

/// Output columns (keys, or value dimensions) of the register tile.
const COLS: usize = 32;
/// Query rows of the register tile.
const ROWS: usize = 4;
/// Query rows per task (their scores: `BLOCK · keys` f32).
const BLOCK: usize = 16;

/// Keys or values `[b, heads, n, d]` read in place: row `j` of head `h` of batch `i` starts at
/// `i · batch + h · head + j · d` in `data` (a key/value cache with room for more keys per head
/// is such a layout, with `head` = room · d).
#[derive(Clone, Copy, Debug)]
pub struct Heads<'a> {
    pub data: &'a [f32],
    pub batch: usize,
    pub head: usize,
}

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Batch rows.
    pub b: usize,
    /// Key/value heads.
    pub kv: usize,
    /// Query heads per key/value head (their rows are folded: `g · t` rows per key/value head).
    pub g: usize,
    /// Query positions per batch row.
    pub t: usize,
    /// Keys per batch row.
    pub keys: usize,
    /// Dimensions per head.
    pub d: usize,
}

/// `softmax(scale · q kᵀ, masked) · v` per key/value head: `q` is `[b, kv, g·t, d]`
/// (contiguous; row `r` is query position `r mod t`), `k` and `v` hold `keys` rows of `d` per
/// head, and `mask` is a boolean `[b, t, keys]` tensor's bytes (non-zero: the key is hidden
/// from that query). Returns `[b, kv, g·t, d]`. A row that sees no key (or with no keys at
/// all) is 0.
pub fn attention(
    q: &[f32],
    k: Heads<'_>,
    v: Heads<'_>,
    mask: &[u8],
    s: Shape,
    scale: f32,
) -> Vec<f32> {
    let Shape {
        b,
        kv,
        g,
        t,
        keys,
        d,
    } = s;
    let rows = g * t;
    assert_eq!(q.len(), b * kv * rows * d, "queries [b, kv, g·t, d]");
    assert_eq!(mask.len(), b * t * keys, "mask [b, t, keys]");
    let mut out = vec![0f32; b * kv * rows * d];
    if rows == 0 || d == 0 || keys == 0 {
        return out;
    }
    // Where each query sees its last key (0: none), once per call.
    let last: Vec<usize> = mask
        .par_chunks(keys)
        .map(|m| m.iter().rposition(|h| *h == 0).map_or(0, |i| i + 1))
        .collect();
    let keys_pad = keys.div_ceil(COLS) * COLS;
    let d_pad = d.div_ceil(COLS) * COLS;
    out.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(bh, out)| {
            let (i, h) = (bh / kv, bh % kv);
            // The head's keys transposed `[d, keys_pad]` (zero-padded), so that a row's scores
            // against COLS keys are one register tile; its values `[keys, d]` as they lie, or
            // padded to `d_pad` columns when `d` is not a multiple of COLS.
            let ks = &k.data[i * k.batch + h * k.head..][..keys * d];
            let mut kt = vec![0f32; d * keys_pad];
            for (j, key) in ks.chunks_exact(d).enumerate() {
                for (c, x) in key.iter().enumerate() {
                    kt[c * keys_pad + j] = *x;
                }
            }
            let vs = &v.data[i * v.batch + h * v.head..][..keys * d];
            let padded;
            let (vs, ldv) = if d == d_pad {
                (vs, d)
            } else {
                let mut p = vec![0f32; keys * d_pad];
                for (j, row) in vs.chunks_exact(d).enumerate() {
                    p[j * d_pad..j * d_pad + d].copy_from_slice(row);
                }
                padded = p;
                (&padded[..], d_pad)
            };
            let qs = &q[bh * rows * d..][..rows * d];
            let mask = &mask[i * t * keys..][..t * keys];
            let last = &last[i * t..][..t];
            out.par_chunks_mut(BLOCK * d)
                .enumerate()
                .for_each(|(blk, out)| {
                    let r0 = blk * BLOCK;
                    let n = out.len() / d;
                    block(
                        &qs[r0 * d..(r0 + n) * d],
                        r0,
                        &kt,
                        keys_pad,
                        vs,
                        ldv,
                        mask,
                        last,
                        s,
                        scale,
                        out,
                    );
                });
        });
    out
}

wide! {
    /// Rows `r0..r0 + n` of one key/value head (`q` and `out` hold those rows).
    fn block(
        q: &[f32],
        r0: usize,
        kt: &[f32],
        keys_pad: usize,
        vs: &[f32],
        ldv: usize,
        mask: &[u8],
        last: &[usize],
        s: Shape,
        scale: f32,
        out: &mut [f32],
    ) {
        let (t, keys, d) = (s.t, s.keys, s.d);
        let n = q.len() / d;
        let mut scores = vec![0f32; n * keys_pad];
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut r = 0;
        while r < n {
            let m = ROWS.min(n - r);
            let hidden = |x: usize| &mask[((r0 + r + x) % t) * keys..][..keys];
            // The keys any row of this group sees lie before `lim`, in runs `[j0, j1)`.
            let lim = (0..m).map(|x| last[(r0 + r + x) % t]).max().unwrap_or(0);
            runs.clear();
            for j in 0..lim {
                if (0..m).any(|x| hidden(x)[j] == 0) {
                    match runs.last_mut() {
                        Some(run) if run.1 == j => run.1 = j + 1,
                        _ => runs.push((j, j + 1)),
                    }
                }
            }
            let sc = &mut scores[r * keys_pad..(r + m) * keys_pad];
            let a: [&[f32]; ROWS] = std::array::from_fn(|x| &q[(r + x.min(m - 1)) * d..][..d]);
            // Scores COLS keys at a time, over the blocks of keys that hold a seen key (the
            // others stay 0: every row hides them).
            let mut done = 0;
            for &(j0, j1) in &runs {
                let mut c0 = (j0 / COLS * COLS).max(done);
                while c0 < j1 {
                    let acc = tile(&a, &kt[c0..], keys_pad, &[(0, d)]);
                    for x in 0..m {
                        sc[x * keys_pad + c0..][..COLS].copy_from_slice(&acc[x]);
                    }
                    c0 += COLS;
                    done = c0;
                }
            }
            // The masked softmax of each row as `crate::masked_softmax` computes it, the rows'
            // sums (key by key, in order) interleaved: four chains of adds instead of one.
            let mut seen = [false; ROWS];
            for x in 0..m {
                let row = &mut sc[x * keys_pad..][..lim];
                seen[x] = crate::softmax_exps(row, &hidden(x)[..lim], scale);
            }
            let mut sums = [0f32; ROWS];
            for j in 0..lim {
                for (x, sum) in sums.iter_mut().enumerate() {
                    *sum += sc[x.min(m - 1) * keys_pad + j];
                }
            }
            for x in (0..m).filter(|x| seen[*x]) {
                crate::softmax_scale(&mut sc[x * keys_pad..][..lim], sums[x]);
            }
            // The weighted values, COLS dimensions at a time, over the keys some row sees.
            let w: [&[f32]; ROWS] = std::array::from_fn(|x| &sc[x.min(m - 1) * keys_pad..][..lim]);
            for c0 in (0..d).step_by(COLS) {
                let acc = tile(&w, &vs[c0..], ldv, &runs);
                for x in 0..m {
                    let width = COLS.min(d - c0);
                    out[(r + x) * d + c0..][..width].copy_from_slice(&acc[x][..width]);
                }
            }
            r += m;
        }
    }
}

/// `acc[x][c] = Σ_p a[x][p] · b[p · ldb + c]` over the `p` of `runs` (`[p0, p1)` each), in
/// order (one fused multiply-add a term). `b` must hold COLS columns from each row it is
/// read at.
#[inline(always)]
fn tile(a: &[&[f32]; ROWS], b: &[f32], ldb: usize, runs: &[(usize, usize)]) -> [[f32; COLS]; ROWS] {
    let mut acc = [[0f32; COLS]; ROWS];
    for &(p0, p1) in runs {
        for p in p0..p1 {
            let bp: &[f32; COLS] = b[p * ldb..p * ldb + COLS].try_into().expect("COLS columns");
            // All ROWS rows are computed (a short group repeats its last row), so the loops
            // have constant bounds and stay in registers; only the first `m` are kept.
            for x in 0..ROWS {
                let ax = a[x][p];
                for c in 0..COLS {
                    acc[x][c] = ax.mul_add(bp[c], acc[x][c]);
                }
            }
        }
    }
    acc
}
