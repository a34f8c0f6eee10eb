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
