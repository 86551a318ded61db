// Reference prompts from llama.cpp's own chat-template path (common_chat_templates_apply,
// use_jinja = true) for tests/data/chat_cases.json (see tests/data/README.md).
// usage: llamacpp_chat_oracle MODEL.gguf CASES.json   -> prints {case name: prompt}
#include "llama.h"
#include "chat.h"
#include <nlohmann/json.hpp>
#include <fstream>
#include <cstdio>
#include <iostream>
using json = nlohmann::ordered_json;
int main(int argc, char ** argv) {
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params(); mp.vocab_only = true;
    llama_model * m = llama_model_load_from_file(argv[1], mp);
    auto tmpls = common_chat_templates_init(m, "");
    std::ifstream f(argv[2]); json cases = json::parse(f);
    json out = json::object();
    for (auto & c : cases) {
        common_chat_templates_inputs in;
        in.use_jinja = true;
        in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
        for (auto & mj : c["messages"]) {
            common_chat_msg msg;
            msg.role = mj["role"];
            if (mj.contains("content") && !mj["content"].is_null()) msg.content = mj["content"];
            if (mj.contains("name")) msg.tool_name = mj["name"];
            if (mj.contains("tool_call_id")) msg.tool_call_id = mj["tool_call_id"];
            if (mj.contains("tool_calls")) for (auto & tc : mj["tool_calls"]) {
                common_chat_tool_call call; call.name = tc["name"]; call.arguments = tc["arguments"]; if (tc.contains("id")) call.id = tc["id"];
                msg.tool_calls.push_back(call);
            }
            in.messages.push_back(msg);
        }
        if (c.contains("tools") && c["tools"].is_array()) for (auto & t : c["tools"]) {
            common_chat_tool tool; tool.name = t["function"]["name"]; tool.description = t["function"].value("description", ""); tool.parameters = t["function"]["parameters"].dump();
            in.tools.push_back(tool);
        }
        try {
            auto params = common_chat_templates_apply(tmpls.get(), in);
            out[c["name"].get<std::string>()] = params.prompt;
        } catch (const std::exception & e) {
            out[c["name"].get<std::string>()] = std::string("ERROR: ") + e.what();
        }
    }
    std::cout << out.dump(1) << std::endl;
    return 0;
}
