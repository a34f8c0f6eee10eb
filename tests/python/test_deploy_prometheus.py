"""deploy/prometheus and deploy/grafana against real tools: promtool checks the configurations and
the rules and runs the alerts' unit tests; a real Prometheus server, started here, scrapes a real
stack under load through deploy/prometheus/prometheus-local.yml, and every PromQL expression of the
dashboard, of the rules and of the prometheus-adapter rules returns data there. One panel is
rendered to a PNG (FERRY_UPDATE_DOCS=1 writes the one docs/deploy.md shows)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import REPO, Stack, binary
from observability import (PROM, catalogue, expected_here, kubernetes_config_as_file_sd, promtool,
                           require_tool, run_load)

GRAFANA = REPO / "deploy" / "grafana"
RULE_FILES = [PROM / "rules" / "ferry-recording.yml", PROM / "rules" / "ferry-alerts.yml"]
PRESET = REPO / "scheduler" / "sim" / "presets" / "rtx4090d-tp4.json"
LOAD_S = float(os.environ.get("FERRY_OBS_LOAD_S", "25"))


def test_promtool_checks_the_rules():
    out = promtool("check", "rules", *map(str, RULE_FILES))
    assert "SUCCESS" in out


def test_alert_unit_tests_cover_every_alert():
    promtool("test", "rules", "tests/ferry-alerts.test.yml", cwd=PROM)
    alerts = {r["alert"] for g in yaml.safe_load(RULE_FILES[1].read_text())["groups"] for r in g["rules"]}
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "tests" / "ferry-alerts.test.yml").read_text()))
    assert alerts - tested == set(), "alerts without a unit test"
    expected = {"FerryHighQueueTime", "FerrySustainedRejections", "FerryTTFTBudgetBurnFast", "FerryTPOTBudgetBurnFast",
                "FerryKVCacheNearFull", "FerryWorkerDown", "FerrySchedulerNoHealthyWorker", "FerryWorkerCrashLoop",
                "FerryWorkerRecoveryStuck"}
    assert expected <= alerts


def test_promtool_checks_both_scrape_configurations(tmp_path):
    promtool("check", "config", str(PROM / "prometheus-local.yml"))
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    promtool("check", "config", str(kubernetes_config_as_file_sd(tmp_path, targets)))


def test_dashboard_json_is_what_the_generator_writes():
    proc = subprocess.run([sys.executable, str(GRAFANA / "make_dashboard.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    dashboard = json.loads((GRAFANA / "ferry.json").read_text())
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"namespace", "replica", "lane"} <= names


# ---- a real Prometheus over a real stack ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, config, tmp_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "prometheus.log", "wb")
        self.log_path = tmp_path / "prometheus.log"
        self.proc = subprocess.Popen(
            [require_tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "prometheus not ready:\n" + self.log_path.read_text()
            time.sleep(0.2)

    def query(self, expr):
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def local_config_for(stack, tmp_path):
    """prometheus-local.yml with the stack's kernel-chosen ports and a 1 s interval."""
    config = yaml.safe_load((PROM / "prometheus-local.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROM / f) for f in config["rule_files"]]
    ports = {"gateway": stack.ports["gateway"]["metrics_port"], "scheduler": stack.ports["scheduler"]["metrics_port"],
             "worker-0": stack.ports["workers"][0]["metrics_port"]}
    for static in config["scrape_configs"][0]["static_configs"]:
        static["targets"] = [f"127.0.0.1:{ports[static['labels']['container']]}"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    promtool("check", "config", str(path))
    return path


def with_bool(expr):
    """An alert's condition with `bool` after each comparison against a number, so it returns a
    0/1 sample for every series it compares instead of only the firing ones."""
    return re.sub(r"(==|!=|>=|<=|>|<)\s*(?=[0-9.(])", r"\1 bool ", expr)


def grafana_to_promql(expr, rate_interval="1m"):
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr.strip())
    if m:  # a variable's query: the label's values exist
        expr = f"count by ({m.group(2)}) ({m.group(1)})"
    expr = expr.replace("$__rate_interval", rate_interval)
    for var in ("namespace", "replica", "lane"):
        expr = expr.replace(f"${var}", ".*")
    return expr


def only_absent_metrics(expr):
    """True when every metric the expression reads is one this machine does not export
    (NVML rows without a driver, --device cuda rows on the CPU engine)."""
    rows = {r.family: r for r in catalogue()}
    used = set()
    for name in re.findall(r"\b(ferry_[a-z0-9_]+)", expr):
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        used.add(base if base in rows else name)
    known = [rows[u] for u in used if u in rows]
    return bool(known) and len(known) == len(used) and not any(expected_here(r) for r in known)


def dashboard_expressions():
    dashboard = json.loads((GRAFANA / "ferry.json").read_text())
    out = [(f"variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"]
           if v["type"] == "query"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return out


def rule_expressions():
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    out.append((f"record {rule['record']}", rule["expr"]))
                    out.append((f"recorded {rule['record']}", rule["record"]))
                else:
                    out.append((f"alert {rule['alert']}", with_bool(rule["expr"])))
    return out


def hpa_pod_metrics():
    """(metric, selector labels) of every Pods metric of the HorizontalPodAutoscalers in deploy/k8s/base."""
    out = []
    for path in sorted((REPO / "deploy" / "k8s" / "base").glob("*-hpa.yaml")):
        for m in yaml.safe_load(path.read_text())["spec"]["metrics"]:
            if m["type"] == "Pods":
                out.append((m["pods"]["metric"]["name"], m["pods"]["metric"].get("selector", {}).get("matchLabels", {})))
    return out


def adapter_expressions():
    """Each HPA metric as prometheus-adapter queries it (its rule's metricsQuery with the HPA's selector),
    and each rule's seriesQuery; every HPA metric has a rule and every rule serves an HPA."""
    rules = {r["name"]["as"]: r for r in yaml.safe_load((PROM / "adapter-rules.yaml").read_text())["rules"]}
    out, used = [], set()
    for name, labels in hpa_pod_metrics():
        assert name in rules, f"the HPA metric {name} has no prometheus-adapter rule"
        used.add(name)
        matchers = ",".join(['namespace="local"'] + [f'{k}="{v}"' for k, v in labels.items()])
        expr = (rules[name]["metricsQuery"].replace("<<.Series>>", name).replace("<<.LabelMatchers>>", matchers)
                .replace("<<.GroupBy>>", "pod"))
        out.append((f"adapter {name} {labels}", expr))
    assert used == set(rules), f"adapter rules no HPA reads: {set(rules) - used}"
    for name, rule in rules.items():
        out.append((f"adapter series {name}", rule["seriesQuery"]))
    return out


@pytest.fixture(scope="module")
def prometheus_over_loaded_stack(tiny_model, tmp_path_factory, ferry_pb):
    tmp = tmp_path_factory.mktemp("prometheus")
    stack = Stack(tiny_model, tmp_path_factory.mktemp("prom-stack"),
                  # A cap below the clients, so requests queue and the batching panels have a picture.
                  ["--scheduler-arg=--enable-prefix-caching", "--scheduler-arg=--max-num-seqs=4",
                   "--worker-arg=--block-size=16", "--worker-arg=--backend=sim", f"--worker-arg=--cost-model={PRESET}",
                   "--worker-arg=--sim-live-tokens=1000"])
    prometheus = None
    try:
        prometheus = Prometheus(local_config_for(stack, tmp), tmp)
        start = time.time()
        counts = run_load(ferry_pb, stack.gateway, stack.scheduler, seconds=LOAD_S, concurrency=8, max_tokens=24)
        assert counts["ok"] > 50, counts
        # Recording rules evaluate every second; wait until they have seen the load.
        deadline = time.time() + 60
        while not prometheus.query("ferry:gateway_tpot_slo_miss:ratio_rate5m"):
            assert time.time() < deadline, "recording rules produced nothing"
            time.sleep(1)
        yield prometheus, start, time.time()
    finally:
        if prometheus:
            prometheus.stop()
        assert stack.stop() == 0, stack.log_text()


def test_every_target_is_up_with_the_labels_the_dashboard_uses(prometheus_over_loaded_stack):
    prometheus, _, _ = prometheus_over_loaded_stack
    up = {r["metric"]["container"]: r for r in prometheus.query("up")}
    assert set(up) == {"gateway", "scheduler", "worker-0"}
    for container, r in up.items():
        assert r["value"][1] == "1", container
        assert r["metric"]["namespace"] == "local"
        assert r["metric"]["component"] == container.split("-")[0]
    assert up["scheduler"]["metric"]["replica"] == up["worker-0"]["metric"]["replica"] == "replica-0"


def test_every_expression_returns_data(prometheus_over_loaded_stack):
    prometheus, _, _ = prometheus_over_loaded_stack
    empty, checked = [], 0
    for where, expr in dashboard_expressions() + rule_expressions() + adapter_expressions():
        promql = grafana_to_promql(expr)
        result = prometheus.query(promql)
        checked += 1
        if only_absent_metrics(promql):
            assert result == [], f"{where}: reads only metrics this machine does not export, yet returned data"
        elif not result:
            empty.append(f"{where}: {promql}")
    assert not empty, "expressions with no data:\n" + "\n".join(empty)
    assert checked > 60


def test_no_alert_fires_on_a_healthy_stack(prometheus_over_loaded_stack):
    prometheus, _, _ = prometheus_over_loaded_stack
    firing = [r["metric"] for r in prometheus.query('ALERTS{alertstate="firing"}')]
    assert firing == []


def test_a_panel_renders_to_png(prometheus_over_loaded_stack, tmp_path):
    prometheus, start, end = prometheus_over_loaded_stack
    update_docs = os.environ.get("FERRY_UPDATE_DOCS") == "1"
    panels = [("Time to first token", "dashboard-ttft.png"), ("Running vs waiting", "dashboard-batching.png")]
    for title, name in panels:
        out = (REPO / "docs" / name) if update_docs else tmp_path / name
        proc = subprocess.run([sys.executable, str(GRAFANA / "render_panel.py"), "--prometheus", prometheus.url,
                               "--panel", title, "--minutes", str((end - start + 20) / 60), "--end", str(end + 5),
                               "--step", "1", "--rate-interval", "10s", "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert re.search(r": [1-9]\d* series", proc.stdout), proc.stdout
        data = out.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_lora_panels_return_data_over_a_stack_serving_adapters(tiny_model, tmp_path, ferry_pb):
    """The dashboard's "LoRA adapters" row reads metrics the catalogue's stack does not export (it serves
    no adapter): here a real Prometheus scrapes a stack started with --enable-lora, and every target of
    that row returns data once requests ran under the adapter (one cancelled, for the failures' line)."""
    import grpc

    adapter = tmp_path / "ft"
    subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(tiny_model), "--out", str(adapter),
                    "--lora-rank", "4"], check=True, capture_output=True)
    (tmp_path / "stack").mkdir()
    stack = Stack(tiny_model, tmp_path / "stack", ["--enable-lora", "--lora-modules", f"ft={adapter}"])
    prometheus = None
    try:
        prometheus = Prometheus(local_config_for(stack, tmp_path), tmp_path)
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(stack.gateway))

        def request(max_tokens):
            return ferry_pb.gen.GenerateRequest(
                token_ids=ferry_pb.gen.TokenIds(ids=list(range(30, 50))), lora_name="ft",
                sampling=ferry_pb.gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True))

        for _ in range(4):
            assert len(stub.Generate(request(8), timeout=60).token_ids) == 8
        stream = stub.GenerateStream(request(400), timeout=60)
        next(stream)
        stream.cancel()
        dashboard = json.loads((GRAFANA / "ferry.json").read_text())
        titles = [p["title"] for p in dashboard["panels"]]
        row = titles.index("LoRA adapters")
        panels = dashboard["panels"][row + 1:row + 4]
        assert [p["title"] for p in panels] == ["Requests by adapter", "Tokens by adapter",
                                               "Adapters running and waiting"]
        pending = {f"{p['title']} {t['refId']}": grafana_to_promql(t["expr"]) for p in panels for t in p["targets"]}
        deadline = time.time() + 60
        while pending:
            pending = {k: e for k, e in pending.items() if not prometheus.query(e)}
            assert time.time() < deadline, f"LoRA panel targets with no data: {pending}"
            time.sleep(1)
        running = prometheus.query("ferry_scheduler_lora_requests_info")
        assert running and running[0]["metric"]["max_lora"] == "1", running
    finally:
        if prometheus:
            prometheus.stop()
        assert stack.stop() == 0, stack.log_text()
