"""The --backend sim worker behind the real gateway and scheduler: it sleeps
for the cost model's step time and returns tokens that depend only on each
sequence's own tokens, so batching cannot change them."""
import concurrent.futures as cf
import json

import grpc
import pytest

from conftest import REPO, Stack

PRESET = REPO / "scheduler" / "sim" / "presets" / "h200.json"


@pytest.fixture(scope="module")
def sim_stack(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("sim-stack"),
              ["--worker-arg=--backend=sim", f"--worker-arg=--cost-model={PRESET}",
               "--worker-arg=--sim-live-tokens=1000"])
    yield s
    assert s.stop() == 0


def test_sim_backend_serves_and_sleeps_the_model(sim_stack, ferry_pb):
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(sim_stack.gateway))
    fixed_s = json.loads(PRESET.read_text())["fixed_s"]

    def ask(prompt):
        req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
            max_tokens=40, ignore_eos=True))
        return stub.Generate(req, timeout=60)

    alone = [ask(f"sim prompt {i} " * (i + 1)) for i in range(8)]
    for r in alone:
        assert len(r.token_ids) == 40 and all(t < 1000 for t in r.token_ids)
        # 40 steps, each at least the model's fixed cost: the worker really sleeps.
        assert r.timings.total_s >= 40 * fixed_s
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(ask, [f"sim prompt {i} " * (i + 1) for i in range(8)]))
    assert [list(r.token_ids) for r in together] == [list(r.token_ids) for r in alone]


def test_overlapping_worker_serves_the_same_tokens(sim_stack, tiny_model, tmp_path, ferry_pb):
    """--sim-overlap: the worker submits step N+1 (sent early by the scheduler's async scheduling)
    while step N runs on the modelled device, as the GPU engine does. Same tokens, in order,
    under concurrency."""
    (tmp_path / "overlap").mkdir()
    overlapped = Stack(tiny_model, tmp_path / "overlap",
                       ["--worker-arg=--backend=sim", f"--worker-arg=--cost-model={PRESET}",
                        "--worker-arg=--sim-live-tokens=1000", "--worker-arg=--sim-overlap"])
    try:
        prompts = [f"overlap prompt {i} " * (i % 5 + 1) for i in range(12)]

        def ask_all(stack):
            stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(stack.gateway))

            def ask(prompt):
                req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
                    max_tokens=30, ignore_eos=True))
                return list(stub.Generate(req, timeout=60).token_ids)

            with cf.ThreadPoolExecutor(max_workers=6) as pool:
                return list(pool.map(ask, prompts))

        got, want = ask_all(overlapped), ask_all(sim_stack)
        assert all(len(t) == 30 for t in got)
        assert got == want
    finally:
        assert overlapped.stop() == 0
