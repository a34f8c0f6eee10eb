"""The gateway's OpenAI-compatible HTTP front, called with the official openai client.

Texts must equal what the gRPC API gives for the same prompt and seed.
"""
import http.client
import json
import subprocess
import time
import urllib.request

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, Stack, serve, run_transformers

openai = pytest.importorskip("openai")

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
MAX_BODY_BYTES = 1 << 20  # http_stack's --http-max-body-bytes


@pytest.fixture(scope="module")
def http_stack(tiny_model, tmp_path_factory):
    yield from serve(Stack(tiny_model, tmp_path_factory.mktemp("http-stack"),
              extra_args=["--http-port", "0", f"--gateway-arg=--http-max-body-bytes={MAX_BODY_BYTES}",
                         "--served-model-name", "m"]))


@pytest.fixture(scope="module")
def slow_http_stack(tiny_model, tmp_path_factory):
    """The HTTP front over the sim worker at 10 ms a step: a 1,800-token stream runs for 18 s, so the
    tests that end one mid-way never race the tiny CPU model, which finishes it in about a second."""
    run_dir = tmp_path_factory.mktemp("slow-http-stack")
    cost = json.loads((REPO / "scheduler" / "sim" / "presets" / "h200.json").read_text())
    cost["fixed_s"] = 0.01
    (run_dir / "cost.json").write_text(json.dumps(cost))
    yield from serve(Stack(tiny_model, run_dir, ["--http-port", "0", "--served-model-name", "m", "--worker-arg=--backend=sim",
                                    f"--worker-arg=--cost-model={run_dir / 'cost.json'}",
                                    "--worker-arg=--sim-live-tokens=1000",
                                    # The tests count seats: a fixed cap of 256, not an adapting one.
                                    "--scheduler-arg=--controller-mode=static"]))


@pytest.fixture(scope="module")
def client(http_stack):
    return openai.OpenAI(base_url=http_stack.http + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def grpc_gen(http_stack, ferry_pb):
    channel = grpc.insecure_channel(http_stack.gateway)
    stub = ferry_pb.gen_grpc.GenerationStub(channel)

    def generate(prompt: str, **sampling):
        req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(**sampling))
        return stub.Generate(req, timeout=60)

    yield generate
    channel.close()


def chatml(messages):
    out = ""
    if messages[0]["role"] != "system":
        out += f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


SAMPLINGS = [dict(temperature=0.0), dict(temperature=0.9, top_p=0.95, seed=1234)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_completions_match_grpc(client, grpc_gen, sampling):
    want = grpc_gen("Hello, my name is", max_tokens=12, ignore_eos=True, **sampling).text
    whole = client.completions.create(model="m", prompt="Hello, my name is", max_tokens=12,
                                      extra_body={"ignore_eos": True}, **sampling)
    assert whole.object == "text_completion"
    assert whole.choices[0].text == want
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    chunks = list(client.completions.create(model="m", prompt="Hello, my name is", max_tokens=12, stream=True,
                                            extra_body={"ignore_eos": True}, **sampling))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_chat_matches_grpc(client, grpc_gen, sampling):
    want = grpc_gen(chatml(MESSAGES), max_tokens=10, ignore_eos=True, **sampling).text
    whole = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10,
                                           extra_body={"ignore_eos": True}, **sampling)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == want
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}, **sampling))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 10


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in content)


def test_chat_prompt_matches_transformers_template(client, tiny_model):
    pytest.importorskip("jinja2")  # apply_chat_template needs it
    conversations = [MESSAGES, [{"role": "system", "content": "Be brief."}, *MESSAGES,
                                {"role": "assistant", "content": "Once"}, {"role": "user", "content": "More"}]]
    script = ("import json, sys; from transformers import AutoTokenizer; "
              "tok = AutoTokenizer.from_pretrained(sys.argv[1]); "
              "print(json.dumps([[tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True), "
              "tok.apply_chat_template(m, tokenize=True, add_generation_prompt=True)] for m in json.load(sys.stdin)]))")
    result = run_transformers(script, tiny_model, conversations)
    for messages, (text, ids) in zip(conversations, result):
        assert text == chatml(messages)
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=1)
        assert r.usage.prompt_tokens == len(ids)


def test_prompt_endings_match_transformers(client, http_stack, tiny_model):
    """add_generation_prompt and continue_final_message (a prefilled answer), as transformers renders them."""
    pytest.importorskip("jinja2")
    prefill = [*MESSAGES, {"role": "assistant", "content": "  Once upon a \n"}]
    cases = [(MESSAGES, False, False), (prefill, False, True), (prefill, False, False)]
    script = ("import json, sys; from transformers import AutoTokenizer; "
              "tok = AutoTokenizer.from_pretrained(sys.argv[1]); "
              "print(json.dumps([tok.apply_chat_template(m, tokenize=True, add_generation_prompt=g, "
              "continue_final_message=c) for m, g, c in json.load(sys.stdin)]))")
    result = run_transformers(script, tiny_model, cases)
    for (messages, gen_prompt, cont), ids in zip(cases, result):
        body = {"messages": messages, "add_generation_prompt": gen_prompt, "continue_final_message": cont}
        r = httpx.post(http_stack.http + "/tokenize", json=body)
        assert r.status_code == 200 and r.json()["tokens"] == ids, (body, r.text)
    r = client.chat.completions.create(model="m", messages=prefill, max_tokens=4, temperature=0,
                                       extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert r.usage.prompt_tokens == len(result[1])
    r = httpx.post(http_stack.http + "/v1/chat/completions",
                   json={"messages": prefill, "continue_final_message": True, "add_generation_prompt": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_tokenize_and_detokenize_match_transformers(http_stack, tiny_model):
    """vLLM's /tokenize and /detokenize: the ids and text transformers gives for the same model."""
    pytest.importorskip("jinja2")
    text = "Hello, world! Tokenise <|im_end|> this: 12345 caf\u00e9 \u4f60\u597d"
    script = ("import json, sys; from transformers import AutoTokenizer; "
              "tok = AutoTokenizer.from_pretrained(sys.argv[1]); m, t = json.load(sys.stdin); "
              "chat = tok.apply_chat_template(m, tokenize=True, add_generation_prompt=True); "
              "ids = tok.encode(t, add_special_tokens=False); "
              "print(json.dumps([chat, ids, tok.decode(ids), tok.decode(chat)]))")
    result = run_transformers(script, tiny_model, [MESSAGES, text])
    chat_ids, text_ids, text_back, chat_back = result
    r = httpx.post(http_stack.http + "/tokenize", json={"model": "m", "prompt": text})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == text_ids and r.json()["count"] == len(text_ids)
    assert r.json()["max_model_len"] > 0
    r = httpx.post(http_stack.http + "/tokenize", json={"messages": MESSAGES})
    assert r.json()["tokens"] == chat_ids
    assert httpx.post(http_stack.http + "/detokenize", json={"tokens": text_ids}).json()["prompt"] == text_back
    assert httpx.post(http_stack.http + "/detokenize", json={"tokens": chat_ids}).json()["prompt"] == chat_back
    r = httpx.post(http_stack.http + "/detokenize", json={"tokens": [1, -5]})
    assert r.status_code == 400 and "tokens[1] = -5" in r.json()["error"]["message"]
    r = httpx.post(http_stack.http + "/tokenize", json={"prompt": "x", "messages": MESSAGES})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_models_and_health(client, http_stack, tiny_model):
    models = client.models.list()
    assert [m.id for m in models.data] == ["m"]  # --served-model-name
    assert httpx.get(http_stack.http + "/health").status_code == 200
    # The gateway's metrics on the API port too, as vLLM serves them: the same registry.
    r = httpx.get(http_stack.http + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "ferry_gateway_requests_in_flight" in names and "ferry_gateway_rejections" in names
    assert "process_cpu_seconds" in names and "process_resident_memory_bytes" in names  # the process's too


def test_bad_field_is_400_naming_it(client, http_stack):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="Hi", max_tokens=4, temperature=-1)
    body = info.value.body
    assert body["param"] == "temperature" and "temperature" in body["message"] and "-1" in body["message"]
    r = httpx.post(http_stack.http + "/v1/completions", json={"prompt": "Hi", "n": 129})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "128" in r.json()["error"]["message"]
    r = httpx.post(http_stack.http + "/v1/completions", json={"prompt": "Hi", "max_tokens": 100000})
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
    r = httpx.post(http_stack.http + "/v1/completions", json={"prompt": "Hi", "lane": "nope"})
    assert r.status_code in (400, 403)


def test_hostile_bodies_get_a_clear_error_and_the_next_request_is_served(http_stack):
    url = http_stack.http + "/v1/completions"
    headers = {"Content-Type": "application/json"}

    def invalid_count():
        return sum(v for (name, labels), v in scrape(http_stack.metrics_urls()["gateway"]).items()
                   if name == "ferry_gateway_rejections_total" and ("reason", "invalid") in labels)

    invalid_before = invalid_count()
    # Nesting that printing the value back would recurse through (it crashed the gateway).
    deep = '{"prompt": "Hi", "temperature": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(url, content=deep, headers=headers)
    assert r.status_code == 400 and "64 levels" in r.json()["error"]["message"]
    # A wrong-typed value is quoted in brief, not whole.
    r = httpx.post(url, json={"prompt": "Hi", "temperature": list(range(100_000))})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "temperature" and len(error["message"]) < 300
    assert "100000 in all" in error["message"]
    # Larger than --http-max-body-bytes: 413 naming the limit, without reading it all.
    r = httpx.post(url, json={"prompt": "x" * (MAX_BODY_BYTES + 1)})
    assert r.status_code == 413 and str(MAX_BODY_BYTES) in r.json()["error"]["message"]
    for body in (b"\xff\xfe{}", b"[1, 2]", b"", b'"prompt"'):
        r = httpx.post(url, content=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["message"], body
    assert invalid_count() == invalid_before + 7  # each refusal is counted, as on the gRPC front
    r = httpx.post(url, json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_logit_bias_forces_and_bans_tokens(client, grpc_gen):
    """OpenAI's logit_bias, over HTTP and gRPC: +100 forces a token, -100 bans one."""
    plain = grpc_gen("Once upon a time", max_tokens=6, temperature=0.0)
    first = plain.token_ids[0]
    target = (first + 7) % 100 + 10
    forced = grpc_gen("Once upon a time", max_tokens=6, temperature=0.0, logit_bias={target: 100.0})
    assert list(forced.token_ids) == [target] * 6
    banned = grpc_gen("Once upon a time", max_tokens=6, temperature=0.8, seed=5, logit_bias={first: -100.0})
    assert first not in banned.token_ids
    over_http = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0.0,
                                          logit_bias={str(target): 100})
    assert over_http.choices[0].text == forced.text


def test_min_tokens_holds_back_end_tokens_and_stop_strings(client, grpc_gen):
    """vLLM's min_tokens: no stop token (not sampled) and no stop string (not looked for) before it."""
    plain = grpc_gen("Once upon a time", max_tokens=8, temperature=0.0, ignore_eos=True)
    first = plain.token_ids[0]
    stopped = grpc_gen("Once upon a time", max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[first])
    assert list(stopped.token_ids) == [first]
    held = grpc_gen("Once upon a time", max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[first],
                    min_tokens=4)
    assert len(held.token_ids) >= 4 and first not in held.token_ids[:4]
    stop = plain.text[:1]
    assert stop
    common = dict(model="m", prompt="Once upon a time", max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True})
    cut = client.completions.create(stop=[stop], **common)
    assert cut.choices[0].finish_reason == "stop" and not cut.choices[0].text.startswith(stop)
    later = client.completions.create(stop=[stop], **{**common, "extra_body": {"ignore_eos": True, "min_tokens": 4}})
    assert later.usage.completion_tokens >= 4
    assert later.choices[0].text.startswith(plain.text[:1])
    # vLLM's include_stop_str_in_output: the text runs to the end of the stop string, streamed too.
    mid = plain.text[2:4]
    assert mid
    with_stop = plain.text[:plain.text.find(mid) + len(mid)]
    kept = client.completions.create(stop=[mid], **{**common, "extra_body": {"ignore_eos": True,
                                                                              "include_stop_str_in_output": True}})
    assert kept.choices[0].text == with_stop and kept.choices[0].finish_reason == "stop", kept
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        stop=[mid], stream=True, **{**common, "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}))
    assert streamed == with_stop


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(http_stack):
    """vLLM's truncate_prompt_tokens: the prompt is cut to its last k tokens, which then answer as
    that shorter prompt does; echo shows what was kept."""
    ids = list(range(1300, 1340))
    post = lambda body: httpx.post(http_stack.http + "/v1/completions", json=body, timeout=60)
    cut = post({"prompt": ids, "max_tokens": 6, "temperature": 0, "truncate_prompt_tokens": 10, "echo": True}).json()
    short = post({"prompt": ids[-10:], "max_tokens": 6, "temperature": 0, "echo": True}).json()
    assert cut["usage"]["prompt_tokens"] == 10 and cut["choices"][0]["text"] == short["choices"][0]["text"], cut
    text = "The quick brown fox jumps over the lazy dog. " * 3
    whole = post({"prompt": text, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert post({"prompt": text, "max_tokens": 1, "truncate_prompt_tokens": 5}).json()["usage"]["prompt_tokens"] == 5
    assert post({"prompt": text, "max_tokens": 1, "truncate_prompt_tokens": -1}).json()["usage"]["prompt_tokens"] == whole
    chat = httpx.post(http_stack.http + "/v1/chat/completions", timeout=60,
                      json={"messages": MESSAGES, "max_tokens": 1, "truncate_prompt_tokens": 3}).json()
    assert chat["usage"]["prompt_tokens"] == 3, chat
    for bad, says in ((0, "must be -1 (max_model_len) or at least 1"), (1 << 30, "exceeds max_model_len")):
        r = post({"prompt": text, "max_tokens": 1, "truncate_prompt_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text
        assert says in r.json()["error"]["message"], r.text


def test_usage_reports_cached_prompt_tokens(http_stack):
    """OpenAI's usage.prompt_tokens_details.cached_tokens, from the scheduler's prefix cache (on by
    default): none the first time, the prompt's full blocks the second."""
    body = {"prompt": list(range(1200, 1200 + 40)), "max_tokens": 1}
    first = httpx.post(http_stack.http + "/v1/completions", json=body, timeout=60).json()["usage"]
    second = httpx.post(http_stack.http + "/v1/completions", json=body, timeout=60).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert second["prompt_tokens"] == 40 and 0 < cached < 40, second


def test_n_choices_are_the_single_requests_seeded_seed_plus_index(client):
    """OpenAI's n: choice i is what a single request with seed + i gives (vLLM's n with a seed is
    reproducible the same way); usage counts the prompt once and every choice's completion."""
    common = dict(model="m", prompt="Once upon a time", max_tokens=8, temperature=0.9, top_p=0.95)
    several = client.completions.create(n=3, seed=1234, **common)
    assert [c.index for c in several.choices] == [0, 1, 2]
    singles = [client.completions.create(seed=1234 + i, **common) for i in range(3)]
    assert [c.text for c in several.choices] == [s.choices[0].text for s in singles]
    assert len({c.text for c in several.choices}) > 1  # sampled apart
    assert several.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert several.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_a_batch_of_prompts_answers_each_as_alone(client):
    """/v1/completions with a list of prompts (lm-eval and vLLM clients send these): choices in
    OpenAI's order, prompt p's i-th at p * n + i, each as its prompt gives alone."""
    prompts = ["Once upon a time", "The sky", [11, 12, 13]]
    common = dict(model="m", max_tokens=5, temperature=0.9, seed=77)
    batch = client.completions.create(prompt=prompts, n=2, **common)
    assert [c.index for c in batch.choices] == list(range(6))
    alone = [client.completions.create(prompt=p, n=2, **common) for p in prompts]
    assert [c.text for c in batch.choices] == [c.text for a in alone for c in a.choices]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_more_choices_than_the_lane_queues_is_400(http_stack):
    r = httpx.post(http_stack.http + "/v1/completions", json={"prompt": ["a"] * 200, "n": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    message = r.json()["error"]["message"]
    assert "400 choices" in message and "interactive" in message and "256" in message, message


def test_n_streamed_choices_each_finish_and_done_comes_once(client):
    common = dict(model="m", messages=MESSAGES, max_tokens=6, temperature=0.0)
    whole = client.chat.completions.create(n=2, **common)
    assert whole.choices[0].message.content == whole.choices[1].message.content  # greedy: equal
    texts, finishes, usage = {}, {}, None
    for chunk in client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **common):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert sorted(texts) == [0, 1] and sorted(finishes) == [0, 1]
    assert texts[0] == texts[1] == whole.choices[0].message.content
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_streams_are_sse_ending_with_done(http_stack):
    with httpx.stream("POST", http_stack.http + "/v1/completions",
                      json={"prompt": "Hi", "max_tokens": 3, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert json.loads(lines[0][6:])["object"] == "text_completion"


def scrape(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def running(http_stack):
    samples = scrape(http_stack.metrics_urls()["scheduler"])
    return sum(v for (name, labels), v in samples.items()
               if name == "ferry_scheduler_requests" and ("state", "running") in labels)


def wait_running(http_stack, n, timeout_s=10):
    """The scheduler's running gauge is published just after a step's tokens go out, so a client
    can see a request end a moment before the gauge does."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and running(http_stack) != n:
        time.sleep(0.02)
    return running(http_stack)


def cancelled(http_stack):
    samples = scrape(http_stack.metrics_urls()["gateway"])
    return sum(v for (name, labels), v in samples.items()
               if name == "ferry_gateway_requests_total" and ("code", "CANCELLED") in labels)


def test_served_model_names(tiny_model, tmp_path):
    """vLLM's --served-model-name: /v1/models lists each name (with the time it started serving and the
    checkpoint as root); a request may name any, and its response echoes that name; one naming none gets
    the first; another name is 404 model_not_found naming both. Without the flag the id is the model path."""
    started = time.time()
    (tmp_path / "named").mkdir()
    (tmp_path / "plain").mkdir()
    named = Stack(tiny_model, tmp_path / "named", ["--http-port", "0", "--served-model-name", "qwen-a", "qwen-b"])
    try:
        c = openai.OpenAI(base_url=named.http + "/v1", api_key="unused", max_retries=0)
        cards = c.models.list().data
        assert [m.id for m in cards] == ["qwen-a", "qwen-b"]
        for m in cards:
            assert int(started) - 1 <= m.created <= time.time() + 1
            assert m.model_dump()["root"] == str(tiny_model)
        r = c.chat.completions.create(model="qwen-b", messages=MESSAGES, max_tokens=2)
        assert r.model == "qwen-b"
        assert c.completions.create(model="qwen-a", prompt="Hi", max_tokens=2).model == "qwen-a"
        r = httpx.post(named.http + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "qwen-a"
        with pytest.raises(openai.NotFoundError) as e:
            c.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
        err = e.value.body
        assert e.value.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
        assert "`gpt-4o`" in err["message"] and "qwen-a, qwen-b" in err["message"]
        # The next request is served.
        assert c.completions.create(model="qwen-b", prompt="Hi", max_tokens=2).choices[0].text is not None
    finally:
        assert named.stop() == 0
    plain = Stack(tiny_model, tmp_path / "plain", ["--http-port", "0"])
    try:
        assert [m["id"] for m in httpx.get(plain.http + "/v1/models").json()["data"]] == [str(tiny_model)]
    finally:
        assert plain.stop() == 0


def test_cancelled_stream_frees_its_sequence(slow_http_stack):
    assert wait_running(slow_http_stack, 0) == 0
    before = cancelled(slow_http_stack)
    body = {"prompt": "Once upon a time", "max_tokens": 1800, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", slow_http_stack.http + "/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
        assert wait_running(slow_http_stack, 1) == 1
    deadline = time.time() + 30
    while time.time() < deadline and (running(slow_http_stack) != 0 or cancelled(slow_http_stack) == before):
        time.sleep(0.05)
    assert running(slow_http_stack) == 0
    assert cancelled(slow_http_stack) == before + 1


def test_closed_connection_cancels_a_whole_request(slow_http_stack):
    """A non-streamed request whose client hangs up stops generating (vLLM aborts it too)."""
    assert wait_running(slow_http_stack, 0) == 0
    before = cancelled(slow_http_stack)
    host, port = slow_http_stack.http.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"prompt": "Once upon a time", "max_tokens": 1800, "ignore_eos": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    deadline = time.time() + 30
    while time.time() < deadline and running(slow_http_stack) != 1:
        time.sleep(0.02)
    assert running(slow_http_stack) == 1  # generating, 1,800 tokens to go
    conn.close()  # gives up before the answer
    deadline = time.time() + 30
    while time.time() < deadline and (running(slow_http_stack) != 0 or cancelled(slow_http_stack) == before):
        time.sleep(0.05)
    assert running(slow_http_stack) == 0
    assert cancelled(slow_http_stack) == before + 1  # cancelled, not run to its 1,800th token
    # The next request is served.
    r = httpx.post(slow_http_stack.http + "/v1/completions",
                   json={"prompt": "Hi", "max_tokens": 4, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def waiting(http_stack):
    samples = scrape(http_stack.metrics_urls()["scheduler"])
    return sum(v for (name, labels), v in samples.items()
               if name == "ferry_scheduler_requests" and ("state", "waiting") in labels)


def test_64_clients_that_hang_up_after_a_second_free_every_seat(slow_http_stack, ferry_pb):
    """64 non-streamed requests, 16 generating and 48 waiting for a seat, whose clients all hang up
    after a second: every one is cancelled (the gateway counts 64 more CANCELLED) and the scheduler's
    running and waiting counts are back to 0 within a second of the hang-ups (measured: printed)."""
    admin = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(slow_http_stack.scheduler))
    cap = admin.GetState(ferry_pb.sched.GetStateRequest(), timeout=10).max_num_seqs
    admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=16), timeout=10)
    try:
        assert wait_running(slow_http_stack, 0) == 0 and waiting(slow_http_stack) == 0
        before = cancelled(slow_http_stack)
        host, port = slow_http_stack.http.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1800, "ignore_eos": True})
        conns = []
        for _ in range(64):
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            conns.append(conn)
        time.sleep(1.0)
        assert (running(slow_http_stack), waiting(slow_http_stack)) == (16, 48)
        for conn in conns:
            conn.close()
        closed = time.time()
        while time.time() < closed + 10 and (running(slow_http_stack) or waiting(slow_http_stack)):
            time.sleep(0.01)
        freed_s = time.time() - closed
        print(f"64 hang-ups: running and waiting back to 0 after {1e3 * freed_s:.0f} ms")
        assert (running(slow_http_stack), waiting(slow_http_stack)) == (0, 0)
        assert freed_s <= 1.0, f"{1e3 * freed_s:.0f} ms"
        deadline = time.time() + 10
        while time.time() < deadline and cancelled(slow_http_stack) < before + 64:
            time.sleep(0.02)
        assert cancelled(slow_http_stack) == before + 64
    finally:
        admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=cap), timeout=10)


def test_a_queued_stream_whose_client_hangs_up_never_runs(slow_http_stack, ferry_pb):
    """A streamed request waiting for a seat has written nothing yet, so no write can fail: the
    gateway watches its connection and cancels it (it would otherwise run to its end for nobody)."""
    assert wait_running(slow_http_stack, 0) == 0
    admin = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(slow_http_stack.scheduler))
    old_cap = admin.GetState(ferry_pb.sched.GetStateRequest()).max_num_seqs
    admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=1))
    try:
        before = cancelled(slow_http_stack)
        body = {"prompt": "Once upon a time", "max_tokens": 1800, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", slow_http_stack.http + "/v1/completions", json=body, timeout=60) as seated:
            lines = seated.iter_lines()
            assert next(line for line in lines if line).startswith("data: ")  # the one seat is taken
            host, port = slow_http_stack.http.removeprefix("http://").split(":")
            queued = http.client.HTTPConnection(host, int(port), timeout=60)
            queued.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
            deadline = time.time() + 30
            while time.time() < deadline and waiting(slow_http_stack) != 1:
                time.sleep(0.02)
            assert waiting(slow_http_stack) == 1
            queued.close()  # hangs up while queued
            deadline = time.time() + 30
            while time.time() < deadline and (waiting(slow_http_stack) != 0 or cancelled(slow_http_stack) == before):
                time.sleep(0.05)
            assert waiting(slow_http_stack) == 0 and cancelled(slow_http_stack) == before + 1
            assert running(slow_http_stack) == 1  # the seated stream goes on
            assert next(line for line in lines if line).startswith("data: ")
        assert wait_running(slow_http_stack, 0) == 0
        # Had the queued one survived, it would now hold the seat for 18 s.
        time.sleep(0.5)
        assert running(slow_http_stack) == 0 and waiting(slow_http_stack) == 0
    finally:
        admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=old_cap))


def test_a_connection_serves_any_number_of_requests(http_stack):
    """Keep-alive holds past cpp-httplib's default of 5 requests per connection, which made clients
    that sent on a connection as the server closed it fail (2-3% of requests at 256 clients)."""
    host, port = http_stack.http.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    local = None
    body = json.dumps({"prompt": "Hi", "max_tokens": 1})
    for i in range(12):
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        r.read()
        assert (r.getheader("Connection") or "").lower() != "close", f"closed after request {i + 1}"
        local = local or conn.sock.getsockname()
        assert conn.sock.getsockname() == local  # the same connection throughout
    conn.close()


def test_listen_backlog_takes_a_burst_of_connections(http_stack):
    """cpp-httplib listens with a backlog of 5; the front raises it so that a burst of new clients
    is not dropped (each dropped SYN costs a 1 s retransmit). `ss` shows a listener's backlog as Send-Q."""
    port = http_stack.http.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    backlogs = [int(line.split()[2]) for line in out.splitlines() if line.strip()]
    assert backlogs and min(backlogs) >= 1024, out


def test_streams_beyond_the_old_64_connection_limit_run_at_once(slow_http_stack):
    """Every stream holds a server thread; 96 sent at once all generate together (the front served 64
    connections at a time, so the rest were submitted only as earlier ones ended). All 96 requests
    go out within a few engine steps, and the first needs 1,800 steps to finish."""
    import selectors
    import socket
    n = 96
    host, port = slow_http_stack.http.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1800, "ignore_eos": True, "stream": True})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    socks = [socket.create_connection((host, int(port)), timeout=60) for _ in range(n)]
    try:
        for s in socks:
            s.sendall(request)
        selector = selectors.DefaultSelector()
        received = {}
        for s in socks:
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ)
            received[s] = b""
        waiting = set(socks)
        deadline = time.time() + 120
        while waiting and time.time() < deadline:
            for key, _ in selector.select(timeout=1):
                s = key.fileobj
                received[s] += s.recv(65536)
                if b"data: " in received[s]:
                    waiting.discard(s)
                    selector.unregister(s)
        assert not waiting, f"{len(waiting)} of {n} streams had no token after 120 s"
        assert all(r.startswith(b"HTTP/1.1 200") for r in received.values())
        generating = wait_running(slow_http_stack, n)
    finally:
        for s in socks:
            s.close()
    assert generating == n
    deadline = time.time() + 30
    while time.time() < deadline and running(slow_http_stack) != 0:
        time.sleep(0.05)
    assert running(slow_http_stack) == 0  # the closed streams were cancelled


def test_streams_aborted_at_random_leave_the_engine_idle(slow_http_stack):
    """300 streams at once (n of 1 or 2, usage on), most given up by their clients at random
    points: events go out from gRPC threads while clients vanish. Every kept stream ends with
    [DONE], the engine ends idle and the next request is served."""
    import asyncio
    import random

    rng = random.Random(5)
    stats = {"done": 0, "aborted": 0, "refused": 0, "other": [], "no_done": []}

    async def one(client):
        body = {"prompt": "Once upon a time", "max_tokens": rng.choice([8, 32, 64]), "ignore_eos": True,
                "stream": True, "n": rng.choice([1, 1, 2]), "stream_options": {"include_usage": True}}
        abort_after = rng.choice([None, 0, 1, 5, 20])
        async with client.stream("POST", slow_http_stack.http + "/v1/completions", json=body, timeout=120) as r:
            if r.status_code == 429:  # the lane's queue is full: a refusal, not a failure
                stats["refused"] += 1
                return
            if r.status_code != 200:
                stats["other"].append(r.status_code)
                return
            seen, done = 0, False
            async for line in r.aiter_lines():
                if not line:
                    continue
                seen += 1
                if abort_after is not None and seen > abort_after:
                    stats["aborted"] += 1
                    return
                if line == "data: [DONE]":
                    stats["done"] += 1
                    done = True
            if not done:  # a stream its client kept ended without [DONE] (issue #53: not checked)
                stats["no_done"].append((body["max_tokens"], body["n"], abort_after, seen))

    async def run():
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        async with httpx.AsyncClient(limits=limits) as client:
            await asyncio.gather(*(one(client) for _ in range(300)))

    asyncio.run(run())
    print(stats)
    assert not stats["other"], stats
    assert not stats["no_done"], stats
    assert stats["done"] > 0 and stats["aborted"] > 0, stats
    assert stats["done"] + stats["aborted"] + stats["refused"] == 300, stats
    assert wait_running(slow_http_stack, 0, timeout_s=30) == 0
    assert waiting(slow_http_stack) == 0
    r = httpx.post(slow_http_stack.http + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
