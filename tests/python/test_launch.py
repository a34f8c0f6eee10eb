"""ferry-launch restarts nothing silently: a child that dies is logged and
fails the stack; SIGTERM stops every child and exits 0 (checked by the
session stack fixture's teardown)."""
import os
import signal
import time

from conftest import Stack


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dead_worker_fails_the_stack(tiny_model, tmp_path):
    s = Stack(tiny_model, tmp_path)
    worker_pid = s.ports["workers"][0]["pid"]
    others = [s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    os.kill(worker_pid, signal.SIGKILL)
    code = s.proc.wait(timeout=30)
    log = s.log_text()
    assert code == 1, log
    assert f"worker-0 (pid {worker_pid}) killed by signal 9" in log, log
    deadline = time.time() + 10
    while any(pid_alive(p) for p in others) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in others), "launch left children running"
    s.stop()


def test_sigterm_stops_all_children(tiny_model, tmp_path):
    s = Stack(tiny_model, tmp_path)
    pids = [w["pid"] for w in s.ports["workers"]] + [s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    assert s.stop() == 0, s.log_text()
    assert not any(pid_alive(p) for p in pids)
