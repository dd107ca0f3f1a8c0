//! The BERT encoder on the CPU with int8 matrix products.
//!
//! candle runs the model in f32 with AVX2 kernels; on a CPU with AVX-512
//! VNNI, an int8 product does four times the multiply-adds per instruction
//! of an f32 one. This encoder quantizes every linear layer's weights per
//! output column at load and its inputs per token at run time (dynamic
//! quantization, as ONNX Runtime and PyTorch do for BERT), sums in i32 and
//! keeps everything else in f32: embeddings, layer norms, attention scores,
//! softmax, GELU and pooling. Its vectors agree with candle's f32 ones to a
//! cosine of about 0.99 or better (tested on the real model).
//!
//! It also takes texts *ragged*: a micro-batch is the concatenation of its
//! texts' real tokens, with attention inside each text, so no work goes to
//! padding.

mod kernel;

use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config as BertConfig, HiddenAct};

pub(crate) use kernel::Kernel;
use kernel::{QLinear, QuantRows};

use super::Pooling;

/// The encoder's weights, int8 where they feed a matrix product.
pub(crate) struct Int8Encoder {
    kernel: Kernel,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    act: HiddenAct,
    eps: f32,
    vocab: usize,
    positions: usize,
    types: usize,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

struct Layer {
    /// Query, key and value in one product: `3 x hidden` outputs.
    qkv: QLinear,
    attn_out: QLinear,
    attn_norm: Norm,
    up: QLinear,
    down: QLinear,
    out_norm: Norm,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// One text: its token ids and type ids, special tokens included, no
/// padding.
pub(crate) type Text<'a> = (&'a [u32], &'a [u32]);

impl Int8Encoder {
    /// Quantizes the weights `vb` holds (the layout candle's `BertModel`
    /// loads, with or without the `bert.` prefix).
    pub(crate) fn load(
        vb: &VarBuilder,
        config: &BertConfig,
        kernel: Kernel,
    ) -> candle_core::Result<Int8Encoder> {
        let h = config.hidden_size;
        let i = config.intermediate_size;
        if h == 0 || i == 0 || config.num_attention_heads == 0 {
            candle_core::bail!(
                "hidden_size {h}, intermediate_size {i} and num_attention_heads {} must all be above 0",
                config.num_attention_heads
            );
        }
        let root = match &config.model_type {
            Some(prefix) if !vb.contains_tensor("embeddings.word_embeddings.weight") => {
                vb.pp(prefix)
            }
            _ => vb.clone(),
        };
        let get = |vb: &VarBuilder, shape: &[usize], name: &str| -> candle_core::Result<Vec<f32>> {
            vb.get(shape, name)?.flatten_all()?.to_vec1::<f32>()
        };
        let norm = |vb: VarBuilder| -> candle_core::Result<Norm> {
            Ok(Norm {
                weight: get(&vb, &[h], "weight")?,
                bias: get(&vb, &[h], "bias")?,
            })
        };
        let linear = |vb: VarBuilder, n: usize, k: usize| -> candle_core::Result<QLinear> {
            Ok(QLinear::new(
                &get(&vb, &[n, k], "weight")?,
                &get(&vb, &[n], "bias")?,
                n,
                k,
            ))
        };
        let emb = root.pp("embeddings");
        let word = get(
            &emb.pp("word_embeddings"),
            &[config.vocab_size, h],
            "weight",
        )?;
        let position = get(
            &emb.pp("position_embeddings"),
            &[config.max_position_embeddings, h],
            "weight",
        )?;
        let token_type = get(
            &emb.pp("token_type_embeddings"),
            &[config.type_vocab_size, h],
            "weight",
        )?;
        let emb_norm = norm(emb.pp("LayerNorm"))?;
        // No `with_capacity` from the config's numbers: a hostile file must
        // get a shape error from the tensors, not an allocation failure.
        let mut layers = Vec::new();
        for l in 0..config.num_hidden_layers {
            let vb = root.pp(format!("encoder.layer.{l}"));
            let attn = vb.pp("attention");
            let mut w = Vec::new();
            let mut b = Vec::new();
            for name in ["query", "key", "value"] {
                let vb = attn.pp("self").pp(name);
                w.extend(get(&vb, &[h, h], "weight")?);
                b.extend(get(&vb, &[h], "bias")?);
            }
            layers.push(Layer {
                qkv: QLinear::new(&w, &b, 3 * h, h),
                attn_out: linear(attn.pp("output").pp("dense"), h, h)?,
                attn_norm: norm(attn.pp("output").pp("LayerNorm"))?,
                up: linear(vb.pp("intermediate").pp("dense"), i, h)?,
                down: linear(vb.pp("output").pp("dense"), h, i)?,
                out_norm: norm(vb.pp("output").pp("LayerNorm"))?,
            });
        }
        Ok(Int8Encoder {
            kernel,
            hidden: h,
            heads: config.num_attention_heads,
            intermediate: i,
            act: config.hidden_act,
            eps: config.layer_norm_eps as f32,
            vocab: config.vocab_size,
            positions: config.max_position_embeddings,
            types: config.type_vocab_size,
            word,
            position,
            token_type,
            emb_norm,
            layers,
        })
    }

    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// One pooled, unit-length vector per text.
    pub(crate) fn embed(&self, texts: &[Text], pooling: Pooling) -> Result<Vec<Vec<f32>>, String> {
        for (ids, types) in texts {
            if ids.len() != types.len() {
                return Err("token ids and type ids differ in length".into());
            }
            if ids.len() > self.positions {
                return Err(format!(
                    "a text of {} tokens is longer than the model's {} positions",
                    ids.len(),
                    self.positions
                ));
            }
            if let Some(id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
                return Err(format!("token id {id} is outside the vocabulary"));
            }
            if let Some(t) = types.iter().find(|&&t| t as usize >= self.types) {
                return Err(format!("token type {t} is outside the model's types"));
            }
        }
        match self.kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni if Kernel::detect() == Some(Kernel::Vnni) => {
                // SAFETY: the CPU has the features, checked just above.
                Ok(unsafe { self.embed_avx512(texts, pooling) })
            }
            _ => Ok(self.embed_inner(texts, pooling)),
        }
    }

    /// `embed_inner` compiled for AVX-512, so that its element-wise loops
    /// (inlined into it) use 16-lane vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    unsafe fn embed_avx512(&self, texts: &[Text], pooling: Pooling) -> Vec<Vec<f32>> {
        self.embed_inner(texts, pooling)
    }

    #[inline(always)]
    fn embed_inner(&self, texts: &[Text], pooling: Pooling) -> Vec<Vec<f32>> {
        let h = self.hidden;
        let total: usize = texts.iter().map(|(ids, _)| ids.len()).sum();
        let mut x = vec![0.0f32; total * h];
        let mut t = 0;
        for (ids, types) in texts {
            for (p, (&id, &ty)) in ids.iter().zip(types.iter()).enumerate() {
                let row = &mut x[t * h..(t + 1) * h];
                let word = &self.word[id as usize * h..][..h];
                let pos = &self.position[p * h..][..h];
                let typ = &self.token_type[ty as usize * h..][..h];
                for (((o, &w), &p), &y) in row.iter_mut().zip(word).zip(pos).zip(typ) {
                    *o = w + p + y;
                }
                layer_norm(row, &self.emb_norm, self.eps);
                t += 1;
            }
        }

        let mut q = QuantRows::default();
        let mut qkv = vec![0.0f32; total * 3 * h];
        let mut ctx = vec![0.0f32; total * h];
        let mut tmp = vec![0.0f32; total * h];
        let mut up = vec![0.0f32; total * self.intermediate];
        let mut scratch = Scratch::default();
        for layer in &self.layers {
            q.quantize(&x, h);
            layer.qkv.forward(self.kernel, &q, &mut qkv);
            let mut start = 0;
            for (ids, _) in texts {
                let len = ids.len();
                self.attention(&qkv, &mut ctx, start, len, &mut scratch);
                start += len;
            }
            q.quantize(&ctx, h);
            layer.attn_out.forward(self.kernel, &q, &mut tmp);
            add_and_norm(&mut x, &tmp, &layer.attn_norm, self.eps);

            q.quantize(&x, h);
            layer.up.forward(self.kernel, &q, &mut up);
            activate(&mut up, self.act);
            q.quantize(&up, self.intermediate);
            layer.down.forward(self.kernel, &q, &mut tmp);
            add_and_norm(&mut x, &tmp, &layer.out_norm, self.eps);
        }

        let mut out = Vec::with_capacity(texts.len());
        let mut start = 0;
        for (ids, _) in texts {
            let len = ids.len();
            let mut v = vec![0.0f32; h];
            if len > 0 {
                match pooling {
                    Pooling::Cls => v.copy_from_slice(&x[start * h..(start + 1) * h]),
                    Pooling::Mean => {
                        for row in x[start * h..(start + len) * h].chunks_exact(h) {
                            for (o, &r) in v.iter_mut().zip(row) {
                                *o += r;
                            }
                        }
                        let inv = 1.0 / len as f32;
                        v.iter_mut().for_each(|o| *o *= inv);
                    }
                }
                let norm = dot(&v, &v).sqrt().max(1e-12);
                v.iter_mut().for_each(|o| *o /= norm);
            }
            out.push(v);
            start += len;
        }
        out
    }

    /// Self-attention of the `len` tokens from `start`, every head, into
    /// `ctx`. Keys are transposed first, so that a query's scores are
    /// computed for 16 keys at a time.
    #[inline(always)]
    fn attention(
        &self,
        qkv: &[f32],
        ctx: &mut [f32],
        start: usize,
        len: usize,
        scratch: &mut Scratch,
    ) {
        let h = self.hidden;
        let d = h / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        let stride = 3 * h;
        // Keys are stored `lp` to a row, zero-padded to whole blocks.
        let lp = len.div_ceil(LANES) * LANES;
        let Scratch {
            keys,
            values,
            scores,
        } = scratch;
        keys.clear();
        keys.resize(d * lp, 0.0);
        values.clear();
        values.resize(d * len, 0.0);
        scores.clear();
        scores.resize(lp, 0.0);
        for head in 0..self.heads {
            let (qo, ko, vo) = (head * d, h + head * d, 2 * h + head * d);
            for j in 0..len {
                let kj = &qkv[(start + j) * stride + ko..][..d];
                for (c, &k) in kj.iter().enumerate() {
                    keys[c * lp + j] = k;
                }
                values[j * d..(j + 1) * d].copy_from_slice(&qkv[(start + j) * stride + vo..][..d]);
            }
            for i in 0..len {
                let qi = &qkv[(start + i) * stride + qo..][..d];
                // 16 keys at a time, summed in registers over the head's
                // dimensions.
                for (jb, block) in scores.chunks_exact_mut(LANES).enumerate() {
                    let keys = &keys[jb * LANES..];
                    let acc = sum_rows(d, |c| (qi[c], &keys[c * lp..][..LANES]));
                    for l in 0..LANES {
                        block[l] = acc[l] * scale;
                    }
                }
                let weights = &mut scores[..len];
                let max = max(weights);
                weights.iter_mut().for_each(|s| *s = exp(*s - max));
                let inv = 1.0 / sum(weights);
                weights.iter_mut().for_each(|s| *s *= inv);
                let out = &mut ctx[(start + i) * h + qo..][..d];
                // 16 of the head's dimensions at a time, summed in registers
                // over the keys.
                let mut blocks = out.chunks_exact_mut(LANES);
                for (b, block) in (&mut blocks).enumerate() {
                    let at = b * LANES;
                    let acc = sum_rows(len, |j| (weights[j], &values[at + j * d..][..LANES]));
                    block.copy_from_slice(&acc);
                }
                let done = d - blocks.into_remainder().len();
                for e in done..d {
                    ctx[(start + i) * h + qo + e] = weights
                        .iter()
                        .enumerate()
                        .map(|(j, &p)| p * values[j * d + e])
                        .sum();
                }
            }
        }
    }
}

/// Attention's buffers, reused across texts and layers.
#[derive(Default)]
struct Scratch {
    /// One head's keys, transposed: `d` rows of the text's `len` tokens.
    keys: Vec<f32>,
    /// One head's values, `len` rows of `d`, contiguous.
    values: Vec<f32>,
    /// One query's scores, then its attention weights.
    scores: Vec<f32>,
}

/// Lanes of the partial sums: wide enough for a 512-bit register, and the
/// fixed order keeps results independent of the instruction set.
const LANES: usize = 16;

/// `Σ a·b`, in `LANES` partial sums (a float sum in one accumulator does not
/// vectorise).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// `Σ_r w_r · row_r` over `n` rows of `LANES` floats, `row(r)` giving
/// `(w_r, row_r)`: four independent sums in registers, so that the adds
/// overlap instead of each waiting for the last.
#[inline(always)]
fn sum_rows<'a>(n: usize, row: impl Fn(usize) -> (f32, &'a [f32])) -> [f32; LANES] {
    #[inline(always)]
    fn add(acc: &mut [f32; LANES], (w, x): (f32, &[f32])) {
        let x: &[f32; LANES] = x[..LANES].try_into().expect("LANES floats");
        for l in 0..LANES {
            acc[l] += w * x[l];
        }
    }
    let (mut a0, mut a1, mut a2, mut a3) = ([0.0; LANES], [0.0; LANES], [0.0; LANES], [0.0; LANES]);
    let whole = n / 4 * 4;
    let mut r = 0;
    while r < whole {
        add(&mut a0, row(r));
        add(&mut a1, row(r + 1));
        add(&mut a2, row(r + 2));
        add(&mut a3, row(r + 3));
        r += 4;
    }
    while r < n {
        add(&mut a0, row(r));
        r += 1;
    }
    for l in 0..LANES {
        a0[l] = (a0[l] + a1[l]) + (a2[l] + a3[l]);
    }
    a0
}

#[inline(always)]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = a.chunks_exact(LANES);
    for x in &mut chunks {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[inline(always)]
fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = a.chunks_exact(LANES);
    for x in &mut chunks {
        for l in 0..LANES {
            acc[l] = acc[l].max(x[l]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    acc.iter().fold(tail, |m, &v| m.max(v))
}

/// `x = LayerNorm(x + residual)`, row by row (rows of the norm's width).
#[inline(always)]
fn add_and_norm(x: &mut [f32], residual: &[f32], norm: &Norm, eps: f32) {
    let h = norm.weight.len();
    for (row, res) in x.chunks_exact_mut(h).zip(residual.chunks_exact(h)) {
        for (v, &r) in row.iter_mut().zip(res) {
            *v += r;
        }
        layer_norm(row, norm, eps);
    }
}

#[inline(always)]
fn layer_norm(row: &mut [f32], norm: &Norm, eps: f32) {
    let n = row.len() as f32;
    let mean = sum(row) / n;
    row.iter_mut().for_each(|v| *v -= mean);
    let var = dot(row, row) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &w), &b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
        *v = *v * inv * w + b;
    }
}

#[inline(always)]
fn activate(x: &mut [f32], act: HiddenAct) {
    match act {
        HiddenAct::Gelu => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        HiddenAct::GeluApproximate => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        HiddenAct::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
    }
}

/// `e^x` to about 2e-7 relative, in operations that vectorise: `2^n · e^r`
/// with `n = round(x / ln 2)` and a degree-6 polynomial on `|r| ≤ ln 2 / 2`.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + kernel::ROUND;
    let n = t - kernel::ROUND;
    let ni = t.to_bits() as i32 - kernel::ROUND_BITS;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((ni + 127) as u32) << 23)
}

/// `x · Φ(x)` with `erf` from Abramowitz and Stegun 7.1.26 (error under
/// 1.5e-7), as BERT's `gelu`.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let erf = 1.0 - poly * exp(-z * z);
    let erf = if x < 0.0 { -erf } else { erf };
    0.5 * x * (1.0 + erf)
}

/// The tanh approximation of GELU (`gelu_new`, `gelu_approximate`).
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let y = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    let tanh = 1.0 - 2.0 / (exp(2.0 * y) + 1.0);
    0.5 * x * (1.0 + tanh)
}

#[cfg(test)]
mod tests;
