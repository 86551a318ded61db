// Products with float weights (F32, F16, BF16) in the PyTorch references' arithmetic:
// the activations as given times the upcast weights, f32 accumulation, the result
// rounded at the reference's cast point (`rb`). A group of `lanes` threads per output row
// (common.cuh `float_row`); each group walks FG_TOK tokens at once so a weight element is
// loaded once per FG_TOK tokens.
// Grouped products (`blockIdx.y` = group: MLA's per-head `k_b`/`v_b`, DeepSeek-V4's
// `o_a`) use element strides between groups and between tokens.

#include "common.cuh"

#define FG_SEGS 6

struct FloatGemv {
    const u8* w;      // group 0's matrix, n_out × n_in
    i64 w_gstride;    // elements between groups' matrices
    const float* x;   // token 0, group 0
    i64 x_tstride, x_gstride;
    float* out;
    i64 o_tstride, o_gstride;
    const float* bias;  // optional, n_out (group 0 only)
    i32 ty, n_out, n_in, n_tok, rb, lanes;
};

// `float_row` waits for the previous kernel.
extern "C" __global__ void __launch_bounds__(FG_THREADS, 4) gemv_float(const FloatGemv P) {
    const int r = float_row_index(blockIdx.x, P.lanes);
    const int g = blockIdx.y;
    const int bytes = P.ty == T_F32 ? 4 : 2;
    float_row(P.w + (g * P.w_gstride + (i64)r * P.n_in) * bytes, P.ty, P.x + g * P.x_gstride, P.x_tstride, P.n_in,
              P.n_tok, P.out + g * P.o_gstride, P.o_tstride, P.bias, r, P.rb, P.lanes, r < P.n_out);
}

// Up to FG_SEGS independent products (each its own weight, input and output, rows of
// n_in contiguous values) in one launch: blocks [first[s], first[s+1]) run segment s.

struct FloatMulti {
    FloatSeg s[FG_SEGS];
    i32 n;
};

extern "C" __global__ void __launch_bounds__(FG_THREADS, 4) gemv_float_multi(const FloatMulti P) {
    int si = 0;
    while (si + 1 < P.n && (int)blockIdx.x >= P.s[si + 1].first) ++si;
    const FloatSeg& S = P.s[si];
    const int r = float_row_index(blockIdx.x - S.first, S.lanes);
    const int bytes = S.ty == T_F32 ? 4 : 2;
    float_row(S.w + (i64)r * S.n_in * bytes, S.ty, S.x, S.n_in, S.n_in, S.n_tok, S.out, S.n_out, S.bias, r, S.rb,
              S.lanes, r < S.n_out);
}

// Routed experts with float weights: blockIdx.y = t·k + j (token t, its j-th expert
// ids[t·k + j]); one warp per output row. Pair mode: gate and up of token t's row,
// out = round(round(silu(min(round(g), lim)))·clamp(round(u))); otherwise the product of
// activation row t·k + j with the expert's matrix, rounded.
struct FloatExperts {
    const u8* w;
    const u8* w2;       // up (pair mode)
    i64 w_gstride;      // elements between experts
    const float* x;
    i64 x_tstride;
    const i32* ids;
    float* out;         // (t·k + j) × rows
    i32 ty, k, n_in, rows, rb, pair;
    float lim;
};

extern "C" __global__ void gemv_float_experts(const FloatExperts P) {
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= P.rows) return;
    const int p = blockIdx.y;
    const int t = p / P.k;
    const int e = P.ids[p];
    const int bytes = P.ty == T_F32 ? 4 : 2;
    const i64 off = (e * P.w_gstride + (i64)r * P.n_in) * bytes;
    const float* x = P.x + (P.pair ? (i64)t : (i64)p) * P.x_tstride;
    float a = 0.f, b = 0.f;
    for (int c = lane; c < P.n_in; c += 32) {
        a = __fadd_rn(a, __fmul_rn(wval(P.w + off, P.ty, c), x[c]));
        if (P.pair) b = __fadd_rn(b, __fmul_rn(wval(P.w2 + off, P.ty, c), x[c]));
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane) return;
    float o;
    if (P.pair) {
        const float g = fminf(rnd(a, P.rb), P.lim);
        const float u = fmaxf(fminf(rnd(b, P.rb), P.lim), -P.lim);
        o = rnd(__fmul_rn(rnd(siluf_ref(g), P.rb), u), P.rb);
    } else {
        o = rnd(a, P.rb);
    }
    P.out[(i64)p * P.rows + r] = o;
}
