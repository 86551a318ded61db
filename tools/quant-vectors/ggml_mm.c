// Dev-time harness over a ggml build (see README.md): one whole matrix product through
// ggml's CPU backend, exactly as llama.cpp runs it (activation quantization, then
// vec_dot, llamafile's tinyBLAS, the tiled K-quant kernels or the repacked kernels,
// whichever ggml picks for the shapes), so gen.py can record reference vectors and so
// ds4-quant's products can be compared bit for bit. Not part of the Rust build.
//
//   ggml_mm TYPE K M N REPACK THREADS w.bin x.f32 out.f32
//
// TYPE: ggml's numeric type id of the weights; w.bin: M rows of K elements of TYPE;
// x.f32: N rows of K f32 activations; out.f32: N rows of M f32 results
// (out[n*M + m] = dot(w row m, x row n)). REPACK=1 puts the weights in the CPU backend's
// repack buffer type (as llama.cpp does for weights whose type it repacks); it is an
// error if ggml does not repack that type and shape.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *len = (size_t) ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*len ? *len : 1);
    if (fread(buf, 1, *len, f) != *len) { perror(path); exit(1); }
    fclose(f);
    return buf;
}

static void write_file(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) { perror(path); exit(1); }
    fclose(f);
}

// The CPU device's repack buffer type ("CPU_REPACK"), or NULL.
static ggml_backend_buffer_type_t repack_buft(void) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    typedef ggml_backend_buffer_type_t * (*get_extra_t)(ggml_backend_dev_t);
    get_extra_t get = (get_extra_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) return NULL;
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) return *b;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 10) { fprintf(stderr, "usage: see the header of ggml_mm.c\n"); return 2; }
    const enum ggml_type type = (enum ggml_type) atoi(argv[1]);
    const int64_t k = atoll(argv[2]), m = atoll(argv[3]), n = atoll(argv[4]);
    const int repack = atoi(argv[5]), threads = atoi(argv[6]);
    size_t wlen, xlen;
    const void *w = read_file(argv[7], &wlen);
    const float *x = read_file(argv[8], &xlen);
    if (wlen != ggml_row_size(type, k) * (size_t) m || xlen != sizeof(float) * (size_t) (k * n)) {
        fprintf(stderr, "input sizes do not match the shapes\n");
        return 2;
    }

    struct ggml_init_params ip = { 3 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *tw = ggml_new_tensor_2d(ctx, type, k, m);
    struct ggml_tensor *tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    struct ggml_tensor *ty = ggml_mul_mat(ctx, tw, tx);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ty);

    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);

    ggml_backend_buffer_type_t wbuft = ggml_backend_get_default_buffer_type(backend);
    if (repack) {
        wbuft = repack_buft();
        if (!wbuft) { fprintf(stderr, "no CPU_REPACK buffer type\n"); return 1; }
    }
    ggml_backend_buffer_t wbuf = ggml_backend_buft_alloc_buffer(wbuft, ggml_backend_buft_get_alloc_size(wbuft, tw) + 256);
    struct ggml_tallocr wa = ggml_tallocr_new(wbuf);
    ggml_tallocr_alloc(&wa, tw);
    if (repack && tw->extra == NULL) { fprintf(stderr, "ggml does not repack this type/shape\n"); return 1; }
    ggml_backend_tensor_set(tw, w, 0, wlen);

    ggml_backend_buffer_t abuf = ggml_backend_alloc_buffer(backend, ggml_nbytes(tx) + ggml_nbytes(ty) + 1024);
    struct ggml_tallocr aa = ggml_tallocr_new(abuf);
    ggml_tallocr_alloc(&aa, tx);
    ggml_tallocr_alloc(&aa, ty);
    ggml_backend_tensor_set(tx, x, 0, xlen);

    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        return 1;
    }
    float *out = malloc(ggml_nbytes(ty));
    ggml_backend_tensor_get(ty, out, 0, ggml_nbytes(ty));
    write_file(argv[9], out, ggml_nbytes(ty));
    return 0;
}
