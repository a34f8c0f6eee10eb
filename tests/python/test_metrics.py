"""Each service's /metrics parses with the Prometheus text-format parser and
has the families we document."""
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

EXPECTED = {
    "gateway": {"ferry_gateway_requests", "ferry_gateway_time_to_first_token_seconds",
                "ferry_gateway_request_duration_seconds", "ferry_gateway_tokens", "ferry_gateway_rejections",
                "ferry_gateway_requests_in_flight"},
    "scheduler": {"ferry_scheduler_requests", "ferry_scheduler_kv_blocks", "ferry_scheduler_kv_cache_usage_ratio",
                  "ferry_scheduler_requests_finished", "ferry_scheduler_steps",
                  "ferry_scheduler_step_duration_seconds", "ferry_scheduler_max_num_seqs",
                  "ferry_scheduler_step_sequences", "ferry_scheduler_load_level", "ferry_scheduler_controller_regime",
                  "ferry_scheduler_preemptions",
                  "ferry_scheduler_prefix_cache_queries", "ferry_scheduler_prefix_cache_hits",
                  "ferry_scheduler_scheduled_tokens"},
    "worker-0": {"ferry_worker_steps", "ferry_worker_step_duration_seconds", "ferry_worker_tokens",
                 "ferry_worker_step_sequences"},
}


def test_metrics_parse(stack, gen_stub, ferry_pb):
    # Some traffic first, so histograms and labelled counters have samples.
    req = ferry_pb.gen.GenerateRequest(text=b"metrics", sampling=ferry_pb.gen.SamplingParams(max_tokens=4))
    gen_stub.Generate(req, timeout=30)
    for service, url in stack.metrics_urls().items():
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        missing = EXPECTED[service] - families.keys()
        assert not missing, f"{service}: missing {missing}"
        for name in EXPECTED[service]:
            assert families[name].samples, f"{service}: {name} has no samples"
