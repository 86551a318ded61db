// Rotary position embedding (ggml `rope`, no context extension), in place, at the
// positions of the current step read from device memory. Angles follow the CPU
// backend: theta for pair i is the position times theta_scale^i computed by repeated
// f32 multiplication (ggml's rope cache), theta_scale = freq_base^(-2/n_dims) being
// computed on the host. Pairs are (2i, 2i+1) (interleaved, llama) or (i, i + n_dims/2)
// (NEOX, qwen2). The rotation of one pair is `rotate` in common.cuh (shared with the
// fused decode attention).

#include "common.cuh"


// x: n_tok rows of n_head * head_dim; one block per token.
extern "C" __global__ void rope_rows(float* x, const StepInfo* step, int n_head, int head_dim, int n_dims, int neox,
                                    float theta_scale) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= step->n_tok) return;
    const int half = n_dims / 2;
    const float pos = (float)(step->pos0 + t);
    float* row = x + (i64)t * n_head * head_dim;
    for (int p = threadIdx.x; p < n_head * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        rotate(row + h * head_dim, i, half, neox, pos, theta_scale);
    }
}

// transformers' rope (`Prec::F32`/`Bf16`, the CPU backend's `rope::torch`): angle =
// position · inv_freq[j] in f32 (frequencies computed on the host, YaRN-blended when
// configured), on the leading or trailing n_dims of each head; sign −1 un-rotates
// (DeepSeek-V4's attention output). x: n_tok rows of n_head * head_dim; one block per
// token.
__device__ __forceinline__ void rope_torch_row(const RopeTorch& R, int t) {
    const int half = R.n_dims / 2;
    const float pos = (float)(R.step->pos0 + t);
    float* row = R.x + (i64)t * R.n_head * R.head_dim;
    for (int p = threadIdx.x; p < R.n_head * half; p += blockDim.x)
        rope_torch_pair(R, row + p / half * R.head_dim, pos, p % half);
}

extern "C" __global__ void rope_torch(const RopeTorch R) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= R.step->n_tok) return;
    rope_torch_row(R, t);
}

// `rope_torch`, then the rotated row of its token into a ring (`store_rows` of the same
// rows, S.src = R.x, S.row_len = n_head·head_dim), after the block's barrier.
extern "C" __global__ void rope_torch_store(const RopeTorch R, const StoreRows S) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= R.step->n_tok) return;
    rope_torch_row(R, t);
    __syncthreads();
    const float* row = S.src + (i64)t * S.row_len;
    float* dst = S.dst + (i64)((R.step->pos0 + t) % S.cap) * S.row_len;
    for (int i = threadIdx.x; i < S.row_len; i += blockDim.x) dst[i] = row[i];
}

// Stores n_tok rows of k and v (kv_dim each) as f16 at the step's positions.
extern "C" __global__ void kv_store(const float* k, const float* v, u16* kc, u16* vc, const StepInfo* step, int kv_dim) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= step->n_tok) return;
    const i64 dst = (i64)(step->pos0 + t) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[dst + i] = f2h(k[(i64)t * kv_dim + i]);
        vc[dst + i] = f2h(v[(i64)t * kv_dim + i]);
    }
}

// Decode (one token): RoPE on q and k in place, and k and v stored in the cache. One
// thread per rotated pair of q or k, then one per element of v (which also stores the
// unrotated dims of k, if any).
extern "C" __global__ void rope_qk_store(float* q, float* k, const float* v, u16* kc, u16* vc, const StepInfo* step,
                                        int n_head, int n_head_kv, int head_dim, int n_dims, int neox,
                                        float theta_scale) {
    pdl_wait();
    pdl_trigger();
    const int half = n_dims / 2;
    const float pos = (float)step->pos0;
    const int nq = n_head * half, nk = n_head_kv * half, kv_dim = n_head_kv * head_dim;
    const i64 dst = (i64)step->pos0 * kv_dim;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < nq) {
        rotate(q + (p / half) * head_dim, p % half, half, neox, pos, theta_scale);
    } else if (p < nq + nk) {
        const int pk = p - nq, h = pk / half, i = pk % half;
        float* head = k + h * head_dim;
        rotate(head, i, half, neox, pos, theta_scale);
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        kc[dst + h * head_dim + a] = f2h(head[a]);
        kc[dst + h * head_dim + b] = f2h(head[b]);
    } else if (p < nq + nk + kv_dim) {
        const int j = p - nq - nk;
        vc[dst + j] = f2h(v[j]);
        if (j % head_dim >= n_dims) kc[dst + j] = f2h(k[j]);
    }
}
