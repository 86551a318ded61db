//! The MTP head (`mtp.rs`): the transformers reference computes no MTP logits (it has
//! no MTP module), so these tests check what can be checked: an MTP block in a GGUF
//! (llama.cpp's `blk.{L}.nextn.*` layout) loads and leaves the trunk untouched; the head
//! runs, gives finite logits of the right shape, deterministically, the same however the
//! calls are split, and rewinds. The block is built from the `small_rates` fixture:
//! its sliding, score-routed layer 2 copied as block 5, plus a random `eh_proj` and
//! norms.

use ds4_gguf::{GgmlType, GgufWriter, Value};

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::families::deepseek4::mtp::MtpState;

/// `small_rates` with an MTP block 5.
fn with_mtp() -> Cpu {
    load(with_mtp_bytes(true))
}

/// The bytes of `small_rates` with an MTP block 5 (`trunk`: with the trunk's layers, as
/// our converter writes; without: as llama.cpp's MTP-only files).
fn with_mtp_bytes(trunk: bool) -> Vec<u8> {
    let src = GgufFile::from_bytes(llamacpp_bytes(&dir("small_rates_f32"))).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        let v = match (k, v) {
            ("deepseek4.block_count", _) => Value::U32(6),
            ("deepseek4.swiglu_clamp_exp" | "deepseek4.swiglu_clamp_shexp", Value::Array(a)) => {
                let mut a = a.clone();
                a.push(a[0].clone());
                Value::Array(a)
            }
            _ => v.clone(),
        };
        w.add_metadata(k, v).unwrap();
    }
    w.add_metadata("deepseek4.nextn_predict_layers", Value::U32(1))
        .unwrap();
    for t in src.tensors() {
        if trunk || !t.name.starts_with("blk.") {
            w.add_tensor(
                t.name.clone(),
                &t.dims,
                t.dtype,
                src.tensor_data(t).to_vec(),
            )
            .unwrap();
        }
        if let Some(rest) = t.name.strip_prefix("blk.2.") {
            w.add_tensor(
                format!("blk.5.{rest}"),
                &t.dims,
                t.dtype,
                src.tensor_data(t).to_vec(),
            )
            .unwrap();
        }
    }
    let d = 64usize;
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut s = 0x9e37_79b9u32;
    let eh: Vec<f32> = (0..2 * d * d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 0.25
        })
        .collect();
    w.add_tensor(
        "blk.5.nextn.eh_proj.weight",
        &[2 * d as u64, d as u64],
        GgmlType::F32,
        f32s(eh),
    )
    .unwrap();
    for n in ["enorm", "hnorm"] {
        let v: Vec<f32> = (0..d).map(|i| 1.0 + 0.01 * i as f32).collect();
        w.add_tensor(
            format!("blk.5.nextn.{n}.weight"),
            &[d as u64],
            GgmlType::F32,
            f32s(v),
        )
        .unwrap();
    }
    w.to_bytes()
}

/// The MTP logits of the prompt: row `i` pairs token `i + 1` with the trunk's streams
/// after token `i`, run in calls of `piece` rows.
fn mtp_logits(m: &Cpu, g: &Golden, st: &mut MtpState<CpuBackend>, piece: usize) -> Vec<f32> {
    let mut cache = m.new_cache(4096).unwrap();
    let (mut out, mut hidden) = (Vec::new(), Vec::new());
    m.forward_with_hidden(&mut *cache, &g.prompt, Logits::Last, &mut out, &mut hidden)
        .unwrap();
    let nd = m.config().hc_mult * m.config().n_embd;
    let s = g.prompt.len();
    let mut all = Vec::new();
    let mut row = Vec::new();
    let mut i = 0;
    while i < s - 1 {
        let n = piece.min(s - 1 - i);
        m.mtp_forward(
            st,
            &g.prompt[i + 1..i + 1 + n],
            &hidden[i * nd..(i + n) * nd],
            &mut row,
        )
        .unwrap();
        all.extend_from_slice(&row);
        i += n;
    }
    all
}

#[test]
fn mtp_head_loads_runs_and_rewinds() {
    let m = with_mtp();
    let dir = dir("small_rates_f32");
    let g = golden(&dir);
    assert_eq!(m.config().n_layer(), 5);
    assert_eq!(m.mtp().map(|x| x.index), Some(5));
    // The trunk is untouched by the extra block.
    assert!(run_protocol(&m, &g) == run_protocol(&llamacpp_model(&dir), &g));
    let v = g.vocab;
    let mut st = m.new_mtp_state(4096).unwrap();
    let a = mtp_logits(&m, &g, &mut st, 1000);
    assert_eq!(a.len(), (g.prompt.len() - 1) * v);
    assert!(a.iter().all(|x| x.is_finite()));
    assert!(row_err(&a[..v], &a[v..2 * v]) > 1e-3, "rows must differ");
    // Deterministic, and the same in any split (per-token operations and a window).
    for piece in [1000, 37, 1] {
        let mut st2 = m.new_mtp_state(4096).unwrap();
        assert!(
            mtp_logits(&m, &g, &mut st2, piece) == a,
            "pieces of {piece}"
        );
    }
    // Rewind: back 10 positions, replay, same rows.
    let nd = m.config().hc_mult * m.config().n_embd;
    let mut cache = m.new_cache(4096).unwrap();
    let (mut out, mut hidden) = (Vec::new(), Vec::new());
    m.forward_with_hidden(&mut *cache, &g.prompt, Logits::Last, &mut out, &mut hidden)
        .unwrap();
    let s = g.prompt.len();
    st.truncate(s - 11).unwrap();
    m.mtp_forward(
        &mut st,
        &g.prompt[s - 10..],
        &hidden[(s - 11) * nd..(s - 1) * nd],
        &mut out,
    )
    .unwrap();
    assert!(out == a[(s - 11) * v..], "replay after rewind");
    // Bad input: hidden rows of the wrong size; a file without an MTP block.
    assert!(
        m.mtp_forward(&mut st, &[1], &hidden[..nd - 1], &mut out)
            .is_err()
    );
    let e = llamacpp_model(&dir)
        .new_mtp_state(16)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no MTP block"), "{e}");
    // llama.cpp's MTP-only files are refused, saying what to do instead.
    let f = Arc::new(GgufFile::from_bytes(with_mtp_bytes(false)).unwrap());
    let e = DeepSeek4::load(Arc::new(CpuBackend::new(1).unwrap()), &f, "x".into())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("MTP-only") && e.contains("--mtp"), "{e}");
}
