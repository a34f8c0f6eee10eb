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


def test_make_model_adapters_load_in_peft(tmp_path):
    """ferry-make-model --lora-for writes PEFT's exact layout: PEFT loads every tensor (none
    unexpected or missing) and the adapter changes the base model's logits."""
    import subprocess

    from conftest import binary

    from safetensors.torch import load_file

    base, adapter = tmp_path / "base", tmp_path / "adapter"
    subprocess.run([str(binary("ferry-make-model")), "--preset", "tiny-llama", "--seed", "3", "--dtype", "float32",
                    "--out", str(base)], check=True, capture_output=True)
    subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(base), "--out", str(adapter),
                    "--lora-rank", "4", "--lora-targets", "q_proj,o_proj,down_proj", "--lora-rslora",
                    "--dtype", "float32"], check=True, capture_output=True)
    config = peft.PeftConfig.from_pretrained(str(adapter))
    assert config.r == 4 and config.use_rslora and set(config.target_modules) == {"q_proj", "o_proj", "down_proj"}
    model = transformers.LlamaForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32).eval()
    tokens = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        before = model(input_ids=tokens).logits
    model = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    written = load_file(str(adapter / "adapter_model.safetensors"))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(written) > 0
    for name, value in written.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(loaded[key], value), name
    with torch.no_grad():
        after = model(input_ids=tokens).logits
    assert torch.max(torch.abs(after - before)) > 1e-2
