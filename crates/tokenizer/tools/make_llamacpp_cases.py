#!/usr/bin/env python3
"""Writes tests/data/llamacpp_vocab_cases.json from llama.cpp's tokenizer (see
tests/data/README.md).

usage: make_llamacpp_cases.py ORACLE FIXTURES_DIR OUTPUT_JSON
"""
import glob
import json
import random
import subprocess
import sys
import tempfile

ORACLE, FIXTURES, OUTPUT = sys.argv[1:4]
PICK = tempfile.mkstemp(suffix=".txt")[1]

# A seeded pool of inputs: the fixture inputs, the fixture prompts, random mixes.
random.seed(1234)
pools = {
 'ascii': "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
 'digits': "0123456789",
 'punct': "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
 'ws': [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\u00a0", "\u2009", "\u3000", "\u0085", "\u1680", "\u200b"],
 'accent': "éèêëàâäçñöüßÉÀÇÑØøåÅæœ",
 'greek': "αβγδΩΣπ\u1fd3\u2126\u212a\u1f71\u1fbe\u0390",
 'cyr': "приветмирЖЩ",
 'cjk': "你好世界中文字符日本語のテキスト",
 'korean': "안녕하세요한국어",
 'arabic': "مرحبا بالعالم",
 'hindi': "नमस्ते दुनिया",
 'marks': "\u0301\u0308\u0327\u20dd\u0903",
 'emoji': ["😀", "🦙", "👍🏽", "🇫🇷", "❤️", "\U0001F9D1\u200d\U0001F4BB"],
 'contr': ["'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'LL", "'d", "'D", "’s"],
 'special': ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "</s>", "<s>", "<unk>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|begin_of_text|>", "<|eot_id|>", "<｜begin▁of▁sentence｜>", "<|repo_name|>", "[PAD151665]", "<0x0A>", "▁", "Ġ"],
 'num': ["1234567", "3.14159", "1,000,000", "٣٤٥", "½", "²", "Ⅻ"],
 'code': ["def f(x):\n    return x*2\n", "fn main() { println!(\"hi\"); }", "    \t\tif (a && b) {\n", "<div class=\"x\">&nbsp;</div>", "SELECT * FROM t;"],
}
def piece():
    k = random.choice(list(pools))
    p = pools[k]
    if isinstance(p, str):
        n = random.choice([1,1,2,3,5,8])
        return ''.join(random.choice(p) for _ in range(n))
    return random.choice(p)
cases = []
for f in glob.glob(f'{FIXTURES}/tokenizer/*.inp'):
    cases += open(f, encoding='utf-8').read().split('\n__ggml_vocab_test__\n')[:-1]
for f in glob.glob(f'{FIXTURES}/llamacpp/*.json'):
    d = json.load(open(f))
    for c in d.get('cases', []):
        cases.append(c['rendered_prompt'])
for i in range(2500):
    n = random.choice([1,2,3,5,8,13,30])
    cases.append(''.join(piece() for _ in range(n)))
for n in [1,2,3,4,7,16,33]:
    cases.append(' ' * n + 'x'); cases.append('x' + ' ' * n); cases.append('\n' * n); cases.append(' \n' * n + ' ')
    cases.append('9' * n); cases.append("'" * n + 's')
cases = list(dict.fromkeys(cases))

# The sample: 40 inputs with special-token text, 40 others, 4 fixed ones.
random.seed(7)
fixture_inputs = set(open(f'{FIXTURES}/tokenizer/ggml-vocab-qwen35.gguf.inp', encoding='utf-8').read().split('\n__ggml_vocab_test__\n'))
pool = [c for c in cases if c not in fixture_inputs and len(c) <= 60 and '<|' not in c[:0]]
special = [c for c in pool if any(s in c for s in ['<|', '</s>', '<s>', '<unk>', '<tool_call>', '[PAD', '<0x', '｜'])]
other = [c for c in pool if c not in special]
pick = random.sample(special, 40) + random.sample(other, 40)
pick += ['<|im_start|>user\nHi</s><s> <unk>', ' <|endoftext|>  <|im_end|>\n', '<tool_call>\n{"a": 1}\n</tool_call>', '']
with open(PICK, 'w', encoding='utf-8') as f:
    for c in pick: f.write(c + '\n__sep__\n')
out = {"provenance": "llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored in PyPI llama-cpp-python 0.3.36), built locally; llama_tokenize / llama_detokenize on the vocabulary-only GGUFs of fixtures/tokenizer; see tests/data/README.md", "cases": pick, "vocabs": {}}
for v in ["qwen2","qwen35","gpt-2","llama-bpe","deepseek-llm","deepseek-coder","llama-spm","starcoder"]:
    r = subprocess.run([ORACLE, f'{FIXTURES}/tokenizer/ggml-vocab-{v}.gguf', PICK], capture_output=True, text=True).stdout.split('\n')
    head = r[0].split(); eog = [int(x) for x in r[1].split()[1:]]
    rows = r[2:]
    res = []
    toint = lambda l: [int(x) for x in l.split()]
    for i in range(len(pick)):
        a, b, d0, d1, d2 = rows[5*i:5*i+5]
        res.append({"plain": toint(a), "special": toint(b), "detok": d0, "detok_special": d1, "detok_strip": d2})
    out["vocabs"][v] = {"bos": int(head[1]), "eos": int(head[3]), "eot": int(head[5]), "add_bos": head[11] == '1', "add_eos": head[13] == '1', "eog": eog, "results": res}

# Keep 60 of the 84 cases, detokenized text as UTF-8 strings.
keep = list(range(0, 30)) + list(range(40, 66)) + [80, 81, 82, 83]
out["cases"] = [out["cases"][i] for i in keep]
for v in out["vocabs"].values():
    rs = [v["results"][i] for i in keep]
    for r in rs:
        for k in ["detok", "detok_special", "detok_strip"]:
            r[k] = bytes.fromhex(r[k]).decode("utf-8")
    v["results"] = rs
json.dump(out, open(OUTPUT, "w"), ensure_ascii=False, separators=(",", ":"))
