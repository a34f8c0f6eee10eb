"""The KV cache at 100% through the real stack (#29): a worker with 24 KV blocks (384 tokens) and 16
concurrent requests that need about ten times that. Requests wait or are preempted and recomputed;
none fails, each returns the tokens it returns on a stack with room to spare (greedy and seeded),
and the pool is empty again afterwards. A request that could never fit is refused at admission,
naming the pool's size."""
import grpc
import pytest

from conftest import Stack
from faults import requests_mix, run_streams, scrape

NUM_BLOCKS = 24


@pytest.fixture(scope="module")
def small_kv(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("kv-full"), [f"--worker-arg=--num-kv-blocks={NUM_BLOCKS}"])
    yield s
    assert s.stop() == 0, s.log_text()


def test_a_full_cache_preempts_or_waits_and_changes_no_token(stack, small_kv, ferry_pb):
    requests = requests_mix(ferry_pb, 8, 8, max_tokens=96)
    expected = run_streams(stack.gateway, ferry_pb, requests)
    metrics = small_kv.ports["scheduler"]["metrics_port"]
    before = scrape(metrics).get("ferry_scheduler_preemptions_total", 0)
    got = run_streams(small_kv.gateway, ferry_pb, requests)
    for rid, (tokens, reason, code, details, _) in got.items():
        assert code == grpc.StatusCode.OK, (rid, code, details)
        assert (tokens, reason) == expected[rid][:2], rid
    after = scrape(metrics)
    assert after["ferry_scheduler_preemptions_total"] > before, "the cache never filled: the test tests nothing"
    assert after["ferry_scheduler_kv_cache_usage_ratio"] == 0.0  # every block back once all ended


def test_a_request_that_can_never_fit_is_refused_naming_the_limit(small_kv, ferry_pb):
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(small_kv.gateway))
    # 400 prompt tokens + 10 to generate: 26 blocks of 16, more than the pool holds.
    req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=[100 + i % 500 for i in range(400)]),
                                       sampling=ferry_pb.gen.SamplingParams(max_tokens=10, ignore_eos=True))
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(req, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert f"num_kv_blocks = {NUM_BLOCKS}" in e.value.details(), e.value.details()
    # The next request is served.
    ok = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=[100, 101, 102]),
                                      sampling=ferry_pb.gen.SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(stub.Generate(ok, timeout=60).token_ids) == 4


def test_an_oversized_message_is_refused_naming_the_limit(small_kv, ferry_pb):
    """A client message over the gateway's 64 MiB receive limit: RESOURCE_EXHAUSTED naming the limit,
    and the gateway serves the next request. (Internal hops stay under their limits by construction:
    the gateway cuts session writes at 2 MB, the scheduler's steps send at most max_step_sent_tokens.)"""
    channel = grpc.insecure_channel(small_kv.gateway, options=[("grpc.max_send_message_length", 128 << 20)])
    stub = ferry_pb.gen_grpc.GenerationStub(channel)
    huge = ferry_pb.gen.GenerateRequest(text=b"a" * (65 << 20), sampling=ferry_pb.gen.SamplingParams(max_tokens=1))
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(huge, timeout=60)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert str(64 << 20) in e.value.details(), e.value.details()
    ok = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=[100, 101, 102]),
                                      sampling=ferry_pb.gen.SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(stub.Generate(ok, timeout=60).token_ids) == 4
