"""Scheduler features through the real stack: prefix caching reuses KV blocks
without changing greedy output, and the admin RPC changes max_num_seqs at run
time (what the benchmark sweep uses)."""
import grpc
import pytest

from conftest import Stack


@pytest.fixture(scope="module")
def cached_stack(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("prefix-stack"),
              ["--scheduler-arg=--enable-prefix-caching", "--worker-arg=--block-size=16"])
    yield s
    assert s.stop() == 0


def test_prefix_caching_reuses_blocks_and_keeps_output(cached_stack, ferry_pb):
    channel = grpc.insecure_channel(cached_stack.gateway)
    gen = ferry_pb.gen_grpc.GenerationStub(channel)
    admin = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(cached_stack.scheduler))
    system = list(range(100, 100 + 160))  # 10 full blocks shared by every request

    def ask(suffix):
        req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=system + suffix),
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=8, temperature=0.0,
                                                                                ignore_eos=True))
        return list(gen.Generate(req, timeout=60).token_ids)

    before = admin.GetState(ferry_pb.sched.GetStateRequest())
    first = ask([7, 8, 9])
    again = ask([7, 8, 9])
    other = ask([5, 6])
    after = admin.GetState(ferry_pb.sched.GetStateRequest())
    assert again == first
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 20  # 10 blocks each for two requests
    assert after.prefix_cache_queries > before.prefix_cache_queries
    assert len(other) == 8


def test_usage_reports_the_prompt_tokens_found_in_the_cache(cached_stack, ferry_pb):
    """usage.cached_tokens: the prompt tokens the first scheduling found in the prefix cache, in
    whole blocks (OpenAI's prompt_tokens_details.cached_tokens over HTTP)."""
    gen = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(cached_stack.gateway))
    prompt = list(range(1000, 1000 + 70))  # 4 full blocks of 16 and 6 tokens

    def usage():
        req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=prompt),
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=2, ignore_eos=True))
        return gen.Generate(req, timeout=60).usage

    first, second = usage(), usage()
    assert (first.prompt_tokens, first.cached_tokens) == (70, 0)
    assert (second.prompt_tokens, second.cached_tokens) == (70, 64)


def test_admin_sets_max_num_seqs(stack, ferry_pb):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    admin = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(stack.scheduler))
    state = admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=3))
    # The default mode adapts; an admin Set holds its cap until one with adapt = true.
    assert (state.max_num_seqs, state.controller_mode, state.cap_held) == (3, "goodput", True)
    assert admin.GetState(ferry_pb.sched.GetStateRequest()).max_num_seqs == 3
    text = urllib.request.urlopen(stack.metrics_urls()["scheduler"], timeout=5).read().decode()
    cap = [s.value for f in text_string_to_metric_families(text) if f.name == "ferry_scheduler_max_num_seqs"
           for s in f.samples]
    assert cap == [3.0]
    with pytest.raises(grpc.RpcError) as err:
        admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=0))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_num_seqs = 0" in err.value.details()
    state = admin.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=64, adapt=True))
    assert (state.max_num_seqs, state.cap_held) == (64, False)


def test_without_targets_the_default_controller_plans_for_no_targets(stack, cached_stack):
    """Issue #52: no --slo-ttft-ms, --slo-tpot-ms or --slo-lane (the quickstart): the default goodput mode has
    nothing to trade throughput for and says so on /metrics; a stated target gives the goodput regime."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def regimes(s):
        text = urllib.request.urlopen(s.metrics_urls()["scheduler"], timeout=5).read().decode()
        return {x.labels["regime"]: x.value for f in text_string_to_metric_families(text)
                if f.name == "ferry_scheduler_controller_regime" for x in f.samples}

    assert regimes(stack) == {"no-targets": 1.0}
    assert regimes(cached_stack) == {"no-targets": 1.0}


def test_a_stated_target_plans_for_goodput(tiny_model, tmp_path_factory):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    s = Stack(tiny_model, tmp_path_factory.mktemp("targets-stack"), ["--scheduler-arg=--slo-tpot-ms=100"])
    try:
        text = urllib.request.urlopen(s.metrics_urls()["scheduler"], timeout=5).read().decode()
        regime = {x.labels["regime"]: x.value for f in text_string_to_metric_families(text)
                  if f.name == "ferry_scheduler_controller_regime" for x in f.samples}
        assert regime == {"goodput": 1.0}
    finally:
        assert s.stop() == 0
