"""Sampling options through the whole stack: logprobs, seeded sampling with
penalties and min-p under different batch mixes, and generation_config.json
defaults honoured when a request leaves a field unset."""
import concurrent.futures as cf
import json
import math
import shutil

import grpc
import pytest

from conftest import Stack


def gen(stub, pb, prompt, **sampling):
    sampling.setdefault("max_tokens", 12)
    sampling.setdefault("ignore_eos", True)
    req = pb.gen.GenerateRequest(text=prompt.encode(), sampling=pb.gen.SamplingParams(**sampling))
    return stub.Generate(req, timeout=60)


def test_logprobs_are_consistent(gen_stub, ferry_pb):
    resp = gen(gen_stub, ferry_pb, "logprobs please", temperature=0.0, logprobs=20)
    assert len(resp.logprobs) == len(resp.token_ids) == 12
    for tok, lp in zip(resp.token_ids, resp.logprobs):
        assert lp.token_id == tok
        assert len(lp.top) == 20
        # Greedy: the sampled token is the most likely one.
        assert lp.top[0].token_id == tok and abs(lp.top[0].logprob - lp.logprob) < 1e-6
        values = [t.logprob for t in lp.top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-4
    zero = gen(gen_stub, ferry_pb, "logprobs please", temperature=0.0, logprobs=0)
    assert all(len(lp.top) == 0 for lp in zero.logprobs) and len(zero.logprobs) == 12
    none = gen(gen_stub, ferry_pb, "logprobs please", temperature=0.0)
    assert len(none.logprobs) == 0


def test_allowed_token_ids_are_all_that_is_sampled(gen_stub, ferry_pb):
    """vLLM's allowed_token_ids: greedy or sampled, only those ids come out; with guided, refused."""
    plain = gen(gen_stub, ferry_pb, "allowed ids", temperature=0.0)
    allowed = [9, 400, 1234, 1777]
    assert not set(plain.token_ids) <= set(allowed)
    for temperature in (0.0, 1.5):
        r = gen(gen_stub, ferry_pb, "allowed ids", temperature=temperature, seed=3, allowed_token_ids=allowed)
        assert len(r.token_ids) == 12 and set(r.token_ids) <= set(allowed), r.token_ids
    for sampling, says in (({"allowed_token_ids": [5, 1 << 20]}, "sampling.allowed_token_ids[1] = 1048576"),
                           ({"allowed_token_ids": [5], "guided": {"json_object": True}},
                            "cannot both be set")):
        with pytest.raises(grpc.RpcError) as err:
            gen(gen_stub, ferry_pb, "x", **sampling)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.value.details(), err.value.details()


def test_seeded_penalised_sampling_is_batch_invariant(gen_stub, ferry_pb):
    opts = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, presence_penalty=0.5,
                frequency_penalty=0.3, repetition_penalty=1.1, seed=77, max_tokens=20)
    alone = list(gen(gen_stub, ferry_pb, "seeded with penalties", **opts).token_ids)
    others = ["filler prompt number %d " % i * (i + 1) for i in range(7)]
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        futs = [pool.submit(gen, gen_stub, ferry_pb, "seeded with penalties", **opts)]
        futs += [pool.submit(gen, gen_stub, ferry_pb, p, temperature=1.0, seed=i + 1) for i, p in enumerate(others)]
        together = list(futs[0].result().token_ids)
        for f in futs[1:]:
            f.result()
    assert together == alone


def test_repetition_penalty_changes_greedy_output(gen_stub, ferry_pb):
    plain = list(gen(gen_stub, ferry_pb, "repeat repeat repeat", temperature=0.0, max_tokens=24).token_ids)
    penalised = list(gen(gen_stub, ferry_pb, "repeat repeat repeat", temperature=0.0, max_tokens=24,
                         frequency_penalty=2.0).token_ids)
    # A strong frequency penalty forbids the loops random greedy models fall into.
    assert len(set(penalised)) > len(set(plain)) or penalised != plain


@pytest.fixture(scope="module")
def sampling_model(tiny_model, tmp_path_factory):
    dst = tmp_path_factory.mktemp("sampling-model") / "model"
    shutil.copytree(tiny_model, dst)
    cfg = json.loads((dst / "generation_config.json").read_text())
    cfg.update({"do_sample": True, "temperature": 1.3, "top_k": 50, "top_p": 0.95})
    (dst / "generation_config.json").write_text(json.dumps(cfg))
    return dst


def test_generation_config_defaults(sampling_model, tmp_path_factory, ferry_pb):
    s = Stack(sampling_model, tmp_path_factory.mktemp("defaults-stack"))
    try:
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        greedy = list(gen(stub, ferry_pb, "defaults", temperature=0.0).token_ids)
        # Unset temperature: the model's default (1.3, sampling) applies, so seeds matter.
        sampled = {tuple(gen(stub, ferry_pb, "defaults", seed=seed).token_ids) for seed in (1, 2, 3, 4)}
        assert len(sampled) > 1
        assert any(list(t) != greedy for t in sampled)
        # Explicit temperature 0 wins over the default: greedy again.
        assert list(gen(stub, ferry_pb, "defaults", temperature=0.0).token_ids) == greedy
    finally:
        assert s.stop() == 0
