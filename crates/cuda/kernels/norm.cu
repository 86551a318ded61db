// Row norms in the PyTorch references' arithmetic (`Prec::F32`/`Bf16`): RMSNorm with
// the reference's two roundings (`round(round(x·r)·w)`), alone or with the rope of its
// rows (DeepSeek-V4's per-head norms), LayerNorm, and the gated output norm of
// delta-rule layers. Sums of squares and statistics in f64, as the CPU
// backend (`engine/src/backend/cpu/torch_math.rs`, `delta.rs`); `rb` rounds to bf16
// at the reference's cast points.

#include "common.cuh"

// `rms_norm_ref`'s parameters (crate::ops::NormRefArgs): rows of `cols`, one per block.
// cast_once = 0 (GLM-5.3's RMSNorm): out = round(round(x·r)·w), w optional. cast_once = 1
// (DeepSeek-V4's norms, `Backend::rms_norm_cast_once`): round(w·(x·r)), or without w
// round(x·round(r)).
struct NormRef {
    const float* x;
    const float* w;
    float* out;
    i32 cols;
    float eps;
    i32 rb, cast_once;
};

// Row `row` of a NormRef, by the whole block.
__device__ __forceinline__ void norm_ref_row(const NormRef& N, int row) {
    __shared__ double red[32];
    const float* xr = N.x + (i64)row * N.cols;
    float* yr = N.out + (i64)row * N.cols;
    double ss = 0.0;
    for (int i = threadIdx.x; i < N.cols; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, red);
    const float r = inv_rms(ss, N.cols, N.eps);
    for (int i = threadIdx.x; i < N.cols; i += blockDim.x) {
        float v;
        if (!N.cast_once) {
            v = rnd(__fmul_rn(xr[i], r), N.rb);
            if (N.w) v = rnd(__fmul_rn(v, N.w[i]), N.rb);
        } else {
            v = N.w ? rnd(__fmul_rn(N.w[i], __fmul_rn(xr[i], r)), N.rb) : rnd(__fmul_rn(xr[i], rnd(r, N.rb)), N.rb);
        }
        yr[i] = v;
    }
}

extern "C" __global__ void rms_norm_ref(const NormRef N) {
    pdl_wait();
    pdl_trigger();
    norm_ref_row(N, blockIdx.x);
}

// A NormRef whose rows are the heads of a rope_torch's tokens (N.out = R.x, N.cols =
// R.head_dim), both in one launch: block b normalises row b, then rotates it as head
// b % n_head of token b / n_head, after the block's barrier (its own row only, so the
// values are those of the two launches).
extern "C" __global__ void rms_norm_rope(const NormRef N, const RopeTorch R) {
    pdl_wait();
    pdl_trigger();
    norm_ref_row(N, blockIdx.x);
    __syncthreads();
    const int t = blockIdx.x / R.n_head;
    if (t >= R.step->n_tok) return;
    const float pos = (float)(R.step->pos0 + t);
    for (int j = threadIdx.x; j < R.n_dims / 2; j += blockDim.x)
        rope_torch_pair(R, R.x + (i64)blockIdx.x * R.head_dim, pos, j);
}

// One block per row (common.cuh `LayerNorm`).
extern "C" __global__ void layer_norm_ref(const LayerNorm L) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    layer_norm_row(L, blockIdx.x, L.out + (i64)blockIdx.x * L.cols, red);
}

// The gated output norm per head of `dv` values: one warp per (row, head).
// silu = 0: KDA, round(w·(o·r)·sigmoid(z)); silu = 1: gated delta net,
// round(w·round(o·r)·silu(z)).
extern "C" __global__ void gated_norm(const float* o, const float* z, const float* w, float* out, i64 n_heads,
                                      int dv, float eps, int silu, int rb) {
    pdl_wait();
    pdl_trigger();
    const i64 hw = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (hw >= n_heads) return;
    const float* orow = o + hw * dv;
    const float* zrow = z + hw * dv;
    float* dst = out + hw * dv;
    const float r = gated_inv_rms(orow, dv, eps);
    for (int j = lane; j < dv; j += 32) dst[j] = gated_value(orow[j], r, w[j], zrow[j], silu, rb);
}
