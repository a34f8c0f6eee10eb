"""The tokenizer's special tokens (its post-processor's template: Llama 3's <|begin_of_text|>)
as vLLM adds them: a completion's text prompt and the gRPC API's get them by default,
add_special_tokens false leaves them out, a chat (whose template writes its own) never gets them,
and /tokenize follows the same defaults. The tiny model's tokenizer is given a BOS template;
token-id prompts are never changed."""
import json
import shutil

import httpx
import pytest

from conftest import Stack, serve


@pytest.fixture(scope="module")
def bos_model(tiny_model, tmp_path_factory):
    model = tmp_path_factory.mktemp("bos-model") / "model"
    shutil.copytree(tiny_model, model)
    path = model / "tokenizer.json"
    tok = json.loads(path.read_text())
    bos = next(t for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    tok["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bos["id"]],
                                                          "tokens": ["<|endoftext|>"]}}}]}
    path.write_text(json.dumps(tok))
    return model, bos["id"]


@pytest.fixture(scope="module")
def stack(bos_model, tmp_path_factory):
    yield from serve(Stack(bos_model[0], tmp_path_factory.mktemp("bos-stack"),
                           ["--http-port", "0", "--served-model-name", "m"]))


def post(stack, path, body):
    r = httpx.post(stack.http + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_and_grpc_add_the_bos_chat_does_not(stack, bos_model, ferry_pb):
    import grpc

    bos = bos_model[1]
    plain = post(stack, "/tokenize", {"prompt": "hello world", "add_special_tokens": False})["tokens"]
    with_bos = post(stack, "/tokenize", {"prompt": "hello world"})["tokens"]
    assert with_bos == [bos] + plain
    usage = lambda body: post(stack, "/v1/completions", {"model": "m", "max_tokens": 1, **body})["usage"]
    assert usage({"prompt": "hello world"})["prompt_tokens"] == len(plain) + 1
    assert usage({"prompt": "hello world", "add_special_tokens": False})["prompt_tokens"] == len(plain)
    assert usage({"prompt": plain})["prompt_tokens"] == len(plain), "token ids are sent as given"
    messages = [{"role": "user", "content": "hello world"}]
    chat_tokens = post(stack, "/tokenize", {"messages": messages})["tokens"]
    assert chat_tokens[0] != bos
    chat = post(stack, "/v1/chat/completions", {"model": "m", "max_tokens": 1, "messages": messages})
    assert chat["usage"]["prompt_tokens"] == len(chat_tokens)
    responses = post(stack, "/v1/responses", {"model": "m", "max_output_tokens": 1, "input": "hello world"})
    assert responses["usage"]["input_tokens"] == len(chat_tokens)
    channel = grpc.insecure_channel(stack.gateway)
    stub = ferry_pb.gen_grpc.GenerationStub(channel)
    sampling = ferry_pb.gen.SamplingParams(max_tokens=1, temperature=0.0)
    got = stub.Generate(ferry_pb.gen.GenerateRequest(text=b"hello world", sampling=sampling), timeout=60)
    assert got.usage.prompt_tokens == len(plain) + 1
    got = stub.Generate(ferry_pb.gen.GenerateRequest(text=b"hello world", sampling=sampling, add_special_tokens=False),
                        timeout=60)
    assert got.usage.prompt_tokens == len(plain)
    channel.close()


def test_truncation_keeps_room_for_the_bos(stack, bos_model):
    bos = bos_model[1]
    text = "one two three four five six seven eight nine ten"
    plain = post(stack, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    assert len(plain) > 4
    r = post(stack, "/v1/completions", {"model": "m", "max_tokens": 1, "prompt": text, "truncate_prompt_tokens": 4,
                                        "echo": True})
    assert r["usage"]["prompt_tokens"] == 4  # the BOS and the text's last 3 tokens, as Hugging Face truncates
    kept = post(stack, "/detokenize", {"tokens": [bos] + plain[-3:]})["prompt"]
    assert r["choices"][0]["text"].startswith(kept), (r["choices"][0]["text"], kept)
