// Row-wise and elementwise operations for multi-token steps (prefill), where they run
// unfused: RMSNorm, residual add, SwiGLU, bias add and the f32 -> bf16 conversion of
// GEMM inputs. Arithmetic follows the CPU backend (`engine/src/backend/cpu.rs`):
// RMSNorm sums f32 squares in f64; SwiGLU is `g / (1 + exp(-g)) * u`.

#include "common.cuh"


// Row `row` by the whole block: out[row] = x[row] * 1/sqrt(mean(x[row]²) + eps) * w, and
// the same values into `ring` when set.
__device__ __forceinline__ void rms_norm_row(const float* x, const float* w, float* out, int n, float eps, int row,
                                             float* ring) {
    __shared__ double red[32];
    const float* xr = x + (i64)row * n;
    float* yr = out + (i64)row * n;
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
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        yr[i] = v;
        if (ring) ring[i] = v;
    }
}

// One block per row.
extern "C" __global__ void rms_norm_rows(const float* x, const float* w, float* out, int n, float eps) {
    pdl_wait();
    pdl_trigger();
    rms_norm_row(x, w, out, n, eps, blockIdx.x, nullptr);
}

// One block per row (token), its normalised row also stored into a ring (`store_rows` of
// the output: S.src = out, S.row_len = n; GLM-5.3's latent row into its cache).
extern "C" __global__ void rms_norm_store(const float* x, const float* w, float* out, int n, float eps,
                                          const StoreRows S) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    rms_norm_row(x, w, out, n, eps, t, S.dst + (i64)((S.step->pos0 + t) % S.cap) * S.row_len);
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

// ---- the reference-arithmetic elementwise operations (`Prec::F32`/`Bf16`) ----

extern "C" __global__ void fill_f32(float* x, i64 n, float v) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) x[i] = v;
}

// out = round(round(silu(min(g, lim)))·clamp(u, −lim, lim)).
extern "C" __global__ void swiglu_ref(const float* g, const float* u, float* out, i64 n, float lim, int rb) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const float gv = fminf(g[i], lim);
        const float uv = fmaxf(fminf(u[i], lim), -lim);
        out[i] = rnd(__fmul_rn(rnd(siluf_ref(gv), rb), uv), rb);
    }
}

// x = round(x + y).
extern "C" __global__ void add_round(float* x, const float* y, i64 n, int rb) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        x[i] = rnd(__fadd_rn(x[i], y[i]), rb);
}

// x[r, c] = round(x[r, c]·sigmoid(gate[r, c or 0])) over rows × cols.
extern "C" __global__ void scale_sigmoid(float* x, const float* gate, i64 rows, int cols, int gate_cols, int rb) {
    pdl_wait();
    pdl_trigger();
    const i64 n = rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / cols;
        const float g = gate[gate_cols == 1 ? r : i];
        x[i] = rnd(__fmul_rn(x[i], sigmoidf_ref(g)), rb);
    }
}

// out[i] = element i of a float weight of type ty (F32, F16, BF16), as f32.
extern "C" __global__ void to_f32(const u8* w, int ty, float* out, i64 n) {
    pdl_wait();
    pdl_trigger();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = wval(w, ty, i);
}
