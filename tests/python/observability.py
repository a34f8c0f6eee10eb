"""Helpers for the observability tests (test_metrics_catalogue.py, test_deploy_prometheus.py,
test_deploy_k8s.py): the metrics catalogue (docs/metrics.md) as data, scraping, a bounded load,
and tool lookup that fails loudly."""
import concurrent.futures as cf
import ctypes
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "docs" / "metrics.md"
PROM = REPO / "deploy" / "prometheus"

# Section heading in docs/metrics.md -> the services it describes ("*": every service).
SECTIONS = {"ferry-gateway": "gateway", "ferry-scheduler": "scheduler", "ferry-worker": "worker",
            "Every service: the exporter's own": "*", "Every service: the process": "*"}


@dataclass(frozen=True)
class Row:
    service: str  # gateway, scheduler, worker or "*"
    name: str  # as exported, e.g. ferry_gateway_requests_total
    type: str
    labels: frozenset
    unit: str
    exported: str  # always, NVML, --device cuda

    @property
    def family(self) -> str:
        """The family name prometheus_client's parser gives (counters lose _total)."""
        return self.name[:-len("_total")] if self.type == "counter" and self.name.endswith("_total") else self.name


def catalogue() -> list:
    rows, service = [], None
    for line in CATALOGUE.read_text().splitlines():
        if line.startswith("## "):
            service = SECTIONS.get(line[3:].strip())
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`([a-z_:0-9]+)`", cells[0]) if line.startswith("| `") else None
        if name and service:
            metric_type, labels, unit, exported = cells[1:5]
            rows.append(Row(service, name.group(1), metric_type,
                            frozenset(l.strip() for l in labels.split(",") if l.strip()), unit, exported))
    assert rows, f"no metric rows parsed from {CATALOGUE}"
    return rows


def rows_for(service: str) -> list:
    return [r for r in catalogue() if r.service in (service, "*")]


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200, url
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_label_names(family) -> set:
    return {frozenset(k for k in s.labels if k not in ("le", "quantile")) for s in family.samples}


def nvml_present() -> bool:
    """Whether this machine has a working NVIDIA driver library (then the worker exports GPU series)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return False
        count = ctypes.c_uint(0)
        ok = lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 and count.value > 0
        lib.nvmlShutdown()
        return ok
    except (OSError, AttributeError):
        return False


def expected_here(row: Row) -> bool:
    """Whether a catalogue row must be exported by the test stack (CPU engine) on this machine."""
    if row.exported == "always":
        return True
    if row.exported == "NVML":
        return nvml_present()
    if row.exported == "--device cuda":
        return False  # the test stacks run the CPU engine
    if row.exported == "--enable-lora":
        return False  # the catalogue's stack serves no adapter; test_e2e_lora.py checks these rows
    if row.exported == "--state-dir":
        return False  # the catalogue's stack has no HTTP front, so no store; test_batch_api.py checks these
    raise AssertionError(f"{row.name}: unknown 'exported' value {row.exported!r} in {CATALOGUE}")


def require_tool(name: str) -> str:
    """The path of a tool scripts/setup.sh installs; a clear failure (not a skip) when it is missing."""
    path = shutil.which(name)
    if not path:
        pytest.fail(f"`{name}` is not on PATH: run scripts/setup.sh (it installs it)")
    return path


def run_load(pb, gateway: str, scheduler: str, *, seconds: float = 0, num_requests: int = 0,
             concurrency: int = 4, max_tokens: int = 12) -> dict:
    """Sends requests on both lanes from `concurrency` threads until `num_requests` were sent or
    `seconds` passed, whichever is set. Prompts share a long prefix (prefix cache hits), some
    carry a stop string; one invalid request and a cap change (SetMaxNumSeqs there and back)
    make those series exist. Returns counts by outcome."""
    import grpc

    channel = grpc.insecure_channel(gateway)
    gen = pb.gen_grpc.GenerationStub(channel)
    admin = pb.sched_grpc.SchedulerStub(grpc.insecure_channel(scheduler))
    shared = list(range(100, 164))  # four 16-token blocks every prompt starts with
    deadline = time.time() + seconds if seconds else None
    counts = {"ok": 0, "error": 0}

    def one(i: int):
        lane = "batch" if i % 3 == 0 else "interactive"
        sampling = pb.gen.SamplingParams(max_tokens=max_tokens + i % 5, temperature=0.0, ignore_eos=True)
        if i % 7 == 0:
            sampling.stop.append(b"zzzz-never")
        req = pb.gen.GenerateRequest(token_ids=pb.gen.TokenIds(ids=shared + [200 + i % 50, 7, 8]),
                                     sampling=sampling, lane=lane)
        try:
            for _ in gen.GenerateStream(req, timeout=60):
                pass
            return "ok"
        except grpc.RpcError:
            return "error"

    with pytest.raises(grpc.RpcError):  # an invalid request: counted as a rejection
        gen.Generate(pb.gen.GenerateRequest(text=b"x", sampling=pb.gen.SamplingParams(max_tokens=-1)), timeout=10)
    state = admin.GetState(pb.sched.GetStateRequest())
    admin.SetMaxNumSeqs(pb.sched.SetMaxNumSeqsRequest(max_num_seqs=max(1, state.max_num_seqs - 1)))
    admin.SetMaxNumSeqs(pb.sched.SetMaxNumSeqsRequest(max_num_seqs=state.max_num_seqs))

    def worker(offset: int):
        i = offset
        while (deadline and time.time() < deadline) or (num_requests and i < num_requests):
            counts[one(i)] += 1
            i += concurrency

    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    channel.close()
    return counts


def promtool(*args, cwd=None) -> str:
    proc = subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def kubernetes_config_as_file_sd(tmp_path, targets_file):
    """deploy/prometheus/prometheus.yml with its kubernetes_sd_configs swapped for a file_sd_configs
    reading targets_file: Debian's Prometheus is built without Kubernetes discovery, so this is how
    promtool checks the rest of it (relabelling included)."""
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    del job["kubernetes_sd_configs"]
    job["file_sd_configs"] = [{"files": [str(targets_file)]}]
    config["rule_files"] = [str(PROM / f) for f in config["rule_files"]]
    path = tmp_path / "prometheus-k8s-file-sd.yml"
    path.write_text(yaml.safe_dump(config))
    return path
