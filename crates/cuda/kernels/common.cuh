// Shared definitions for every kernel module: integer types, f16/bf16 conversions
// (inline PTX, so that no CUDA header is needed and NVRTC compiles without include
// paths), the GPU plane layout of quantized weights and the per-type dequantization of
// one 32-element chunk.
//
// Formats follow ggml (`ggml-common.h`, `ggml-quants.c` dequantize_row_*): the block
// fields are the same bytes, but each field of a tensor lives in its own plane (see
// `src/layout.rs`) so that every load is naturally aligned. Dequantization keeps
// ggml's reference arithmetic order with explicitly rounded operations (`__fmul_rn`,
// `__fsub_rn`) so that no multiply-add is contracted and values equal the CPU
// backend's bit for bit.

#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// ggml type ids (GGUF), as in `ds4_gguf::GgmlType`.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ2_XXS 16
#define T_BF16 30

#define MAX_PLANES 4

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// A quantized matrix on the GPU: one pointer per field plane (see src/layout.rs).
struct Planes {
    const u8* p[MAX_PLANES];
};

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// f32 rounded to the nearest f16 and back (ggml stores q8 scales as f16).
__device__ __forceinline__ float round_f16(float f) { return h2f(f2h(f)); }

__device__ __forceinline__ u16 f2bf(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// bf16 bits to f32.
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float((u32)h << 16); }

// `x` rounded to bf16 (round to nearest even) when `rb`, else `x`: the reference's cast
// points of a bf16 model (`Prec::Bf16`).
__device__ __forceinline__ float rnd(float x, int rb) { return rb ? bf2f(f2bf(x)) : x; }

// Element i of a float weight of ggml type ty (F32, F16 or BF16).
__device__ __forceinline__ float wval(const u8* w, int ty, i64 i) {
    if (ty == T_F32) return ((const float*)w)[i];
    if (ty == T_F16) return h2f(((const u16*)w)[i]);
    return bf2f(((const u16*)w)[i]);
}

// Programmatic dependent launch: wait for the previous kernel before reading its results
// (every kernel run inside a step calls this before its trigger), and let the next one
// start early. Before the wait a kernel reads only weights, or state the host knows the
// previous kernel does not write (`delta_step`'s `early`): no kernel of a step writes
// weights, a step's first kernel (the embedding) reads nothing before its wait, and a
// kernel starts only after the one before the previous one has completed, so the
// loader's kernels are complete by then. One exception: `hc_sinkhorn` (mhc.cu) lets the
// next kernel start before its own wait, so that one may start while the kernel before
// `hc_sinkhorn` still runs (for `delta_step`'s `early`, that kernel is then one of the
// projections the host checked).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// Asynchronous copies from global to shared memory (sm_80 and later): issued at once,
// complete for this thread after `cp_async_wait_all` (then a barrier for the block).
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Groups: `cp_async_commit` closes this thread's copies issued since the last one;
// `cp_async_wait_but_one` waits for all groups but the newest.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_but_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// Every block of the grid meets here, its earlier global writes visible to all blocks
// after it. Only for grids that can be resident at once: the host launches at most as
// many blocks as the device has SMs (not a cooperative launch: a device shared with
// another context's long kernels could delay the last blocks until those finish).
// One word: arrivals in the low 16 bits (zero between launches), a generation above. Thread
// 0 of each block arrives with a release-acquire add; the last to arrive takes the
// arrivals back to zero and advances the generation in one release add, and the others
// wait for the generation to change with acquire loads: two memory round trips after the
// last arrival, no fences (a block's other threads are ordered by the block barriers).
__device__ __forceinline__ void grid_sync(u32* counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 old;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        if ((old & 0xFFFFu) == gridDim.x - 1) {
            asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(0x10000u - gridDim.x)
                         : "memory");
        } else {
            u32 now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(counter) : "memory");
            } while ((now ^ old) >> 16 == 0);
        }
    }
    __syncthreads();
}

__device__ __forceinline__ float sigmoidf_ref(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float siluf_ref(float x) { return __fmul_rn(x, sigmoidf_ref(x)); }
// PyTorch's softplus (threshold 20), as written (not log1p).
__device__ __forceinline__ float softplusf_ref(float x) { return x > 20.f ? x : logf(__fadd_rn(1.0f, expf(x))); }

// 1/sqrt(mean + eps) from a double sum of n squares, the mean rounded to f32 first (the
// reference's f32 RMSNorm).
__device__ __forceinline__ float inv_rms(double ss, int n, float eps) {
    const float mean = (float)(ss / (double)n);
    return __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, eps)));
}

// The gated output norm of one head (KDA's `o_norm`, Qwen3.5's gated RMSNorm): 1/rms of
// its dv outputs `o` by one warp (lane L sums o[L], o[L+32], … in f64, then a butterfly:
// every lane gets the same value), and one output from it.
__device__ __forceinline__ float gated_inv_rms(const float* o, int dv, float eps) {
    const int lane = threadIdx.x & 31;
    double ss = 0.0;
#pragma unroll 1
    for (int j = lane; j < dv; j += 32) ss += (double)o[j] * (double)o[j];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    return inv_rms(ss, dv, eps);
}

__device__ __forceinline__ float gated_value(float o, float r, float w, float z, int silu, int rb) {
    const float n = __fmul_rn(o, r);
    return silu ? rnd(__fmul_rn(__fmul_rn(w, rnd(n, rb)), siluf_ref(z)), rb)
                : rnd(__fmul_rn(__fmul_rn(w, n), sigmoidf_ref(z)), rb);
}

__device__ __forceinline__ u16 ld_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld_u32(const u8* p) { return *(const u32*)p; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One step of `warp_sums`: a lane keeps the upper or lower half of its HALF·2 values (by
// its lane bit O) and adds its partner's of the same indices.
template <int HALF, int O, class T>
__device__ __forceinline__ void warp_halve(T* v, int lane) {
    const bool up = lane & O;
#pragma unroll
    for (int x = 0; x < HALF; ++x) {
        const T send = up ? v[x] : v[x + HALF];
        const T keep = up ? v[x + HALF] : v[x];
        v[x] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    if constexpr (HALF > 1) warp_halve<HALF / 2, O / 2>(v, lane);
}

// The warp sums of each of v[0 .. COUNT) (COUNT a power of two, 2 to 32) in one butterfly
// of COUNT − 1 shuffles instead of 5·COUNT: every step adds the same two partials as
// `warp_sum`'s, so each sum is warp_sum's, bit for bit. Returns the sum of value
// lane / (32 / COUNT) (v is clobbered).
template <int COUNT, class T>
__device__ __forceinline__ T warp_sums(T (&v)[COUNT], int lane) {
    static_assert(COUNT >= 2 && COUNT <= 32 && (COUNT & (COUNT - 1)) == 0, "a power of two up to 32");
    warp_halve<COUNT / 2, 16>(v, lane);
    T s = v[0];
#pragma unroll
    for (int o = 16 / COUNT; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Copies `rows` rows of `cols` floats (contiguous in global memory) into shared memory
// rows `ld` floats apart, by the whole block: 16-byte loads, eight per thread issued
// before their stores, when cols and ld are multiples of 4 and src is 16-byte aligned.
__device__ __forceinline__ void stage_rows(float* dst, int ld, const float* src, int rows, int cols) {
    if ((cols & 3) == 0 && (ld & 3) == 0 && ((u64)src & 15) == 0) {
        const int c4 = cols >> 2, n4 = rows * c4;
        for (int i0 = threadIdx.x; i0 < n4; i0 += 8 * blockDim.x) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = i0 + u * blockDim.x;
                if (i < n4) v[u] = ((const float4*)src)[i];
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = i0 + u * blockDim.x;
                if (i < n4) *(float4*)(dst + (i / c4) * ld + 4 * (i % c4)) = v[u];
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) dst[(i / cols) * ld + i % cols] = src[i];
}

// Block-wide sum of a double (blockDim.x a multiple of 32, at most 1024 threads);
// `red` is shared scratch of 32 doubles. Every thread gets the total.
__device__ __forceinline__ double block_sum_d(double v, double* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int k = 0; k < (int)(blockDim.x >> 5); ++k) t += red[k];
    return t;
}

// `layer_norm_ref`'s parameters (crate::ops::LayerNormArgs): rows of `cols`,
// out = round(((x − mean)·rsqrt(var + eps))·w + b), statistics in f64.
struct LayerNorm {
    const float* x;
    const float* w;
    const float* b;
    float* out;
    i32 cols;
    float eps;
    i32 rb;
};

// Row `row` of a LayerNorm into `yr`, by the whole block (`red` as above).
__device__ __forceinline__ void layer_norm_row(const LayerNorm& L, int row, float* yr, double* red) {
    const float* xr = L.x + (i64)row * L.cols;
    double s = 0.0;
    for (int i = threadIdx.x; i < L.cols; i += blockDim.x) s += (double)xr[i];
    const double mean = block_sum_d(s, red) / (double)L.cols;
    double v = 0.0;
    for (int i = threadIdx.x; i < L.cols; i += blockDim.x) v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    const double var = block_sum_d(v, red) / (double)L.cols;
    const double r = 1.0 / sqrt(var + (double)L.eps);
    for (int i = threadIdx.x; i < L.cols; i += blockDim.x) {
        const float n = (float)(((double)xr[i] - mean) * r);
        yr[i] = rnd(__fadd_rn(__fmul_rn(n, L.w[i]), L.b[i]), L.rb);
    }
}

// Block-wide max of a float; `red` as above (floats).
__device__ __forceinline__ float block_max_f(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = red[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); ++k) t = fmaxf(t, red[k]);
    return t;
}

// Spreads the 4 low bits of `b` to bit 0 of each byte (bit i -> byte i).
__device__ __forceinline__ u32 spread4(u32 b) { return ((b & 0xFu) * 0x00204081u) & 0x01010101u; }

// ggml get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K/Q5_K block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// ggml iq2xxs_grid: 256 entries of 8 magnitudes (bytes 0x08, 0x19, 0x2b).
__device__ const u64 IQ2XXS_GRID[256] = {
    0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
    0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x08080808082b0808ull,
    0x08080808082b082bull, 0x08080808082b2b08ull, 0x08080808082b2b2bull, 0x0808080819080819ull,
    0x0808080819081908ull, 0x0808080819190808ull, 0x0808080819192b08ull, 0x08080808192b0819ull,
    0x08080808192b1908ull, 0x080808082b080808ull, 0x080808082b08082bull, 0x080808082b082b2bull,
    0x080808082b2b082bull, 0x0808081908080819ull, 0x0808081908081908ull, 0x0808081908190808ull,
    0x0808081908191919ull, 0x0808081919080808ull, 0x080808192b081908ull, 0x080808192b192b08ull,
    0x0808082b08080808ull, 0x0808082b0808082bull, 0x0808082b082b082bull, 0x0808082b2b08082bull,
    0x0808190808080819ull, 0x0808190808081908ull, 0x0808190808190808ull, 0x08081908082b0819ull,
    0x08081908082b1908ull, 0x0808190819080808ull, 0x080819081908082bull, 0x0808190819082b08ull,
    0x08081908192b0808ull, 0x080819082b080819ull, 0x080819082b081908ull, 0x080819082b190808ull,
    0x080819082b2b1908ull, 0x0808191908080808ull, 0x080819190808082bull, 0x0808191908082b08ull,
    0x08081919082b0808ull, 0x080819191908192bull, 0x08081919192b2b19ull, 0x080819192b080808ull,
    0x080819192b190819ull, 0x0808192b08082b19ull, 0x0808192b08190808ull, 0x0808192b19080808ull,
    0x0808192b2b081908ull, 0x0808192b2b2b1908ull, 0x08082b0808080808ull, 0x08082b0808081919ull,
    0x08082b0808082b08ull, 0x08082b0808191908ull, 0x08082b08082b2b08ull, 0x08082b0819080819ull,
    0x08082b0819081908ull, 0x08082b0819190808ull, 0x08082b081919082bull, 0x08082b082b082b08ull,
    0x08082b1908081908ull, 0x08082b1919080808ull, 0x08082b2b0808082bull, 0x08082b2b08191908ull,
    0x0819080808080819ull, 0x0819080808081908ull, 0x0819080808190808ull, 0x08190808082b0819ull,
    0x0819080819080808ull, 0x08190808192b0808ull, 0x081908082b081908ull, 0x081908082b190808ull,
    0x081908082b191919ull, 0x0819081908080808ull, 0x0819081908082b08ull, 0x08190819082b0808ull,
    0x0819081919190808ull, 0x0819081919192b2bull, 0x081908192b080808ull, 0x0819082b082b1908ull,
    0x0819082b19081919ull, 0x0819190808080808ull, 0x0819190808082b08ull, 0x08191908082b0808ull,
    0x08191908082b1919ull, 0x0819190819082b19ull, 0x081919082b080808ull, 0x0819191908192b08ull,
    0x08191919192b082bull, 0x0819192b08080808ull, 0x0819192b0819192bull, 0x08192b0808080819ull,
    0x08192b0808081908ull, 0x08192b0808190808ull, 0x08192b0819080808ull, 0x08192b082b080819ull,
    0x08192b1908080808ull, 0x08192b1908081919ull, 0x08192b192b2b0808ull, 0x08192b2b19190819ull,
    0x082b080808080808ull, 0x082b08080808082bull, 0x082b080808082b2bull, 0x082b080819081908ull,
    0x082b0808192b0819ull, 0x082b08082b080808ull, 0x082b08082b08082bull, 0x082b0819082b2b19ull,
    0x082b081919082b08ull, 0x082b082b08080808ull, 0x082b082b0808082bull, 0x082b190808080819ull,
    0x082b190808081908ull, 0x082b190808190808ull, 0x082b190819080808ull, 0x082b19081919192bull,
    0x082b191908080808ull, 0x082b191919080819ull, 0x082b1919192b1908ull, 0x082b192b2b190808ull,
    0x082b2b0808082b08ull, 0x082b2b08082b0808ull, 0x082b2b082b191908ull, 0x082b2b2b19081908ull,
    0x1908080808080819ull, 0x1908080808081908ull, 0x1908080808190808ull, 0x1908080808192b08ull,
    0x19080808082b0819ull, 0x19080808082b1908ull, 0x1908080819080808ull, 0x1908080819082b08ull,
    0x190808081919192bull, 0x19080808192b0808ull, 0x190808082b080819ull, 0x190808082b081908ull,
    0x190808082b190808ull, 0x1908081908080808ull, 0x19080819082b0808ull, 0x19080819192b0819ull,
    0x190808192b080808ull, 0x190808192b081919ull, 0x1908082b08080819ull, 0x1908082b08190808ull,
    0x1908082b19082b08ull, 0x1908082b1919192bull, 0x1908082b192b2b08ull, 0x1908190808080808ull,
    0x1908190808082b08ull, 0x19081908082b0808ull, 0x190819082b080808ull, 0x190819082b192b19ull,
    0x190819190819082bull, 0x19081919082b1908ull, 0x1908192b08080808ull, 0x19082b0808080819ull,
    0x19082b0808081908ull, 0x19082b0808190808ull, 0x19082b0819080808ull, 0x19082b0819081919ull,
    0x19082b1908080808ull, 0x19082b1919192b08ull, 0x19082b19192b0819ull, 0x19082b192b08082bull,
    0x19082b2b19081919ull, 0x19082b2b2b190808ull, 0x1919080808080808ull, 0x1919080808082b08ull,
    0x1919080808190819ull, 0x1919080808192b19ull, 0x19190808082b0808ull, 0x191908082b080808ull,
    0x191908082b082b08ull, 0x1919081908081908ull, 0x191908191908082bull, 0x191908192b2b1908ull,
    0x1919082b2b190819ull, 0x191919082b190808ull, 0x191919082b19082bull, 0x1919191908082b2bull,
    0x1919192b08080819ull, 0x1919192b19191908ull, 0x19192b0808080808ull, 0x19192b0808190819ull,
    0x19192b0808192b19ull, 0x19192b08192b1908ull, 0x19192b1919080808ull, 0x19192b2b08082b08ull,
    0x192b080808081908ull, 0x192b080808190808ull, 0x192b080819080808ull, 0x192b0808192b2b08ull,
    0x192b081908080808ull, 0x192b081919191919ull, 0x192b082b08192b08ull, 0x192b082b192b0808ull,
    0x192b190808080808ull, 0x192b190808081919ull, 0x192b191908190808ull, 0x192b19190819082bull,
    0x192b19192b081908ull, 0x192b2b081908082bull, 0x2b08080808080808ull, 0x2b0808080808082bull,
    0x2b08080808082b2bull, 0x2b08080819080819ull, 0x2b0808082b08082bull, 0x2b08081908081908ull,
    0x2b08081908192b08ull, 0x2b08081919080808ull, 0x2b08082b08190819ull, 0x2b08190808080819ull,
    0x2b08190808081908ull, 0x2b08190808190808ull, 0x2b08190808191919ull, 0x2b08190819080808ull,
    0x2b081908192b0808ull, 0x2b08191908080808ull, 0x2b0819191908192bull, 0x2b0819192b191908ull,
    0x2b08192b08082b19ull, 0x2b08192b19080808ull, 0x2b08192b192b0808ull, 0x2b082b080808082bull,
    0x2b082b1908081908ull, 0x2b082b2b08190819ull, 0x2b19080808081908ull, 0x2b19080808190808ull,
    0x2b190808082b1908ull, 0x2b19080819080808ull, 0x2b1908082b2b0819ull, 0x2b1908190819192bull,
    0x2b1908192b080808ull, 0x2b19082b19081919ull, 0x2b19190808080808ull, 0x2b191908082b082bull,
    0x2b19190819081908ull, 0x2b19191919190819ull, 0x2b192b082b080819ull, 0x2b192b19082b0808ull,
    0x2b2b08080808082bull, 0x2b2b080819190808ull, 0x2b2b08082b081919ull, 0x2b2b081908082b19ull,
    0x2b2b082b08080808ull, 0x2b2b190808192b08ull, 0x2b2b2b0819190808ull, 0x2b2b2b1908081908ull,
};

// ggml ksigns_iq2xs[i]: the 7 stored sign bits plus an eighth that makes the parity even.
__device__ __forceinline__ u32 iq2_signs(u32 i) { return i | ((__popc(i) & 1u) << 7); }

// ---- products with float weights (F32, F16, BF16), a group of threads per output row ----

#define FG_TOK 4
// Threads per block of the float products; a row's group is `lanes` of them (a power of
// two from 4 to FG_THREADS, chosen by the host from the row's length), so a block takes
// FG_THREADS / lanes rows.
#define FG_THREADS 256

// One product with a float weight: rows of n_in contiguous values, n_tok tokens
// (`first`: its first block in a multi-product launch; `lanes`: threads per row).
struct FloatSeg {
    const u8* w;
    const float* x;
    float* out;
    const float* bias;
    i32 ty, n_out, n_in, n_tok, rb, first, lanes;
};

// The row of the calling thread's group in block `b` of a product (`lanes` threads per row).
__device__ __forceinline__ int float_row_index(int b, int lanes) {
    return b * (FG_THREADS / lanes) + threadIdx.x / lanes;
}

// The 16-byte chunks c0, c0 + lanes, c0 + 2·lanes, c0 + 3·lanes of a row (those below
// `chunks`), their loads issued together.
__device__ __forceinline__ void chunk_loads(const u8* wr, int c0, int lanes, int chunks, uint4 (&raw)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
        if (c0 + u * lanes < chunks) raw[u] = *(const uint4*)(wr + (i64)(c0 + u * lanes) * 16);
}

// The products of `chunk_loads`' chunks (8 half-width or 4 f32 values each) with tokens
// t0 .. t0+FG_TOK, in element order.
__device__ __forceinline__ void chunk_dots(const uint4 (&raw)[4], int ty, int c0, int lanes, int n_in,
                                           const float* x, i64 x_ts, int t0, int n_tok, float* acc) {
    const int per = ty == T_F32 ? 4 : 8;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int cu = (c0 + u * lanes) * per;
        if (cu >= n_in) break;
        float wv[8];
        if (ty == T_F32) {
            wv[0] = __uint_as_float(raw[u].x);
            wv[1] = __uint_as_float(raw[u].y);
            wv[2] = __uint_as_float(raw[u].z);
            wv[3] = __uint_as_float(raw[u].w);
        } else {
            const u32 r4[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
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
            // Four activations per load (16-byte aligned: the caller's `x`, and rows and
            // chunks of whole multiples of four values).
            const float4* xr = (const float4*)(x + (i64)(t0 + k) * x_ts + cu);
            const float4 a = xr[0];
            const float4 b = per == 8 ? xr[1] : a;
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int q = 0; q < 8; ++q)
                if (q < per) acc[k] = __fadd_rn(acc[k], __fmul_rn(wv[q], xv[q]));
        }
    }
}

// The state `float_row` carries from its first loads to its sums.
struct FloatRowIn {
    uint4 raw[4];
    int j;       // the thread's lane in its row's group
    int chunks;  // 16-byte chunks of a row
    bool vec;    // the row is taken in 16-byte chunks
};

// The first loads of `float_row` (its parameters), which a kernel issues before its wait
// for the previous kernel (the weights do not depend on it): whole aligned 16-byte
// chunks when every token's `x` is 16-byte aligned too.
__device__ __forceinline__ void float_row_loads(const u8* wr, int ty, const float* x, i64 x_ts, int n_in, int lanes,
                                                bool valid, FloatRowIn& in) {
    const int per = ty == T_F32 ? 4 : 8;
    in.j = threadIdx.x & (lanes - 1);
    in.chunks = n_in / per;
    in.vec = n_in % per == 0 && ((u64)wr & 15) == 0 && ((u64)x & 15) == 0 && (x_ts & 3) == 0;
    if (valid && in.vec) chunk_loads(wr, in.j, lanes, in.chunks, in.raw);
}

// `float_row` after its first loads (`in`, from `float_row_loads`) and its wait.
__device__ __forceinline__ void float_row_sums(FloatRowIn& in, const u8* wr, int ty, const float* x, i64 x_ts,
                                               int n_in, int n_tok, float* out, i64 o_ts, const float* bias, int r,
                                               int rb, int lanes, bool valid) {
    __shared__ float part[FG_TOK][FG_THREADS / 32];
    uint4(&raw)[4] = in.raw;
    const int j = in.j;
    const bool vec = in.vec;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int span = lanes < 32 ? lanes : 32;
    const int chunks = in.chunks;
    for (int t0 = 0; t0 < n_tok; t0 += FG_TOK) {
        float acc[FG_TOK];
#pragma unroll
        for (int k = 0; k < FG_TOK; ++k) acc[k] = 0.f;
        if (valid && vec) {
            for (int c0 = j; c0 < chunks; c0 += 4 * lanes) {
                if (t0 > 0 || c0 > j) chunk_loads(wr, c0, lanes, chunks, raw);
                chunk_dots(raw, ty, c0, lanes, n_in, x, x_ts, t0, n_tok, acc);
            }
        } else if (valid) {
            for (int c = j; c < n_in; c += lanes) {
                const float wv = wval(wr, ty, c);
#pragma unroll
                for (int k = 0; k < FG_TOK; ++k)
                    if (t0 + k < n_tok) acc[k] = __fadd_rn(acc[k], __fmul_rn(wv, x[(i64)(t0 + k) * x_ts + c]));
            }
        }
#pragma unroll
        for (int k = 0; k < FG_TOK; ++k)
            for (int o = span >> 1; o > 0; o >>= 1) acc[k] = __fadd_rn(acc[k], __shfl_xor_sync(0xffffffffu, acc[k], o));
        if (lanes > 32) {
            if (lane == 0)
#pragma unroll
                for (int k = 0; k < FG_TOK; ++k) part[k][warp] = acc[k];
            __syncthreads();
            if (j == 0) {
#pragma unroll
                for (int k = 0; k < FG_TOK; ++k) {
                    float v = part[k][warp];
                    for (int w = 1; w < lanes / 32; ++w) v = __fadd_rn(v, part[k][warp + w]);
                    acc[k] = v;
                }
            }
            __syncthreads();
        }
        if (valid && j == 0) {
#pragma unroll
            for (int k = 0; k < FG_TOK; ++k)
                if (t0 + k < n_tok) {
                    const float b = bias ? bias[r] : 0.f;
                    out[(i64)(t0 + k) * o_ts + r] = rnd(__fadd_rn(acc[k], b), rb);
                }
        }
    }
}

// Row r of one product for every token, by the `lanes` threads of the calling thread's
// group (group g = threadIdx.x / lanes of a FG_THREADS-thread block; every thread of the
// block calls this, `valid` false for groups past the last row). Thread j takes the
// 16-byte chunks j, j + lanes, … when the row is whole aligned chunks and every token's
// `x` is 16-byte aligned (the first four loaded before the wait for the previous kernel,
// which is this function's: the weights do not depend on it), else the values j,
// j + lanes, …. The group's sums in a fixed order: a warp's lanes by shuffles, then
// (groups wider than a warp) the warps in order. Without `wait` the caller waits for the
// previous kernel itself.
__device__ __forceinline__ void float_row(const u8* wr, int ty, const float* x, i64 x_ts, int n_in, int n_tok,
                                          float* out, i64 o_ts, const float* bias, int r, int rb, int lanes,
                                          bool valid, bool wait = true) {
    FloatRowIn in;
    float_row_loads(wr, ty, x, x_ts, n_in, lanes, valid, in);
    if (wait) {
        pdl_wait();
        pdl_trigger();
    }
    float_row_sums(in, wr, ty, x, x_ts, n_in, n_tok, out, o_ts, bias, r, rb, lanes, valid);
}

// Row r of product S's weight.
__device__ __forceinline__ const u8* float_seg_row(const FloatSeg& S, int r) {
    return S.w + (i64)r * S.n_in * (S.ty == T_F32 ? 4 : 2);
}

// ---- quantized matrices ----

// Matrix `e` of a stack of quantized matrices: plane i starts e·stride[i] bytes on. (With
// a plane's row bytes as strides, the matrix whose row r is row r + e of `w`.)
template <class S>
__device__ __forceinline__ Planes expert_planes(const Planes& w, const S* stride, int e) {
    Planes p;
#pragma unroll
    for (int i = 0; i < MAX_PLANES; ++i) p.p[i] = w.p[i] ? w.p[i] + e * (i64)stride[i] : nullptr;
    return p;
}

// Elements per block of a type.
__device__ __forceinline__ int block_elems(int ty) {
    return (ty == T_Q4_0 || ty == T_Q4_1 || ty == T_Q5_0 || ty == T_Q8_0) ? 32 : 256;
}

// Dequantizes chunk `c` (elements 32c .. 32c+31) of block `blk` of a quantized matrix
// into `y` (ggml dequantize_row_* arithmetic).
__device__ void dequant_chunk(int ty, const Planes& w, i64 blk, int c, float* y) {
    switch (ty) {
    case T_Q4_0: {
        const float d = h2f(ld_u16(w.p[0] + blk * 2));
        const u8* qs = w.p[1] + blk * 16;
        for (int j = 0; j < 16; ++j) {
            y[j] = __fmul_rn((float)((qs[j] & 0xF) - 8), d);
            y[j + 16] = __fmul_rn((float)((qs[j] >> 4) - 8), d);
        }
        break;
    }
    case T_Q4_1: {
        const float d = h2f(ld_u16(w.p[0] + blk * 4));
        const float m = h2f(ld_u16(w.p[0] + blk * 4 + 2));
        const u8* qs = w.p[1] + blk * 16;
        for (int j = 0; j < 16; ++j) {
            y[j] = __fadd_rn(__fmul_rn((float)(qs[j] & 0xF), d), m);
            y[j + 16] = __fadd_rn(__fmul_rn((float)(qs[j] >> 4), d), m);
        }
        break;
    }
    case T_Q5_0: {
        const float d = h2f(ld_u16(w.p[0] + blk * 2));
        const u32 qh = ld_u32(w.p[1] + blk * 4);
        const u8* qs = w.p[2] + blk * 16;
        for (int j = 0; j < 16; ++j) {
            const int x0 = ((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
            const int x1 = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            y[j] = __fmul_rn((float)x0, d);
            y[j + 16] = __fmul_rn((float)x1, d);
        }
        break;
    }
    case T_Q8_0: {
        const float d = h2f(ld_u16(w.p[0] + blk * 2));
        const i8* qs = (const i8*)(w.p[1] + blk * 32);
        for (int j = 0; j < 32; ++j) y[j] = __fmul_rn((float)qs[j], d);
        break;
    }
    case T_Q4_K: {
        const float d = h2f(ld_u16(w.p[0] + blk * 4));
        const float dmin = h2f(ld_u16(w.p[0] + blk * 4 + 2));
        int sc, m;
        scale_min_k4(c, w.p[1] + blk * 12, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const u8* q = w.p[2] + blk * 128 + (c >> 1) * 32;
        const int shift = (c & 1) * 4;
        for (int l = 0; l < 32; ++l) y[l] = __fsub_rn(__fmul_rn(d1, (float)((q[l] >> shift) & 0xF)), m1);
        break;
    }
    case T_Q5_K: {
        const float d = h2f(ld_u16(w.p[0] + blk * 4));
        const float dmin = h2f(ld_u16(w.p[0] + blk * 4 + 2));
        int sc, m;
        scale_min_k4(c, w.p[1] + blk * 12, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const u8* qh = w.p[2] + blk * 32;
        const u8* q = w.p[3] + blk * 128 + (c >> 1) * 32;
        const int shift = (c & 1) * 4;
        for (int l = 0; l < 32; ++l) {
            const int v = ((q[l] >> shift) & 0xF) + (((qh[l] >> c) & 1) << 4);
            y[l] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
        break;
    }
    case T_Q6_K: {
        const u8* ql = w.p[0] + blk * 128;
        const u8* qh = w.p[1] + blk * 64;
        const i8* sc = (const i8*)(w.p[2] + blk * 16);
        const float d = h2f(ld_u16(w.p[3] + blk * 2));
        const int n = c >> 2, g = c & 3;
        const u8* l4 = ql + 64 * n + (g & 1) * 32;
        const int lshift = (g >> 1) * 4, hshift = 2 * g;
        for (int l = 0; l < 32; ++l) {
            const int q = (((l4[l] >> lshift) & 0xF) | (((qh[32 * n + l] >> hshift) & 3) << 4)) - 32;
            const float ds = __fmul_rn(d, (float)sc[8 * n + 2 * g + l / 16]);
            y[l] = __fmul_rn(ds, (float)q);
        }
        break;
    }
    case T_Q2_K: {
        // Chunk c: half n = c/4, pair j = c%4 (bits 2j of qs[32n..32n+32)); scales
        // 8n+2j (elements 0..15) and 8n+2j+1 (16..31): low nibble scale, high min.
        const int n = c >> 2, j = c & 3;
        const float d = h2f(ld_u16(w.p[2] + blk * 4));
        const float dmin = h2f(ld_u16(w.p[2] + blk * 4 + 2));
        const u8* sc = w.p[0] + blk * 16 + 8 * n + 2 * j;
        const u8* q = w.p[1] + blk * 64 + 32 * n;
        for (int h = 0; h < 2; ++h) {
            const float dl = __fmul_rn(d, (float)(sc[h] & 0xF)), ml = __fmul_rn(dmin, (float)(sc[h] >> 4));
            for (int l = 0; l < 16; ++l)
                y[16 * h + l] = __fsub_rn(__fmul_rn(dl, (float)((q[16 * h + l] >> (2 * j)) & 3)), ml);
        }
        break;
    }
    case T_IQ2_XXS: {
        const float d = h2f(ld_u16(w.p[0] + blk * 2));
        const u8* q = w.p[1] + blk * 64 + c * 8;
        const u32 aux0 = ld_u32(q), aux1 = ld_u32(q + 4);
        const float db = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)(aux1 >> 28))), 0.25f);
        for (int l = 0; l < 4; ++l) {
            const u64 grid = IQ2XXS_GRID[(aux0 >> (8 * l)) & 0xFF];
            const u32 signs = iq2_signs((aux1 >> (7 * l)) & 127);
            for (int j = 0; j < 8; ++j) {
                const float g = (float)((grid >> (8 * j)) & 0xFF);
                const float s = (signs >> j) & 1 ? -1.f : 1.f;
                y[8 * l + j] = __fmul_rn(__fmul_rn(db, g), s);
            }
        }
        break;
    }
    default:
        for (int l = 0; l < 32; ++l) y[l] = 0.f;
        break;
    }
}

// RoPE of pair i of one head in place (ggml `rope`, no context extension): theta is the
// position times theta_scale^i by repeated f32 multiplication (ggml's rope cache), pairs
// (2i, 2i+1) or, NEOX, (i, i + half). Used by rope.cu and the fused decode attention.
__device__ __forceinline__ void rotate(float* head, int i, int half, int neox, float pos, float theta_scale) {
    float theta = pos;
    for (int k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
    const float c = cosf(theta), s = sinf(theta);
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    head[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    head[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// transformers' rotation of pair j of a segment in place (`Prec::F32`/`Bf16`, the
// CPU backend's `rope::torch_head`): cos/sin of `ang` times the attention factor
// `mscale`, rounded by `rb`, sin times `sign` (−1 un-rotates), then
// round(x·cos + rotate_half(x)·sin). Used by rope.cu and the compressor (sparse.cu).
__device__ __forceinline__ void rotate_torch(float* seg, int j, int half, int neox, float ang, float mscale,
                                             float sign, int rb) {
    const float c = rnd(__fmul_rn(cosf(ang), mscale), rb);
    const float s = __fmul_rn(rnd(__fmul_rn(sinf(ang), mscale), rb), sign);
    const int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
    const float x0 = seg[a], x1 = seg[b];
    seg[a] = rnd(__fadd_rn(__fmul_rn(x0, c), __fmul_rn(-x1, s)), rb);
    seg[b] = rnd(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)), rb);
}

// Per-step inputs in device memory (written by `Backend::step` before a step runs, or by
// the previous step's `greedy_pick` for a picked token's step), so that a captured
// decode graph reads the current position instead of baking it in.
struct StepInfo {
    i32 pos0;   // position of the first token of the step
    i32 n_tok;  // tokens in the step
    i32 pad[2];
    // followed by n_tok u32 token ids
};

__device__ __forceinline__ const u32* step_tokens(const StepInfo* s) { return (const u32*)(s + 1); }

// `rope_torch`'s parameters (rope.cu, crate::ops::RopeTorchArgs), also carried by the
// kernels that rotate their own output (norm.cu, sparse.cu).
struct RopeTorch {
    float* x;
    const StepInfo* step;
    const float* inv_freq;
    i32 n_head, head_dim, n_dims, neox, trailing;
    float sign, mscale;
    i32 rb;
};

// Pair j of the rotated segment of one head (`head`: its first value) at position `pos`,
// in `rope_torch`'s arithmetic.
__device__ __forceinline__ void rope_torch_pair(const RopeTorch& R, float* head, float pos, int j) {
    const int start = R.trailing ? R.head_dim - R.n_dims : 0;
    rotate_torch(head + start, j, R.n_dims / 2, R.neox, __fmul_rn(pos, R.inv_freq[j]), R.mscale, R.sign, R.rb);
}

// Bytes p .. p + bytes into L2 (one bulk prefetch: the 16-byte lines that hold them).
__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
    // Bulk prefetch needs a 16-byte aligned start and a multiple of 16 bytes.
    u64 a = (u64)p;
    u64 b = a + bytes;
    a &= ~15ull;
    b = (b + 15) & ~15ull;
    if (b > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((u32)(b - a)) : "memory");
}

// `store_rows`' parameters (sparse.cu, crate::ops::StoreRowsArgs): the step's `rows` rows
// of `row_len` values from `src` into the ring `dst` of `cap` rows.
struct StoreRows {
    const StepInfo* step;
    const float* src;
    float* dst;
    i32 rows, row_len, cap;
};

// The k slots of one token in increasing expert id (the order the CPU backend sums
// them): an insertion sort of the ids (k ≤ 32).
__device__ __forceinline__ void slot_order(const i32* ids, int k, int* order) {
    for (int j = 0; j < k; ++j) order[j] = j;
    for (int a = 1; a < k; ++a) {
        const int s = order[a];
        int b = a - 1;
        while (b >= 0 && ids[order[b]] > ids[s]) {
            order[b + 1] = order[b];
            --b;
        }
        order[b + 1] = s;
    }
}

// Σ_j w[j]·y[j·stride + c] over the k slots in `slot_order`'s order, f32; `wrb` rounds
// each weighted output to bf16 (bf16 routing weights, DeepSeek-V4's bf16 model). The
// loads of up to 8 slots are issued before their sums.
__device__ __forceinline__ float sum_sorted(const float* y, i64 stride, const int* order, const float* w, int k,
                                            int c, int wrb) {
    float acc = 0.f;
    for (int a0 = 0; a0 < k; a0 += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = a0 + u < k ? __ldcg(y + order[a0 + u] * stride + c) : 0.f;
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (a0 + u < k) acc = __fadd_rn(acc, rnd(__fmul_rn(v[u], w[order[a0 + u]]), wrb));
    }
    return acc;
}

__device__ __forceinline__ float sum_slots(const float* y, i64 stride, const i32* ids, const float* w, int k,
                                           int c, int wrb) {
    int order[32];
    slot_order(ids, k, order);
    return sum_sorted(y, stride, order, w, k, c, wrb);
}
