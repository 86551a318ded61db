//! Matrix products at the shapes of the two reference models (SmolLM2-135M Q4_1 and
//! Qwen2.5-0.5B Q4_K_M): decode (1 token, throughput in weight bytes/s) and prefill
//! (512 tokens, throughput in FLOP/s, 2 per multiply-add, shown as "elem/s"), on rayon's
//! global pool (`RAYON_NUM_THREADS` sets its size) and single-threaded; and the
//! activation quantization of a 512-token prefill (activations/s). Decode benchmarks
//! reuse one matrix, which stays in cache for all but the output projections.
//!
//! `cargo bench -p ds4-quant --bench matmul [-- FILTER]`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ds4_quant::{
    GgmlType, QMatrix, QuantizedActs, matmul, matmul_single_thread, quantize_row, vec_dot_type,
};

/// (label, type, rows, cols, benchmark prefill too)
const SHAPES: &[(&str, GgmlType, usize, usize, bool)] = &[
    ("smollm2.attn_q", GgmlType::Q4_1, 576, 576, true),
    ("smollm2.attn_kv", GgmlType::Q4_1, 192, 576, true),
    ("smollm2.ffn_up", GgmlType::Q4_1, 1536, 576, true),
    ("smollm2.ffn_down", GgmlType::Q4_1, 576, 1536, true),
    ("smollm2.output", GgmlType::Q8_0, 49152, 576, false),
    ("qwen.attn_q", GgmlType::Q5_0, 896, 896, true),
    ("qwen.attn_kv", GgmlType::Q5_0, 128, 896, true),
    ("qwen.ffn_up", GgmlType::Q5_0, 4864, 896, true),
    ("qwen.ffn_down_q4k", GgmlType::Q4_K, 896, 4864, true),
    ("qwen.ffn_down_q6k", GgmlType::Q6_K, 896, 4864, true),
    ("qwen.q8_0", GgmlType::Q8_0, 896, 896, true),
    ("qwen.output", GgmlType::Q8_0, 151936, 896, false),
    ("f32", GgmlType::F32, 896, 896, true),
    ("f16", GgmlType::F16, 896, 896, true),
];

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let mut data = vec![0u8; rows * rb];
    let x = values(cols, 7);
    for row in data.chunks_exact_mut(rb) {
        quantize_row(ty, &x, row).expect("quantize");
    }
    data
}

fn bench(c: &mut Criterion) {
    eprintln!(
        "isa: {:?}, rayon threads: {}",
        ds4_quant::isa(),
        rayon::current_num_threads()
    );
    for &(label, ty, rows, cols, prefill) in SHAPES {
        let data = weights(ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).expect("matrix");
        let mut g = c.benchmark_group(label);
        g.warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2))
            .sample_size(20);
        let x1 = QuantizedActs::new(vec_dot_type(ty), &values(cols, 3), 1, cols);
        let mut out = vec![0f32; rows];
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_function(BenchmarkId::new("decode", "pool"), |b| {
            b.iter(|| matmul(&w, black_box(&x1), &mut out))
        });
        g.bench_function(BenchmarkId::new("decode", "1thread"), |b| {
            b.iter(|| matmul_single_thread(&w, black_box(&x1), &mut out).expect("shapes"))
        });
        if prefill {
            let n = 512;
            let xn = QuantizedActs::new(vec_dot_type(ty), &values(cols * n, 5), n, cols);
            let mut out = vec![0f32; rows * n];
            g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            g.bench_function(BenchmarkId::new("prefill512", "pool"), |b| {
                b.iter(|| matmul(&w, black_box(&xn), &mut out))
            });
            let xs = values(cols * n, 5);
            g.throughput(Throughput::Elements((cols * n) as u64));
            g.bench_function(BenchmarkId::new("quantize_acts512", "pool"), |b| {
                b.iter(|| QuantizedActs::new(vec_dot_type(ty), black_box(&xs), n, cols))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
