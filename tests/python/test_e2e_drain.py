"""Health and drain: grpc.health.v1 reports SERVING on every service; on SIGTERM
the stack drains: 20 live streams all complete, new calls get UNAVAILABLE, and
every process exits 0."""
import concurrent.futures as cf
import signal
import time

import grpc
import pytest

from conftest import REPO, Stack


def health_status(address, service=""):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_health_reports_serving(stack):
    pytest.importorskip("grpc_health")
    from grpc_health.v1 import health_pb2

    worker = f"127.0.0.1:{stack.ports['workers'][0]['grpc_port']}"
    for address in (stack.gateway, stack.scheduler, worker):
        assert health_status(address) == health_pb2.HealthCheckResponse.SERVING, address


def test_reflection_lists_the_api(stack):
    pytest.importorskip("grpc_reflection")
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(stack.gateway))
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                          timeout=5)
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert "ferry.v1.Generation" in names and "grpc.health.v1.Health" in names


def test_sigterm_drains_live_streams(tiny_model, tmp_path, ferry_pb):
    s = Stack(tiny_model, tmp_path, [
        "--worker-arg=--backend=sim", f"--worker-arg=--cost-model={REPO / 'tests/fixtures/sim_20ms.json'}",
        "--worker-arg=--sim-live-tokens=1000"])
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))

    def stream(i):
        req = ferry_pb.gen.GenerateRequest(text=f"drain {i}".encode(), sampling=ferry_pb.gen.SamplingParams(
            max_tokens=60, ignore_eos=True))
        chunks = list(stub.GenerateStream(req, timeout=60))
        return chunks[-1].finish_reason, sum(len(c.token_ids) for c in chunks)

    with cf.ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit(stream, i) for i in range(20)]
        time.sleep(0.4)  # every stream is live (60 steps of 20 ms each)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as err:
            fresh = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
            fresh.Generate(ferry_pb.gen.GenerateRequest(text=b"late", sampling=ferry_pb.gen.SamplingParams(
                max_tokens=2)), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        results = [f.result() for f in futures]
    assert all(r == (ferry_pb.gen.FINISH_REASON_LENGTH, 60) for r in results), results
    assert s.proc.wait(timeout=60) == 0
    log = s.log_text()
    assert f"gateway (pid {s.ports['gateway']['pid']}) exited with code 0" in log, log
    assert f"scheduler (pid {s.ports['scheduler']['pid']}) exited with code 0" in log, log
    s.stop()


def test_sigterm_drains_http_streams_and_whole_requests(tiny_model, tmp_path):
    """The OpenAI HTTP front drains with the gRPC server: requests in flight finish (streams to
    [DONE] with every token), new ones get 503, /health 503, and the gateway exits 0."""
    import http.client
    import json

    s = Stack(tiny_model, tmp_path, [
        "--http-port", "0", "--worker-arg=--backend=sim",
        f"--worker-arg=--cost-model={REPO / 'tests/fixtures/sim_20ms.json'}", "--worker-arg=--sim-live-tokens=1000"])
    port = s.ports["gateway"]["http_port"]

    def post(body, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()

    def stream(i):
        status, text = post({"prompt": f"drain {i}", "max_tokens": 60, "ignore_eos": True, "stream": True,
                             "stream_options": {"include_usage": True}})
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        usage = json.loads(events[-2])["usage"]["completion_tokens"] if len(events) >= 2 else None
        return status, events[-1] if events else None, usage

    def whole(i):
        status, text = post({"prompt": f"whole {i}", "max_tokens": 60, "ignore_eos": True})
        return status, json.loads(text)["usage"]["completion_tokens"] if status == 200 else text

    with cf.ThreadPoolExecutor(max_workers=12) as pool:
        streams = [pool.submit(stream, i) for i in range(8)]
        wholes = [pool.submit(whole, i) for i in range(4)]
        time.sleep(0.4)  # all live: 60 steps of 20 ms each
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late_status, late = post({"prompt": "late", "max_tokens": 2}, timeout=10)
        assert late_status == 503 and "shutting down" in late, late
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 503
        assert [f.result() for f in streams] == [(200, "[DONE]", 60)] * 8
        assert [f.result() for f in wholes] == [(200, 60)] * 4
    assert s.proc.wait(timeout=60) == 0
    log = s.log_text()
    assert f"gateway (pid {s.ports['gateway']['pid']}) exited with code 0" in log, log
    s.stop()


def test_http_streams_past_the_drain_grace_are_cancelled(tiny_model, tmp_path):
    """A stream that outlasts --drain-grace-s ends with an error event and [DONE], not a cut
    connection, and the gateway still exits 0."""
    import http.client
    import json

    s = Stack(tiny_model, tmp_path, [
        "--http-port", "0", "--gateway-arg=--drain-grace-s=1", "--worker-arg=--backend=sim",
        f"--worker-arg=--cost-model={REPO / 'tests/fixtures/sim_20ms.json'}", "--worker-arg=--sim-live-tokens=1000"])
    conn = http.client.HTTPConnection("127.0.0.1", s.ports["gateway"]["http_port"], timeout=60)
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"prompt": "long", "max_tokens": 1000, "ignore_eos": True, "stream": True}))
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")  # live: 1,000 steps of 20 ms to go
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    events = [line[6:].strip() for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert time.time() - start < 15
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2]), events[-3:]
    assert s.proc.wait(timeout=60) == 0
    assert f"gateway (pid {s.ports['gateway']['pid']}) exited with code 0" in s.log_text()
    s.stop()
