"""A bad checkpoint is refused at start with an error naming the file and the
tensor; the worker never starts half-loaded (it exits non-zero, serving nothing)."""
import json
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import binary


def start_worker(model_dir, tmp_path):
    ready = tmp_path / "ready.json"
    proc = subprocess.run([str(binary("ferry-worker")), "--model", str(model_dir), "--port", "0",
                           "--ready-file", str(ready)], capture_output=True, text=True, timeout=120)
    return proc, ready


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    """A float32 checkpoint, so numpy can rewrite its tensors."""
    out = tmp_path_factory.mktemp("tiny-f32")
    subprocess.run([str(binary("ferry-make-model")), "--preset", "tiny", "--dtype", "float32", "--out", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture()
def model_copy(tiny_f32, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny_f32, dst)
    return dst


def rewrite(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_good_checkpoint_starts(tiny_model, tmp_path):
    # The same helper with an intact copy reaches the ready file (then we stop it).
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([str(binary("ferry-worker")), "--model", str(tiny_model), "--port", "0",
                             "--ready-file", str(ready)], stderr=subprocess.PIPE, text=True)
    try:
        import time
        deadline = time.time() + 60
        while not ready.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "timeout"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_missing_tensor(model_copy, tmp_path):
    rewrite(model_copy, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    assert "model.safetensors" in proc.stderr and "model.layers.1.mlp.down_proj.weight" in proc.stderr, proc.stderr


def test_wrong_shape(model_copy, tmp_path):
    def edit(t):
        w = t["model.layers.0.self_attn.q_proj.weight"]
        t["model.layers.0.self_attn.q_proj.weight"] = np.ascontiguousarray(w[:-1])
    rewrite(model_copy, edit)
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    assert "model.layers.0.self_attn.q_proj.weight" in proc.stderr and "shape" in proc.stderr, proc.stderr


def test_unsupported_dtype(model_copy, tmp_path):
    def edit(t):
        t["model.norm.weight"] = t["model.norm.weight"].astype(np.float64)
    rewrite(model_copy, edit)
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    assert "model.norm.weight" in proc.stderr and "F64" in proc.stderr, proc.stderr


def test_truncated_file(model_copy, tmp_path):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    assert "model.safetensors" in proc.stderr, proc.stderr


def test_unsupported_architecture(model_copy, tmp_path):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    cfg["model_type"] = "gpt_neox"
    (model_copy / "config.json").write_text(json.dumps(cfg))
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    # The file, the value, and what is served.
    for said in ("config.json", "GPTNeoXForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"):
        assert said in proc.stderr, proc.stderr


def test_unserved_config_field(model_copy, tmp_path):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (model_copy / "config.json").write_text(json.dumps(cfg))
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    for said in ("config.json", "rope_scaling", "yarn", "Ferry serves null"):
        assert said in proc.stderr, proc.stderr


def test_shape_disagrees_with_config(model_copy, tmp_path):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (model_copy / "config.json").write_text(json.dumps(cfg))
    proc, ready = start_worker(model_copy, tmp_path)
    assert proc.returncode != 0 and not ready.exists()
    assert "mlp" in proc.stderr and "shape" in proc.stderr, proc.stderr


def start_gateway(model_dir):
    return subprocess.run([str(binary("ferry-gateway")), "--scheduler", "127.0.0.1:9", "--tokenizer", str(model_dir),
                           "--port", "0", "--http-port", "0", "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=60)


def test_unserved_chat_template_construct_fails_the_gateway_at_start(model_copy):
    cfg = json.loads((model_copy / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }}\n{% include 'footer.jinja' %}{% endfor %}"
    (model_copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    proc = start_gateway(model_copy)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    for said in ("tokenizer_config.json", "chat_template", "line 2", "include", "gateway/jinja/README.md"):
        assert said in out, out


def test_malformed_tokenizer_json_fails_the_gateway_at_start(model_copy):
    (model_copy / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, '
                                               '"pre_tokenizer": {"type": "Whitespace"}}')
    proc = start_gateway(model_copy)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    for said in ("tokenizer.json", "pre_tokenizer", "Whitespace"):
        assert said in out, out
