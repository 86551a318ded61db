// Products with float weights (F32, F16, BF16) in the PyTorch references' arithmetic:
// the activations as given times the upcast weights, f32 accumulation, the result
// rounded at the reference's cast point (`rb`). One warp per output row; each warp
// walks TOK tokens at once so a weight element is loaded once per TOK tokens.
// Grouped products (`blockIdx.y` = group: MLA's per-head `k_b`/`v_b`, DeepSeek-V4's
// `o_a`) use element strides between groups and between tokens.

#include "common.cuh"

#define FG_TOK 4
#define FG_SEGS 4

struct FloatGemv {
    const u8* w;      // group 0's matrix, n_out × n_in
    i64 w_gstride;    // elements between groups' matrices
    const float* x;   // token 0, group 0
    i64 x_tstride, x_gstride;
    float* out;
    i64 o_tstride, o_gstride;
    const float* bias;  // optional, n_out (group 0 only)
    i32 ty, n_out, n_in, n_tok, rb;
};

// Lane `lane`'s share of row `wr` · x for tokens t0 .. t0+FG_TOK: 16-byte weight loads
// (8 half-width or 4 f32 values) when the row allows, else one value per lane.
__device__ __forceinline__ void row_part(const u8* wr, int ty, const float* x, i64 x_ts, int n_in, int t0, int n_tok,
                                         int lane, float* acc) {
    const int per = ty == T_F32 ? 4 : 8;
    if (n_in % (32 * per) == 0 && ((u64)wr & 15) == 0) {
        for (int c0 = lane * per; c0 < n_in; c0 += 32 * per) {
            float wv[8];
            const uint4 raw = *(const uint4*)(wr + (i64)c0 * (ty == T_F32 ? 4 : 2));
            if (ty == T_F32) {
                wv[0] = __uint_as_float(raw.x);
                wv[1] = __uint_as_float(raw.y);
                wv[2] = __uint_as_float(raw.z);
                wv[3] = __uint_as_float(raw.w);
            } else {
                const u32 r4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const u16 lo = (u16)(r4[q] & 0xFFFF), hi = (u16)(r4[q] >> 16);
                    wv[2 * q] = ty == T_F16 ? h2f(lo) : bf2f(lo);
                    wv[2 * q + 1] = ty == T_F16 ? h2f(hi) : bf2f(hi);
                }
            }
#pragma unroll
            for (int k = 0; k < FG_TOK; ++k) {
                if (t0 + k >= n_tok) break;
                const float* xr = x + (i64)(t0 + k) * x_ts + c0;
#pragma unroll
                for (int q = 0; q < 8; ++q)
                    if (q < per) acc[k] = __fadd_rn(acc[k], __fmul_rn(wv[q], xr[q]));
            }
        }
        return;
    }
    for (int c = lane; c < n_in; c += 32) {
        const float wv = wval(wr, ty, c);
#pragma unroll
        for (int k = 0; k < FG_TOK; ++k)
            if (t0 + k < n_tok) acc[k] = __fadd_rn(acc[k], __fmul_rn(wv, x[(i64)(t0 + k) * x_ts + c]));
    }
}

// Row r of one product for every token, by one warp.
__device__ __forceinline__ void float_row(const u8* wr, int ty, const float* x, i64 x_ts, int n_in, int n_tok,
                                          float* out, i64 o_ts, const float* bias, int r, int rb) {
    const int lane = threadIdx.x & 31;
    for (int t0 = 0; t0 < n_tok; t0 += FG_TOK) {
        float acc[FG_TOK];
#pragma unroll
        for (int k = 0; k < FG_TOK; ++k) acc[k] = 0.f;
        row_part(wr, ty, x, x_ts, n_in, t0, n_tok, lane, acc);
#pragma unroll
        for (int k = 0; k < FG_TOK; ++k) {
            const float v = warp_sum(acc[k]);
            if (lane == 0 && t0 + k < n_tok) {
                const float b = bias ? bias[r] : 0.f;
                out[(i64)(t0 + k) * o_ts + r] = rnd(__fadd_rn(v, b), rb);
            }
        }
    }
}

extern "C" __global__ void gemv_float(const FloatGemv P) {
    pdl_wait();
    pdl_trigger();
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= P.n_out) return;
    const int g = blockIdx.y;
    const int bytes = P.ty == T_F32 ? 4 : 2;
    float_row(P.w + (g * P.w_gstride + (i64)r * P.n_in) * bytes, P.ty, P.x + g * P.x_gstride, P.x_tstride, P.n_in,
              P.n_tok, P.out + g * P.o_gstride, P.o_tstride, P.bias, r, P.rb);
}

// Up to FG_SEGS independent products (each its own weight, input and output, rows of
// n_in contiguous values) in one launch: blocks [first[s], first[s+1]) run segment s.
struct FloatSeg {
    const u8* w;
    const float* x;
    float* out;
    const float* bias;
    i32 ty, n_out, n_in, n_tok, rb, first;
};

struct FloatMulti {
    FloatSeg s[FG_SEGS];
    i32 n;
};

extern "C" __global__ void gemv_float_multi(const FloatMulti P) {
    pdl_wait();
    pdl_trigger();
    int si = 0;
    while (si + 1 < P.n && (int)blockIdx.x >= P.s[si + 1].first) ++si;
    const FloatSeg& S = P.s[si];
    const int r = ((blockIdx.x - S.first) * blockDim.x + threadIdx.x) >> 5;
    if (r >= S.n_out) return;
    const int bytes = S.ty == T_F32 ? 4 : 2;
    float_row(S.w + (i64)r * S.n_in * bytes, S.ty, S.x, S.n_in, S.n_in, S.n_tok, S.out, S.n_out, S.bias, r, S.rb);
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
