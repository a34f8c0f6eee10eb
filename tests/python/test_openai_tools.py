"""Tools (function calling) on /v1/chat/completions, called with the official openai client.

The prompt with tools, tool calls and tool results is the one transformers' apply_chat_template
renders with Qwen2.5's template. The tiny random model never writes a call of its own accord, so
the tests make it: a named tool choice generates the arguments under the function's schema,
"required" an array of calls under the tools' schemas, and under tool_choice "auto" a guided_regex
forces a Hermes-format text that the parser must turn into calls, streamed or not.
"""
import json
import re

import pytest

from conftest import Stack, post_json as post, serve, run_transformers, streamed_tool_calls

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")

VERDICT = {"type": "object", "additionalProperties": False, "required": ["verdict", "confidence"],
           "properties": {"verdict": {"enum": ["yes", "no", "unsure"]}, "confidence": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "judge", "description": "Give a verdict", "parameters": VERDICT}},
    {"type": "function", "function": {"name": "get_time"}},
]
# Under tool_choice "auto": text, then two calls in the Hermes format Qwen2.5 is trained on.
FORCED = ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


@pytest.fixture(scope="module")
def tools_stack(tiny_model, tmp_path_factory):
    yield from serve(Stack(tiny_model, tmp_path_factory.mktemp("tools-stack"), ["--http-port", "0",
                                                                                   "--served-model-name", "m"]))


@pytest.fixture(scope="module")
def client(tools_stack):
    return openai.OpenAI(base_url=tools_stack.http + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def close_brace(tiny_model):
    return tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json")).token_to_id("}")


def test_prompts_with_tools_match_transformers(tools_stack, tiny_model):
    pytest.importorskip("jinja2")
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris, and the time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5]}}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C, caf\u00e9 weather"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "assistant", "content": "Sunny, noon."},
        {"role": "user", "content": "Thanks"},
    ]
    cases = [(MESSAGES, TOOLS) for MESSAGES in ([{"role": "user", "content": "Hi"}], history)]
    cases.append((history, None))  # calls and results in the history without tools
    script = ("import json, sys; from transformers import AutoTokenizer; "
              "tok = AutoTokenizer.from_pretrained(sys.argv[1]); "
              "print(json.dumps([tok.apply_chat_template(m, tools=t, tokenize=True, add_generation_prompt=True) "
              "for m, t in json.load(sys.stdin)]))")
    expected = run_transformers(script, tiny_model, cases)
    for (messages, tools), ids in zip(cases, expected):
        # OpenAI's form: arguments as a JSON string, which Ferry parses as vLLM does.
        sent = [dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                                    for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in messages]
        body = {"model": "m", "messages": sent}
        if tools:
            body["tools"] = tools
        status, r = post(tools_stack, "/tokenize", body)
        assert status == 200, r
        assert r["tokens"] == ids, (messages, tools)
        status, r = post(tools_stack, "/v1/chat/completions", dict(body, max_tokens=1, tool_choice="none"))
        assert status == 200 and r["usage"]["prompt_tokens"] == len(ids), r


def check_verdict(arguments):
    value = json.loads(arguments)
    assert list(value) == ["verdict", "confidence"], arguments  # the schema's order
    assert value["verdict"] in ("yes", "no", "unsure") and isinstance(value["confidence"], int), arguments


def test_a_named_tool_choice_generates_arguments_under_its_schema(client, close_brace):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Is it raining?"}], tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": "judge"}}, max_tokens=200,
                  temperature=0, logit_bias={str(close_brace): 100})
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None, r
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "judge" and call.id.startswith("chatcmpl-tool-")
    check_verdict(call.function.arguments)
    # Streamed: the name and id once, then the arguments in pieces that join to the same text.
    arguments, names, ids, finish = "", [], set(), None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        for c in delta.tool_calls or []:
            assert c.index == 0
            arguments += c.function.arguments or ""
            names += [c.function.name] if c.function.name else []
            ids |= {c.id} if c.id else set()
        assert not delta.content
        finish = chunk.choices[0].finish_reason or finish
    assert arguments == call.function.arguments and names == ["judge"] and len(ids) == 1 and finish == "stop"


def test_required_tool_choice_gives_calls_under_their_tools_schemas(client, close_brace):
    pick = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"], "additionalProperties": False}}}
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Judge, or pick a unit"}], tools=[TOOLS[1], pick],
                  tool_choice="required", parallel_tool_calls=False, max_tokens=300, temperature=0,
                  logit_bias={str(close_brace): 100})
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", r
    (call,) = choice.message.tool_calls
    if call.function.name == "judge":
        check_verdict(call.function.arguments)
    else:
        assert call.function.name == "pick" and json.loads(call.function.arguments)["unit"] in ("c", "f"), call
    streamed, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices[0].delta.tool_calls or []:
            streamed[c.index] = (c.function.name, c.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert streamed == {0: (call.function.name, call.function.arguments)} and finish == "tool_calls"


def test_auto_tool_calls_are_parsed_from_the_text(client):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris, and the time?"}], tools=TOOLS,
                  max_tokens=256, extra_body={"guided_regex": re.escape(FORCED)})
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure.\n", r
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert choice.message.tool_calls[0].function.arguments == '{"city": "Paris"}'  # json.dumps' spacing, as vLLM
    content, calls, finish = streamed_tool_calls(client.chat.completions.create(stream=True, **kwargs))
    assert content == "Sure.\n" and finish == "tool_calls"
    assert calls == [[c.function.name, c.function.arguments] for c in choice.message.tool_calls]
    # n = 2: each choice parsed on its own, streamed ones too.
    two = client.chat.completions.create(n=2, **kwargs)
    assert [[c.function.name for c in ch.message.tool_calls] for ch in two.choices] == [["get_weather", "get_time"]] * 2
    names = {0: [], 1: []}
    for chunk in client.chat.completions.create(n=2, stream=True, **kwargs):
        for ch in chunk.choices:
            names[ch.index] += [c.function.name for c in ch.delta.tool_calls or [] if c.function.name]
    assert names == {0: ["get_weather", "get_time"], 1: ["get_weather", "get_time"]}
    one = client.chat.completions.create(parallel_tool_calls=False, **kwargs)
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
    plain = client.chat.completions.create(tool_choice="none", **kwargs)
    assert plain.choices[0].message.content == FORCED and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "stop"


def test_tool_requests_ferry_cannot_serve_are_named(tools_stack, client):
    base = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, "max_tokens": 2}
    for extra, param, says in (
            ({"tool_choice": "required", "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "format": "ipv6"}}}}}]},
             "tools", '"format" "ipv6" is not supported'),
            ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", '"nope"'),
            ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "tools[0].function.name"),
            ({"tool_choice": {"type": "function", "function": {"name": "judge"}},
              "response_format": {"type": "json_object"}}, "tool_choice", "conflicts"),
            ({"functions": [{"name": "f"}]}, "functions", "use tools")):
        status, body = post(tools_stack, "/v1/chat/completions", dict(base, **extra))
        assert status == 400 and body["error"]["param"] == param and says in body["error"]["message"], body
    status, body = post(tools_stack, "/v1/completions", {"prompt": "x", "tools": TOOLS})
    assert status == 400 and body["error"]["param"] == "tools", body
    r = client.chat.completions.create(model="m", messages=base["messages"], max_tokens=2)
    assert r.choices[0].message.tool_calls is None, "the next request is served, without tools"
