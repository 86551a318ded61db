"""Drives a running ds4-server with the official OpenAI and Anthropic Python SDKs.

Usage: check_sdks.py --chat-url URL [--tools-url URL]

--chat-url: a server with a small chat model (SmolLM2-135M-Instruct): plain chat,
streaming, Responses (plain and streamed), legacy completions, models, Anthropic messages
(plain, streamed, count_tokens), and error mapping of both SDKs.
--tools-url: a server with a model whose template supports tools (Qwen2.5-Coder-0.5B):
a greedy tool-call round trip through both SDKs (call parsed, result sent back and
rendered, prefix reused), and streamed tool calls.

Prints one line per check; exits non-zero on the first failure.
"""

import argparse
import json
import sys

import anthropic
import openai

KEY = "unused"


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok   {name}")


def chat_checks(url):
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
    model = oa.models.list().data[0].id
    check("openai models.list", bool(model), model)

    r = oa.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}],
        max_tokens=24,
        seed=1,
    )
    text = r.choices[0].message.content
    check("openai chat text", isinstance(text, str) and len(text) > 0, repr(text))
    check("openai chat usage", r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage)
    check("openai chat cached_tokens reported", r.usage.prompt_tokens_details.cached_tokens is not None, r.usage)

    stream = oa.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=24,
        seed=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("openai chat stream text", len("".join(pieces)) > 0, pieces)
    check("openai chat stream finish", finish in ("stop", "length"), finish)
    check("openai chat stream usage", usage is not None and usage.completion_tokens > 0, usage)

    # The same seed twice gives the same text.
    a = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, seed=5)
    b = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, seed=5)
    check("openai seed reproducible", a.choices[0].message.content == b.choices[0].message.content)

    resp = oa.responses.create(model=model, input="Say hi.", instructions="Be brief.", max_output_tokens=24)
    check("openai responses output_text", len(resp.output_text) > 0, resp)
    check("openai responses usage", resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0, resp.usage)

    events = list(oa.responses.create(model=model, input="Say hi.", max_output_tokens=16, stream=True))
    kinds = [e.type for e in events]
    check("openai responses stream order", kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check("openai responses stream text", deltas == events[-1].response.output_text, (deltas, events[-1].response.output_text))

    comp = oa.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    check("openai completions", isinstance(comp.choices[0].text, str) and comp.usage.completion_tokens > 0, comp)

    # An agent's own model name is accepted and answered under the served id.
    other = oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    check("openai other model name -> served id", other.model == model, other.model)
    try:
        oa.chat.completions.create(model=model, messages=[])
        check("openai empty messages -> BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("openai empty messages -> BadRequestError", "messages" in str(e), str(e))

    an = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    msg = an.messages.create(
        model=model,
        max_tokens=24,
        system="You are brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    check("anthropic message text", msg.content[-1].type == "text" and len(msg.content[-1].text) > 0, msg)
    check("anthropic stop_reason", msg.stop_reason in ("end_turn", "max_tokens"), msg.stop_reason)
    check("anthropic usage", msg.usage.output_tokens > 0 and msg.usage.cache_read_input_tokens is not None, msg.usage)

    with an.messages.stream(model=model, max_tokens=24, messages=[{"role": "user", "content": "Count to three."}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic stream text", len(streamed) > 0 and final.content[-1].text == streamed, (streamed, final))

    # A repeated prompt is read from the cache.
    again = an.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "Count to three."}])
    check("anthropic cache_read_input_tokens", again.usage.cache_read_input_tokens > 0, again.usage)

    n = an.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hello there"}])
    check("anthropic count_tokens", n.input_tokens > 3, n)

    other = an.messages.create(model="claude-agent-model", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    check("anthropic other model name -> served id", other.model == model, other.model)
    try:
        an.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "x"}], extra_body={"temperature": 1.5})
        check("anthropic temperature 1.5 -> BadRequestError", False, "no error")
    except anthropic.BadRequestError as e:
        check("anthropic temperature 1.5 -> BadRequestError", "temperature" in str(e), str(e))


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
# Anthropic's SDK no longer has sampling parameters; the server still reads them.
GREEDY = {"temperature": 0}


def tool_checks(url):
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
    model = oa.models.list().data[0].id
    messages = [{"role": "user", "content": QUESTION}]
    r = oa.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0, max_tokens=128)
    choice = r.choices[0]
    calls = choice.message.tool_calls or []
    check("openai tool call parsed", len(calls) == 1 and calls[0].function.name == "get_weather", choice)
    args = json.loads(calls[0].function.arguments)
    check("openai tool call arguments", "paris" in json.dumps(args).lower(), args)
    check("openai finish_reason tool_calls", choice.finish_reason == "tool_calls", choice.finish_reason)

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 18 degrees Celsius."})
    r2 = oa.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0, max_tokens=64)
    # What the model does with the result is up to the model (greedy Qwen2.5-Coder-0.5B
    # calls the tool again); the server must render the result, reuse the prefix and
    # return a well-formed answer with any call parsed.
    c2 = r2.choices[0]
    print(f"     the model answered the tool result with: content={c2.message.content!r}, {len(c2.message.tool_calls or [])} tool call(s)")
    check("openai tool result accepted", c2.finish_reason in ("stop", "tool_calls", "length"), c2)
    check("openai no unparsed call in content", '"name": "get_weather"' not in (c2.message.content or ""), c2)
    check("openai tool result in the prompt", r2.usage.prompt_tokens > r.usage.prompt_tokens + r.usage.completion_tokens + 5, (r.usage, r2.usage))
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check("openai round trip reuses the prefix", cached >= r.usage.prompt_tokens, (cached, r.usage.prompt_tokens))

    stream = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER], temperature=0, max_tokens=128, stream=True)
    name, arg_text, n_arg_chunks = None, "", 0
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    name = tc.function.name
                if tc.function and tc.function.arguments:
                    arg_text += tc.function.arguments
                    n_arg_chunks += 1
    check("openai streamed tool call", name == "get_weather" and json.loads(arg_text) == args, (name, arg_text))
    check("openai streamed argument deltas", n_arg_chunks > 1, n_arg_chunks)

    an = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"], "input_schema": WEATHER["function"]["parameters"]}
    msgs = [{"role": "user", "content": QUESTION}]
    m = an.messages.create(model=model, max_tokens=128, extra_body=GREEDY, tools=[tool], messages=msgs)
    uses = [b for b in m.content if b.type == "tool_use"]
    check("anthropic tool_use", m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", m)
    check("anthropic tool_use input", "paris" in json.dumps(uses[0].input).lower(), uses[0].input)
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 18 degrees Celsius."}]})
    m2 = an.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=[tool], messages=msgs)
    print(f"     the model answered the tool result with: {[b.type for b in m2.content]}")
    check("anthropic tool result accepted", m2.stop_reason in ("end_turn", "tool_use", "max_tokens"), m2)
    check("anthropic no unparsed call in text", all('"name": "get_weather"' not in getattr(b, "text", "") for b in m2.content), m2)
    check("anthropic round trip reuses the prefix", m2.usage.cache_read_input_tokens >= m.usage.input_tokens + m.usage.cache_read_input_tokens, (m.usage, m2.usage))

    with an.messages.stream(model=model, max_tokens=128, extra_body=GREEDY, tools=[tool], messages=[{"role": "user", "content": QUESTION}]) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    check("anthropic streamed tool_use", len(uses) == 1 and "paris" in json.dumps(uses[0].input).lower(), final)

    agent_loop_checks(oa, an, model, tool)


def agent_loop_checks(oa, an, model, tool):
    """What coding agents send: malformed calls in the history, one call at a time,
    constraints the server does not implement, an assistant prefill."""
    broken = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "error: the arguments are not JSON"},
    ]
    r = oa.chat.completions.create(model=model, messages=broken, tools=[WEATHER], temperature=0, max_tokens=8)
    check("openai history with malformed call arguments", r.choices[0].finish_reason is not None, r)
    m = an.messages.create(model=model, max_tokens=8, extra_body=GREEDY, tools=[tool], messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "error", "is_error": True}]},
    ])
    check("anthropic history with an errored call", m.stop_reason is not None, m)

    two = [{"role": "user", "content": "Get the weather in Paris and in London."}]
    r = oa.chat.completions.create(model=model, messages=two, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=120)
    calls = r.choices[0].message.tool_calls or []
    check("openai parallel_tool_calls=False gives one call", len(calls) == 1 and r.choices[0].finish_reason == "tool_calls", r)

    r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=5)
    check("openai cut tool call -> length", r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls and (r.choices[0].message.content or "").startswith("<tool_call>"), r)

    try:
        oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], response_format={"type": "json_object"}, max_tokens=4)
        check("openai response_format json_object -> 400", False, "no error")
    except openai.BadRequestError as e:
        check("openai response_format json_object -> 400", e.body.get("param") == "response_format", e.body)

    m = an.messages.create(model=model, max_tokens=12, extra_body=GREEDY, messages=[
        {"role": "user", "content": "Count from 1 to 10, separated by commas."},
        {"role": "assistant", "content": "1, 2, 3,"},
    ])
    text = m.content[0].text if m.content else ""
    check("anthropic assistant prefill is continued", not text.lstrip().startswith("1,") and len(text) > 0, m)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chat-url")
    p.add_argument("--tools-url")
    a = p.parse_args()
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}")
    if a.chat_url:
        chat_checks(a.chat_url)
    if a.tools_url:
        tool_checks(a.tools_url)
    print("all SDK checks passed")


if __name__ == "__main__":
    main()
