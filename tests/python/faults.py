"""Shared code of the fault tests: services started as real processes on loopback (a worker restarted
on its own port as a supervisor would), many streams run at once through the gateway, and the
scheduler's metrics read back. scripts/chaos.sh injects the same faults by hand."""
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from conftest import binary

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "soak"))
from soak import scrape  # noqa: E402  name{labels} -> value of one service's /metrics


class Proc:
    """One service process started with --ready-file; restart() starts it again on the same ports."""

    def __init__(self, name, argv, run_dir, log):
        self.name, self.argv, self.run_dir, self.log = name, list(argv), run_dir, log
        self.proc, self.ports, self.starts = None, None, 0
        self.start()

    def start(self, timeout_s=120):
        self.starts += 1
        ready = self.run_dir / f"{self.name}-{self.starts}.json"
        argv = list(self.argv)
        if self.ports:  # the same address as the first incarnation: its clients reconnect to it
            argv[argv.index("--port") + 1] = str(self.ports["grpc_port"])
        self.proc = subprocess.Popen([*argv, "--ready-file", str(ready)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while not ready.exists():
            assert self.proc.poll() is None, f"{self.name} exited {self.proc.returncode}"
            assert time.time() < deadline, f"{self.name} not ready in {timeout_s} s"
            time.sleep(0.05)
        time.sleep(0.05)  # the file is written whole, but let the writer close it
        ports = json.loads(ready.read_text())
        assert self.ports is None or ports["grpc_port"] == self.ports["grpc_port"]
        self.ports = self.ports or ports
        self.metrics_port = ports["metrics_port"]
        http = ready.with_name(ready.name + ".http.json")  # the gateway's, with --http-port
        self.http_port = json.loads(http.read_text())["http_port"] if http.exists() else None
        return self

    @property
    def address(self):
        return f"127.0.0.1:{self.ports['grpc_port']}"

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def requests_mix(pb, n_greedy, n_seeded, max_tokens, lane=""):
    """Greedy and seeded-sampled requests of varied prompt lengths that run to max_tokens, in `lane`."""
    out = []
    for i in range(n_greedy + n_seeded):
        seeded = i >= n_greedy
        sampling = pb.gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                         temperature=0.8 if seeded else 0.0, top_p=0.95 if seeded else 1.0,
                                         seed=1000 + i if seeded else 0)
        prompt = f"request {i}: " + " ".join(f"word{(i * 7 + k) % 50}" for k in range(3 + (i * 5) % 40))
        out.append(pb.gen.GenerateRequest(request_id=f"r{i}", text=prompt.encode(), sampling=sampling, lane=lane))
    return out


class StreamProgress:
    """What run_streams delivered so far: every token's arrival, by request, for a fault injector that
    waits for a share of the run and for a test that checks where its faults landed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.num_tokens = 0
        self.arrivals = {}  # request id -> [time.monotonic() of each token]

    def add(self, request_id, n):
        now = time.monotonic()
        with self.lock:
            self.num_tokens += n
            self.arrivals.setdefault(request_id, []).extend([now] * n)

    def wait_for(self, num_tokens, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.num_tokens >= num_tokens:
                    return
            time.sleep(0.005)
        raise AssertionError(f"{self.num_tokens} tokens delivered, waited for {num_tokens}")

    def straddling(self, before, after):
        """Requests that had tokens delivered before monotonic time `before` and after `after` (a fault
        sent between the two landed mid-stream for them)."""
        with self.lock:
            return [rid for rid, times in self.arrivals.items() if times[0] < before and times[-1] > after]


def run_streams(gateway, pb, requests, timeout_s=300, progress=None):
    """Streams every request at once; returns {request_id: (token ids, finish reason, status code, status
    details, trailing metadata)} once all have ended. `progress` (a StreamProgress) sees each chunk."""
    channel = grpc.insecure_channel(gateway)
    stub = pb.gen_grpc.GenerationStub(channel)
    results, lock = {}, threading.Lock()

    def one(request):
        tokens, reason, code, details, trailers = [], 0, grpc.StatusCode.OK, "", ()
        call = stub.GenerateStream(request, timeout=timeout_s)
        try:
            for chunk in call:
                tokens += chunk.token_ids
                if progress is not None and chunk.token_ids:
                    progress.add(request.request_id, len(chunk.token_ids))
                reason = chunk.finish_reason or reason
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
        trailers = dict(call.trailing_metadata() or ())
        with lock:
            results[request.request_id] = (tokens, reason, code, details, trailers)

    threads = [threading.Thread(target=one, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    channel.close()
    assert len(results) == len(requests), "some streams never ended"
    return results


def wait_serving(gateway, pb, timeout_s=60):
    """Sends a one-token request through the gateway until one ends OK: the gateway has the scheduler it
    was started with (or one restarted on its address) in rotation. A test that restarts a service with
    new flags waits for this, so that its requests' queue timeouts do not start while the gateway is
    still reconnecting."""
    probe = pb.gen.GenerateRequest(request_id="serving-probe", text=b"probe",
                                   sampling=pb.gen.SamplingParams(max_tokens=1, ignore_eos=True))
    deadline = time.time() + timeout_s
    while True:
        code = run_streams(gateway, pb, [probe], timeout_s=30)["serving-probe"][2]
        if code == grpc.StatusCode.OK:
            return
        assert time.time() < deadline, f"the gateway did not serve within {timeout_s} s: {code}"
        time.sleep(0.2)


def wait_metric(port, name, predicate, timeout_s=60):
    deadline = time.time() + timeout_s
    while True:
        value = scrape(port).get(name)
        if value is not None and predicate(value):
            return value
        assert time.time() < deadline, f"{name} = {value} after {timeout_s} s"
        time.sleep(0.1)
