"""Speculative decoding (prompt lookup) through the whole stack: the worker's --speculative-config
default and the per-request override give exactly the tokens of plain decoding, greedy and seeded,
alone and batched with prefix caching on; drafts are accepted (the worker's metrics say how many);
bad values are refused naming the field; a backend without drafts refuses a request that asks."""
import json
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, Stack, binary

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
# Prompts that repeat a passage (copying is what prompt lookup feeds on), and some that do not.
PASSAGE = list(range(40, 71))
PROMPTS = [PASSAGE + PASSAGE[:n] for n in (3, 9, 20)] + [list(range(5, 5 + n)) for n in (6, 33)]
PREFIXED = [PASSAGE * 2 + [7, n] for n in range(3)]  # share whole blocks: the prefix cache serves them


def generate(stub, pb, ids, speculative=None, max_tokens=40, **sampling):
    params = pb.gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    if speculative is not None:
        params.speculative.CopyFrom(speculative)
    req = pb.gen.GenerateRequest(token_ids=pb.gen.TokenIds(ids=ids), sampling=params)
    return list(stub.Generate(req, timeout=120).token_ids)


def spec_counts(stack):
    text = urllib.request.urlopen(stack.metrics_urls()["worker-0"], timeout=5).read().decode()
    counts = {}
    for family in text_string_to_metric_families(text):
        if family.name == "ferry_worker_spec_decode_tokens":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["kind"]] = sample.value
    return counts


@pytest.fixture(scope="module")
def spec_stack(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("spec"),
              ["--speculative-config", NGRAM, "--enable-prefix-caching", "--max-num-batched-tokens", "48"])
    yield s
    assert s.stop() == 0, s.log_text()


def test_tokens_equal_plain_decoding_alone_and_batched(spec_stack, ferry_pb):
    cmdline = open(f"/proc/{spec_stack.ports['workers'][0]['pid']}/cmdline").read().split("\0")
    assert f"--speculative-config={NGRAM}" in cmdline
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(spec_stack.gateway))
    off = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NONE)
    prompts = PROMPTS + PREFIXED
    plain = [generate(stub, ferry_pb, p, off) for p in prompts]
    before = spec_counts(spec_stack)
    alone = [generate(stub, ferry_pb, p) for p in prompts]  # the server's default: ngram, 4
    assert alone == plain
    # Together, speculating and plain requests share steps, prefills chunked at 48 tokens.
    with ThreadPoolExecutor(len(prompts) * 2) as pool:
        mixed = list(pool.map(lambda i: generate(stub, ferry_pb, prompts[i % len(prompts)], None if i % 2 else off),
                              range(len(prompts) * 2)))
    assert mixed == plain * 2
    after = spec_counts(spec_stack)
    accepted = after["accepted"] - before["accepted"]
    drafted = after["draft"] - before["draft"]
    assert 0 < accepted < drafted, (accepted, drafted)
    assert after["drafts"] > before["drafts"]


def test_seeded_sampling_equal_plain_and_per_request_count(spec_stack, ferry_pb):
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(spec_stack.gateway))
    sampling = dict(temperature=0.8, top_p=0.9, seed=42)
    off = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NONE)
    many = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NGRAM, num_speculative_tokens=15)
    before = spec_counts(spec_stack)
    for p in PROMPTS:
        plain = generate(stub, ferry_pb, p, off, **sampling)
        assert generate(stub, ferry_pb, p, **sampling) == plain
        assert generate(stub, ferry_pb, p, many, **sampling) == plain
    after = spec_counts(spec_stack)
    # Speculation did something under sampling: drafts were made and some accepted (issue #53: this test
    # passed with speculation doing nothing).
    assert after["draft"] > before["draft"], (before, after)
    assert after["accepted"] > before["accepted"], (before, after)


def test_seeded_requests_batched_with_distinct_seeds_equal_each_decoded_alone(spec_stack, ferry_pb):
    """A mixed batch: every request its own seed, half speculating, all at once; each equals itself decoded
    alone without speculation (issue #53: seeded top-p was compared only at the same batch composition)."""
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(spec_stack.gateway))
    off = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NONE)
    prompts = PROMPTS + PREFIXED
    cases = [(prompts[i % len(prompts)], 100 + i, None if i % 2 else off) for i in range(2 * len(prompts))]
    alone = [generate(stub, ferry_pb, p, off, temperature=0.8, top_p=0.9, seed=seed) for p, seed, _ in cases]
    before = spec_counts(spec_stack)
    with ThreadPoolExecutor(len(cases)) as pool:
        batched = list(pool.map(lambda c: generate(stub, ferry_pb, c[0], c[2], temperature=0.8, top_p=0.9,
                                                   seed=c[1]), cases))
    assert batched == alone
    assert spec_counts(spec_stack)["accepted"] > before["accepted"]


def test_bad_values_are_refused_naming_the_field(spec_stack, ferry_pb):
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(spec_stack.gateway))
    for spec, message in [
        (ferry_pb.gen.SpeculativeDecoding(num_speculative_tokens=16),
         "sampling.speculative.num_speculative_tokens = 16 must be in [0, 15]"),
        # A value the enum lacks (a newer client's): refused by name at the gateway.
        (ferry_pb.gen.SpeculativeDecoding(method=9),
         "sampling.speculative.method = 9 is not a SpeculativeMethod (DEFAULT, NONE, NGRAM, DRAFT_MODEL)"),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            generate(stub, ferry_pb, PROMPTS[0], spec)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in e.value.details()
    # The next request is served.
    assert len(generate(stub, ferry_pb, PROMPTS[0])) == 40


def test_bad_config_is_refused_at_start(tiny_model):
    for config, message in [
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 16}', "num_speculative_tokens = 16 must be in [1, 15]"),
        ('{"method": "ngram", "model": "/tmp/x", "num_speculative_tokens": 4}', "model is for method draft_model"),
        ('{"method": "draft_model", "num_speculative_tokens": 4}', "model (the draft checkpoint's directory) is required"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1}',
         "field 'draft_tensor_parallel_size' is not supported"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
         "prompt_lookup_min = 5 must be in [1, 3]"),
        ("ngram", "not JSON"),
    ]:
        out = subprocess.run([str(binary("ferry-worker")), "--model", str(tiny_model), "--port", "0",
                              "--speculative-config", config], capture_output=True, text=True, timeout=60)
        assert out.returncode != 0, config
        assert message in out.stdout + out.stderr, (config, out.stdout + out.stderr)


def test_draft_model_that_is_the_target_has_its_drafts_accepted(tiny_model, tmp_path, ferry_pb):
    """The tiny model as its own draft: its greedy drafts are the target's tokens, so all are accepted
    and the output is plain decoding's; a request may still choose prompt lookup or none."""
    config = json.dumps({"method": "draft_model", "model": str(tiny_model), "num_speculative_tokens": 3})
    s = Stack(tiny_model, tmp_path, ["--speculative-config", config, "--enable-prefix-caching"])
    try:
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        off = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NONE)
        ngram = ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NGRAM)
        plain = [generate(stub, ferry_pb, p, off) for p in PROMPTS]
        before = spec_counts(s)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert list(pool.map(lambda p: generate(stub, ferry_pb, p), PROMPTS)) == plain
        after = spec_counts(s)
        assert after["draft"] > before["draft"]
        assert after["accepted"] - before["accepted"] == after["draft"] - before["draft"]
        assert [generate(stub, ferry_pb, p, ngram) for p in PROMPTS] == plain
    finally:
        assert s.stop() == 0, s.log_text()


def test_a_backend_without_drafts_refuses_a_request_that_asks(tiny_model, tmp_path, ferry_pb):
    s = Stack(tiny_model, tmp_path, ["--worker-arg=--backend=sim",
                                     f"--worker-arg=--cost-model={REPO / 'tests/fixtures/sim_5ms.json'}"])
    try:
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        with pytest.raises(grpc.RpcError) as e:
            generate(stub, ferry_pb, PROMPTS[0], ferry_pb.gen.SpeculativeDecoding(method=ferry_pb.gen.SPECULATIVE_METHOD_NGRAM))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.speculative.method = 'ngram' is not supported by this replica's workers" in e.value.details()
        assert len(generate(stub, ferry_pb, PROMPTS[0], max_tokens=4)) == 4
    finally:
        assert s.stop() == 0, s.log_text()
