#!/usr/bin/env python3
"""Writes deploy/grafana/ferry.json, Ferry's Grafana dashboard, from the panel list below.

    python3 deploy/grafana/make_dashboard.py            # rewrite ferry.json
    python3 deploy/grafana/make_dashboard.py --check    # exit 1 if ferry.json is not what this writes

Edit the panels here, not the JSON. Every query is run against a real Prometheus scraping a loaded
stack by tests/python/test_deploy_prometheus.py. Metric meanings: docs/metrics.md.
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("ferry.json")

# Label filters from the dashboard's variables. Gateways belong to no model replica.
GW = 'namespace=~"$namespace", lane=~"$lane"'
GW_ALL_LANES = 'namespace=~"$namespace"'
SCHED = 'namespace=~"$namespace", replica=~"$replica"'
RI = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


def q(expr, legend="", fmt=None):
    target = {"expr": expr, "legendFormat": legend}
    if fmt:
        target["format"] = fmt
    return target


def quantiles(metric, labels, by, qs=(0.5, 0.95, 0.99)):
    return [q(f"histogram_quantile({p}, sum by ({by}, le) (rate({metric}_bucket{{{labels}}}[{RI}])))",
              f"p{int(p * 100)} {{{{{by}}}}}") for p in qs]


def timeseries(title, targets, unit="short", description="", stack=False, max_=None):
    defaults = {"unit": unit, "custom": {"fillOpacity": 10, "showPoints": "never",
                                          "stacking": {"mode": "normal" if stack else "none"}}}
    if max_ is not None:
        defaults["max"] = max_
        defaults["min"] = 0
    return {"type": "timeseries", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title, target, unit="short", description="", thresholds=None):
    steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in (thresholds or [])]
    return {"type": "stat", "title": title, "description": description, "targets": [target],
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "area"}}


def heatmap(title, metric, labels, description=""):
    return {"type": "heatmap", "title": title, "description": description,
            "targets": [q(f"sum by (le) (increase({metric}_bucket{{{labels}}}[{RI}]))", "{{le}}", "heatmap")],
            "options": {"calculate": False, "yAxis": {"unit": "short"}, "color": {"scheme": "Blues"},
                        "cellGap": 1},
            "fieldConfig": {"defaults": {}, "overrides": []}}


def state_timeline(title, target, description="", on=("active", "green")):
    """A 0/1 series over time: 1 drawn as `on` (text, colour), 0 left blank."""
    return {"type": "state-timeline", "title": title, "description": description, "targets": [target],
            "fieldConfig": {"defaults": {"mappings": [
                {"type": "value", "options": {"0": {"text": "-", "color": "transparent"},
                                              "1": {"text": on[0], "color": on[1]}}}]},
                "overrides": []},
            "options": {"showValue": "never", "mergeValues": True}}


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


# (panel, width) in reading order; rows span the width. Grafana's grid is 24 wide.
LAYOUT = [
    (row("Overview"), 24),
    (stat("Requests/s", q(f"sum(rate(ferry_gateway_requests_total{{{GW}}}[{RI}]))"), "reqps",
          "Requests answered by the gateways, every code."), 4),
    (stat("Success", q(f'sum(rate(ferry_gateway_requests_total{{{GW}, code="OK"}}[{RI}])) / '
                       f"sum(rate(ferry_gateway_requests_total{{{GW}}}[{RI}]))"), "percentunit",
          "Share of requests answered OK."), 4),
    (stat("p95 TTFT", q(f"histogram_quantile(0.95, sum by (le) (rate("
                        f"ferry_gateway_time_to_first_token_seconds_bucket{{{GW}}}[{RI}])))"), "s",
          "Time to first token, all selected lanes.", [(1, "orange"), (5, "red")]), 4),
    (stat("p95 TPOT", q(f"histogram_quantile(0.95, sum by (le) (rate("
                        f"ferry_gateway_time_per_output_token_seconds_bucket{{{GW}}}[{RI}])))"), "s",
          "Time per output token, all selected lanes.", [(0.05, "orange"), (0.2, "red")]), 4),
    (stat("Waiting", q(f'sum(ferry_scheduler_requests{{{SCHED}, state="waiting"}})'), "short",
          "Requests queued or preempted in the selected replicas' schedulers."), 4),
    (stat("KV cache", q(f"max(ferry_scheduler_kv_cache_usage_ratio{{{SCHED}}})"), "percentunit",
          "Fullest KV cache among the selected replicas.", [(0.9, "orange"), (0.97, "red")]), 4),

    (row("Traffic and outcomes"), 24),
    (timeseries("Requests by lane and code", [q(f"sum by (lane, code) (rate(ferry_gateway_requests_total{{{GW}}}[{RI}]))",
                                                "{{lane}} {{code}}")], "reqps",
                "Every answered request, by its lane and gRPC status code."), 8),
    (timeseries("Finish reasons", [q(f"sum by (lane, reason) (rate(ferry_gateway_requests_finished_total{{{GW}}}[{RI}]))",
                                     "{{lane}} {{reason}}")], "reqps",
                "Why requests that finished stopped: stop string/token, length, end of sequence, deadline."), 8),
    (timeseries("Rejections by reason", [q(f"sum by (reason) (rate(ferry_gateway_rejections_total{{{GW_ALL_LANES}}}[{RI}]))",
                                           "{{reason}}")], "reqps",
                "Refused before reaching a scheduler: invalid, lane_full, auth, rate_limit."), 8),
    (timeseries("Tokens/s by lane", [q(f"sum by (lane, kind) (rate(ferry_gateway_tokens_total{{{GW}}}[{RI}]))",
                                       "{{lane}} {{kind}}")], "short",
                "Prompt and completion tokens of finished requests."), 12),
    (timeseries("In flight per lane (gateways)", [q(f"sum by (lane, state) (ferry_gateway_requests_in_flight{{{GW}}})",
                                                    "{{lane}} {{state}}")], "short",
                "Requests the gateways hold: waiting for their first step, or running."), 12),

    (row("Latency per lane"), 24),
    (timeseries("Time to first token", quantiles("ferry_gateway_time_to_first_token_seconds", GW, "lane"), "s",
                "p50/p95/p99 of arrival to first token, per lane."), 12),
    (timeseries("Time per output token", quantiles("ferry_gateway_time_per_output_token_seconds", GW, "lane"), "s",
                "p50/p95/p99 of (last token - first token) / (tokens - 1), per lane."), 12),
    (timeseries("End-to-end latency", quantiles("ferry_gateway_request_duration_seconds", GW, "lane"), "s",
                "p50/p95/p99 of arrival to last token of finished requests, per lane."), 8),
    (timeseries("Inter-token latency", quantiles("ferry_gateway_inter_token_latency_seconds", GW, "lane", (0.5, 0.95)),
                "s", "p50/p95 of the gap between two token deliveries, per lane."), 8),
    (timeseries("Queue time", quantiles("ferry_gateway_queue_time_seconds", GW, "lane", (0.5, 0.95)), "s",
                "p50/p95 of the wait in the scheduler's queue before the first step, per lane."), 8),

    (row("Batching"), 24),
    (timeseries("Running vs waiting", [q(f"sum by (replica, state) (ferry_scheduler_requests{{{SCHED}}})",
                                         "{{replica}} {{state}}"),
                                       q(f"max by (replica) (ferry_scheduler_max_num_seqs{{{SCHED}}})",
                                         "{{replica}} cap (max_num_seqs)")], "short",
                "Sequences in the batch and in the queue, against the controller's cap."), 12),
    (state_timeline("Load level", q(f"max by (replica, level) (ferry_scheduler_load_level{{{SCHED}}})",
                                    "{{replica}} {{level}}"),
                    "The controller's level over time (static, goodput, or a load level)."), 12),
    (heatmap("Batch size (sequences per step)", "ferry_scheduler_step_sequences", SCHED,
             "How many sequences each step ran."), 8),
    (timeseries("Tokens per step", [q(f"sum(rate(ferry_scheduler_step_tokens_sum{{{SCHED}}}[{RI}])) / "
                                      f"sum(rate(ferry_scheduler_step_tokens_count{{{SCHED}}}[{RI}]))", "mean"),
                                    *quantiles("ferry_scheduler_step_tokens", SCHED, "replica", (0.5, 0.95))],
                "short", "Tokens computed per step (prefill chunks and decodes)."), 8),
    (timeseries("Step time", quantiles("ferry_scheduler_step_duration_seconds", SCHED, "replica", (0.5, 0.95)), "s",
                "Wall time of a step, plan to commit (the workers' execution and the round trip)."), 8),

    (row("KV cache and prefix cache"), 24),
    (timeseries("KV cache usage", [q(f"max by (replica) (ferry_scheduler_kv_cache_usage_ratio{{{SCHED}}})",
                                     "{{replica}}")], "percentunit", "Share of KV blocks in use.", max_=1), 8),
    (timeseries("Prefix cache hit rate", [q(f"sum by (replica) (rate(ferry_scheduler_prefix_cache_hits_total{{{SCHED}}}[{RI}])) / "
                                            f"sum by (replica) (rate(ferry_scheduler_prefix_cache_queries_total{{{SCHED}}}[{RI}]))",
                                            "{{replica}}")], "percentunit",
                "Full KV blocks reused / looked up (needs --enable-prefix-caching).", max_=1), 8),
    (timeseries("Preemptions", [q(f"sum by (replica) (rate(ferry_scheduler_preemptions_total{{{SCHED}}}[{RI}]))",
                                  "{{replica}}")], "short", "Sequences preempted per second (recomputed later)."), 8),

    (row("Workers and devices"), 24),
    (timeseries("Device utilisation and engine busy", [
        q(f"ferry_worker_device_utilization_ratio{{{SCHED}}}", "{{replica}} {{container}} {{device}} utilisation"),
        q(f"ferry_worker_engine_busy_ratio{{{SCHED}}}", "{{replica}} {{container}} busy")], "percentunit",
        "NVML's GPU utilisation (GPU machines only) and the share of time each worker spent in steps.", max_=1), 12),
    (timeseries("Device memory", [
        q(f"ferry_worker_device_memory_used_bytes{{{SCHED}}}", "{{replica}} {{container}} {{device}} used"),
        q(f"ferry_worker_device_memory_total_bytes{{{SCHED}}}", "{{replica}} {{container}} {{device}} total")],
        "bytes", "Memory used and available per worker: GPU memory from NVML, or the process's resident memory "
                 "on the CPU engine."), 12),
    (timeseries("Worker health", [q(f"min by (replica, rank) (ferry_scheduler_worker_up{{{SCHED}}})", "{{replica}} rank {{rank}}"),
                                  q(f'up{{{SCHED}, component="worker"}}', "{{replica}} {{container}} scraped")],
                "short", "1 while each rank answers its scheduler's health checks, and while Prometheus can "
                         "scrape it.", max_=1), 12),
    (timeseries("Worker step time", quantiles("ferry_worker_step_duration_seconds", SCHED, "container", (0.5, 0.95)),
                "s", "Time to execute one step on each worker."), 12),
    (timeseries("Speculative decoding", [
        q(f'sum by (replica) (rate(ferry_worker_spec_decode_tokens_total{{{SCHED}, kind="accepted"}}[{RI}])) / '
          f'sum by (replica) (rate(ferry_worker_spec_decode_tokens_total{{{SCHED}, kind="draft"}}[{RI}]))',
          "{{replica}} acceptance rate"),
        q(f'(sum by (replica) (rate(ferry_worker_spec_decode_tokens_total{{{SCHED}, kind="accepted"}}[{RI}])) + '
          f'sum by (replica) (rate(ferry_worker_spec_decode_tokens_total{{{SCHED}, kind="drafts"}}[{RI}]))) / '
          f'sum by (replica) (rate(ferry_worker_spec_decode_tokens_total{{{SCHED}, kind="drafts"}}[{RI}]))',
          "{{replica}} tokens per speculating step")], "short",
        "Drafts accepted / drafts verified, and tokens a speculating sequence gets per step (1 = no gain; at most "
        "1 + num_speculative_tokens). Empty without --speculative-config or a request that asks "
        "(docs/speculative_decoding.md)."), 12),

    # Issue #57: one base model, many fine-tunes. Empty on a stack without --enable-lora.
    (row("LoRA adapters"), 24),
    (timeseries("Requests by adapter", [
        q(f'sum by (adapter) (rate(ferry_gateway_lora_requests_total{{{GW_ALL_LANES}, code="OK"}}[{RI}]))',
          "{{adapter}}"),
        q(f'sum by (adapter, code) (rate(ferry_gateway_lora_requests_total{{{GW_ALL_LANES}, code!="OK"}}[{RI}]))',
          "{{adapter}} {{code}}")], "reqps",
        "Requests answered under each LoRA adapter (the OpenAI model / gRPC lora_name), and those that ended "
        "with another status than OK: NOT_FOUND-like refusals after an unload show here."), 8),
    (timeseries("Tokens by adapter", [
        q(f"sum by (adapter, kind) (rate(ferry_gateway_lora_tokens_total{{{GW_ALL_LANES}}}[{RI}]))",
          "{{adapter}} {{kind}}")], "short",
        "Prompt and completion tokens per second of the requests answered under each adapter: what each "
        "tenant's fine-tune costs."), 8),
    (timeseries("Adapters running and waiting", [
        q(f"max by (replica, running_lora_adapters, waiting_lora_adapters, max_lora) "
          f"(ferry_scheduler_lora_requests_info{{{SCHED}}})",
          "{{replica}} running [{{running_lora_adapters}}] waiting [{{waiting_lora_adapters}}] of {{max_lora}}")],
        "short",
        "vLLM's lora_requests_info per replica: the adapters of its running and of its waiting requests (at most "
        "--max-loras run in one step; the gateway prefers a replica running the adapter). One series at 1, "
        "replaced when the sets change.", max_=1), 8),

    # Losses are rare: counts over fixed windows read as "in the last 5 minutes / hour" at any zoom.
    (row("Worker failures and recovery"), 24),
    (state_timeline("Recovering", q(f"max by (replica) (ferry_scheduler_worker_recovering{{{SCHED}}})", "{{replica}}"),
                    "While a replica waits for a lost worker group: its requests are paused (resumed by "
                    "recompute when the workers are back, UNAVAILABLE after --worker-recovery-timeout-s) and it "
                    "takes no new work.", on=("recovering", "red")), 24),
    (timeseries("Worker losses and restarts", [
        q(f"sum by (replica, reason) (increase(ferry_scheduler_worker_losses_total{{{SCHED}}}[5m]))",
          "{{replica}} lost: {{reason}}"),
        q(f"max by (replica) (increase(ferry_scheduler_worker_restarts_total{{{SCHED}}}[5m]))",
          "{{replica}} restarted")], "short",
        "In the last 5 minutes: ranks declared lost (disconnected: the process died or was killed; step_timeout: "
        "a step outlived --step-timeout-s) and worker groups back with a new incarnation (a tensor-parallel "
        "group counts once)."), 8),
    (timeseries("Requests across a loss", [
        q(f"sum by (replica) (increase(ferry_scheduler_requests_resumed_total{{{SCHED}}}[5m]))",
          "{{replica}} resumed"),
        q(f"sum by (replica) (increase(ferry_scheduler_requests_failed_by_loss_total{{{SCHED}}}[5m]))",
          "{{replica}} failed (UNAVAILABLE)"),
        q(f"sum by (outcome) (increase(ferry_gateway_migrations_total{{{GW_ALL_LANES}}}[5m]))",
          "scheduler lost: {{outcome}}")], "short",
        "In the last 5 minutes: requests kept across a worker loss and resumed by recompute, requests ended "
        "UNAVAILABLE because the workers were not back in time, and started requests whose scheduler was lost: "
        "resumed elsewhere by the gateway, or ended past --migration-limit (limit)."), 8),
    (timeseries("Recovery time", [
        q(f"histogram_quantile({p}, sum by (replica, le) (increase("
          f"ferry_scheduler_worker_recovery_seconds_bucket{{{SCHED}}}[1h])))", f"p{int(p * 100)} {{{{replica}}}}")
        for p in (0.5, 0.95)], "s",
        "From a worker loss until the replica serves again, over the recoveries of the last hour (empty "
        "without one)."), 8),
]


def variable(name, label, query, include_all=True):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
            "includeAll": include_all, "multi": True, "allValue": ".*", "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def dashboard():
    panels, x, y, line_h = [], 0, 0, 0
    for panel_id, (panel, width) in enumerate(LAYOUT, start=1):
        if panel["type"] == "row":
            y, x, line_h = y + line_h, 0, 0
            panels.append(dict(panel, id=panel_id, gridPos={"x": 0, "y": y, "w": 24, "h": 1}))
            y += 1
            continue
        height = 4 if panel["type"] == "stat" else 8
        if x + width > 24:
            y, x, line_h = y + line_h, 0, 0
        targets = [dict(t, refId=chr(ord("A") + i), datasource=DS) for i, t in enumerate(panel["targets"])]
        panels.append(dict(panel, id=panel_id, datasource=DS, targets=targets,
                           gridPos={"x": x, "y": y, "w": width, "h": height}))
        x, line_h = x + width, max(line_h, height)
    return {
        "title": "Ferry",
        "uid": "ferry-overview",
        "description": "Ferry LLM serving: traffic, latency per lane, batching, KV cache, devices, worker "
                       "failures. Metrics: docs/metrics.md; reading it: docs/deploy.md.",
        "tags": ["ferry", "llm-serving"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("namespace", "Namespace", "label_values(ferry_scheduler_requests, namespace)"),
            variable("replica", "Replica", 'label_values(ferry_scheduler_requests{namespace=~"$namespace"}, replica)'),
            variable("lane", "Lane", 'label_values(ferry_gateway_requests_in_flight{namespace=~"$namespace"}, lane)'),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            sys.exit(f"{OUT} is stale: run python3 {Path(__file__).name}")
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}")
