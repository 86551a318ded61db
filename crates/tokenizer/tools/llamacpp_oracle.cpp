// Reference outputs from llama.cpp's tokenizer, for tests/data/llamacpp_vocab_cases.json
// (see tests/data/README.md for how to build and run it).
//
// usage: llamacpp_oracle MODEL.gguf [CASES_FILE]   (cases separated by "\n__sep__\n")
// prints: "bos B eos E eot T eom -1 nl N add_bos 0|1 add_eos 0|1", "eog ID...", then per
// case five lines: llama_tokenize(add_special=0, parse_special=0) ids,
// llama_tokenize(1, 1) ids, and llama_detokenize of the latter (as hex) with
// (remove_special, unparse_special) = (0, 0), (0, 1), (1, 1).
#include "llama.h"
#include <cstdio>
#include <string>
#include <vector>
#include <fstream>
#include <sstream>
static std::vector<llama_token> tok(const llama_vocab * v, const std::string & s, bool add, bool sp) {
    std::vector<llama_token> out(s.size() * 2 + 16);
    int n = llama_tokenize(v, s.data(), s.size(), out.data(), out.size(), add, sp);
    if (n < 0) { out.resize(-n); n = llama_tokenize(v, s.data(), s.size(), out.data(), out.size(), add, sp); }
    out.resize(n); return out;
}
static std::string detok(const llama_vocab * v, const std::vector<llama_token> & t, bool rm, bool sp) {
    std::string buf(t.size() * 64 + 64, '\0');
    int n = llama_detokenize(v, t.data(), t.size(), buf.data(), buf.size(), rm, sp);
    if (n < 0) { buf.resize(-n); n = llama_detokenize(v, t.data(), t.size(), buf.data(), buf.size(), rm, sp); }
    buf.resize(n); return buf;
}
static void print_ids(const std::vector<llama_token> & t) { for (size_t i = 0; i < t.size(); i++) printf(i ? " %d" : "%d", t[i]); printf("\n"); }
static void print_hex(const std::string & s) { for (unsigned char c : s) printf("%02x", c); printf("\n"); }
int main(int argc, char ** argv) {
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params(); mp.vocab_only = true;
    llama_model * m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * v = llama_model_get_vocab(m);
    printf("bos %d eos %d eot %d eom %d nl %d add_bos %d add_eos %d\n", llama_vocab_bos(v), llama_vocab_eos(v), llama_vocab_eot(v), -1, llama_vocab_nl(v), llama_vocab_get_add_bos(v), llama_vocab_get_add_eos(v));
    printf("eog");
    for (int i = 0; i < llama_vocab_n_tokens(v); i++) if (llama_vocab_is_eog(v, i)) printf(" %d", i);
    printf("\n");
    if (argc < 3) return 0;
    std::ifstream f(argv[2]); std::stringstream ss; ss << f.rdbuf(); std::string all = ss.str();
    const std::string sep = "\n__sep__\n";
    size_t pos = 0;
    while (true) {
        size_t e = all.find(sep, pos); if (e == std::string::npos) break;
        std::string c = all.substr(pos, e - pos); pos = e + sep.size();
        auto a = tok(v, c, false, false); print_ids(a);
        auto b = tok(v, c, true, true); print_ids(b);
        print_hex(detok(v, b, false, false));
        print_hex(detok(v, b, false, true));
        print_hex(detok(v, b, true, true));
    }
    return 0;
}
