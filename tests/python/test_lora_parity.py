"""Checks the LoRA parity fixtures are still what PEFT applied to transformers computes.

The C++ side (worker/model/lora_parity_test.cc) compares Ferry against
tests/fixtures/*/lora/*/expected.json; this keeps those files honest: a PEFT or transformers
upgrade, or a hand edit of an adapter or its expected logits, shows here. Skipped where torch,
transformers or peft is not installed.
"""
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
ADAPTERS = [("hf_tiny_qwen2", "qv"), ("hf_tiny_qwen2", "all_rslora"), ("hf_tiny_qwen2", "mlp_bf16"),
            ("hf_tiny_qwen2", "ko"), ("hf_tiny_llama", "all")]


@pytest.mark.parametrize("base,name", ADAPTERS)
def test_lora_fixture_matches_peft(base, name):
    base_dir = os.path.join(FIXTURES, base)
    adapter_dir = os.path.join(base_dir, "lora", name)
    with open(os.path.join(adapter_dir, "expected.json")) as f:
        expected = json.load(f)
    with open(os.path.join(base_dir, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(
        base_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    model = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
    prompt = expected["prompt_token_ids"]
    full = prompt + expected["generated_token_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full])).logits[0]
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == expected["generated_token_ids"]
    assert torch.max(torch.abs(logits[len(prompt) - 1] - torch.tensor(expected["last_prompt_logits"]))) < 1e-4
    assert torch.max(torch.abs(logits[-1] - torch.tensor(expected["final_logits"]))) < 1e-4
    # The adapter matters: the base alone is far from it.
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(input_ids=torch.tensor([full])).logits[0]
    assert torch.max(torch.abs(base_logits[-1] - logits[-1])) > 1e-2
