"""Tensor parallelism over Gloo with real processes: a TP=2 stack returns the
same greedy tokens as TP=1 for 16 concurrent requests, and the same
log-probabilities (log-softmax of the logits) within 1e-4, on the exact fp32 path."""
import concurrent.futures as cf

import grpc
import pytest

from conftest import Stack

PROMPTS = [f"request {i}: " + "tensor parallel " * (1 + 3 * i) for i in range(16)]


@pytest.fixture(scope="module")
def stacks(tiny_model, tmp_path_factory, ferry_pb):
    started = {}
    try:
        for tp in (1, 2):
            started[tp] = Stack(tiny_model, tmp_path_factory.mktemp(f"tp{tp}"),
                                ["--tensor-parallel-size", str(tp), "--worker-arg=--dtype=float32"])
        yield started
    finally:
        for s in started.values():
            s.stop()


def run_all(stack, pb):
    channel = grpc.insecure_channel(stack.gateway)
    stub = pb.gen_grpc.GenerationStub(channel)

    def one(prompt):
        req = pb.gen.GenerateRequest(text=prompt.encode(), sampling=pb.gen.SamplingParams(
            max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=5))
        return stub.Generate(req, timeout=120)

    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        out = list(pool.map(one, PROMPTS))
    channel.close()
    return out


def test_tp2_equals_tp1(stacks, ferry_pb):
    assert len(stacks[2].ports["workers"]) == 2
    one = run_all(stacks[1], ferry_pb)
    two = run_all(stacks[2], ferry_pb)
    for i, (a, b) in enumerate(zip(one, two)):
        assert list(a.token_ids) == list(b.token_ids), f"request {i}"
        assert len(a.logprobs) == len(b.logprobs) == 16
        for pos, (la, lb) in enumerate(zip(a.logprobs, b.logprobs)):
            assert abs(la.logprob - lb.logprob) < 1e-4, (i, pos, la.logprob, lb.logprob)
            assert [t.token_id for t in la.top] == [t.token_id for t in lb.top], (i, pos)
            for ta, tb in zip(la.top, lb.top):
                assert abs(ta.logprob - tb.logprob) < 1e-4, (i, pos, ta.token_id)
