// Dev-time harness over a ggml build (see README.md): runs ggml's own quantizers,
// dequantizers, CPU activation quantizers and CPU dot products on files, so gen.py can
// record reference vectors. Not part of the Rust build.
//
//   ggml_ref quant   TYPE N_PER_ROW NROWS in.f32 out.bin   ggml_quantize_chunk, no imatrix
//   ggml_ref dequant TYPE N in.bin out.f32                  type_traits.to_float
//   ggml_ref act     TYPE N in.f32 out.bin                  CPU from_float of TYPE (Q8_0/Q8_1/Q8_K)
//   ggml_ref dot     TYPE N NROWS w.bin act.bin out.f32     CPU vec_dot of each row with one act row
//
// TYPE is ggml's numeric type id.
#include "ggml.h"
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

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: see the header of ggml_ref.c\n"); return 2; }
    ggml_cpu_init();
    const char *op = argv[1];
    const enum ggml_type type = (enum ggml_type) atoi(argv[2]);
    size_t len;
    if (!strcmp(op, "quant") && argc == 7) {
        const int64_t n = atoll(argv[3]), nrows = atoll(argv[4]);
        const float *x = read_file(argv[5], &len);
        const size_t out_len = ggml_row_size(type, n) * (size_t) nrows;
        void *y = calloc(1, out_len);
        ggml_quantize_chunk(type, x, y, 0, nrows, n, NULL);
        write_file(argv[6], y, out_len);
    } else if (!strcmp(op, "dequant") && argc == 6) {
        const int64_t n = atoll(argv[3]);
        const void *x = read_file(argv[4], &len);
        float *y = calloc((size_t) n, sizeof(float));
        ggml_get_type_traits(type)->to_float(x, y, n);
        write_file(argv[5], y, (size_t) n * sizeof(float));
    } else if (!strcmp(op, "act") && argc == 6) {
        const int64_t n = atoll(argv[3]);
        const float *x = read_file(argv[4], &len);
        const size_t out_len = ggml_row_size(type, n);
        void *y = calloc(1, out_len);
        ggml_get_type_traits_cpu(type)->from_float(x, y, n);
        write_file(argv[5], y, out_len);
    } else if (!strcmp(op, "dot") && argc == 8) {
        const int64_t n = atoll(argv[3]), nrows = atoll(argv[4]);
        const char *w = read_file(argv[5], &len);
        const void *a = read_file(argv[6], &len);
        const size_t rb = ggml_row_size(type, n);
        float *out = calloc((size_t) nrows, sizeof(float));
        for (int64_t r = 0; r < nrows; r++) {
            ggml_get_type_traits_cpu(type)->vec_dot((int) n, &out[r], 0, w + r * rb, 0, a, 0, 1);
        }
        write_file(argv[7], out, (size_t) nrows * sizeof(float));
    } else {
        fprintf(stderr, "bad arguments for %s\n", op);
        return 2;
    }
    return 0;
}
