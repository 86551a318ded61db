//! Chat-template rendering with tools, tool calls, tool results and null content
//! (`tests/data/chat_cases.json`, expected prompts from llama.cpp, see its README): the two
//! real models' templates (a failure under CI when the models are absent, a visible skip
//! elsewhere) and the Qwen2
//! template of the `ggml-vocab-qwen2.gguf` fixture.

use ds4_gguf::GgufFile;
use ds4_tokenizer::{ChatMessage, ChatTemplate, RenderOptions};
use serde_json::Value;

fn check(key: &str, path: Option<std::path::PathBuf>, object_arguments: bool) {
    let Some(path) = path else {
        return;
    };
    let data: Value = serde_json::from_str(include_str!("data/chat_cases.json")).unwrap();
    let template = ChatTemplate::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(template.object_arguments(), object_arguments, "{key}");
    for case in data["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case["tools"].as_array().cloned(),
            ..RenderOptions::default()
        };
        let got = template.render(&messages, &opts).unwrap();
        assert_eq!(
            got,
            case["expected"][key].as_str().unwrap(),
            "{key}: {name}"
        );
    }
}

#[test]
fn smollm2_chat_template() {
    let key = "smollm2-135m-instruct-q4_1";
    check(key, ds4_testkit::model(&format!("{key}.gguf")), false);
}

#[test]
fn qwen25_chat_template_with_tools() {
    let key = "qwen2.5-coder-0.5b-instruct-q4_k_m";
    check(key, ds4_testkit::model(&format!("{key}.gguf")), true);
}

#[test]
fn qwen2_fixture_chat_template() {
    let path = ds4_testkit::fixture("tokenizer/ggml-vocab-qwen2.gguf");
    check("ggml-vocab-qwen2", path, false);
}

#[test]
fn bos_is_stripped_when_the_tokenizer_adds_it() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    let plain = t.render(&msgs, &RenderOptions::default()).unwrap();
    assert_eq!(plain, "<s>hi</s>");
    let opts = RenderOptions {
        strip_bos: true,
        strip_eos: true,
        ..RenderOptions::default()
    };
    assert_eq!(t.render(&msgs, &opts).unwrap(), "hi");
    assert!(!t.uses_tools());
}
