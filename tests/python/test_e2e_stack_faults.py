"""#27's acceptance on a whole stack under ferry-launch, with the faults injected by scripts/chaos.sh:
a tensor-parallel rank killed or stopped is replaced with its group and every request ends exactly
as without the fault; with --restart-policy never every request in flight ends UNAVAILABLE within
the recovery timeout + 1 s and the processes exit cleanly. Tiny model (2 cores)."""
import json
import os
import signal
import subprocess
import threading
import time

import grpc
import pytest

from conftest import REPO, Stack
from faults import requests_mix, run_streams, scrape, wait_metric

CHAOS = REPO / "scripts" / "chaos.sh"


def chaos(stack, *args):
    return subprocess.Popen(["bash", str(CHAOS), str(stack.ready_file), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def losses(metrics_port):
    m = scrape(metrics_port)
    return sum(v for k, v in m.items() if k.startswith("ferry_scheduler_worker_losses_total"))


@pytest.fixture()
def tp2(tiny_model, tmp_path):
    s = Stack(tiny_model, tmp_path, ["--tensor-parallel-size", "2", "--step-timeout-s", "10",
                                     "--worker-recovery-timeout-s", "90", "--worker-arg=--num-kv-blocks=512"])
    yield s
    assert s.stop() == 0, s.log_text()


def run_with_fault(stack, ferry_pb, fault):
    """The fault-free tokens, then the run with `fault(metrics_port)` injected from a thread once
    requests are running; asserts every request ends as without it."""
    requests = requests_mix(ferry_pb, 16, 16, max_tokens=160)
    expected = run_streams(stack.gateway, ferry_pb, requests)
    metrics = stack.ports["scheduler"]["metrics_port"]
    done = []

    def inject():
        wait_metric(metrics, 'ferry_scheduler_requests{state="running"}', lambda v: v >= 8)
        time.sleep(0.3)
        done.append(fault(metrics))

    injector = threading.Thread(target=inject)
    injector.start()
    got = run_streams(stack.gateway, ferry_pb, requests)
    injector.join(120)
    assert done, "the fault was not injected"
    for rid, (tokens, reason, code, details, _) in got.items():
        assert code == grpc.StatusCode.OK, (rid, code, details)
        assert (tokens, reason) == expected[rid][:2], rid
    m = scrape(metrics)
    assert m["ferry_scheduler_requests_resumed_total"] > 0
    assert m['ferry_scheduler_kv_blocks{state="used"}'] == 0
    return done[0]


def test_tp2_rank_killed_the_group_restarts_and_every_request_ends_as_without_it(tp2, ferry_pb):
    def kill(metrics):
        before = losses(metrics)
        assert chaos(tp2, "kill-worker", 1).wait(30) == 0
        # The scheduler counts the loss when a step fails or the process exit is seen, after the kill
        # returns: until then "recovering" still reads 0 (a CI run read it there and found no loss).
        deadline = time.time() + 30
        while losses(metrics) == before and time.time() < deadline:
            time.sleep(0.05)
        wait_metric(metrics, "ferry_scheduler_worker_recovering", lambda v: v == 0, timeout_s=90)
        return losses(metrics) - before

    assert run_with_fault(tp2, ferry_pb, kill) == 1
    m = scrape(tp2.ports["scheduler"]["metrics_port"])
    assert m['ferry_scheduler_worker_restarts_total{rank="0"}'] == 1  # the group restarted whole
    assert m['ferry_scheduler_worker_restarts_total{rank="1"}'] == 1


def test_tp2_rank_stopped_60s_is_detected_within_12s_replaced_and_every_request_ends_as_without_it(tp2, ferry_pb):
    def stop(metrics):
        before = losses(metrics)
        stopped_pid = json.loads(tp2.ready_file.read_text())["workers"][1]["pid"]
        stopper = chaos(tp2, "stop-worker", 1, 60)  # SIGCONT after 60 s, if the process still exists
        start = time.time()
        wait_metric(metrics, "ferry_scheduler_worker_recovering", lambda v: v == 1, timeout_s=15)
        detected_s = time.time() - start
        wait_metric(metrics, "ferry_scheduler_worker_recovering", lambda v: v == 0, timeout_s=90)
        stopper.kill()
        # Replaced: by the launcher's health probe, or with its group when rank 0's collective failed first.
        assert json.loads(tp2.ready_file.read_text())["workers"][1]["pid"] != stopped_pid
        assert not os.path.exists(f"/proc/{stopped_pid}/status") or "zombie" in open(f"/proc/{stopped_pid}/status").read()
        return detected_s, losses(metrics) - before

    detected_s, lost = run_with_fault(tp2, ferry_pb, stop)
    assert detected_s < 12, detected_s
    assert lost == 1


def test_restart_policy_never_ends_every_request_unavailable_in_time_and_exits_cleanly(tiny_model, tmp_path,
                                                                                        ferry_pb):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    recovery_s = 3
    s = Stack(tiny_model, tmp_path, ["--restart-policy", "never", "--worker-recovery-timeout-s", str(recovery_s)])
    scheduler = f"127.0.0.1:{s.ports['scheduler']['grpc_port']}"
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(scheduler))
    seen = {}

    def kill():
        wait_metric(s.ports["scheduler"]["metrics_port"], 'ferry_scheduler_requests{state="running"}',
                    lambda v: v >= 8)
        # SIGKILL sent here rather than by chaos.sh: the bound is from the kill itself, and starting
        # the script on 2 cores the engine keeps busy once took 1.05 s before its kill (the
        # scheduler saw the loss 1.05 s after the time taken before it, then ended the requests at
        # exactly 3 s), which the interval below counted.
        pid = json.loads(s.ready_file.read_text())["workers"][0]["pid"]
        seen["kill"] = time.time()
        os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        seen["health"] = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status

    injector = threading.Thread(target=kill)
    injector.start()
    got = run_streams(s.gateway, ferry_pb, requests_mix(ferry_pb, 8, 8, max_tokens=1500), timeout_s=120)
    seen["end"] = time.time()
    injector.join(60)
    for rid, (tokens, reason, code, details, trailers) in got.items():
        assert code == grpc.StatusCode.UNAVAILABLE, (rid, code, details)
        assert int(trailers.get("grpc-retry-pushback-ms", 0)) > 0, (rid, trailers)
    assert seen["end"] - seen["kill"] < recovery_s + 1, seen
    assert seen["health"] == health_pb2.HealthCheckResponse.NOT_SERVING
    assert s.proc.wait(timeout=60) == 1  # a child died: the stack stopped
    s.log.flush()
    log = s.log_path.read_text(errors="replace")
    s.stop()
    for name in ("gateway", "scheduler"):
        assert f"{name} (pid" in log and "exited with code 0" in log.split(f"{name} (pid")[-1].split("\n")[0], log
