"""Two scheduler replicas behind one gateway: requests are spread over both;
when one replica is killed mid-load every request still ends with its whole
answer (one that had started on the dead replica resumes on the other) and
traffic continues on the other."""
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, binary


class Proc:
    def __init__(self, name, args, run_dir):
        self.ready = run_dir / f"{name}.json"
        self.log = open(run_dir / f"{name}.log", "wb")
        self.proc = subprocess.Popen([str(binary(name.split("-")[0] + "-" + name.split("-")[1])), *args,
                                      "--ready-file", str(self.ready)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not self.ready.exists():
            assert self.proc.poll() is None, f"{name} exited {self.proc.returncode}"
            assert time.time() < deadline, f"{name} not ready"
            time.sleep(0.05)
        self.ports = json.loads(self.ready.read_text())

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture()
def replicas(tiny_model, tmp_path):
    procs = []
    try:
        sim = ["--backend", "sim", "--cost-model", str(REPO / "tests/fixtures/sim_5ms.json"), "--sim-live-tokens", "1000"]
        schedulers = []
        for i in range(2):
            w = Proc(f"ferry-worker-{i}", ["--model", str(tiny_model), "--port", "0", *sim], tmp_path)
            procs.append(w)
            s = Proc(f"ferry-scheduler-{i}", ["--port", "0", "--worker", f"127.0.0.1:{w.ports['grpc_port']}"], tmp_path)
            procs.append(s)
            schedulers.append(s)
        g = Proc("ferry-gateway-0", ["--tokenizer", str(tiny_model), "--port", "0",
                                     *[a for s in schedulers for a in ("--scheduler", f"127.0.0.1:{s.ports['grpc_port']}")]],
                 tmp_path)
        procs.append(g)
        yield g, schedulers
    finally:
        for p in reversed(procs):
            p.stop()


def steps(scheduler):
    text = urllib.request.urlopen(f"http://127.0.0.1:{scheduler.ports['metrics_port']}/metrics", timeout=5).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "ferry_scheduler_steps" for s in f.samples)


def test_killing_a_replica_mid_load(replicas, ferry_pb):
    gateway, schedulers = replicas
    stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(f"127.0.0.1:{gateway.ports['grpc_port']}"))

    def one(i):
        req = ferry_pb.gen.GenerateRequest(text=f"replica {i} ".encode() * (1 + i % 7),
                                           sampling=ferry_pb.gen.SamplingParams(max_tokens=60, ignore_eos=True))
        try:
            chunks = list(stub.GenerateStream(req, timeout=60))
            return ("ok", chunks[-1].finish_reason, sum(len(c.token_ids) for c in chunks))
        except grpc.RpcError as e:
            return (e.code(), None, None)

    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        first = [pool.submit(one, i) for i in range(48)]
        time.sleep(0.6)
        assert steps(schedulers[0]) > 0 and steps(schedulers[1]) > 0, "both replicas should serve traffic"
        schedulers[1].proc.send_signal(signal.SIGKILL)
        results = [f.result(timeout=120) for f in first]
        # After the kill, everything goes to the surviving replica.
        later = list(pool.map(one, range(100, 132)))
    # Both replicas were serving when one died: the dead one's requests resume on the survivor (the
    # gateway's migration), so every request ends whole (exact tokens: test_e2e_scheduler_loss.py).
    assert all(r[0] == "ok" and r[1] == ferry_pb.gen.FINISH_REASON_LENGTH and r[2] == 60 for r in results), results
    assert all(r[0] == "ok" and r[2] == 60 for r in later), later
