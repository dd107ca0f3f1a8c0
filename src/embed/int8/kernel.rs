//! Int8 matrix products: `out = A · Wᵀ + bias` with `A` quantized per row
//! and `W` per output column, the products summed in i32.
//!
//! Weights are packed once, at load, for AVX-512 VNNI's `vpdpbusd`, which
//! multiplies 64 unsigned bytes by 64 signed bytes and adds each group of
//! four into one of 16 i32 lanes: a panel of 16 output columns stores, for
//! each group of 4 inputs, the 16 columns' 4 weights (64 bytes). Activations
//! are quantized symmetrically to −127..=127 and stored offset by 128 as
//! unsigned bytes; `128 · Σ w` per column, computed at load, takes the
//! offset back out.
//!
//! No crate does this on stable Rust: candle's `Q8_0` product is a row-by-row
//! AVX2 dot product (no register blocking, no VNNI) and `gemm`'s AVX-512
//! kernels need nightly. The portable kernel computes the same integers
//! with plain loops; it is the reference the tests hold the VNNI kernel to,
//! and it runs wherever the CPU lacks VNNI and int8 was asked for.

/// Which instructions the products run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX-512 F + BW + VNNI (and FMA), detected at run time.
    Vnni,
    /// Plain Rust loops: the same results, many times slower.
    Portable,
}

impl Kernel {
    /// `Vnni` when this CPU has it.
    pub(crate) fn detect() -> Option<Kernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Some(Kernel::Vnni);
            }
        }
        None
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Vnni => "int8-avx512-vnni",
            Kernel::Portable => "int8-portable",
        }
    }
}

/// Output columns per packed panel (one 512-bit register of i32).
pub(crate) const PANEL: usize = 16;

/// A linear layer `y = x Wᵀ + b` with int8 weights.
pub(crate) struct QLinear {
    /// Outputs.
    pub(crate) n: usize,
    /// `k` rounded up to a multiple of 4: the stride of quantized rows.
    pub(crate) kp: usize,
    /// Panels of `PANEL` columns: `[panel][kp / 4][PANEL][4]`.
    packed: Vec<i8>,
    /// Per column, padded to whole panels: the weight scale, `128 · Σ w`,
    /// and the bias.
    scale: Vec<f32>,
    comp: Vec<i32>,
    bias: Vec<f32>,
}

impl QLinear {
    /// `weight` is `n` rows of `k` (PyTorch's `Linear.weight`), `bias` is `n`.
    pub(crate) fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> QLinear {
        assert_eq!(weight.len(), n * k, "weight is not {n}x{k}");
        assert_eq!(bias.len(), n, "bias is not {n}");
        let kp = k.div_ceil(4) * 4;
        let panels = n.div_ceil(PANEL);
        let cols = panels * PANEL;
        let mut packed = vec![0i8; panels * kp * PANEL];
        let mut scale = vec![0.0f32; cols];
        let mut comp = vec![0i32; cols];
        let mut padded_bias = vec![0.0f32; cols];
        for c in 0..n {
            let row = &weight[c * k..(c + 1) * k];
            let amax = row.iter().fold(0.0f32, |m, &w| m.max(w.abs()));
            let s = if amax > 0.0 && amax.is_finite() {
                amax / 127.0
            } else {
                1.0
            };
            scale[c] = s;
            padded_bias[c] = bias[c];
            let (panel, lane) = (c / PANEL, c % PANEL);
            let mut sum = 0i32;
            for (i, &w) in row.iter().enumerate() {
                let q = quantize(w / s);
                sum += i32::from(q);
                let at = panel * kp * PANEL + (i / 4) * PANEL * 4 + lane * 4 + i % 4;
                packed[at] = q;
            }
            comp[c] = 128 * sum;
        }
        QLinear {
            n,
            kp,
            packed,
            scale,
            comp,
            bias: padded_bias,
        }
    }

    /// `out` (`m` rows of `n`) = the rows of `a` times the weights, plus the
    /// bias.
    pub(crate) fn forward(&self, kernel: Kernel, a: &QuantRows, out: &mut [f32]) {
        assert_eq!(a.kp, self.kp, "quantized rows have the wrong stride");
        let m = a.scale.len();
        assert_eq!(
            a.data.len(),
            m * self.kp,
            "quantized rows are not {m}x{}",
            self.kp
        );
        assert_eq!(out.len(), m * self.n, "output is not {m}x{}", self.n);
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => {
                assert!(
                    Kernel::detect() == Some(Kernel::Vnni),
                    "the VNNI kernel on a CPU without AVX-512 VNNI"
                );
                // SAFETY: the CPU has the features (checked above), and
                // every pointer the kernel forms stays inside the slices
                // whose shapes were checked above and at construction.
                unsafe { vnni::gemm(self, a, out) }
            }
            _ => self.forward_portable(a, out),
        }
    }

    fn forward_portable(&self, a: &QuantRows, out: &mut [f32]) {
        let groups = self.kp / 4;
        for (r, out_row) in out.chunks_exact_mut(self.n).enumerate() {
            let row = &a.data[r * self.kp..(r + 1) * self.kp];
            for (c, o) in out_row.iter_mut().enumerate() {
                let (panel, lane) = (c / PANEL, c % PANEL);
                let base = panel * self.kp * PANEL + lane * 4;
                let mut acc = 0i32;
                for g in 0..groups {
                    let w = &self.packed[base + g * PANEL * 4..][..4];
                    for b in 0..4 {
                        acc += i32::from(row[g * 4 + b]) * i32::from(w[b]);
                    }
                }
                *o =
                    ((acc - self.comp[c]) as f32).mul_add(a.scale[r] * self.scale[c], self.bias[c]);
            }
        }
    }
}

/// Rows of activations quantized for `QLinear`: `128 + round(x / scale)`,
/// each row `kp` bytes (zero-padded), with one scale per row.
#[derive(Default)]
pub(crate) struct QuantRows {
    pub(crate) kp: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) scale: Vec<f32>,
}

impl QuantRows {
    /// Quantizes `x`, rows of `k` floats, for a layer that reads `k`.
    /// Inlined, so that it vectorises for the caller's instruction set.
    #[inline(always)]
    pub(crate) fn quantize(&mut self, x: &[f32], k: usize) {
        let kp = k.div_ceil(4) * 4;
        let m = x.len().checked_div(k).unwrap_or(0);
        self.kp = kp;
        self.data.clear();
        self.data.resize(m * kp, 128);
        self.scale.clear();
        for (row, dst) in x.chunks_exact(k).zip(self.data.chunks_exact_mut(kp)) {
            let amax = abs_max(row);
            let (s, inv) = if amax > 0.0 && amax.is_finite() {
                (amax / 127.0, 127.0 / amax)
            } else {
                (1.0, 0.0)
            };
            self.scale.push(s);
            for (d, &v) in dst.iter_mut().zip(row) {
                *d = quantize_offset(v * inv);
            }
        }
    }
}

/// The largest magnitude in `row` (NaN ignored), in 16 lanes so that it
/// vectorises.
#[inline(always)]
fn abs_max(row: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            lanes[l] = lanes[l].max(c[l].abs());
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    lanes.iter().fold(tail, |m, &v| m.max(v))
}

/// 1.5 · 2^23: adding it to a float of magnitude below 2^22 rounds it to an
/// integer (ties to even) and leaves that integer in the low mantissa bits,
/// `bits - ROUND_BITS`. No `roundf` call and no saturating `as` (neither
/// vectorises).
pub(crate) const ROUND: f32 = 12_582_912.0;
pub(crate) const ROUND_BITS: i32 = 0x4B40_0000;

/// Rounds to the nearest integer (ties to even) in −127..=127; NaN becomes
/// 0.
#[inline(always)]
fn quantize(v: f32) -> i8 {
    (i32::from(quantize_offset(v)) - 128) as i8
}

/// `128 + quantize(v)`, the byte the VNNI kernel reads.
#[inline(always)]
fn quantize_offset(v: f32) -> u8 {
    #[allow(clippy::eq_op)] // NaN is the only value unequal to itself.
    let v = if v == v { v.clamp(-127.0, 127.0) } else { 0.0 };
    ((v + (ROUND + 128.0)).to_bits() as i32 - ROUND_BITS) as u8
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{QLinear, QuantRows, PANEL};

    /// Rows per tile.
    const MR: usize = 6;
    /// Panels per tile: 6 x 4 accumulators of 16 lanes = 384 outputs in 24
    /// of the 32 registers.
    const NP: usize = 4;

    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `a` has `kp`-byte rows matching
    /// `layer` and `out` holds `a`'s rows x `layer.n`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn gemm(layer: &QLinear, a: &QuantRows, out: &mut [f32]) {
        let m = a.scale.len();
        let panels = layer.n.div_ceil(PANEL);
        let mut p0 = 0;
        while p0 < panels {
            let np = (panels - p0).min(NP);
            let mut r0 = 0;
            while r0 < m {
                let mr = (m - r0).min(MR);
                // SAFETY: as the function's.
                unsafe {
                    match (mr, np) {
                        (6, 4) => tile::<6, 4>(layer, a, out, r0, p0),
                        (_, 4) => tile_rows::<4>(layer, a, out, r0, p0, mr),
                        (_, 3) => tile_rows::<3>(layer, a, out, r0, p0, mr),
                        (_, 2) => tile_rows::<2>(layer, a, out, r0, p0, mr),
                        _ => tile_rows::<1>(layer, a, out, r0, p0, mr),
                    }
                }
                r0 += mr;
            }
            p0 += np;
        }
    }

    /// The last rows (fewer than `MR`), or a tile of fewer panels, one
    /// monomorphised size at a time.
    #[inline(always)]
    unsafe fn tile_rows<const P: usize>(
        layer: &QLinear,
        a: &QuantRows,
        out: &mut [f32],
        r0: usize,
        p0: usize,
        mr: usize,
    ) {
        // SAFETY: as `gemm`'s.
        unsafe {
            match mr {
                6 => tile::<6, P>(layer, a, out, r0, p0),
                5 => tile::<5, P>(layer, a, out, r0, p0),
                4 => tile::<4, P>(layer, a, out, r0, p0),
                3 => tile::<3, P>(layer, a, out, r0, p0),
                2 => tile::<2, P>(layer, a, out, r0, p0),
                _ => tile::<1, P>(layer, a, out, r0, p0),
            }
        }
    }

    /// Rows `r0..r0 + R` times panels `p0..p0 + P`.
    #[inline(always)]
    unsafe fn tile<const R: usize, const P: usize>(
        layer: &QLinear,
        a: &QuantRows,
        out: &mut [f32],
        r0: usize,
        p0: usize,
    ) {
        let kp = layer.kp;
        let n = layer.n;
        let panel_bytes = kp * PANEL;
        // SAFETY (whole body): rows r0..r0 + R exist in `a` (R <= m - r0),
        // panels p0..p0 + P exist in `packed` (P <= panels - p0), each
        // panel holds kp / 4 groups of 64 bytes, and each row kp bytes; the
        // per-column vectors are padded to whole panels; stores are masked
        // to the columns below n of rows below m.
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            let w_base = layer.packed.as_ptr().add(p0 * panel_bytes);
            let a_base = a.data.as_ptr().add(r0 * kp);
            for g in 0..kp / 4 {
                let mut w = [_mm512_setzero_si512(); P];
                for (j, w) in w.iter_mut().enumerate() {
                    *w = _mm512_loadu_si512(
                        w_base.add(j * panel_bytes + g * PANEL * 4) as *const __m512i
                    );
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = (a_base.add(r * kp + g * 4) as *const i32).read_unaligned();
                    let x = _mm512_set1_epi32(x);
                    for (acc, w) in acc.iter_mut().zip(&w) {
                        *acc = _mm512_dpbusd_epi32(*acc, x, *w);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let row = r0 + r;
                let sa = _mm512_set1_ps(*a.scale.get_unchecked(row));
                for (j, acc) in acc.iter().enumerate() {
                    let col = (p0 + j) * PANEL;
                    let comp = _mm512_loadu_si512(layer.comp.as_ptr().add(col) as *const __m512i);
                    let ws = _mm512_loadu_ps(layer.scale.as_ptr().add(col));
                    let bias = _mm512_loadu_ps(layer.bias.as_ptr().add(col));
                    let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(*acc, comp));
                    let v = _mm512_fmadd_ps(v, _mm512_mul_ps(sa, ws), bias);
                    let valid = (n - col).min(PANEL);
                    let mask: __mmask16 = if valid == PANEL {
                        0xffff
                    } else {
                        (1u16 << valid) - 1
                    };
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(row * n + col), mask, v);
                }
            }
        }
    }
}
