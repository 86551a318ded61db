// Weight preparation and dequantization: splitting GGUF blocks into field planes,
// generating synthetic blocks and floats, embedding rows (get_rows) and whole matrices
// to bf16 for the prefill GEMMs.

#include "common.cuh"


// dst[k] = field byte k % size of block k / size: one plane of a GGUF-layout tensor.
extern "C" __global__ void split_plane(const u8* src, u8* dst, i64 n_blocks, int block_bytes, int field_off,
                                       int field_size) {
    const i64 total = n_blocks * field_size;
    for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < total; k += (i64)gridDim.x * blockDim.x) {
        const i64 b = k / field_size;
        const int j = (int)(k - b * field_size);
        dst[k] = src[b * block_bytes + field_off + j];
    }
}

// splitmix64 (Steele, Lea, Flood 2014): the synthetic-weight generator, mirrored in
// src/synth/generate.rs so that host and device produce the same bytes.
__device__ __forceinline__ u64 splitmix64(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ void put_u16(u8* p, u16 v) {
    p[0] = (u8)(v & 0xFF);
    p[1] = (u8)(v >> 8);
}

// Random valid blocks of type `ty` (see src/synth/generate.rs for the scheme): random bytes,
// then the f16 scales set to finite values of a fixed exponent and random mantissa.
extern "C" __global__ void synth_blocks(u8* dst, int ty, int block_bytes, i64 n_blocks, u64 key) {
    for (i64 b = blockIdx.x * (i64)blockDim.x + threadIdx.x; b < n_blocks; b += (i64)gridDim.x * blockDim.x) {
        u8* o = dst + b * block_bytes;
        const u64 base = splitmix64(key ^ ((u64)b * 0xD1B54A32D192ED03ull));
        for (int i = 0; i * 8 < block_bytes; ++i) {
            const u64 r = splitmix64(base + (u64)i);
            for (int k = 0; k < 8 && i * 8 + k < block_bytes; ++k) o[i * 8 + k] = (u8)(r >> (8 * k));
        }
        const u32 mant = (u32)(splitmix64(base ^ 0xA5A5A5A5A5A5A5A5ull) & 0x3FF);
        switch (ty) {
        case T_Q4_0: put_u16(o, (u16)((7u << 10) | mant)); break;
        case T_Q4_1: put_u16(o, (u16)((7u << 10) | mant)); put_u16(o + 2, (u16)(0x8000u | (10u << 10) | mant)); break;
        case T_Q5_0: put_u16(o, (u16)((6u << 10) | mant)); break;
        case T_Q8_0: put_u16(o, (u16)((3u << 10) | mant)); break;
        case T_Q4_K: put_u16(o, (u16)((2u << 10) | mant)); put_u16(o + 2, (u16)((5u << 10) | mant)); break;
        case T_Q5_K: put_u16(o, (u16)((1u << 10) | mant)); put_u16(o + 2, (u16)((5u << 10) | mant)); break;
        case T_Q6_K:
            for (int k = 0; k < 16; ++k) o[192 + k] = (u8)((o[192 + k] & 0x3F) + 224);
            put_u16(o + 208, (u16)((1u << 10) | mant));
            break;
        case T_IQ2_XXS: put_u16(o, (u16)((4u << 10) | mant)); break;
        case T_Q2_K: put_u16(o + 80, (u16)((3u << 10) | mant)); put_u16(o + 82, (u16)((3u << 10) | mant)); break;
        default: break;
        }
    }
}

// Random floats of a synthetic tensor (see src/synth/generate.rs `float`): element i is
// (u - 2^23) * 2^-28 with u the top 24 bits of splitmix64(key ^ i * 0x9E3779B97F4A7C15),
// exact in f32, stored as f16 or bf16 (`ty`) rounded to nearest even.
extern "C" __global__ void synth_floats(u16* dst, int ty, i64 n, u64 key) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i32 u = (i32)(splitmix64(key ^ ((u64)i * 0x9E3779B97F4A7C15ull)) >> 40);
        const float x = __fmul_rn((float)(u - (1 << 23)), 3.7252902984619140625e-9f);
        dst[i] = ty == T_BF16 ? f2bf(x) : f2h(x);
    }
}

// out[t] = dequantized row tokens[t] of a table with `cols` columns (one block per token).
extern "C" __global__ void embed_rows(const Planes w, int ty, int cols, const StepInfo* step, float* out) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= step->n_tok) return;
    const i64 row = step_tokens(step)[t];
    const int be = block_elems(ty), nbr = cols / be;
    float y[32];
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        const int e = c * 32;
        dequant_chunk(ty, w, row * nbr + e / be, (e % be) / 32, y);
        float* o = out + (i64)t * cols + e;
        for (int l = 0; l < 32; ++l) o[l] = y[l];
    }
}

// out = the whole matrix (rows x cols) as bf16, one thread per 32-element chunk.
extern "C" __global__ void dequant_bf16(const Planes w, int ty, i64 rows, int cols, u16* out) {
    pdl_wait();
    pdl_trigger();
    const int cpr = cols / 32, be = block_elems(ty), nbr = cols / be;
    const i64 total = rows * cpr;
    float y[32];
    for (i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x; c < total; c += (i64)gridDim.x * blockDim.x) {
        const i64 row = c / cpr;
        const int e = (int)(c - row * cpr) * 32;
        dequant_chunk(ty, w, row * nbr + e / be, (e % be) / 32, y);
        uint4* o = (uint4*)(out + row * cols + e);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            uint4 v;
            v.x = (u32)f2bf(y[8 * k + 0]) | ((u32)f2bf(y[8 * k + 1]) << 16);
            v.y = (u32)f2bf(y[8 * k + 2]) | ((u32)f2bf(y[8 * k + 3]) << 16);
            v.z = (u32)f2bf(y[8 * k + 4]) | ((u32)f2bf(y[8 * k + 5]) << 16);
            v.w = (u32)f2bf(y[8 * k + 6]) | ((u32)f2bf(y[8 * k + 7]) << 16);
            o[k] = v;
        }
    }
}

// out[t, s] = row tokens[t] of a table (quantized planes, or a float matrix in p[0]),
// for s < streams (the hyper-connection streams), rounded (`rb`). One block per token.
extern "C" __global__ void embed_streams(const Planes w, int ty, int cols, const StepInfo* step, int streams, int rb,
                                         float* out) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= step->n_tok) return;
    const i64 row = step_tokens(step)[t];
    float* o = out + (i64)t * streams * cols;
    if (ty == T_F32 || ty == T_F16 || ty == T_BF16) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            const i64 k = row * cols + c;
            const float v = ty == T_F32 ? ((const float*)w.p[0])[k]
                          : ty == T_F16 ? h2f(((const u16*)w.p[0])[k]) : bf2f(((const u16*)w.p[0])[k]);
            for (int s = 0; s < streams; ++s) o[(i64)s * cols + c] = rnd(v, rb);
        }
        return;
    }
    const int be = block_elems(ty), nbr = cols / be;
    float y[32];
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        const int e = c * 32;
        dequant_chunk(ty, w, row * nbr + e / be, (e % be) / 32, y);
        for (int s = 0; s < streams; ++s)
            for (int l = 0; l < 32; ++l) o[(i64)s * cols + e + l] = rnd(y[l], rb);
    }
}
