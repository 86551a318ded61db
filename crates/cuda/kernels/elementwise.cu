// Row-wise and elementwise operations for multi-token steps (prefill), where they run
// unfused: RMSNorm, residual add, SwiGLU, bias add and the f32 -> bf16 conversion of
// GEMM inputs. Arithmetic follows the CPU backend (`engine/src/backend/cpu.rs`):
// RMSNorm sums f32 squares in f64; SwiGLU is `g / (1 + exp(-g)) * u`.

#include "common.cuh"

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// One block per row: out[r] = x[r] * 1/sqrt(mean(x[r]²) + eps) * w.
extern "C" __global__ void rms_norm_rows(const float* x, const float* w, float* out, int n, float eps) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = out + (i64)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)__fmul_rn(xr[i], xr[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int k = 0; k < (int)(blockDim.x >> 5); ++k) t += red[k];
        red[0] = t;
    }
    __syncthreads();
    const float mean = (float)(red[0] / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

extern "C" __global__ void add_inplace(float* x, const float* y, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

extern "C" __global__ void swiglu(const float* g, const float* u, float* out, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const float v = g[i];
        out[i] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), u[i]);
    }
}

// out[r][c] += bias[c] for rows x cols.
extern "C" __global__ void add_bias_rows(float* out, const float* bias, int cols, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(out[i], bias[i % cols]);
}

extern "C" __global__ void f32_to_bf16(const float* x, u16* y, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] = f2bf(x[i]);
}

// dst[i] = src[i] for n floats (a kernel rather than a memcpy node so that it takes
// part in programmatic dependent launch like its neighbours).
extern "C" __global__ void copy_f32(const float* src, float* dst, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) dst[i] = src[i];
}
