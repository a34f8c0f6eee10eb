"""The checkpoint ferry-make-model writes is a real Hugging Face checkpoint:
transformers loads it unchanged, and its greedy generation equals what the
whole Ferry stack returns for the same prompts."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["hello world", "The quick brown fox", "北京的天气", "def f(x):\n    return x", "🚀 launch in 3, 2, 1"]


@pytest.fixture(scope="module")
def hf(tiny_model):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model), torch_dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare full lengths, as ignore_eos does
    return tok, model


def test_stack_greedy_equals_transformers(hf, gen_stub, ferry_pb):
    tok, model = hf
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
