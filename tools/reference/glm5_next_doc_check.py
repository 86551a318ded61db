#!/usr/bin/env python3
"""Independent NumPy (float64) implementation of docs/glm5_next.md, checked
against the f32 fixtures.

It reads only what the Rust engine will read — the fixture's `config.json` and
hub-format `model.safetensors` — and follows the doc, not the reference code:
KDA chunked form via an explicit (I + L)^-1 solve, recurrent form for decode,
MLA with explicit per-query token sets from the DSA indexer, the MoE router,
mHC with Sinkhorn. Agreement with the reference logits shows that the doc (and
its checkpoint-name table) is complete.

Usage:
    tools/reference/.venv/bin/python tools/reference/glm5_next_doc_check.py \
        crates/engine/tests/fixtures/glm5_next/lowerbound_sparse_f32 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


class LayerState:
    def __init__(self):
        self.conv = None  # last Kc-1 pre-conv rows [Kc-1, 3qkv]
        self.S = None  # [Hk, dk, dv]
        self.c = None  # MLA latents [T, rkv]
        self.ik = None  # indexer keys [T, di]
        self.igs = None  # indexer gate scores [T, di]


class Glm5NextDoc:
    def __init__(self, folder: Path):
        cfg = json.loads((folder / "config.json").read_text())["text_config"]
        self.c = cfg
        raw = load_file(str(folder / "model.safetensors"))
        self.t = {k: v.astype(np.float64) for k, v in raw.items()}
        self.eps = cfg["rms_norm_eps"]

    def w(self, name):
        return self.t["model.language_model." + name]

    # ---- mHC (doc §3)
    def hc(self, X, p):
        c = self.c
        N = c["hc_mult"]
        S = X.shape[0]
        xf = X.reshape(S, -1)
        xn = xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + self.eps)
        m = xn @ self.w(p + "_fn").T
        base, sc, e = self.w(p + "_base"), self.w(p + "_scale"), c["hc_eps"]
        pre = sigmoid(m[:, :N] * sc[0] + base[:N]) + e
        post = 2 * sigmoid(m[:, N:2 * N] * sc[1] + base[N:2 * N])
        C = softmax(m[:, 2 * N:].reshape(S, N, N) * sc[2] + base[2 * N:].reshape(N, N), axis=-1) + e
        C = C / (C.sum(axis=1, keepdims=True) + e)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            C = C / (C.sum(axis=2, keepdims=True) + e)
            C = C / (C.sum(axis=1, keepdims=True) + e)
        x = np.einsum("sn,snd->sd", pre, X)
        return post, C, x

    # ---- KDA (doc §4)
    def kda(self, x, st: LayerState, p):
        c = self.c
        H, dk, K = c["linear_num_heads"], c["linear_head_dim"], c["linear_conv_kernel_dim"]
        S = x.shape[0]
        u = np.concatenate([x @ self.w(p + f"{n}_proj.weight").T for n in "qkv"], axis=1)
        cw = np.concatenate([self.w(p + f"{n}_conv1d.weight")[:, 0, :] for n in "qkv"], axis=0)  # [3qkv, K]
        hist = np.zeros((K - 1, u.shape[1])) if st.conv is None else st.conv
        full = np.concatenate([hist, u], axis=0)
        conv = np.stack([(full[t:t + K] * cw.T).sum(axis=0) for t in range(S)])
        st.conv = full[-(K - 1):]
        q, k, v = np.split(silu(conv), 3, axis=1)
        q, k, v = (a.reshape(S, H, dk) for a in (q, k, v))
        g0 = (x @ self.w(p + "f_a_proj.weight").T) @ self.w(p + "f_b_proj.weight").T + self.w(p + "dt_bias")
        g0 = g0.reshape(S, H, dk)
        a = np.exp(self.w(p + "A_log"))[None, :, None]
        lb = c["linear_lower_bound"]
        if lb is not None:
            g = lb * sigmoid(a * g0)
        else:
            g = -a * np.where(g0 > 20, g0, np.log1p(np.exp(np.minimum(g0, 20))))
        beta = sigmoid(x @ self.w(p + "b_proj.weight").T)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk**-0.5
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        state = np.zeros((H, dk, dk)) if st.S is None else st.S
        o = np.zeros((S, H, dk))
        if S == 1 and st.S is not None:
            for h in range(H):
                Sh = state[h] * np.exp(g[0, h])[:, None]
                delta = (v[0, h] - k[0, h] @ Sh) * beta[0, h]
                Sh = Sh + np.outer(k[0, h], delta)
                o[0, h] = q[0, h] @ Sh
                state[h] = Sh
        else:
            for h in range(H):
                Sh = state[h]
                for s0 in range(0, S, 64):
                    sl = slice(s0, min(S, s0 + 64))
                    qc, kc, vc, gc, bc = q[sl, h], k[sl, h], v[sl, h], g[sl, h], beta[sl, h]
                    n = qc.shape[0]
                    G = np.cumsum(gc, axis=0)
                    tri = np.tril(np.ones((n, n)), 0)
                    gam = np.exp(np.minimum(G[:, None, :] - G[None, :, :], 0)) * tri[:, :, None]
                    Lm = bc[:, None] * np.einsum("id,jd,ijd->ij", kc, kc, gam) * np.tril(np.ones((n, n)), -1)
                    T = np.linalg.inv(np.eye(n) + Lm)
                    U = T @ (bc[:, None] * vc)
                    W = T @ (bc[:, None] * kc * np.exp(G))
                    A = np.einsum("id,jd,ijd->ij", qc, kc, gam)
                    Vn = U - W @ Sh
                    o[sl, h] = (qc * np.exp(G)) @ Sh + A @ Vn
                    Sh = Sh * np.exp(G[-1])[:, None] + (kc * np.exp(G[-1] - G)).T @ Vn
                state[h] = Sh
        st.S = state
        gate = ((x @ self.w(p + "g_a_proj.weight").T) @ self.w(p + "g_b_proj.weight").T).reshape(S, H, dk)
        y = rms(o, self.w(p + "o_norm.weight"), self.eps) * sigmoid(gate)
        return y.reshape(S, -1) @ self.w(p + "o_proj.weight").T

    # ---- DSA indexer (doc §6)
    def indexer(self, x, q_lat, st: LayerState, p, past):
        c = self.c
        Hi, di, P, Ktop = c["index_n_heads"], c["index_head_dim"], c["index_kpool"], c["index_topk"]
        S = x.shape[0]
        kx = x @ self.w(p + "wk.weight").T
        mu = kx.mean(-1, keepdims=True)
        var = ((kx - mu) ** 2).mean(-1, keepdims=True)
        kx = (kx - mu) / np.sqrt(var + 1e-6) * self.w(p + "k_norm.weight") + self.w(p + "k_norm.bias")
        gs = x @ self.w(p + "index_kpool_compress_gate").T
        st.ik = kx if st.ik is None else np.concatenate([st.ik, kx])
        st.igs = gs if st.igs is None else np.concatenate([st.igs, gs])
        T = st.ik.shape[0]
        npools = T // P
        logits = st.igs[: npools * P].reshape(npools, P, di) + self.w(p + "index_kpool_compress_ape")[None]
        pool_k = (softmax(logits, axis=1) * st.ik[: npools * P].reshape(npools, P, di)).sum(axis=1)
        q = (q_lat @ self.w(p + "wq_b.weight").T).reshape(S, Hi, di)
        hw = (x @ self.w(p + "weights_proj.weight").T) * Hi**-0.5
        score = np.einsum("sh,shp->sp", hw, np.maximum(np.einsum("shd,pd->shp", q, pool_k) * di**-0.5, 0))
        select_k = min(Ktop // P, npools)
        sets = []
        for i in range(S):
            t = past + i
            vis = [pp for pp in range(npools) if (pp + 1) * P - 1 <= t]
            chosen = sorted(vis, key=lambda pp: -score[i, pp])[:select_k]
            toks = {j for pp in chosen for j in range(pp * P, (pp + 1) * P)}
            if c["index_kpool_always_select_tail"]:
                toks |= set(range(P * ((t + 1) // P), t + 1))
            sets.append(sorted(toks))
        return sets

    # ---- MLA (doc §5)
    def mla(self, x, st: LayerState, p, prev_sets, full):
        c = self.c
        Ha, dn, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
        S = x.shape[0]
        past = 0 if st.c is None else st.c.shape[0]
        q_lat = rms(x @ self.w(p + "q_a_proj.weight").T, self.w(p + "q_a_layernorm.weight"), self.eps)
        q = (q_lat @ self.w(p + "q_b_proj.weight").T).reshape(S, Ha, dn)
        lat = rms(x @ self.w(p + "kv_a_proj_with_mqa.weight").T, self.w(p + "kv_a_layernorm.weight"), self.eps)
        st.c = lat if st.c is None else np.concatenate([st.c, lat])
        kv = (st.c @ self.w(p + "kv_b_proj.weight").T).reshape(-1, Ha, dn + dv)
        kk, vv = kv[..., :dn], kv[..., dn:]
        sets = self.indexer(x, q_lat, st, p + "indexer.", past) if full else prev_sets
        out = np.zeros((S, Ha, dv))
        for i in range(S):
            idx = np.array(sets[i])
            sc = np.einsum("hd,jhd->hj", q[i], kk[idx]) * dn**-0.5
            out[i] = np.einsum("hj,jhd->hd", softmax(sc, axis=-1), vv[idx])
        return out.reshape(S, -1) @ self.w(p + "o_proj.weight").T, sets

    # ---- MLP / MoE (doc §7)
    def swiglu(self, x, wg, wu, wd):
        lim = self.c["swiglu_limit"]
        return (silu(np.minimum(x @ wg.T, lim)) * np.clip(x @ wu.T, -lim, lim)) @ wd.T

    def moe(self, x, p):
        c = self.c
        E, G, kg, k = c["n_routed_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
        s = sigmoid(x @ self.w(p + "gate.weight").T)
        sc = s + self.w(p + "gate.e_score_correction_bias")
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            grp = np.sort(sc[t].reshape(G, E // G), axis=1)[:, -2:].sum(1)
            keep = np.argsort(-grp, kind="stable")[:kg]
            masked = np.full(E, -np.inf)
            for gi in keep:
                masked[gi * (E // G):(gi + 1) * (E // G)] = sc[t, gi * (E // G):(gi + 1) * (E // G)]
            idx = np.argsort(-masked, kind="stable")[:k]
            wts = s[t, idx]
            if c["norm_topk_prob"]:
                wts = wts / (wts.sum() + 1e-20)
            wts = wts * c["routed_scaling_factor"]
            for e, we in zip(idx, wts):
                q = p + f"experts.{e}."
                out[t] += we * self.swiglu(x[t:t + 1], self.w(q + "gate_proj.weight"), self.w(q + "up_proj.weight"),
                                           self.w(q + "down_proj.weight"))[0]
        q = p + "shared_experts."
        return out + self.swiglu(x, self.w(q + "gate_proj.weight"), self.w(q + "up_proj.weight"),
                                 self.w(q + "down_proj.weight"))

    # ---- whole model (doc §2)
    def forward(self, tokens, states):
        c = self.c
        X = np.repeat(self.w("embed_tokens.weight")[tokens][:, None, :], c["hc_mult"], axis=1)
        sets = None
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            post, C, x = self.hc(X, p + "hc_attn")
            x = rms(x, self.w(p + "input_layernorm.weight"), self.eps)
            if c["layer_types"][i] == "linear_attention":
                y, sets = self.kda(x, states[i], p + "self_attn."), None
            else:
                full = c["indexer_types"][i] == "full"
                if not full and sets is None:
                    raise ValueError(f"layer {i}: shared indexer layer without a preceding full MLA layer")
                y, new_sets = self.mla(x, states[i], p + "self_attn.", sets, full)
                nxt = c["indexer_types"][min(i + 1, c["num_hidden_layers"] - 1)]
                sets = new_sets if (full and nxt == "shared") else None
            X = post[:, :, None] * y[:, None, :] + np.einsum("sij,sid->sjd", C, X)
            post, C, x = self.hc(X, p + "hc_ffn")
            x = rms(x, self.w(p + "post_attention_layernorm.weight"), self.eps)
            if c["mlp_layer_types"][i] == "sparse":
                y = self.moe(x, p + "mlp.")
            else:
                y = self.swiglu(x, self.w(p + "mlp.gate_proj.weight"), self.w(p + "mlp.up_proj.weight"),
                                self.w(p + "mlp.down_proj.weight"))
            X = post[:, :, None] * y[:, None, :] + np.einsum("sij,sid->sjd", C, X)
        h = rms(X.mean(axis=1), self.w("norm.weight"), self.eps)
        return h @ self.t["lm_head.weight"].T


def rel_err(a, ref):
    scale = np.maximum(ref.std(axis=-1), 1.0)
    return float((np.abs(a - ref).max(axis=-1) / scale).max())


def check(folder: Path) -> float:
    m = Glm5NextDoc(folder)
    prompt = np.load(folder / "prompt.npy")
    feed = np.load(folder / "decode_tokens.npy")
    ref_pre = np.load(folder / "prefill_logits.npy").astype(np.float64)
    ref_dec = np.load(folder / "decode_logits.npy").astype(np.float64)
    states = [LayerState() for _ in range(m.c["num_hidden_layers"])]
    pre = m.forward(prompt, states)
    dec = np.stack([m.forward(feed[i:i + 1], states)[0] for i in range(ref_dec.shape[0])])
    e_pre, e_dec = rel_err(pre, ref_pre), rel_err(dec, ref_dec)
    greedy_ok = bool((dec.argmax(-1) == feed[1:]).all())
    print(f"{folder.name}: prefill rel err {e_pre:.2e}, decode rel err {e_dec:.2e}, greedy tokens match: {greedy_ok}")
    return max(e_pre, e_dec)


if __name__ == "__main__":
    worst = max(check(Path(f)) for f in sys.argv[1:])
    sys.exit(0 if worst <= 1e-4 else 1)
