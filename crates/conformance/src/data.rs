//! Random inputs and weights for the checks.

use std::sync::Arc;

use ds4_engine::backend::Backend;
use ds4_engine::{EngineError, Result};
use ds4_gguf::{GgmlType, GgufFile, GgufWriter};
use half::{bf16, f16};

/// A small deterministic generator (xorshift64*), with normal samples by Box–Muller.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit() as f32
    }

    /// `n` normal values of standard deviation `std`.
    pub fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u, v) = (self.unit().max(1e-300), self.unit());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32 * std
            })
            .collect()
    }

    /// An index in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }
}

/// `data` in a new backend buffer.
pub fn upload<B: Backend>(b: &B, data: &[f32]) -> Result<B::Buf> {
    let mut buf = b.buf(data.len())?;
    b.write(&mut buf, 0, data)?;
    Ok(buf)
}

/// The first `len` values of `buf`.
pub fn download<B: Backend>(b: &B, buf: &B::Buf, len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::with_capacity(len);
    b.read(buf, 0, len, &mut v)?;
    Ok(v)
}

/// The first `len` ids of `ids`.
pub fn download_ids<B: Backend>(b: &B, ids: &B::Ids, len: usize) -> Result<Vec<i32>> {
    let mut v = Vec::with_capacity(len);
    b.read_ids(ids, 0, len, &mut v)?;
    Ok(v)
}

/// The bytes of `values` in type `ty` (rows of `row` values). IQ2_XXS has no fast
/// quantizer: its blocks are random (every bit pattern is valid) with a scale fit to
/// `values`' spread, and the values are replaced by what the blocks hold.
fn encode(ty: GgmlType, values: &[f32], row: usize, rng: &mut Rng) -> Result<Vec<u8>> {
    let bad = |e: ds4_quant::QuantError| EngineError::Backend(format!("encoding {ty}: {e}"));
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::I32 => values
            .iter()
            .flat_map(|v| (*v as i32).to_le_bytes())
            .collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::IQ2_XXS => {
            let std = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
            let blocks = values.len() / 256;
            let mut out = Vec::with_capacity(blocks * 66);
            for _ in 0..blocks {
                // The grid values reach 43 and the scale nibble multiplies by up to 15.5/4.
                let d = f16::from_f32(std / 25.0 * rng.uniform(0.7, 1.3));
                out.extend_from_slice(&d.to_bits().to_le_bytes());
                for _ in 0..64 {
                    out.push(rng.u64() as u8);
                }
            }
            out
        }
        _ => {
            let rb = ty.row_bytes(row).ok_or_else(|| {
                EngineError::Backend(format!("{ty}: rows of {row} are not whole blocks"))
            })?;
            let mut out = vec![0u8; values.len() / row * rb];
            for (src, dst) in values.chunks_exact(row).zip(out.chunks_exact_mut(rb)) {
                ds4_quant::quantize_row(ty, src, dst).map_err(bad)?;
            }
            out
        }
    })
}

/// A weight of ggml dims `dims` (`{cols, rows[, n]}`) and type `ty` holding random
/// normal values of deviation `std`, loaded on `b`, with the values it holds (decoded
/// from its bytes) for the references.
pub fn weight<B: Backend>(
    b: &B,
    rng: &mut Rng,
    name: &str,
    dims: &[usize],
    ty: GgmlType,
    std: f32,
) -> Result<(B::Weight, Vec<f64>)> {
    let n: usize = dims.iter().product();
    // IQ2_XXS blocks are drawn directly (see `encode`): only the spread matters.
    let values = if ty == GgmlType::IQ2_XXS {
        vec![std; n]
    } else {
        rng.normal(n, std)
    };
    weight_of(b, rng, name, dims, ty, &values)
}

/// As [`weight`] with given values (rounded to `ty`).
pub fn weight_of<B: Backend>(
    b: &B,
    rng: &mut Rng,
    name: &str,
    dims: &[usize],
    ty: GgmlType,
    values: &[f32],
) -> Result<(B::Weight, Vec<f64>)> {
    let row = dims[0];
    let bytes = encode(ty, values, row, rng)?;
    let mut w = GgufWriter::new();
    let d64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    w.add_tensor(name, &d64, ty, bytes)
        .map_err(|e| EngineError::Backend(e.to_string()))?;
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes())?);
    let info = file.tensor(name).expect("just written").clone();
    let held = if ty == GgmlType::I32 {
        values.to_vec()
    } else {
        ds4_engine::loader::decode_tensor(&file, &info)?
    };
    let weight = b.weight(&file, &info)?;
    Ok((weight, held.into_iter().map(f64::from).collect()))
}

/// `values` as f64.
pub fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
