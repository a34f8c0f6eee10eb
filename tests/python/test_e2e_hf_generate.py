"""The checkpoint ferry-make-model writes is a real Hugging Face checkpoint:
transformers loads it unchanged, and its greedy generation equals what the
whole Ferry stack returns for the same prompts."""
import json
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import Stack

PROMPTS = ["hello world", "The quick brown fox", "北京的天气", "def f(x):\n    return x", "🚀 launch in 3, 2, 1"]


@pytest.fixture(scope="module")
def hf(tiny_model):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model), torch_dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare full lengths, as ignore_eos does
    return tok, model


@pytest.fixture(scope="module")
def fp32_stub(tiny_model, tmp_path_factory, ferry_pb):
    """A stack on the exact fp32 path: transformers runs fp32 too."""
    import grpc

    s = Stack(tiny_model, tmp_path_factory.mktemp("fp32-stack"), ["--worker-arg=--dtype=float32"])
    channel = grpc.insecure_channel(s.gateway)
    yield ferry_pb.gen_grpc.GenerationStub(channel)
    channel.close()
    assert s.stop() == 0


def test_stack_greedy_equals_transformers(hf, fp32_stub, ferry_pb):
    tok, model = hf
    gen_stub = fp32_stub
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                 synced_gpus=False, pad_token_id=0)
        expected = out[0, ids.shape[1]:].tolist()
        req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
            max_tokens=24, temperature=0.0, ignore_eos=True))
        resp = gen_stub.Generate(req, timeout=60)
        assert resp.usage.prompt_tokens == ids.shape[1], prompt
        assert list(resp.token_ids) == expected, prompt
        assert resp.text == tok.decode(expected, skip_special_tokens=True), prompt


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-mistral"])
def test_other_families_load_in_transformers_and_the_stack_generates_the_same(preset, tmp_path, ferry_pb):
    """ferry-make-model's Llama and Mistral checkpoints (Llama with rope_scaling llama3) are real
    Hugging Face checkpoints of those architectures, and the stack's greedy tokens equal
    transformers'. (Qwen3 needs transformers >= 4.51; its parity is worker/model/hf_parity_test.cc's.)"""
    import subprocess

    import grpc

    from conftest import binary

    model_dir = tmp_path / preset
    subprocess.run([str(binary("ferry-make-model")), "--preset", preset, "--seed", "3", "--out", str(model_dir)],
                   check=True, capture_output=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    assert type(model).__name__ == {"tiny-llama": "LlamaForCausalLM", "tiny-mistral": "MistralForCausalLM"}[preset]
    model.generation_config.eos_token_id = None
    (tmp_path / "stack").mkdir()
    # Prefill in 16-token chunks with prefix caching on: what Qwen2 is tested with, on this family.
    s = Stack(model_dir, tmp_path / "stack", ["--worker-arg=--dtype=float32", "--scheduler-arg=--enable-prefix-caching",
                                              "--scheduler-arg=--max-num-batched-tokens=16"])
    channel = grpc.insecure_channel(s.gateway)
    try:
        stub = ferry_pb.gen_grpc.GenerationStub(channel)
        for prompt in PROMPTS[:3]:
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                     synced_gpus=False, pad_token_id=0)
                logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
                max_tokens=16, temperature=0.0, ignore_eos=True, prompt_logprobs=1))
            first = stub.Generate(req, timeout=60)
            assert list(first.token_ids) == out[0, ids.shape[1]:].tolist(), prompt
            # Prompt logprobs over chunked prefill: transformers' log-softmax of each prompt token.
            got = [p.logprob for p in first.prompt_logprobs[1:]]
            want = [logprobs[i - 1, ids[0, i]].item() for i in range(1, ids.shape[1])]
            assert got == pytest.approx(want, abs=1e-3), prompt
        # A long prompt twice: the second time its full blocks come from the prefix cache (a request
        # asking for prompt logprobs computes them all), and the tokens do not change.
        long_prompt = " ".join(PROMPTS) * 3
        req = ferry_pb.gen.GenerateRequest(text=long_prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
            max_tokens=8, temperature=0.0, ignore_eos=True))
        first, again = stub.Generate(req, timeout=60), stub.Generate(req, timeout=60)
        assert first.usage.prompt_tokens > 48 and again.usage.cached_tokens >= 32, again.usage
        assert list(again.token_ids) == list(first.token_ids)
        # Structured output on this family: the text is one the constraint allows, whole.
        sampling = ferry_pb.gen.SamplingParams(max_tokens=32, temperature=0.0)
        sampling.guided.regex = r"(yes|no), [0-9]{2} [a-z]{3}"
        req = ferry_pb.gen.GenerateRequest(text=PROMPTS[0].encode(), sampling=sampling)
        text = stub.Generate(req, timeout=60).text
        assert re.fullmatch(r"(yes|no), [0-9]{2} [a-z]{3}", text), text
    finally:
        channel.close()
        assert s.stop() == 0
