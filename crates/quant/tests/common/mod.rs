//! Shared by the tests against ggml's whole matrix products (tests/vectors/mm/, made by
//! tools/quant-vectors/gen.py with the ggml_mm harness: llama.cpp 0c1e570, AVX-512
//! build).

use std::path::PathBuf;

use ds4_quant::{
    GgmlType, Layout, QMatrix, QuantizedActs, matmul_as, matmul_rows_as, matmul_single_thread,
    vec_dot_type,
};

const NS: [usize; 10] = [1, 2, 3, 4, 5, 7, 8, 9, 13, 21];

/// Shapes of the vectors: the main set (`""`) and the odd one (`"odd/"`: rows not a
/// multiple of 4, row length not a multiple of 64).
fn shape(dir: &str) -> (usize, usize) {
    if dir.is_empty() { (24, 512) } else { (22, 544) }
}

fn read(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors/mm")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Compares ours with ggml's products of `name`, bit for bit, for every token count.
/// `variant`: `""` (plain weights, no tiled kernels: as the fixtures' llama.cpp ran),
/// `".repack"` (the weights in ggml's repack buffer, i.e. our `Layout::Auto` for the
/// types ggml repacks) or `".tiled"` (ggml's tiled K-quant kernels on; the caller sets
/// `DS4_GGML_TILED=1`).
pub fn check(name: &str, ty: GgmlType, variant: &str) {
    let (dir, name) = name.rsplit_once('/').map_or(("", name), |(d, n)| (d, n));
    let dir = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let (rows, k) = shape(&dir);
    let w = read(&format!("{dir}{name}.w.bin"));
    let x = read_f32(&format!("{dir}x.f32"));
    let repack = variant == ".repack";
    let suffix = variant;
    let want_all = read_f32(&format!("{dir}{name}{suffix}.ggml.f32"));
    let m = QMatrix::new(ty, rows, k, &w).unwrap();
    let layout = if repack { Layout::Auto } else { Layout::Plain };
    let mut off = 0;
    let mut failures = Vec::new();
    for n in NS {
        let want = &want_all[off..off + n * rows];
        off += n * rows;
        let acts = QuantizedActs::new(vec_dot_type(ty), &x[..n * k], n, k);
        let mut got = vec![f32::NAN; n * rows];
        matmul_as(&m, layout, &acts, &mut got);
        let mut by_rows = vec![f32::NAN; n * rows];
        for r0 in (0..rows).step_by(5) {
            let r1 = (r0 + 5).min(rows);
            let mut part = vec![f32::NAN; n * (r1 - r0)];
            matmul_rows_as(&m, layout, &acts, r0..r1, &mut part).unwrap();
            for t in 0..n {
                by_rows[t * rows + r0..t * rows + r1]
                    .copy_from_slice(&part[t * (r1 - r0)..(t + 1) * (r1 - r0)]);
            }
        }
        for (what, g) in [("matmul", &got), ("row ranges", &by_rows)] {
            let bad = g
                .iter()
                .zip(want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if bad > 0 {
                let i = g
                    .iter()
                    .zip(want)
                    .position(|(a, b)| a.to_bits() != b.to_bits())
                    .unwrap();
                failures.push(format!(
                    "{name}{suffix} n={n} {what}: {bad} of {} differ, first token {} row {}: ours {:e}, ggml {:e}",
                    want.len(),
                    i / rows,
                    i % rows,
                    g[i],
                    want[i]
                ));
            }
        }
        if !repack {
            let mut single = vec![f32::NAN; n * rows];
            let plain = QMatrix::new(ty, rows, k, &w).unwrap();
            if !matches!(
                ty,
                GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q2_K | GgmlType::MXFP4
            ) {
                matmul_single_thread(&plain, &acts, &mut single).unwrap();
                if single
                    .iter()
                    .zip(want)
                    .any(|(a, b)| a.to_bits() != b.to_bits())
                {
                    failures.push(format!("{name} n={n}: single-threaded result differs"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
