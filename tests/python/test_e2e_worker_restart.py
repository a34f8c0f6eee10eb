"""A worker outlives its scheduler: when a scheduler dies mid-generation (SIGKILL) and a new one
connects, the new one's requests are served. The worker drops the old stream's sequences when a
new Step stream opens; without that, the restarted scheduler's sequence ids (numbered from 1
again) collide with the dead one's and its steps fail."""
import json
import signal
import subprocess
import time

import grpc

from conftest import binary


def start(cmd, ready_file, log, timeout_s=60):
    proc = subprocess.Popen([*cmd, "--ready-file", str(ready_file)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout_s
    while not ready_file.exists():
        assert proc.poll() is None, f"{cmd[0]} exited {proc.returncode}"
        assert time.time() < deadline, f"{cmd[0]} not ready"
        time.sleep(0.05)
    return proc, json.loads(ready_file.read_text())


def submit(stub, pb, max_tokens):
    """The request's events, alone on a session of its own (the gateway multiplexes many)."""
    sampling = pb.gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True, repetition_penalty=1.0, top_p=1.0)
    request = pb.sched.SubmitRequest(prompt_token_ids=[11, 12, 13, 14, 15], sampling=sampling)
    session = stub.Session(iter([pb.sched.SessionRequests(submits=[pb.sched.SessionSubmit(stream_id=1, request=request)])]),
                           timeout=120)
    for message in session:
        for event in message.events:
            assert event.stream_id == 1 and event.status_code == 0, event
            yield event


def generate(stub, pb, max_tokens):
    tokens = []
    for event in submit(stub, pb, max_tokens):
        tokens += event.token_ids
        if event.finish != pb.sched.FINISH_KIND_NONE:
            return tokens, event.finish
    raise AssertionError("stream ended without a finish")


def test_new_scheduler_is_served_after_the_old_one_died(tiny_model, ferry_pb, tmp_path):
    log = open(tmp_path / "services.log", "wb")
    worker, wports = start([str(binary("ferry-worker")), "--model", str(tiny_model), "--port", "0"],
                           tmp_path / "worker.json", log)
    worker_addr = f"127.0.0.1:{wports['grpc_port']}"
    schedulers = []
    try:
        def scheduler(name):
            proc, ports = start([str(binary("ferry-scheduler")), "--port", "0", "--worker", worker_addr],
                                tmp_path / f"{name}.json", log)
            schedulers.append(proc)
            channel = grpc.insecure_channel(f"127.0.0.1:{ports['grpc_port']}")
            return proc, ferry_pb.sched_grpc.SchedulerStub(channel)

        first, stub = scheduler("first")
        expected, finish = generate(stub, ferry_pb, 6)
        assert len(expected) == 6 and finish == ferry_pb.sched.FINISH_KIND_LENGTH
        # A long generation is running on the worker when its scheduler dies.
        events = submit(stub, ferry_pb, 1500)
        next(events)
        next(events)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)

        second, stub = scheduler("second")
        for _ in range(3):
            tokens, finish = generate(stub, ferry_pb, 6)
            assert finish == ferry_pb.sched.FINISH_KIND_LENGTH
            assert tokens == expected  # greedy: the same tokens as before the restart
        assert worker.poll() is None
    finally:
        for proc in [*schedulers, worker]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        log.close()
