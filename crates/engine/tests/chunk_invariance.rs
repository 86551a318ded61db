//! On the CPU backend the logits of a position do not depend on how the prompt was
//! split into forward steps, nor on what the session held before: with the real models
//! (SmolLM2-135M Q4_1: plain quantized weights; Qwen2.5-Coder-0.5B Q4_K_M: Q4_K weights
//! that ggml repacks, Q5_0, Q6_K, Q8_0), every row of one 150-token step equals, bit for
//! bit, the same row computed in uneven chunks, token by token, and after a rewind.
//!
//! The models are located by `ds4_testkit` (a failure under CI when absent, a visible
//! skip elsewhere).

use ds4_engine::{LoadedModel, Session};

const MODELS: [&str; 2] = [
    "smollm2-135m-instruct-q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
];

fn prompt(lm: &LoadedModel) -> Vec<u32> {
    let text = "The lighthouse keeper climbed the stairs every evening, counting the steps \
                as his father had taught him: one hundred and twelve, never more and never \
                less. On the night of the storm he counted one hundred and thirteen, and he \
                stopped on the last step to listen to the sea, which had gone quiet. ";
    let mut t = lm.tokenize_rendered(&text.repeat(3));
    t.truncate(150);
    assert_eq!(t.len(), 150);
    t
}

/// The logits rows of `tokens` evaluated in steps of the given sizes (cycled).
fn rows_in_steps(lm: &LoadedModel, tokens: &[u32], steps: &[usize]) -> Vec<f32> {
    let mut s = Session::new(lm.model.clone(), 512).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    for &n in steps.iter().cycle() {
        if at == tokens.len() {
            break;
        }
        let end = (at + n).min(tokens.len());
        out.extend(s.forward_all(&tokens[at..end]).unwrap());
        at = end;
    }
    out
}

fn first_difference(a: &[f32], b: &[f32], n_vocab: usize) -> Option<(usize, f32, f32)> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| (i / n_vocab, a[i], b[i]))
}

#[test]
fn logits_do_not_depend_on_the_prompt_split() {
    for file in MODELS {
        let Some(path) = ds4_testkit::model(file) else {
            continue;
        };
        let lm = LoadedModel::open(&path).unwrap();
        let n_vocab = lm.model.info().n_vocab;
        let tokens = prompt(&lm);
        let whole = rows_in_steps(&lm, &tokens, &[tokens.len()]);
        for steps in [&[1][..], &[7, 1, 64, 3, 2], &[5], &[149, 1]] {
            let split = rows_in_steps(&lm, &tokens, steps);
            assert_eq!(
                first_difference(&whole, &split, n_vocab),
                None,
                "{file}: steps {steps:?} (row, one step, split)"
            );
        }
        // After a rewind the last token is evaluated alone: the same logits as in the
        // one-step prefill.
        let mut s = Session::new(lm.model.clone(), 512).unwrap();
        s.prefill(&tokens, &mut |_, _| {}).unwrap();
        s.decode(42).unwrap();
        s.rewind(tokens.len() - 1).unwrap();
        let again = s.decode(tokens[tokens.len() - 1]).unwrap().to_vec();
        let last = &whole[(tokens.len() - 1) * n_vocab..];
        assert_eq!(
            first_difference(last, &again, n_vocab),
            None,
            "{file}: the last row after a rewind"
        );
        eprintln!("{file}: 150 rows bit-identical in 5 splits and after a rewind");
    }
}
