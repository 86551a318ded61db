//! Real models against llama.cpp's recorded outputs (`../shared/fixtures/llamacpp`):
//! rendered prompts and prompt tokens exactly; greedy continuations token for token up
//! to the first near-tie (recorded top-1/top-2 gap < [`NEAR_TIE`]); teacher-forced on
//! llama.cpp's own tokens, our top-1 equals theirs wherever the recorded gap is at
//! least [`NEAR_TIE`] and our log-probabilities of their recorded top-10 are within
//! [`LOGPROB_TOL`] (first 8 steps).
//!
//! The bounds are those of our chunk-invariant CPU arithmetic (every row computed as
//! ggml computes a one-token step), not of llama.cpp's batched prefill, which rounds
//! differently from its own decode: measured worst top-10 distance 0.535 (SmolLM2) and
//! 0.302 (Qwen), top-1 changes at recorded gaps up to 0.157 (docs/parity.md, "Chunk
//! invariance"). With llama.cpp's batch-size-dependent kernels the same checks held at
//! 0.0002 / 0.0007 with a near-tie of 0.05.

mod common;

use ds4_engine::generate::{GenerateParams, generate};
use ds4_engine::logprobs::{logprob, top_logprobs};
use ds4_engine::sampler::SamplerParams;
use ds4_engine::{LoadedModel, Session};
use ds4_tokenizer::{ChatMessage, RenderOptions};
use serde_json::Value;

/// Recorded top-1/top-2 gaps below this are near-ties: our chunk-invariant arithmetic
/// (one-token rounding for prompt rows, where llama.cpp's prefill used its batched
/// kernels) may choose the other token there (measured up to 0.157).
const NEAR_TIE: f64 = 0.2;
/// Largest allowed difference of a log-probability from llama.cpp's (measured 0.535).
const LOGPROB_TOL: f64 = 0.6;

struct Case {
    id: String,
    chat: bool,
    raw_prompt: String,
    messages: Vec<ChatMessage>,
    rendered: String,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    gaps: Vec<f64>,
    top10: Vec<Vec<(u32, f64)>>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load_cases(json: &str) -> Option<(String, Vec<Case>)> {
    let path = common::fixture(&format!("llamacpp/{json}"))?;
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let key = doc["model"]["key"].as_str().unwrap().to_string();
    let cases = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            id: c["id"].as_str().unwrap().to_string(),
            chat: c["chat_template_applied"].as_bool().unwrap(),
            raw_prompt: c["raw_prompt"].as_str().unwrap().to_string(),
            messages: c["chat_messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| {
                            ChatMessage::new(
                                m["role"].as_str().unwrap(),
                                m["content"].as_str().unwrap(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            rendered: c["rendered_prompt"].as_str().unwrap().to_string(),
            prompt: ids(&c["prompt_token_ids"]),
            generated: ids(&c["generated_token_ids"]),
            gaps: c["top1_minus_top2_logprob_per_step"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_f64().unwrap())
                .collect(),
            top10: c["top10_first8_steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["top10"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| {
                            (
                                t["id"].as_u64().unwrap() as u32,
                                t["logprob"].as_f64().unwrap(),
                            )
                        })
                        .collect()
                })
                .collect(),
        })
        .collect();
    Some((key, cases))
}

fn open(json: &str) -> Option<(LoadedModel, Vec<Case>)> {
    let (key, cases) = load_cases(json)?;
    let model = common::model(&format!("{key}.gguf"))?;
    Some((LoadedModel::open(&model).unwrap(), cases))
}

fn check_prompts(json: &str) {
    let Some((lm, cases)) = open(json) else {
        return;
    };
    for c in &cases {
        let tokens = if c.chat {
            let (text, tokens) = lm
                .chat_prompt(&c.messages, &RenderOptions::default())
                .unwrap();
            assert_eq!(text, c.rendered, "{}: rendered prompt", c.id);
            tokens
        } else {
            assert_eq!(c.raw_prompt, c.rendered);
            lm.tokenize_rendered(&c.raw_prompt)
        };
        assert_eq!(tokens, c.prompt, "{}: prompt tokens", c.id);
    }
}

fn check_greedy(json: &str) {
    let Some((lm, cases)) = open(json) else {
        return;
    };
    let greedy = GenerateParams {
        max_tokens: 48,
        sampler: SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        },
        seed: 42,
    };
    for c in &cases {
        // Tokens are compared before the first step whose recorded gap is a near-tie.
        let exact = c
            .gaps
            .iter()
            .position(|&g| g < NEAR_TIE)
            .unwrap_or(c.generated.len());
        let mut session = Session::new(lm.model.clone(), 2048).unwrap();
        let mut ours = Vec::new();
        let params = GenerateParams {
            max_tokens: exact,
            ..greedy
        };
        generate(
            &mut session,
            &c.prompt,
            &params,
            &|t| lm.tokenizer.is_eog(t),
            &mut |_, _| {},
            &mut |t, _| {
                ours.push(t);
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
        assert_eq!(
            ours,
            c.generated[..exact],
            "{}: greedy tokens before the first near-tie",
            c.id
        );
        eprintln!(
            "{}: {} greedy tokens equal llama.cpp's (of {})",
            c.id,
            exact,
            c.generated.len()
        );
    }
}

fn check_teacher_forced(json: &str) {
    let Some((lm, cases)) = open(json) else {
        return;
    };
    for c in &cases {
        let mut session = Session::new(lm.model.clone(), 2048).unwrap();
        let mut rows = vec![session.prefill(&c.prompt, &mut |_, _| {}).unwrap().to_vec()];
        for &t in &c.generated[..c.generated.len() - 1] {
            rows.push(session.decode(t).unwrap().to_vec());
        }
        let mut worst = 0f64;
        for (step, row) in rows.iter().enumerate() {
            let top1 = top_logprobs(row, 1)[0].0;
            if c.gaps[step] >= NEAR_TIE {
                assert_eq!(
                    top1, c.generated[step],
                    "{}: top-1 at step {step} (gap {:.3})",
                    c.id, c.gaps[step]
                );
            }
            if let Some(reference) = c.top10.get(step) {
                for &(id, lp) in reference {
                    let d = (logprob(row, id) - lp).abs();
                    worst = worst.max(d);
                    assert!(
                        d <= LOGPROB_TOL,
                        "{}: step {step} token {id}: logprob {} vs {lp}",
                        c.id,
                        logprob(row, id)
                    );
                }
            }
        }
        eprintln!(
            "{}: teacher-forced top-1 equal; worst top-10 logprob difference {worst:.4}",
            c.id
        );
    }
}

#[test]
fn smollm2_prompts_match_llamacpp() {
    check_prompts("smollm2-135m-instruct-q4_1.json");
}

#[test]
fn qwen25_prompts_match_llamacpp() {
    check_prompts("qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}

#[test]
fn smollm2_greedy_matches_llamacpp() {
    check_greedy("smollm2-135m-instruct-q4_1.json");
}

#[test]
fn qwen25_greedy_matches_llamacpp() {
    check_greedy("qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}

#[test]
fn smollm2_teacher_forced_matches_llamacpp() {
    check_teacher_forced("smollm2-135m-instruct-q4_1.json");
}

#[test]
fn qwen25_teacher_forced_matches_llamacpp() {
    check_teacher_forced("qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}
