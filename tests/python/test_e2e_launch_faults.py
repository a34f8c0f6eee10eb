"""Faults under ferry-launch with requests in flight (issue #53: the supervision tests check restarts on an
idle stack, and no test restarted the gateway, ran `chaos.sh random`, or killed the only worker of a launched
stack mid-stream). The faults go through scripts/chaos.sh, as a person would run them.

- The only worker killed mid-stream: a pause; every stream ends with the tokens of a fault-free run.
- `chaos.sh random`: kills of the worker or the scheduler at random points while streams run; both are pauses
  (the scheduler restarts and the gateway resumes what it held): every stream ends with the tokens of a
  fault-free run, and the stack serves again.
- The gateway killed: its streams end, nothing is left running behind it, and the restarted gateway serves."""
import threading
import time

import grpc

from conftest import Stack
from faults import StreamProgress, requests_mix, run_streams, scrape
from test_launch_supervision import (chaos, pid_alive, serves, stacks, state, wait_for,  # noqa: F401
                                     wait_for_new_pids)


def test_the_only_worker_killed_mid_stream_is_a_pause(tiny_model, tmp_path, ferry_pb, stacks):
    s = Stack(tiny_model, tmp_path)
    stacks.append(s)
    requests = requests_mix(ferry_pb, 16, 16, max_tokens=512, lane="batch")
    expected = run_streams(s.gateway, ferry_pb, requests, timeout_s=300)
    total = sum(len(r[0]) for r in expected.values())
    progress = StreamProgress()
    killed = []

    def kill_at_a_quarter():
        progress.wait_for(total // 4, timeout_s=120)
        before = time.monotonic()
        chaos(s, "kill-worker", 0)
        killed.append((before, time.monotonic()))

    injector = threading.Thread(target=kill_at_a_quarter)
    injector.start()
    got = run_streams(s.gateway, ferry_pb, requests, timeout_s=300, progress=progress)
    injector.join(130)
    assert killed, "the kill did not happen"
    assert progress.straddling(*killed[0]), "the kill landed in no stream"
    for rid, (tokens, reason, code, details, _) in got.items():
        assert code == grpc.StatusCode.OK, (rid, code, details)
        assert (tokens, reason) == expected[rid][:2], rid
    [worker] = wait_for_new_pids(s, "workers", {s.ports["workers"][0]["pid"]})
    assert worker["restarts"] == 1
    m = scrape(state(s)["scheduler"]["metrics_port"])
    assert m["ferry_scheduler_requests_resumed_total"] > 0
    assert m["ferry_scheduler_requests_failed_by_loss_total"] == 0


def test_random_kills_end_every_stream_and_the_stack_serves_again(tiny_model, tmp_path, ferry_pb, stacks):
    s = Stack(tiny_model, tmp_path)
    stacks.append(s)
    requests = requests_mix(ferry_pb, 24, 24, max_tokens=64, lane="batch")
    expected = run_streams(s.gateway, ferry_pb, requests, timeout_s=300)
    results = {}
    streams = threading.Thread(target=lambda: results.update(run_streams(s.gateway, ferry_pb, requests,
                                                                          timeout_s=300)))
    streams.start()
    out = chaos(s, "random", 3, 2)  # three kills, each within its own 2 s
    streams.join(330)
    assert len(results) == len(requests), "some streams never ended"
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"random {i + 1}/3: ") for i, line in enumerate(lines)), out
    for rid, (tokens, reason, code, details, trailers) in results.items():
        # A worker's death is a pause, and so is the scheduler's: the gateway resumes what it held.
        assert code == grpc.StatusCode.OK, (rid, code, details)
        assert (tokens, reason) == expected[rid][:2], rid
    kills = sum(1 for line in lines if "SIGKILL" in line)
    assert kills >= 1, out
    wait_for("a restart for every kill", lambda: (state(s)["scheduler"].get("restarts", 0) +
                                                  sum(w.get("restarts", 0) for w in state(s)["workers"])) == kills, 60)
    serves(s, ferry_pb)


def test_a_killed_gateway_ends_its_streams_and_leaves_nothing_running(tiny_model, tmp_path, ferry_pb, stacks):
    s = Stack(tiny_model, tmp_path)
    stacks.append(s)
    requests = requests_mix(ferry_pb, 8, 8, max_tokens=1500, lane="batch")  # still running at the kill
    progress = StreamProgress()
    results = {}
    streams = threading.Thread(target=lambda: results.update(run_streams(s.gateway, ferry_pb, requests,
                                                                          timeout_s=120, progress=progress)))
    streams.start()
    progress.wait_for(16 * 8, timeout_s=60)  # every stream under way
    before = state(s)["gateway"]
    assert chaos(s, "kill-gateway") == f"kill-gateway: SIGKILL gateway (pid {before['pid']})\n"
    streams.join(150)
    assert len(results) == len(requests), "some streams never ended"
    for rid, (tokens, reason, code, details, _) in results.items():
        assert code == grpc.StatusCode.UNAVAILABLE, (rid, code, details)  # the connection to it broke
        assert 0 < len(tokens) < 1500, rid
    # The scheduler ends what the dead gateway's session held: nothing keeps running for no client.
    metrics = state(s)["scheduler"]["metrics_port"]
    wait_for("the scheduler idle", lambda: scrape(metrics)['ferry_scheduler_requests{state="running"}'] == 0 and
             scrape(metrics)['ferry_scheduler_requests{state="waiting"}'] == 0, 30)
    [after] = wait_for_new_pids(s, "gateway", {before["pid"]})
    assert after["grpc_port"] == before["grpc_port"] and not pid_alive(before["pid"])
    serves(s, ferry_pb)
