"""Tenants, API keys and rate limits through the real stack: the gateway reads a keys file
(--api-keys-file, passed with ferry-launch --gateway-arg) and answers UNAUTHENTICATED,
PERMISSION_DENIED and RESOURCE_EXHAUSTED (+ grpc-retry-pushback-ms) before running anything;
the OpenAI-compatible HTTP front answers 401, 403 and 429 (+ Retry-After) for the same cases."""
import hashlib
import secrets
import subprocess

import grpc
import pytest

from conftest import Stack, binary

KEYS = {tenant: "fk-" + secrets.token_hex(16) for tenant in ("acme", "limited", "free")}


def hash_key(key: str) -> str:
    """The keys file's hash, by the ferry-hash-key tool (checked against hashlib)."""
    out = subprocess.run([str(binary("ferry-hash-key"))], input=key.encode(), check=True,
                         capture_output=True).stdout.decode().strip()
    assert out == hashlib.sha256(key.encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def auth_stack(tiny_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("auth-stack")
    keys_file = run_dir / "keys.yaml"
    keys_file.write_text(f"""
tenants:
  - name: acme
    lanes: [interactive]
  - name: limited
    requests_per_second: 0.2
    burst: 1
  - name: free
keys:
  - {{sha256: {hash_key(KEYS['acme'])}, tenant: acme}}
  - {{sha256: {hash_key(KEYS['limited'])}, tenant: limited}}
  - {{sha256: {hash_key(KEYS['free'])}, tenant: free}}
""")
    s = Stack(tiny_model, run_dir, extra_args=[f"--gateway-arg=--api-keys-file={keys_file}", "--log-level", "debug",
                                               "--http-port", "0", "--served-model-name", "tiny"])
    yield s
    s.stop()


@pytest.fixture()
def stub(auth_stack, ferry_pb):
    channel = grpc.insecure_channel(auth_stack.gateway)
    yield ferry_pb.gen_grpc.GenerationStub(channel)
    channel.close()


def request(pb, lane=""):
    return pb.gen.GenerateRequest(text=b"hello world", lane=lane,
                                  sampling=pb.gen.SamplingParams(max_tokens=4, temperature=0.0))


def bearer(key):
    return [("authorization", f"Bearer {key}")]


def call_code(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_missing_or_wrong_key_is_unauthenticated(stub, ferry_pb):
    assert call_code(stub.Generate, request(ferry_pb), timeout=30) == grpc.StatusCode.UNAUTHENTICATED
    wrong = "fk-" + secrets.token_hex(16)
    assert call_code(stub.Generate, request(ferry_pb), metadata=bearer(wrong),
                     timeout=30) == grpc.StatusCode.UNAUTHENTICATED
    assert call_code(stub.Generate, request(ferry_pb), metadata=[("authorization", KEYS["free"])],
                     timeout=30) == grpc.StatusCode.UNAUTHENTICATED  # not a bearer token
    # Streaming is guarded the same way.
    with pytest.raises(grpc.RpcError) as e:
        list(stub.GenerateStream(request(ferry_pb), timeout=30))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_valid_key_works(stub, ferry_pb):
    resp = stub.Generate(request(ferry_pb, lane="batch"), metadata=bearer(KEYS["free"]), timeout=60)
    assert resp.usage.completion_tokens == 4
    chunks = list(stub.GenerateStream(request(ferry_pb), metadata=bearer(KEYS["acme"]), timeout=60))
    assert sum(len(c.token_ids) for c in chunks) == 4


def test_lane_not_allowed_is_permission_denied(stub, ferry_pb):
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(request(ferry_pb, lane="batch"), metadata=bearer(KEYS["acme"]), timeout=30)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "batch" in e.value.details()
    # The default lane (interactive) is allowed.
    stub.Generate(request(ferry_pb), metadata=bearer(KEYS["acme"]), timeout=60)


def test_over_the_rate_is_resource_exhausted_with_pushback(stub, ferry_pb):
    stub.Generate(request(ferry_pb), metadata=bearer(KEYS["limited"]), timeout=60)  # the burst of 1
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(request(ferry_pb), metadata=bearer(KEYS["limited"]), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(e.value.trailing_metadata())
    pushback_ms = int(trailers["grpc-retry-pushback-ms"])
    assert 0 < pushback_ms <= 5000  # 0.2 requests per second
    # Other tenants are not limited by it.
    stub.Generate(request(ferry_pb), metadata=bearer(KEYS["free"]), timeout=60)


def test_refusals_are_counted_by_reason(auth_stack, stub, ferry_pb):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def rejections():
        text = urllib.request.urlopen(auth_stack.metrics_urls()["gateway"], timeout=5).read().decode()
        return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "ferry_gateway_rejections" for s in f.samples if s.name.endswith("_total")}

    before = rejections()
    with pytest.raises(grpc.RpcError):
        stub.Generate(request(ferry_pb), metadata=bearer("not-a-key"), timeout=30)
    with pytest.raises(grpc.RpcError):  # the limited tenant's burst is 1 at 0.2 requests/s
        for _ in range(2):
            stub.Generate(request(ferry_pb), metadata=bearer(KEYS["limited"]), timeout=60)
    after = rejections()
    assert after["auth"] == before["auth"] + 1, (before, after)
    assert after["rate_limit"] >= before["rate_limit"] + 1, (before, after)


def http_post(stack, body, key=None, lane=None):
    """(status, headers, json body) of POST /v1/completions."""
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if lane:
        headers["X-Ferry-Lane"] = lane
    req = urllib.request.Request(stack.http + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_http_front_answers_401_403_429(auth_stack):
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 4, "temperature": 0}
    status, _, err = http_post(auth_stack, body)
    assert status == 401 and err["error"]["type"] == "authentication_error", err
    status, _, err = http_post(auth_stack, body, key="fk-" + secrets.token_hex(16))
    assert status == 401, err
    status, _, err = http_post(auth_stack, body, key=KEYS["acme"], lane="batch")
    assert status == 403 and "batch" in err["error"]["message"], err
    status, _, ok = http_post(auth_stack, body, key=KEYS["acme"])
    assert status == 200 and ok["usage"]["completion_tokens"] == 4, ok
    # The limited tenant: a burst of 1 at 0.2 requests/s, so two calls in a row meet the limit
    # (the first may already, if an earlier test spent the burst moments ago).
    answers = [http_post(auth_stack, body, key=KEYS["limited"]) for _ in range(2)]
    limited = [a for a in answers if a[0] == 429]
    assert limited, answers
    status, headers, err = limited[0]
    assert err["error"]["type"] == "rate_limit_error" or "rate" in err["error"]["message"], err
    assert 1 <= int(headers["Retry-After"]) <= 5, headers


def test_http_models_and_tokenizer_need_a_key(auth_stack):
    """As vLLM with --api-key: every endpoint but /health answers 401 without a valid key."""
    import httpx

    for key, expected in ((None, 401), ("fk-" + secrets.token_hex(16), 401), (KEYS["acme"], 200)):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.get(auth_stack.http + "/v1/models", headers=headers).status_code == expected
        r = httpx.post(auth_stack.http + "/tokenize", json={"prompt": "hi"}, headers=headers)
        assert r.status_code == expected, r.text
        r = httpx.post(auth_stack.http + "/detokenize", json={"tokens": [1]}, headers=headers)
        assert r.status_code == expected, r.text
    assert httpx.get(auth_stack.http + "/health").status_code == 200


def test_stored_responses_are_their_tenants(auth_stack):
    """/v1/responses needs a key; a stored response is read, continued and deleted only by its tenant
    (another's gets 404, as for one that does not exist)."""
    import httpx

    def call(method, path, key, **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, auth_stack.http + path, headers=headers, timeout=60, **kw)

    body = {"model": "tiny", "input": "hello", "max_output_tokens": 2}
    assert call("POST", "/v1/responses", None, json=body).status_code == 401
    r = call("POST", "/v1/responses", KEYS["acme"], json=body)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    assert call("GET", f"/v1/responses/{rid}", KEYS["acme"]).json()["id"] == rid
    assert call("GET", f"/v1/responses/{rid}", None).status_code == 401
    assert call("GET", f"/v1/responses/{rid}", KEYS["free"]).status_code == 404
    assert call("DELETE", f"/v1/responses/{rid}", KEYS["free"]).status_code == 404
    r = call("POST", "/v1/responses", KEYS["free"], json={**body, "previous_response_id": rid})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id", r.text
    assert call("DELETE", f"/v1/responses/{rid}", KEYS["acme"]).json()["deleted"] is True
    assert call("GET", f"/v1/responses/{rid}", KEYS["acme"]).status_code == 404


def test_no_key_in_any_log_line(auth_stack, stub, ferry_pb):
    # One more of each outcome, then read every service's log (ferry-launch gathers them).
    for key in KEYS.values():
        call_code(stub.Generate, request(ferry_pb, lane="batch"), metadata=bearer(key), timeout=60)
    call_code(stub.Generate, request(ferry_pb), metadata=bearer("fk-not-a-key-0123456789"), timeout=30)
    assert auth_stack.stop() == 0
    logs = auth_stack.log_path.read_text(errors="replace")
    for f in auth_stack.ready_file.parent.glob("*.log"):
        logs += f.read_text(errors="replace")
    assert "refused request tenant=-" in logs  # the gateway's lines are in what was read
    for key in list(KEYS.values()) + ["fk-not-a-key-0123456789"]:
        assert key not in logs
        assert key[3:] not in logs
