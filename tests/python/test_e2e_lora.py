"""Multi-LoRA through the whole stack (issue #57): ferry-launch --enable-lora --lora-modules with
adapters ferry-make-model writes in PEFT's layout. A request names its adapter (gRPC lora_name,
the OpenAI API's model); requests of three adapters and the base, all at once under --max-loras 2
with prefix caching on and the same prompt under every adapter, each get exactly the tokens they
get alone; /v1/models lists each adapter with its parent; an unknown adapter is refused naming it,
and the next request is served."""
import json
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Stack, binary, serve

ADAPTERS = {"tenant-a": ("q_proj,v_proj", 4), "tenant-b": ("all-linear", 8), "tenant-c": ("gate_proj,down_proj", 2)}
PROMPT = list(range(40, 40 + 37))  # the same prompt under every adapter: 2 full blocks cached per adapter


def write_adapters(tiny_model, run):
    modules = []
    for i, (name, (targets, rank)) in enumerate(ADAPTERS.items()):
        out = run / name
        subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(tiny_model), "--out", str(out),
                        "--lora-rank", str(rank), "--lora-targets", targets, "--seed", str(10 + i)],
                       check=True, capture_output=True)
        modules.append(f"{name}={out}")
    return modules


@pytest.fixture(scope="module")
def lora_stack(tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora")
    modules = write_adapters(tiny_model, run)
    (run / "stack").mkdir()
    yield from serve(Stack(tiny_model, run / "stack", ["--http-port", "0", "--served-model-name", "base",
                                                        "--enable-lora", "--lora-modules", *modules,
                                                        "--max-loras", "2", "--max-num-batched-tokens", "64"]))


def generate(stub, ferry_pb, lora, ids=PROMPT, max_tokens=12):
    req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=ids), lora_name=lora,
                                       sampling=ferry_pb.gen.SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                            ignore_eos=True))
    return list(stub.Generate(req, timeout=120).token_ids)


def test_adapters_in_one_batch_give_each_request_its_tokens_alone(lora_stack, ferry_pb):
    import grpc

    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(lora_stack.gateway))
    names = ["", *ADAPTERS]
    alone = {name: generate(stub, ferry_pb, name) for name in names}
    assert all(len(t) == 12 for t in alone.values())
    # Every adapter changes the reply: its tokens are not the base model's nor another adapter's.
    assert len({tuple(t) for t in alone.values()}) == len(names), alone
    # All at once, three times over: twelve requests over three adapters and the base, at most two
    # adapters a step, prefills chunked at 64 tokens beside decodes, prefix blocks cached per adapter.
    with ThreadPoolExecutor(12) as pool:
        together = list(pool.map(lambda n: (n, generate(stub, ferry_pb, n)), names * 3))
    for name, tokens in together:
        assert tokens == alone[name], name


def test_adapter_metrics_are_the_catalogues(lora_stack, ferry_pb):
    """The `--enable-lora` rows of docs/metrics.md: exported with exactly their labels once adapters
    served requests; the scheduler's lora_requests_info is one series naming max_lora."""
    import grpc

    from observability import rows_for, sample_label_names, scrape

    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(lora_stack.gateway))
    for name in ADAPTERS:
        generate(stub, ferry_pb, name, max_tokens=3)
    urls = lora_stack.metrics_urls()
    for service in ("gateway", "scheduler"):
        families = scrape(urls[service])
        rows = [r for r in rows_for(service) if r.exported == "--enable-lora"]
        assert rows, service
        for row in rows:
            assert row.family in families, f"{service}: {row.name} missing"
            assert sample_label_names(families[row.family]) == {row.labels}, row.name
    gw = scrape(urls["gateway"])["ferry_gateway_lora_requests"]
    done = {s.labels["adapter"]: s.value for s in gw.samples if s.name.endswith("_total") and s.labels["code"] == "OK"}
    assert all(done.get(name, 0) >= 1 for name in ADAPTERS), done
    info = scrape(urls["scheduler"])["ferry_scheduler_lora_requests_info"].samples
    assert len(info) == 1 and info[0].value == 1 and info[0].labels["max_lora"] == "2", info


def test_openai_model_names_the_adapter(lora_stack, ferry_pb):
    with urllib.request.urlopen(lora_stack.http + "/v1/models", timeout=10) as r:
        models = json.loads(r.read())["data"]
    by_id = {m["id"]: m for m in models}
    assert set(by_id) == {"base", *ADAPTERS}
    for name in ADAPTERS:
        assert by_id[name]["parent"] == "base"
    assert "parent" not in by_id["base"]

    def complete(model):
        body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(lora_stack.http + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    import grpc

    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(lora_stack.gateway))
    out = complete("tenant-b")
    assert out["model"] == "tenant-b"
    assert out["choices"][0]["text"] != complete("base")["choices"][0]["text"]
    # The same reply the gRPC API gives under the adapter: the same tokens, detokenised.
    tokens = generate(stub, ferry_pb, "tenant-b")
    detok = json.loads(urllib.request.urlopen(urllib.request.Request(
        lora_stack.http + "/detokenize", data=json.dumps({"tokens": tokens}).encode(),
        headers={"Content-Type": "application/json"}), timeout=10).read())["prompt"]
    assert out["choices"][0]["text"] == detok

    try:
        complete("tenant-z")
        raise AssertionError("an unknown adapter was served")
    except urllib.error.HTTPError as e:
        assert e.code == 404
        error = json.loads(e.read())["error"]
        assert error["code"] == "model_not_found" and "tenant-z" in error["message"]
        assert "tenant-a" in error["message"], "the refusal lists what is served"
    assert complete("tenant-a")["model"] == "tenant-a"  # the next request is served


def test_grpc_unknown_adapter_is_refused_naming_it(lora_stack, ferry_pb):
    import grpc

    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(lora_stack.gateway))
    with pytest.raises(grpc.RpcError) as e:
        generate(stub, ferry_pb, "nobody")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "lora_name" in e.value.details() and "nobody" in e.value.details()
    assert len(generate(stub, ferry_pb, "tenant-c")) == 12


def test_the_worker_refuses_a_bad_adapter_at_start(tiny_model, tmp_path):
    worker = [str(binary("ferry-worker")), "--model", str(tiny_model), "--port", "0"]
    out = subprocess.run(worker + ["--enable-lora", "--lora-modules", f"x={tmp_path / 'missing'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "adapter_config.json" in out.stderr + out.stdout and "missing" in out.stderr + out.stdout
    out = subprocess.run(worker + ["--lora-modules", f"x={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--enable-lora" in out.stderr + out.stdout
    big = tmp_path / "big"
    subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(tiny_model), "--out", str(big),
                    "--lora-rank", "32"], check=True, capture_output=True)
    out = subprocess.run(worker + ["--enable-lora", "--lora-modules", f"big={big}", "--max-lora-rank", "16"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "r = 32 is above --max-lora-rank 16" in out.stderr + out.stdout


def test_a_tenants_adapters_are_not_anothers(tiny_model, tmp_path, ferry_pb):
    """A key file's `adapters` list: the tenant's own fine-tune is not usable, nor listed, for another
    tenant, whose refusal is the one an adapter that does not exist gets (404 model_not_found over
    HTTP, INVALID_ARGUMENT over gRPC), naming only what that tenant may use."""
    import hashlib

    import grpc

    modules = write_adapters(tiny_model, tmp_path)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"""tenants:
  - name: acme
    adapters: [tenant-a]
  - name: shop
    adapters: [tenant-b, tenant-c]
keys:
  - {{sha256: {hashlib.sha256(b"acme-key").hexdigest()}, tenant: acme}}
  - {{sha256: {hashlib.sha256(b"shop-key").hexdigest()}, tenant: shop}}
""")
    (tmp_path / "stack").mkdir()
    stack = Stack(tiny_model, tmp_path / "stack", ["--http-port", "0", "--served-model-name", "base",
                                                   f"--gateway-arg=--api-keys-file={keys}", "--enable-lora",
                                                   "--lora-modules", *modules, "--max-loras", "2"])
    try:
        def call(path, key, body=None):
            req = urllib.request.Request(stack.http + path, data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert {m["id"] for m in call("/v1/models", "acme-key")[1]["data"]} == {"base", "tenant-a"}
        assert {m["id"] for m in call("/v1/models", "shop-key")[1]["data"]} == {"base", "tenant-b", "tenant-c"}
        body = {"model": "tenant-b", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        status, out = call("/v1/completions", "acme-key", body)
        assert status == 404 and out["error"]["code"] == "model_not_found", out
        assert "tenant-b" in out["error"]["message"] and "tenant-c" not in out["error"]["message"]
        assert "tenant-a" in out["error"]["message"], "the refusal names what acme may use"
        status, out = call("/v1/completions", "shop-key", body)
        assert status == 200 and out["model"] == "tenant-b"
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(stack.gateway))
        req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=PROMPT), lora_name="tenant-c",
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=4))
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(req, metadata=[("authorization", "Bearer acme-key")], timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tenant-c" in e.value.details()
        assert len(stub.Generate(req, metadata=[("authorization", "Bearer shop-key")], timeout=60).token_ids) == 4
    finally:
        assert stack.stop() == 0, stack.log_text()
