//! The prompts llama.cpp rendered and tokenized for two real models
//! (`fixtures/llamacpp/*.json`): chat-template rendering, prompt token ids
//! (`add_special = false, parse_special = true`), special ids, the EOG set, and the
//! detokenized generations. Needs the model files and fixtures: a failure under CI when absent, a
//! visible skip elsewhere.

use ds4_gguf::GgufFile;
use ds4_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, StreamDecoder, Tokenizer};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(key: &str, uses_tools: bool) {
    let Some(json) = ds4_testkit::fixture(&format!("llamacpp/{key}.json")) else {
        return;
    };
    let Some(path) = ds4_testkit::model(&format!("{key}.gguf")) else {
        return;
    };
    let fixture: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let model = &fixture["model"];
    let file = GgufFile::open(&path).unwrap();
    let started = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let load = started.elapsed();
    let template = ChatTemplate::from_gguf(&file)
        .unwrap()
        .expect("chat template");

    assert_eq!(tok.n_vocab() as u64, model["n_vocab"].as_u64().unwrap());
    assert_eq!(tok.bos().map(u64::from), model["bos_id"].as_u64());
    assert_eq!(tok.eos().map(u64::from), model["eos_id"].as_u64());
    assert_eq!(tok.eot().map(u64::from), model["eot_id"].as_u64());
    assert_eq!(tok.add_bos(), model["add_bos_token"].as_bool().unwrap());
    let eog: Vec<u32> = tok.eog_ids().iter().copied().collect();
    assert_eq!(eog, ids(&model["eog_token_ids"]), "{key}: EOG set");
    assert_eq!(
        template.uses_tools(),
        uses_tools,
        "{key}: template reads `tools`"
    );

    let cases = fixture["cases"].as_array().unwrap();
    let mut encode_time = std::time::Duration::ZERO;
    let mut n_tokens = 0;
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let rendered = case["rendered_prompt"].as_str().unwrap();
        if case["chat_template_applied"].as_bool().unwrap() {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["chat_messages"].clone()).unwrap();
            let opts = RenderOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                ..RenderOptions::default()
            };
            assert_eq!(
                template.render(&messages, &opts).unwrap(),
                rendered,
                "{id}: rendering"
            );
        } else {
            assert_eq!(rendered, case["raw_prompt"].as_str().unwrap());
        }
        let want = ids(&case["prompt_token_ids"]);
        let started = std::time::Instant::now();
        let got = tok.encode(rendered, false, true);
        encode_time += started.elapsed();
        n_tokens += got.len();
        assert_eq!(got, want, "{id}: prompt tokens");
        // Neither vocabulary adds BOS/EOS, so add_special changes nothing.
        assert_eq!(tok.encode(rendered, true, true), want, "{id}: add_special");

        let generated = ids(&case["generated_token_ids"]);
        let stopped = case["stop_reason"] == "eog";
        assert_eq!(
            stopped,
            generated.last().is_some_and(|&t| tok.is_eog(t)),
            "{id}"
        );
        let body = if stopped {
            &generated[..generated.len() - 1]
        } else {
            &generated[..]
        };
        let text = case["generated_text"].as_str().unwrap();
        assert_eq!(tok.decode(body, false), text, "{id}: generated_text");
        assert_eq!(
            tok.decode(&generated, true),
            case["generated_text_with_special"].as_str().unwrap(),
            "{id}: generated_text_with_special"
        );
        let mut stream = StreamDecoder::new();
        let mut streamed: String = body
            .iter()
            .map(|&t| stream.push(&tok.piece(t, false)))
            .collect();
        streamed += &stream.flush();
        assert_eq!(streamed, text, "{id}: streamed text");
    }
    println!(
        "{key}: {} cases match; load {:.1} ms; encode {n_tokens} prompt tokens in {:.2} ms",
        cases.len(),
        load.as_secs_f64() * 1e3,
        encode_time.as_secs_f64() * 1e3
    );
}

#[test]
fn smollm2_prompts_match_llama_cpp() {
    check_model("smollm2-135m-instruct-q4_1", false);
}

#[test]
fn qwen25_prompts_match_llama_cpp() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m", true);
}
