"""ferry-launch supervises its stack (#27): a worker, a tensor-parallel rank or the scheduler that
dies, or a worker that hangs past --step-timeout-s, is restarted on its old ports (its group with
it) and the stack serves again; --restart-policy never and the restart cap stop the stack. The
faults go through scripts/chaos.sh, as a person would run them. Whether requests in flight
survive a loss is the scheduler's part (tests of its own); these check the supervision."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import REPO, Stack, binary

CHAOS = REPO / "scripts" / "chaos.sh"


def chaos(stack, *args, timeout=30):
    out = subprocess.run(["bash", str(CHAOS), str(stack.ready_file), *map(str, args)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def state(stack):
    return json.loads(stack.ready_file.read_text())


def wait_for(what, predicate, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def wait_for_new_pids(stack, key, old, timeout_s=30):
    """The ready file's entries for key ("workers", "scheduler") once every pid differs from old."""
    def changed():
        now = state(stack)[key]
        entries = now if isinstance(now, list) else [now]
        return entries if all(e["pid"] not in old for e in entries) else None
    return wait_for(f"{key} restarted (pids other than {old})", changed, timeout_s)


def serves(stack, ferry_pb, timeout_s=60):
    """Retries a short generation through the gateway until one succeeds: after a restart the
    scheduler and the gateway reconnect on their own schedule."""
    import grpc

    channel = grpc.insecure_channel(stack.gateway)
    stub = ferry_pb.gen_grpc.GenerationStub(channel)
    request = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=[5, 6, 7]),
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=2))
    deadline = time.time() + timeout_s
    try:
        while True:
            try:
                return stub.Generate(request, timeout=10)
            except grpc.RpcError as e:
                if time.time() > deadline:
                    raise AssertionError(f"the stack does not serve again: {e}") from e
                time.sleep(0.2)
    finally:
        channel.close()


def cmdline(pid):
    return open(f"/proc/{pid}/cmdline").read().split("\0")


def assert_forwarded(stack, flag, value, binaries=("ferry-worker", "ferry-scheduler")):
    """An engine flag set on ferry-launch reaches each service that owns it."""
    pids = {"ferry-worker": stack.ports["workers"][0]["pid"], "ferry-scheduler": stack.ports["scheduler"]["pid"]}
    for name in binaries:
        assert f"{flag}={value}" in cmdline(pids[name]), (name, cmdline(pids[name]))


@pytest.fixture()
def stacks():
    """Stacks a test starts; each is stopped (SIGTERM) at the end and must exit 0 unless the test
    already saw it end."""
    started = []
    yield started
    for s in started:
        running = s.proc.poll() is None
        code = s.stop()
        assert not running or code == 0, f"ferry-launch exited {code} on SIGTERM:\n{s.log_text()}"


def test_killed_worker_restarts_on_its_port_and_the_stack_serves_again(tiny_model, tmp_path, ferry_pb, stacks):
    s = Stack(tiny_model, tmp_path)
    stacks.append(s)
    serves(s, ferry_pb)
    before = s.ports["workers"][0]
    assert chaos(s, "kill-worker", 0) == f"kill-worker: SIGKILL worker-0 (pid {before['pid']})\n"
    [after] = wait_for_new_pids(s, "workers", {before["pid"]})
    assert (after["grpc_port"], after["metrics_port"]) == (before["grpc_port"], before["metrics_port"])
    assert after["restarts"] == 1 and pid_alive(after["pid"]) and not pid_alive(before["pid"])
    assert "--port" in cmdline(after["pid"]) and str(before["grpc_port"]) in cmdline(after["pid"])
    # Not set: the worker still gets the default step timeout (its own default is off), so that its
    # Health turns false past it; the scheduler keeps its own default.
    assert "--step-timeout-s=60" in cmdline(after["pid"])
    assert not any(a.startswith("--step-timeout-s") for a in cmdline(s.ports["scheduler"]["pid"]))
    assert f"worker-0 (pid {before['pid']}) killed by signal 9; restarting worker-0 in 0.5 s" in s.log_text()
    serves(s, ferry_pb)


def test_tensor_parallel_rank_death_restarts_the_group_with_a_fresh_rendezvous(tiny_model, tmp_path, ferry_pb,
                                                                                stacks):
    s = Stack(tiny_model, tmp_path, ["--tensor-parallel-size", "2"])
    stacks.append(s)
    serves(s, ferry_pb)
    before = s.ports["workers"]
    assert [a for a in cmdline(before[0]["pid"]) if "gloo" in a] == [str(tmp_path / "gloo-0")]
    chaos(s, "kill-worker", 1)
    after = wait_for_new_pids(s, "workers", {w["pid"] for w in before})
    assert [w["grpc_port"] for w in after] == [w["grpc_port"] for w in before]
    assert not any(pid_alive(w["pid"]) for w in before), "a rank of the old group is still running"
    for w in after:  # both ranks on a rendezvous no earlier incarnation used
        assert [a for a in cmdline(w["pid"]) if "gloo" in a] == [str(tmp_path / "gloo-1")]
    assert not (tmp_path / "gloo-0").exists()
    log = s.log_text()
    assert f"worker-0 (pid {before[0]['pid']}) killed by signal 9: its group restarts together" in log, log
    assert "restarting the worker group (worker-0, worker-1) in 0.5 s" in log, log
    serves(s, ferry_pb)


def test_stopped_worker_is_killed_after_the_step_timeout_and_restarted(tiny_model, tmp_path, ferry_pb, stacks):
    step_timeout_s = 3
    s = Stack(tiny_model, tmp_path, ["--step-timeout-s", str(step_timeout_s)])
    stacks.append(s)
    assert_forwarded(s, "--step-timeout-s", step_timeout_s)
    old = s.ports["workers"][0]["pid"]
    stop_s = step_timeout_s + 5  # SIGCONT after that, when the launcher has not killed it by then
    stop = subprocess.Popen(["bash", str(CHAOS), str(s.ready_file), "stop-worker", "0", str(stop_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stopped_at = time.time()
        wait_for("the worker stopped", lambda: open(f"/proc/{old}/stat").read().split()[2] == "T", 5)
        [new] = wait_for_new_pids(s, "workers", {old}, timeout_s=step_timeout_s + 10)
        # Probed each second with a 1 s deadline, restarted 0.5 s after the kill; the tiny model loads in under 1 s.
        assert time.time() - stopped_at < step_timeout_s + 5
        assert not pid_alive(old) and new["grpc_port"] == s.ports["workers"][0]["grpc_port"]
        assert f"worker-0 (pid {old}) had not answered Health ok for" in s.log_text()
        assert f"(--step-timeout-s {step_timeout_s}); killed; restarting worker-0" in s.log_text()
        serves(s, ferry_pb)
    finally:
        out, err = stop.communicate(timeout=30)
    assert f"stop-worker: worker-0 (pid {old}) is gone after {stop_s} s" in out, out + err


def test_killed_scheduler_restarts_on_its_port_and_the_gateway_reaches_it(tiny_model, tmp_path, ferry_pb, stacks):
    s = Stack(tiny_model, tmp_path)
    stacks.append(s)
    before = s.ports["scheduler"]
    chaos(s, "kill-scheduler")
    [after] = wait_for_new_pids(s, "scheduler", {before["pid"]})
    assert after["grpc_port"] == before["grpc_port"] and after["restarts"] == 1
    assert state(s)["workers"] == s.ports["workers"]  # the workers were left alone
    serves(s, ferry_pb)


def test_restart_policy_never_stops_the_stack_when_a_worker_dies(tiny_model, tmp_path, stacks):
    s = Stack(tiny_model, tmp_path, ["--restart-policy", "never", "--worker-recovery-timeout-s", "7"])
    stacks.append(s)
    pids = [s.ports["workers"][0]["pid"], s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    # The gateway, stopped first, drains until the scheduler has ended what it held for the worker.
    assert "--drain-grace-s=12" in cmdline(s.ports["gateway"]["pid"])
    assert_forwarded(s, "--worker-recovery-timeout-s", 7, binaries=["ferry-scheduler"])
    chaos(s, "kill-worker")
    assert s.proc.wait(timeout=30) == 1, s.log_text()
    assert f"worker-0 (pid {pids[0]}) killed by signal 9; stopping the stack (--restart-policy never)" in s.log_text()
    wait_for("every child gone", lambda: not any(pid_alive(p) for p in pids), 10)


def test_more_restarts_than_the_cap_stop_the_stack(tiny_model, tmp_path, stacks):
    s = Stack(tiny_model, tmp_path, ["--max-restarts-per-minute", "1"])
    stacks.append(s)
    first = s.ports["workers"][0]["pid"]
    chaos(s, "kill-worker")
    [second] = wait_for_new_pids(s, "workers", {first})
    chaos(s, "kill-worker")
    assert s.proc.wait(timeout=30) == 1, s.log_text()
    log = s.log_text()
    assert (f"worker-0 (pid {second['pid']}) killed by signal 9; worker-0 was restarted once within the last 60 s, "
            "the most --max-restarts-per-minute 1 allows: stopping the stack") in log, log
    others = [s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    wait_for("every child gone", lambda: not any(pid_alive(p) for p in others), 10)


def test_bad_supervision_flags_are_refused_naming_the_flag(tiny_model, tmp_path):
    for flag, value in [("--restart-policy", "sometimes"), ("--max-restarts-per-minute", "-1"),
                        ("--step-timeout-s", "0"), ("--worker-recovery-timeout-s", "0")]:
        out = subprocess.run([str(binary("ferry-launch")), "--model", str(tiny_model), "--run-dir", str(tmp_path),
                              flag, value], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and flag in out.stderr and value in out.stderr, (flag, out.stderr)


def test_chaos_refuses_bad_arguments_and_pids_that_are_not_ferry(tmp_path):
    ready = tmp_path / "stack.json"
    sleeper = subprocess.Popen(["sleep", "60"])  # a live pid that is not a ferry binary
    try:
        ready.write_text(json.dumps({"workers": [{"pid": sleeper.pid}], "scheduler": {"pid": sleeper.pid},
                                     "gateway": {"pid": sleeper.pid}}))
        cases = {("kill-worker",): "refusing to signal pid", ("kill-scheduler",): "not a running ferry-scheduler",
                 ("kill-worker", "1"): "RANK must be in [0, 0], got 1",
                 ("stop-worker", "0", "601"): "SECONDS must be in [1, 600], got 601",
                 ("random", "21", "1"): "N must be in [1, 20], got 21",
                 ("random", "2", "0"): "INTERVAL_S must be in [1, 600], got 0",
                 ("random", "x", "1"): "N must be a whole number", ("explode",): "unknown action 'explode'"}
        for args, message in cases.items():
            out = subprocess.run(["bash", str(CHAOS), str(ready), *args], capture_output=True, text=True, timeout=10)
            assert out.returncode != 0 and message in out.stderr, (args, out.stderr)
        assert sleeper.poll() is None, "chaos.sh signalled a process that is not a ferry binary"
        out = subprocess.run(["bash", str(CHAOS)], capture_output=True, text=True, timeout=10)
        assert out.returncode == 2 and "usage: scripts/chaos.sh READY_FILE ACTION" in out.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
