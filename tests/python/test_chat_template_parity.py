"""The published chat templates of Qwen2.5, Qwen3, Llama 3.1, Llama 3.2 and Mistral v0.3, rendered
by the gateway's own path (ferry-render-chat: an OpenAI chat request body in, the prompt out) and by
transformers' apply_chat_template on Python's jinja2, over generated conversations: system or not,
tools or not, tool calls and their results, several turns, continue_final_message, the templates'
own kwargs (enable_thinking, date_string, tools_in_user_message). Every prompt must be
byte-identical; a conversation a template refuses (its raise_exception) must be refused by both,
with the template's message.

The messages transformers gets are those vLLM gives the template: content as a string, an
assistant's tool_calls with their arguments parsed from JSON, a tool result's tool_call_id. The
templates come from PyPI packages (scripts/fetch_reference_data.py, run by scripts/setup.sh)."""

import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("FERRY_BUILD_DIR", os.path.join(ROOT, "build"))
RENDER_CHAT = os.path.join(BUILD, "bin", "ferry-render-chat")
TEMPLATES = os.path.join(ROOT, ".venv", "share", "ferry-reference")
CONVERSATIONS = 200

FAMILIES = {
    "qwen2.5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-v0.3": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}

TEXTS = [
    "Hi", "What's the weather in Paris?", "  padded with spaces  ", "line one\nline two\n\n", "ünïcödé — 你好 🙂",
    "quotes \"double\" and 'single'", "{{ not a template }} {% neither %}", "<|im_end|> in the text", "tab\there",
    "", "1234567890", "a" * 300, "Sure.", "\n\nleading newlines", "trailing newlines\n\n", "<tool_response>x</tool_response>",
    "<think>\nreasoning here\n</think>\n\nThe answer is 4.", "back\\slash", "emoji 🚀🔥 and CJK 日本語",
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                      "unit": {"enum": ["c", "f"]}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Searches the wéb",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                                      "n": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "now", "description": "The time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def call_id(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


def arguments(rng, name):
    if name == "get_weather":
        args = {"city": rng.choice(["Paris", "Oslo", "São Paulo"])}
        if rng.random() < 0.5:
            args["unit"] = rng.choice(["c", "f"])
        return args
    if name == "search":
        return {"q": rng.choice(TEXTS[:8]), "n": rng.randint(1, 9)}
    return {}


def tool_turn(rng, family, tools):
    """An assistant turn of tool calls, then one result per call."""
    n = 1 if family.startswith("llama") and rng.random() < 0.9 else rng.randint(1, 3)
    calls = []
    for _ in range(n):
        name = rng.choice(tools)["function"]["name"]
        calls.append({"id": call_id(rng), "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments(rng, name), ensure_ascii=False)}})
    content = rng.choice([None, "", "Let me check."])
    turn = [{"role": "assistant", "content": content, "tool_calls": calls}]
    for c in calls:
        result = rng.choice(['{"temp": 18}', "sunny", "no results", "[1, 2, 3]"])
        turn.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return turn


def conversation(rng, family):
    tools = rng.sample(TOOLS, rng.randint(1, 3)) if rng.random() < 0.5 else None
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        last = t == turns - 1
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
        if rng.random() < 0.05:  # two user turns in a row: Mistral's template refuses them
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        if tools and rng.random() < 0.5:
            messages += tool_turn(rng, family, tools)
            if not last or rng.random() < 0.6:
                messages.append({"role": "assistant", "content": rng.choice(TEXTS)})
        elif not last or rng.random() < 0.5:
            messages.append({"role": "assistant", "content": rng.choice(TEXTS)})
    body = {"messages": messages}
    if tools:
        body["tools"] = tools
    final = messages[-1]
    if final["role"] == "assistant" and "tool_calls" not in final and final["content"].strip() and rng.random() < 0.4:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    elif rng.random() < 0.2:
        body["add_generation_prompt"] = False
    kwargs = {}
    if family == "qwen3" and rng.random() < 0.5:
        kwargs["enable_thinking"] = rng.random() < 0.5
    if family.startswith("llama") and rng.random() < 0.3:
        kwargs["date_string"] = "06 Dec 2026"
    if family.startswith("llama") and tools and rng.random() < 0.3:
        kwargs["tools_in_user_message"] = False
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


# transformers in a child process: importing it next to gRPC threads aborts pytest (see
# test_tokenizer_parity.py), and the reference should not share the test's interpreter state.
REFERENCE = r"""
import json, sys
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
cases = json.load(open(sys.argv[1]))
out = []
tokenizers = {}
for case in cases:
    key = json.dumps(case["special_tokens"], sort_keys=True)
    if key not in tokenizers:
        # Only the template and the special tokens matter to apply_chat_template(tokenize=False).
        word_level = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
        tokenizers[key] = PreTrainedTokenizerFast(tokenizer_object=word_level, **case["special_tokens"])
    tok = tokenizers[key]
    body = case["body"]
    messages = []
    for m in body["messages"]:  # what vLLM hands the template
        v = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            v["tool_calls"] = [{"id": c["id"], "type": c["type"],
                                "function": {"name": c["function"]["name"],
                                             "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        if m["role"] == "tool" and "tool_call_id" in m:
            v["tool_call_id"] = m["tool_call_id"]
        messages.append(v)
    cont = body.get("continue_final_message", False)
    try:
        text = tok.apply_chat_template(messages, tools=body.get("tools"), chat_template=case["template"],
                                       tokenize=False, add_generation_prompt=body.get("add_generation_prompt", not cont),
                                       continue_final_message=cont, **body.get("chat_template_kwargs", {}))
        out.append({"prompt": text})
    except Exception as e:
        out.append({"error": str(e), "raised": type(e).__name__ == "TemplateError"})
json.dump(out, open(sys.argv[2], "w"))
"""


def render_reference(cases):
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(src, "w") as f:
            json.dump(cases, f)
        subprocess.run([sys.executable, "-c", REFERENCE, src, dst], check=True, timeout=600)
        with open(dst) as f:
            return json.load(f)


def render_ferry(family, template, special_tokens, bodies, tmp_path):
    model = tmp_path / family
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, **special_tokens}))
    lines = "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bodies)
    out = subprocess.run([RENDER_CHAT, "--model", str(model)], input=lines, capture_output=True, text=True,
                         timeout=300, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_published_template_renders_as_transformers(family, tmp_path):
    pytest.importorskip("transformers")
    path = os.path.join(TEMPLATES, family + ".jinja")
    if not os.path.exists(path):
        pytest.skip(f"{path} missing: scripts/setup.sh fetches the published templates from PyPI")
    if not os.path.exists(RENDER_CHAT):
        pytest.skip(f"{RENDER_CHAT} not built (set FERRY_BUILD_DIR)")
    check_renders_as_transformers(family, open(path, encoding="utf-8").read(), FAMILIES[family], tmp_path)


# The templates ferry-make-model writes for its Llama- and Mistral-shaped models (Ferry's own, in
# their families' formats), held to the same rule; conversations shaped as for the family.
MAKE_MODEL_PRESETS = {"tiny-llama": "llama3.2", "tiny-mistral": "mistral-v0.3", "tiny-qwen3": "qwen2.5"}


@pytest.mark.parametrize("preset", list(MAKE_MODEL_PRESETS))
def test_make_model_template_renders_as_transformers(preset, tmp_path):
    pytest.importorskip("transformers")
    make_model = os.path.join(BUILD, "bin", "ferry-make-model")
    if not os.path.exists(RENDER_CHAT) or not os.path.exists(make_model):
        pytest.skip(f"{RENDER_CHAT} or {make_model} not built (set FERRY_BUILD_DIR)")
    out = tmp_path / "model"
    subprocess.run([make_model, "--preset", preset, "--out", str(out)], check=True, capture_output=True, timeout=120)
    config = json.loads((out / "tokenizer_config.json").read_text())
    special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if isinstance(config.get(k), str)}
    check_renders_as_transformers(MAKE_MODEL_PRESETS[preset], config["chat_template"], special, tmp_path)


def check_renders_as_transformers(family, template, special_tokens, tmp_path):
    """200 conversations shaped for `family`, rendered by transformers and by the gateway's path."""
    rng = random.Random(f"{family}-20261206")
    bodies = [conversation(rng, family) for _ in range(CONVERSATIONS)]
    want = render_reference([{"template": template, "body": b, "special_tokens": special_tokens} for b in bodies])
    got = render_ferry(family, template, special_tokens, bodies, tmp_path)
    assert len(got) == len(bodies)
    failures, rendered = [], 0
    for body, w, g in zip(bodies, want, got):
        if "prompt" in w:
            rendered += 1
            if g.get("prompt") != w["prompt"]:
                failures.append(f"{json.dumps(body, ensure_ascii=False)}\n  transformers: {w['prompt']!r}\n  ferry: {g}")
        elif "error" not in g:
            failures.append(f"{json.dumps(body, ensure_ascii=False)}\n  transformers raised {w['error']!r}\n  ferry: {g}")
        elif w["raised"] and w["error"] not in g["error"]:
            failures.append(f"{json.dumps(body, ensure_ascii=False)}\n  template raised {w['error']!r}\n  ferry: {g}")
    assert not failures, f"{len(failures)} of {len(bodies)} differ:\n" + "\n".join(failures[:10])
    # What the conversations covered, so that a generator change cannot quietly drop a kind.
    covered = {
        "system": sum(b["messages"][0]["role"] == "system" for b in bodies),
        "tools": sum("tools" in b for b in bodies),
        "tool calls": sum(any(m.get("tool_calls") for m in b["messages"]) for b in bodies),
        "multi-turn": sum(sum(m["role"] == "user" for m in b["messages"]) > 1 for b in bodies),
        "continue_final_message": sum(b.get("continue_final_message", False) for b in bodies),
    }
    assert all(n >= 20 for n in covered.values()), covered
    assert rendered >= CONVERSATIONS * 3 // 4, f"only {rendered} of {CONVERSATIONS} rendered (the rest refused)"
