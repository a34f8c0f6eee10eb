"""LoRA adapters loaded and unloaded while the stack serves (issue #57): vLLM's
POST /v1/load_lora_adapter and /v1/unload_lora_adapter and the gRPC ferry.v1.LoraAdapters service,
admin keys only, over a tensor-parallel pair of workers (every rank loads, all or none keep it).
Under a steady load of requests on the base model, a start adapter and a run-time one, the run-time
one is unloaded, reloaded with other weights, unloaded and loaded back: no request on the base or
the start adapter fails or changes, a request under the run-time name gets exactly the tokens of the
weights served when it was accepted (never a mix, never another adapter's), and one sent while the
name is not served is refused as an unknown model."""
import hashlib
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import Stack, binary

PROMPT = list(range(60, 60 + 29))
MAX_TOKENS = 16


def make_adapter(tiny_model, out, seed, rank=4, targets="all-linear"):
    subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(tiny_model), "--out", str(out),
                    "--lora-rank", str(rank), "--lora-targets", targets, "--seed", str(seed)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def runtime_stack(tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora-runtime")
    dirs = {name: make_adapter(tiny_model, run / name, seed) for name, seed in
            (("start", 31), ("w1", 32), ("w2", 33))}
    dirs["rank64"] = make_adapter(tiny_model, run / "rank64", 34, rank=64)
    keys = run / "keys.yaml"
    keys.write_text(f"""tenants:
  - name: ops
    admin: true
  - name: acme
    adapters: [start]
keys:
  - {{sha256: {hashlib.sha256(b"ops-key").hexdigest()}, tenant: ops}}
  - {{sha256: {hashlib.sha256(b"acme-key").hexdigest()}, tenant: acme}}
""")
    (run / "stack").mkdir()
    stack = Stack(tiny_model, run / "stack", ["--http-port", "0", "--served-model-name", "base",
                                              "--tensor-parallel-size", "2", f"--gateway-arg=--api-keys-file={keys}",
                                              "--enable-lora", "--lora-modules", f"start={dirs['start']}",
                                              "--max-loras", "2", "--max-lora-rank", "16",
                                              "--max-num-batched-tokens", "64"])
    yield stack, dirs
    assert stack.stop() == 0, stack.log_text()


def http(stack, path, key, body=None):
    req = urllib.request.Request(stack.http + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def load(stack, name, path, key="ops-key"):
    return http(stack, "/v1/load_lora_adapter", key, {"lora_name": name, "lora_path": str(path)})


def unload(stack, name, key="ops-key"):
    return http(stack, "/v1/unload_lora_adapter", key, {"lora_name": name})


def generate(stub, ferry_pb, lora):
    req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=PROMPT), lora_name=lora,
                                       sampling=ferry_pb.gen.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                                            ignore_eos=True))
    return tuple(stub.Generate(req, metadata=[("authorization", "Bearer ops-key")], timeout=120).token_ids)


def test_admin_only_and_bad_adapters_are_refused_naming_them(runtime_stack, ferry_pb, tmp_path):
    import grpc

    stack, dirs = runtime_stack
    status, text = load(stack, "x", dirs["w1"], key="acme-key")
    assert status == 403 and "admin" in text, text
    status, text = load(stack, "x", dirs["w1"], key="wrong-key")
    assert status == 401, text
    status, text = load(stack, "x", tmp_path / "missing")
    assert status == 400 and "missing" in text and "adapter_config.json" in text, text
    status, text = load(stack, "x", dirs["rank64"])
    assert status == 400 and "r = 64 is above --max-lora-rank 16" in text, text
    status, text = load(stack, "has space", dirs["w1"])
    assert status == 400 and "lora_name" in text, text
    status, text = http(stack, "/v1/load_lora_adapter", "ops-key", {"lora_name": "x"})
    assert status == 400 and "lora_path is required" in text, text
    status, text = load(stack, "start", dirs["w1"])
    assert status == 400 and "already loaded" in text, text
    status, text = unload(stack, "nobody")
    assert status == 404 and "nobody" in text, text
    # Nothing was loaded half-way: the models are the base and the start adapter.
    status, text = http(stack, "/v1/models", "ops-key")
    assert {m["id"] for m in json.loads(text)["data"]} == {"base", "start"}

    admin = ferry_pb.lora_grpc.LoraAdaptersStub(grpc.insecure_channel(stack.gateway))
    with pytest.raises(grpc.RpcError) as e:
        admin.Load(ferry_pb.lora.LoadLoraAdapterRequest(lora_name="g", lora_path=str(dirs["w1"])),
                   metadata=[("authorization", "Bearer acme-key")], timeout=60)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        admin.Unload(ferry_pb.lora.UnloadLoraAdapterRequest(lora_name="g"),
                     metadata=[("authorization", "Bearer ops-key")], timeout=60)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "g" in e.value.details()


def test_load_use_unload_and_reload_under_load(runtime_stack, ferry_pb):
    import grpc

    stack, dirs = runtime_stack
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(stack.gateway))
    admin = ferry_pb.lora_grpc.LoraAdaptersStub(grpc.insecure_channel(stack.gateway))
    ops = [("authorization", "Bearer ops-key")]
    # The weights' own replies, each loaded under a name of its own (gRPC for one, HTTP for the other).
    out = admin.Load(ferry_pb.lora.LoadLoraAdapterRequest(lora_name="ref-w2", lora_path=str(dirs["w2"])),
                     metadata=ops, timeout=120)
    assert "ref-w2" in out.lora_names
    assert load(stack, "x", dirs["w1"]) == (200, "Success: LoRA adapter 'x' added successfully.")
    status, text = http(stack, "/v1/models", "ops-key")
    assert {m["id"]: m.get("parent") for m in json.loads(text)["data"]} == {
        "base": None, "start": "base", "x": "base", "ref-w2": "base"}
    # A tenant limited to its own adapters does not get the new one: 404 naming it.
    status, text = http(stack, "/v1/completions", "acme-key", {"model": "x", "prompt": PROMPT, "max_tokens": 2})
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found" and "x" in text, text
    ref = {"": generate(stub, ferry_pb, ""), "start": generate(stub, ferry_pb, "start"),
           "w1": generate(stub, ferry_pb, "x"), "w2": generate(stub, ferry_pb, "ref-w2")}
    assert len(set(ref.values())) == 4, "every set of weights shows in its tokens"
    admin.Unload(ferry_pb.lora.UnloadLoraAdapterRequest(lora_name="ref-w2"), metadata=ops, timeout=60)

    # The steady load: base, start and x, each request timed against the changes to x.
    results, stop = [], threading.Event()
    lock = threading.Lock()

    def client(names):
        while not stop.is_set():
            for name in names:
                sent = time.monotonic()
                try:
                    tokens, code = generate(stub, ferry_pb, name), "OK"
                except grpc.RpcError as e:
                    tokens, code = None, (e.code().name, e.details())
                with lock:
                    results.append((name, sent, time.monotonic(), tokens, code))

    threads = [threading.Thread(target=client, args=(names,)) for names in
               (["", "x"], ["x", "start"], ["start", "x", ""], ["x"])]
    for t in threads:
        t.start()
    changes = []  # (what x serves from now on, when the call began, when it returned)

    def change(serving, call):
        begun = time.monotonic()
        status, text = call()
        assert status == 200, text
        changes.append((serving, begun, time.monotonic()))
        time.sleep(1.5)

    try:
        time.sleep(1.5)
        change(None, lambda: unload(stack, "x"))
        change("w2", lambda: load(stack, "x", dirs["w2"]))  # the reload: new weights under the name
        change(None, lambda: unload(stack, "x"))
        change("w1", lambda: load(stack, "x", dirs["w1"]))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)

    margin = 0.3  # a request reaches the gateway's check some time after it is sent

    def serving_at(t):  # what x served at time t, when no change was under way
        serving = "w1"
        for what, begun, done in changes:
            if begun - margin <= t <= done + margin:
                return "changing"
            if done < t:
                serving = what
        return serving

    by_state = {}
    for name, sent, ended, tokens, code in results:
        if name != "x":
            assert code == "OK" and tokens == ref[name], (name, code)
            continue
        if code == "OK":
            # Exactly one set of weights' reply, never a mix or another adapter's.
            assert tokens in (ref["w1"], ref["w2"]), tokens
        else:
            # Refused only as an unknown model (the gateway's catalog, or the replica's between them).
            assert code[0] in ("INVALID_ARGUMENT", "NOT_FOUND") and "x" in code[1], code
        state = serving_at(sent)
        if state == "changing":
            continue
        by_state.setdefault(state, []).append(code if code != "OK" else tokens)
        if state is None:
            assert code != "OK", "served while unloaded"
        else:
            assert code == "OK" and tokens == ref[state], (state, code)
    # Each state saw requests: the load was on throughout.
    assert {None, "w1", "w2"} <= set(by_state), {k: len(v) for k, v in by_state.items()}
    assert sum(1 for r in results if r[0] != "x") >= 10
    status, text = http(stack, "/v1/models", "ops-key")
    assert {m["id"] for m in json.loads(text)["data"]} == {"base", "start", "x"}
