// Logits of a token sequence from llama.cpp's libllama (CPU), for
// tools/reference/llamacpp_check.sh: the fixture protocol of the golden masters —
// the prompt in one llama_decode call (logits of every position), then each decode
// token fed alone (teacher-forced, logits of that step).
//
//   llamacpp_logits MODEL.gguf TOKENS.txt N_PROMPT OUT.f32
//
// TOKENS.txt: whitespace-separated token ids (the prompt, then the tokens fed at the
// decode steps). OUT.f32: little-endian f32, one row of n_vocab per fed token
// (N_PROMPT prefill rows, then one per decode step). KV cache in f32 (type_k/type_v),
// flash attention off, one sequence, one ubatch for the whole prompt.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

static int fail(const char * what) {
    std::fprintf(stderr, "llamacpp_logits: %s\n", what);
    return 1;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        return fail("usage: llamacpp_logits MODEL.gguf TOKENS.txt N_PROMPT OUT.f32");
    }
    std::vector<llama_token> tokens;
    {
        std::ifstream in(argv[2]);
        long t;
        while (in >> t) {
            tokens.push_back((llama_token) t);
        }
    }
    const int n_prompt = std::atoi(argv[3]);
    if (n_prompt <= 0 || n_prompt > (int) tokens.size()) {
        return fail("N_PROMPT must be in 1..number of tokens");
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        return fail("llama.cpp could not load the model");
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256 * ((tokens.size() + 255) / 256);
    cp.n_batch = n_prompt;
    cp.n_ubatch = n_prompt;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.offload_kqv = false;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        return fail("llama.cpp could not create a context");
    }

    std::FILE * out = std::fopen(argv[4], "wb");
    if (out == nullptr) {
        return fail("cannot write the output file");
    }
    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    int pos = 0;
    // the prompt in one call, then one call per decode token
    for (int start = 0; start < (int) tokens.size();) {
        const int n = start == 0 ? n_prompt : 1;
        batch.n_tokens = n;
        for (int i = 0; i < n; ++i) {
            batch.token[i] = tokens[start + i];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        if (llama_decode(ctx, batch) != 0) {
            return fail("llama_decode failed");
        }
        for (int i = 0; i < n; ++i) {
            const float * row = llama_get_logits_ith(ctx, i);
            if (row == nullptr || std::fwrite(row, sizeof(float), n_vocab, out) != (size_t) n_vocab) {
                return fail("no logits");
            }
        }
        pos += n;
        start += n;
    }
    std::fclose(out);
    std::fprintf(stderr, "llamacpp_logits: %zu tokens (%d prompt), n_vocab %d\n", tokens.size(), n_prompt, n_vocab);

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
