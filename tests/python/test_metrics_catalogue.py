"""docs/metrics.md is the truth about every service's /metrics: after a short load each catalogued
metric is exported with its type and exactly its labels, nothing exported is missing from the
catalogue, and every metric name in the C++ sources has a row. GPU-only rows are checked too:
NVML rows against a stand-in libnvidia-ml.so.1, `--device cuda` rows for their absence from the
CPU engine."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BUILD, REPO, Stack, binary
from observability import catalogue, expected_here, nvml_present, rows_for, run_load, sample_label_names, scrape

SERVICE_DIRS = ["common", "gateway", "scheduler", "worker"]


@pytest.fixture(scope="module")
def loaded_stack(tiny_model, tmp_path_factory, ferry_pb):
    s = Stack(tiny_model, tmp_path_factory.mktemp("catalogue-stack"),
              ["--scheduler-arg=--enable-prefix-caching", "--worker-arg=--block-size=16"])
    try:
        counts = run_load(ferry_pb, s.gateway, s.scheduler, num_requests=24, concurrency=3)
        assert counts["ok"] >= 20, counts
        time.sleep(1.5)  # the worker's device gauges are sampled every second
        yield s
    finally:
        assert s.stop() == 0, s.log_text()


def service_of(name: str) -> str:
    return "worker" if name.startswith("worker") else name


def check_family(row, families, where):
    assert row.family in families, f"{where}: {row.name} is catalogued but not exported"
    family = families[row.family]
    assert family.type == row.type, f"{where}: {row.name} is a {family.type}, catalogued as {row.type}"
    assert family.samples, f"{where}: {row.name} has no samples after the load"
    label_sets = sample_label_names(family)
    assert label_sets == {row.labels}, (
        f"{where}: {row.name} has labels {sorted(map(sorted, label_sets))}, catalogued {sorted(row.labels)}")


def test_catalogue_rows_are_well_formed():
    rows = catalogue()
    names = [r.name for r in rows]
    assert len(names) == len(set(names)), "a metric is catalogued twice"
    for r in rows:
        assert r.type in ("counter", "gauge", "histogram", "summary"), r
        if r.name.startswith("ferry_"):
            assert re.fullmatch(r"ferry_(gateway|scheduler|worker)_[a-z0-9_]+", r.name), r.name
            assert (r.type == "counter") == r.name.endswith("_total"), f"{r.name}: counters and only counters end _total"
            if r.unit == "seconds":
                assert "_seconds" in r.name, r.name
            if r.unit == "bytes":
                assert r.name.endswith("_bytes"), r.name
            if r.unit == "ratio":
                assert r.name.endswith("_ratio"), r.name


def test_every_metric_in_the_sources_is_catalogued():
    in_sources = set()
    for d in SERVICE_DIRS:
        for path in [*(REPO / d).rglob("*.cc"), *(REPO / d).rglob("*.h")]:
            if path.name.endswith("_test.cc") or "bench" in path.name:
                continue
            in_sources |= set(re.findall(r'Name\("(ferry_[a-z0-9_]+)"\)', path.read_text()))
    catalogued = {r.name for r in catalogue() if r.name.startswith("ferry_")}
    assert in_sources - catalogued == set(), "exported by the code but missing from docs/metrics.md"
    assert catalogued - in_sources == set(), "in docs/metrics.md but no longer in the code"


def test_every_service_exports_exactly_the_catalogue(loaded_stack):
    for where, url in loaded_stack.metrics_urls().items():
        families = scrape(url)
        rows = rows_for(service_of(where))
        for row in rows:
            if expected_here(row):
                check_family(row, families, where)
            else:
                assert row.family not in families, f"{where}: {row.name} ({row.exported}) exported here"
        extra = set(families) - {r.family for r in rows}
        assert not extra, f"{where}: exported but not in docs/metrics.md: {sorted(extra)}"


def test_counters_and_histograms_are_sane(loaded_stack):
    for where, url in loaded_stack.metrics_urls().items():
        for family in scrape(url).values():
            if not family.name.startswith("ferry_") or family.type not in ("counter", "histogram"):
                continue
            for s in family.samples:
                assert s.value >= 0, f"{where}: {s.name}{s.labels} = {s.value}"


def test_load_shows_in_the_metrics(loaded_stack):
    urls = loaded_stack.metrics_urls()
    gw, sched, worker = scrape(urls["gateway"]), scrape(urls["scheduler"]), scrape(urls["worker-0"])

    def total(family, **labels):
        return sum(s.value for s in family.samples
                   if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith(("_bucket", "_sum")))

    assert total(gw["ferry_gateway_requests_finished"], lane="interactive") > 0
    assert total(gw["ferry_gateway_requests_finished"], lane="batch") > 0
    assert total(gw["ferry_gateway_rejections"], reason="invalid") >= 1
    assert total(gw["ferry_gateway_time_per_output_token_seconds"], lane="interactive") > 0
    assert total(gw["ferry_gateway_requests_in_flight"]) == 0  # all done
    assert total(sched["ferry_scheduler_prefix_cache_hits"]) > 0
    assert total(sched["ferry_scheduler_cap_changes"], kind="admin") == 2
    assert total(sched["ferry_scheduler_worker_up"], rank="0") == 1
    assert total(sched["ferry_scheduler_step_tokens"]) > 0
    assert 0 <= total(worker["ferry_worker_engine_busy_ratio"]) <= 1
    assert total(worker["ferry_worker_device_memory_used_bytes"], device="cpu") > 1e6


def test_nvml_series_where_the_driver_library_loads(tiny_model, tmp_path):
    """A worker that finds libnvidia-ml.so.1 (here the stand-in from worker/testing/fake_nvml.cc)
    exports every NVML row with its catalogued type and labels, for the GPU of its rank."""
    fake = BUILD / "tests" / "fake-nvml"
    assert (fake / "libnvidia-ml.so.1").exists(), f"{fake}/libnvidia-ml.so.1 is missing: build the project"
    ready = tmp_path / "worker.json"
    env = dict(os.environ, LD_LIBRARY_PATH=f"{fake}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([str(binary("ferry-worker")), "--model", str(tiny_model), "--port", "0",
                             "--metrics-port", "0", "--ready-file", str(ready)], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.05)
        families = scrape(f"http://127.0.0.1:{json.loads(ready.read_text())['metrics_port']}/metrics")
        nvml_rows = [r for r in rows_for("worker") if r.exported == "NVML"]
        assert nvml_rows, "docs/metrics.md marks no row NVML"
        for row in nvml_rows + [r for r in rows_for("worker") if r.exported == "always"]:
            check_family(row, families, "worker with NVML")
        devices = {s.labels["device"] for s in families["ferry_worker_device_memory_total_bytes"].samples}
        assert devices == {"cpu", "gpu0"}
        util = [s.value for s in families["ferry_worker_device_utilization_ratio"].samples]
        assert util == [pytest.approx(0.40)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log.close()


def test_the_worker_sees_the_gpus_this_machine_has(stack):
    """The worker's device series name a GPU exactly when this machine's NVIDIA driver library loads
    and counts one (issue #53: this test only printed which case the machine was)."""
    families = scrape(stack.metrics_urls()["worker-0"])
    devices = {s.labels["device"] for s in families["ferry_worker_device_memory_total_bytes"].samples}
    assert "cpu" in devices
    assert any(d.startswith("gpu") for d in devices) == nvml_present(), devices
