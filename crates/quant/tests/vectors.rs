//! Reference vectors (tests/vectors/, made by tools/quant-vectors/gen.py): dequantization
//! and quantization against the `gguf` Python package, and the K-quant quantizers,
//! activation quantizers and dot products against ggml itself.

use std::path::PathBuf;

use ds4_quant::{GgmlType, QuantizedActs, dequantize_row, quantize_row, vec_dot, vec_dot_type};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

fn read(name: &str) -> Vec<u8> {
    let p = vectors().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn ty(name: &str) -> GgmlType {
    use GgmlType::*;
    match name {
        "f16" => F16,
        "bf16" => BF16,
        "q4_0" => Q4_0,
        "q4_1" => Q4_1,
        "q5_0" => Q5_0,
        "q5_1" => Q5_1,
        "q8_0" => Q8_0,
        "q8_1" => Q8_1,
        "q8_k" => Q8_K,
        "q2_k" => Q2_K,
        "q3_k" => Q3_K,
        "q4_k" => Q4_K,
        "q5_k" => Q5_K,
        "q6_k" => Q6_K,
        "iq2_xxs" => IQ2_XXS,
        "mxfp4" | "mxfp4_odd" => MXFP4,
        _ => panic!("unknown type {name}"),
    }
}

const ALL: [&str; 13] = [
    "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
    "iq2_xxs",
];

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    for name in ALL {
        let blocks = read(&format!("dequant/{name}.blocks"));
        let want = read_f32(&format!("dequant/{name}.f32"));
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty(name), &blocks, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name} element {i}: got {g}, gguf {w}"
            );
        }
    }
}

#[test]
fn quantize_matches_gguf_bit_for_bit() {
    for name in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16"] {
        let x = read_f32(&format!("quant/{name}.in.f32"));
        let want = read(&format!("quant/{name}.gguf.bin"));
        let mut got = vec![0u8; want.len()];
        quantize_row(ty(name), &x, &mut got).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn quantize_matches_ggml_reference_quantizers() {
    for name in [
        "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
    ] {
        let x = read_f32(&format!("quant/{name}.ggml.in.f32"));
        let want = read(&format!("quant/{name}.ggml.bin"));
        let t = ty(name);
        let mut got = vec![0u8; want.len()];
        quantize_row(t, &x, &mut got).unwrap();
        let bs = t.type_size();
        for (b, (g, w)) in got.chunks(bs).zip(want.chunks(bs)).enumerate() {
            assert_eq!(g, w, "{name} block {b}");
        }
    }
}

#[test]
fn activation_quantization_matches_ggml_cpu() {
    for name in ["q8_0", "q8_1", "q8_k"] {
        let x = read_f32(&format!("act/{name}.in.f32"));
        let want = read(&format!("act/{name}.ggml.bin"));
        let a = QuantizedActs::new(ty(name), &x, 1, x.len());
        let got = a.ggml_row(0);
        let bs = ty(name).type_size();
        for (b, (g, w)) in got.chunks(bs).zip(want.chunks(bs)).enumerate() {
            assert_eq!(g, w, "{name} block {b}");
        }
    }
}

/// Our dot products against ggml's CPU `vec_dot`s, bit for bit, and against the f64 dot
/// of the dequantized operands within rounding.
///
/// Tolerance of the f64 check: every result is a sum of at most 2·(blocks)·8 f32
/// terms, each a product of an exact integer with an f32 scale product. The rounding
/// error is then below (number of roundings) · 2⁻²⁴ · Σ|terms|, with at most ~150
/// roundings for 1024 elements: 1e-5 · Σ|w_k·a_k| bounds it. The dequantized f64 dot
/// differs from the exact one by the rounding of each dequantized element (a few
/// ulps), inside the same bound.
#[test]
fn dot_products_match_ggml_cpu() {
    for name in [
        "q4_0",
        "q4_1",
        "q5_0",
        "q5_1",
        "q8_0",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "iq2_xxs",
        "mxfp4",
        "mxfp4_odd",
    ] {
        let t = ty(name);
        let w = read(&format!("dot/{name}.w.bin"));
        let x = read_f32(&format!("dot/{name}.act.f32"));
        let want = read_f32(&format!("dot/{name}.ggml.f32"));
        let n = x.len();
        let acts = QuantizedActs::new(vec_dot_type(t), &x, 1, n);
        let mut adeq = vec![0f32; n];
        dequantize_row(vec_dot_type(t), &acts.ggml_row(0), &mut adeq).unwrap();
        let rb = t.row_bytes(n).unwrap();
        for (r, want) in want.iter().enumerate() {
            let row = &w[r * rb..(r + 1) * rb];
            let got = vec_dot(t, row, &acts, 0).unwrap();
            let mut wdeq = vec![0f32; n];
            dequantize_row(t, row, &mut wdeq).unwrap();
            let mut exact: f64 = wdeq
                .iter()
                .zip(&adeq)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            if matches!(t, GgmlType::Q4_1 | GgmlType::Q5_1) {
                // Q8_1 carries s = f16(d·Σq): the minimum term uses it, as ggml does.
                exact = min_term_with_s(t, row, &acts.ggml_row(0), &wdeq, &adeq);
            }
            let mag: f64 = wdeq
                .iter()
                .zip(&adeq)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let tol = 1e-5 * mag + 1e-30;
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{name} row {r}: ours {got}, ggml {want}"
            );
            assert!(
                (got as f64 - exact).abs() <= tol,
                "{name} row {r}: ours {got}, f64 {exact}, tolerance {tol}"
            );
        }
    }
}

/// MXFP4 against ggml itself (these vectors come from the `ggml_ref` harness, not from
/// the `gguf` package): `dequantize_row_mxfp4` (subnormal and extreme scales included)
/// and `quantize_row_mxfp4_ref`, bit for bit.
#[test]
fn mxfp4_matches_ggml() {
    let blocks = read("dequant/mxfp4.blocks");
    let want = read_f32("dequant/mxfp4.f32");
    let mut got = vec![0f32; want.len()];
    dequantize_row(GgmlType::MXFP4, &blocks, &mut got).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "mxfp4 element {i}: got {g}, ggml {w}"
        );
    }
    let x = read_f32("quant/mxfp4.ggml.in.f32");
    let want = read("quant/mxfp4.ggml.bin");
    let mut got = vec![0u8; want.len()];
    quantize_row(GgmlType::MXFP4, &x, &mut got).unwrap();
    for (b, (g, w)) in got.chunks(17).zip(want.chunks(17)).enumerate() {
        assert_eq!(g, w, "mxfp4 block {b}");
    }
}

/// f64 dot of a Q4_1/Q5_1 row with Q8_1 activations where each block's minimum term is
/// `m·s` (s as stored), as the format's arithmetic prescribes.
fn min_term_with_s(t: GgmlType, w: &[u8], a: &[u8], wdeq: &[f32], adeq: &[f32]) -> f64 {
    let f16 = |b: &[u8], o: usize| half_to_f64(u16::from_le_bytes([b[o], b[o + 1]]));
    let (wb, ab) = (t.type_size(), 36);
    let mut sum = 0.0;
    for b in 0..wdeq.len() / 32 {
        let m = f16(&w[b * wb..], 2);
        let s = f16(&a[b * ab..], 2);
        for k in 32 * b..32 * b + 32 {
            sum += (wdeq[k] as f64 - m) * adeq[k] as f64;
        }
        sum += m * s;
    }
    sum
}

/// IEEE half to f64 (normal, subnormal, zero; no inf/NaN in these vectors).
fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f64;
    sign * if e == 0 {
        m * 2f64.powi(-24)
    } else {
        (1.0 + m / 1024.0) * 2f64.powi(e - 15)
    }
}
