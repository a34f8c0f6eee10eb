"""Checks the Hugging Face parity fixtures are still what transformers computes.

The C++ side (worker/model/hf_parity_test.cc) compares Ferry against tests/fixtures/*/expected.json;
this keeps those files honest: a transformers upgrade or a hand edit that changed them shows here.
Skipped where torch or transformers is not installed.
"""
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


# Each fixture and its architecture. Qwen3 needs transformers >= 4.51 (the setup script's venv has
# 4.46 on Debian's torch 1.13): skipped where it is missing (make_hf_tiny_families.py wrote it).
@pytest.mark.parametrize("name,architecture", [("hf_tiny_qwen2", "Qwen2ForCausalLM"),
                                               ("hf_tiny_qwen2_tied", "Qwen2ForCausalLM"),
                                               ("hf_tiny_llama", "LlamaForCausalLM"),
                                               ("hf_tiny_mistral", "MistralForCausalLM"),
                                               ("hf_tiny_qwen3", "Qwen3ForCausalLM")])
def test_fixture_matches_transformers(name, architecture):
    model_dir = os.path.join(FIXTURES, name)
    with open(os.path.join(model_dir, "expected.json")) as f:
        expected = json.load(f)
    if not hasattr(transformers, architecture):
        pytest.skip(f"transformers {transformers.__version__} has no {architecture}")
    model = getattr(transformers, architecture).from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    prompt = expected["prompt_token_ids"]
    full = prompt + expected["generated_token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0]
    # Greedy: each generated token is the argmax after the tokens before it.
    argmax = logits[len(prompt) - 1:-1].argmax(-1).tolist()
    assert argmax == expected["generated_token_ids"]
    last_prompt = torch.tensor(expected["last_prompt_logits"])
    assert torch.max(torch.abs(logits[len(prompt) - 1] - last_prompt)) < 1e-4
    final = torch.tensor(expected["final_logits"])
    assert torch.max(torch.abs(logits[-1] - final)) < 1e-4


def test_fixtures_stay_small():
    total = 0
    for root, _, files in os.walk(FIXTURES):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if not f.endswith(".pyc"))
    assert total < 3 << 20  # six checkpoints of four architectures and five LoRA adapters
