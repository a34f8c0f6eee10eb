"""The quickstart (scripts/quickstart.sh, FERRY_MODEL=...) serving a Llama-shaped and a Mistral-shaped
model, each with its family's published chat template (--chat-template; scripts/setup.sh fetches
them) and with the template ferry-make-model writes beside its own family's tokenizer (no flag),
called with the official openai client: a chat, streamed and not; a tool call under tool_choice
"auto" in the family's own format (Llama 3's JSON, Mistral's [TOOL_CALLS]), parsed streamed and
not; and the call and its result sent back, rendered as transformers renders the template.

The tiny random models never write a call of their own accord, so a guided_regex makes them write
one in the family's format, which the parser the template implies must turn into tool_calls."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import binary, run_transformers, streamed_tool_calls

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / ".venv" / "share" / "ferry-reference"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
FAMILIES = {
    # preset: (published template, what the model writes for a call under "auto", parser)
    "tiny-llama": ("llama3.1", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3_json"),
    "tiny-mistral": ("mistral-v0.3", 'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
                     "mistral"),
}


@pytest.fixture(scope="module", params=[(preset, source) for source in ("published", "own") for preset in FAMILIES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def quickstart(request, tmp_path_factory):
    preset, source = request.param
    work = tmp_path_factory.mktemp(preset)
    model = work / "model"
    subprocess.run([str(binary("ferry-make-model")), "--preset", preset, "--seed", "3", "--out", str(model)],
                   check=True, capture_output=True)
    flags = []
    if source == "published":
        path = TEMPLATES / (FAMILIES[preset][0] + ".jinja")
        if not path.exists():
            pytest.skip(f"{path} missing: scripts/setup.sh fetches the published templates from PyPI")
        flags, template = ["--chat-template", str(path)], path.read_text()
    else:
        template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    ready = work / "stack.json"
    env = dict(os.environ, FERRY_MODEL=str(model), FERRY_PORT="0", FERRY_HTTP_PORT="0", FERRY_METRICS_PORT="0")
    log = open(work / "quickstart.log", "wb")
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "quickstart.sh"), *flags,
                             "--served-model-name", "m", "--run-dir", str(work / "run"), "--ready-file", str(ready)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300  # setup.sh checks and builds first (a no-op when built)
    while not ready.exists():
        assert proc.poll() is None, (work / "quickstart.log").read_text()[-3000:]
        assert time.time() < deadline, (work / "quickstart.log").read_text()[-3000:]
        time.sleep(0.1)
    ports = json.loads(ready.read_text())
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['gateway']['http_port']}/v1", api_key="unused",
                           max_retries=0)
    yield preset, model, template, client, work
    proc.send_signal(2)  # Ctrl-C, as a quickstart user stops it
    assert proc.wait(timeout=60) == 0, (work / "quickstart.log").read_text()[-3000:]
    log.close()
    assert f"tool calls parsed as {FAMILIES[preset][2]}" in (work / "quickstart.log").read_text()


def test_chat_streamed_and_not(quickstart):
    _, _, _, client, _ = quickstart
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].message.content, "greedy: the stream says what the whole answer says"


def test_tool_call_in_the_familys_format(quickstart):
    preset, model, template, client, _ = quickstart
    forced = FAMILIES[preset][1]
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=96,
                  extra_body={"guided_regex": re.escape(forced)})
    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content == ("Checking. " if preset == "tiny-mistral" else None)
    if preset == "tiny-mistral":
        assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id), "Mistral's template takes 9-character ids only"
    content, calls, finish = streamed_tool_calls(client.chat.completions.create(stream=True, **kwargs))
    assert finish == "tool_calls" and calls == [["get_weather", call.function.arguments]]
    assert content == (choice.message.content or "")

    # The call and its result go back; the prompt is the template's, as transformers renders it.
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": choice.message.content,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "18C"},
               {"role": "assistant", "content": "It is 18C."},  # Mistral's template wants turns to alternate
               {"role": "user", "content": "And tomorrow?"}]
    again = client.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice="none", max_tokens=1)
    script = ("import json, sys; from transformers import AutoTokenizer; "
              "tok = AutoTokenizer.from_pretrained(sys.argv[1]); m, tools, tpl = json.load(sys.stdin); "
              "m = [dict(x, content=x['content'] or '', tool_calls=[dict(c, function=dict(c['function'], "
              "arguments=json.loads(c['function']['arguments']))) for c in x['tool_calls']]) "
              "if x.get('tool_calls') else x for x in m]; "
              "print(json.dumps(len(tok.apply_chat_template(m, tools=tools, chat_template=tpl, tokenize=True, "
              "add_generation_prompt=True))))")
    assert again.usage.prompt_tokens == run_transformers(script, model, [history, TOOLS, template])
