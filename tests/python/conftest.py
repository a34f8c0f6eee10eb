"""Shared fixtures for the end-to-end tests: real binaries, real gRPC on loopback.

The build directory comes from FERRY_BUILD_DIR (default: <repo>/build).
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FERRY_BUILD_DIR", REPO / "build"))
BIN = BUILD / "bin"


def build_sanitizers() -> str:
    """FERRY_SANITIZE of the build under test ("" for a normal build; "address,undefined" or "thread"
    for scripts/sanitize.sh's)."""
    cache = BUILD / "CMakeCache.txt"
    if not cache.exists():
        return ""
    for line in cache.read_text().splitlines():
        if line.startswith("FERRY_SANITIZE:"):
            return line.split("=", 1)[1]
    return ""


def post_json(stack, path, body, timeout=60):
    """POSTs body as JSON to the stack's HTTP front: (status, decoded JSON answer), errors included."""
    req = urllib.request.Request(stack.http + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def binary(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build the project first (scripts/setup.sh)")
    return path


@pytest.fixture(scope="session")
def ferry_pb(tmp_path_factory):
    """Python stubs for proto/ferry/v1, generated with grpcio-tools."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("pb")
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    rc = protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--python_out={out}", f"--grpc_python_out={out}", *protos])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, str(out))
    from ferry.v1 import generation_pb2, generation_pb2_grpc, lora_pb2, lora_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

    class PB:
        gen = generation_pb2
        gen_grpc = generation_pb2_grpc
        sched = scheduler_pb2
        sched_grpc = scheduler_pb2_grpc
        lora = lora_pb2
        lora_grpc = lora_pb2_grpc

    return PB


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run([str(binary("ferry-make-model")), "--preset", "tiny", "--seed", "1", "--out", str(out)],
                   check=True, capture_output=True)
    return out


class Stack:
    """A running ferry-launch process and the ports of every service."""

    def __init__(self, model: Path, run_dir: Path, extra_args=()):
        self.ready_file = run_dir / "stack.json"
        self.log_path = run_dir / "launch.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary("ferry-launch")), "--model", str(model), "--port", "0", "--run-dir", str(run_dir),
             "--ready-file", str(self.ready_file), *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferry-launch exited {self.proc.returncode}:\n{self.log_text()}")
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"stack not ready in time:\n{self.log_text()}")
            time.sleep(0.05)
        self.ports = json.loads(self.ready_file.read_text())
        self.gateway = f"127.0.0.1:{self.ports['gateway']['grpc_port']}"
        self.scheduler = f"127.0.0.1:{self.ports['scheduler']['grpc_port']}"
        http_port = self.ports["gateway"].get("http_port")  # with --http-port
        self.http = f"http://127.0.0.1:{http_port}" if http_port else None

    def metrics_urls(self):
        urls = {"gateway": self.ports["gateway"]["metrics_port"], "scheduler": self.ports["scheduler"]["metrics_port"]}
        for i, w in enumerate(self.ports["workers"]):
            urls[f"worker-{i}"] = w["metrics_port"]
        return {k: f"http://127.0.0.1:{v}/metrics" for k, v in urls.items()}

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def serve(s: Stack):
    """A fixture's body: yields the stack, then stops it and checks that it exited cleanly."""
    yield s
    code = s.stop()
    assert code == 0, f"ferry-launch exited {code} on SIGTERM:\n{s.log_text()}"


def streamed_tool_calls(stream):
    """An openai client's chat stream (one choice) summed up: (content, [[name, arguments], ...] by
    index, finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            calls.setdefault(c.index, ["", ""])
            calls[c.index][0] += c.function.name or ""
            calls[c.index][1] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def run_transformers(script: str, model: Path, payload):
    """Runs `script` (reading JSON on stdin, printing JSON last) with the model directory as argv[1].
    transformers runs in its own process: importing it beside grpc here aborts the interpreter."""
    out = subprocess.run([sys.executable, "-c", script, str(model)], input=json.dumps(payload),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def stack(tiny_model, tmp_path_factory):
    yield from serve(Stack(tiny_model, tmp_path_factory.mktemp("stack")))


@pytest.fixture()
def gen_stub(stack, ferry_pb):
    import grpc

    channel = grpc.insecure_channel(stack.gateway)
    yield ferry_pb.gen_grpc.GenerationStub(channel)
    channel.close()
