#!/usr/bin/env python3
"""Ferry's soak test (#29): the real stack on loopback under open-loop load for a bounded time,
checking that nothing leaks and nothing fails that should not.

1. Starts ferry-launch on a model (default: a random qwen2.5-0.5b-shape checkpoint it writes).
2. Measures capacity: a closed loop of --concurrency streams for --probe-s seconds (requests/s).
3. Sends Poisson arrivals at --load (0.7) of that for --minutes: random prompts and lengths; 20% of
   the requests cancelled by the client at a random point, 5% with a deadline of 5-50% of the mean
   latency the probe measured (they expire in the queue or mid-stream).
4. Every --sample-s (10) seconds: each process's RSS (/proc/PID/status) and the scheduler's KV use.
5. Then waits for the stack to go idle and checks:
   - RSS of each process grew at most --max-rss-growth-mb (50) from the first sample after warm-up
     (the first --warmup fraction, 20%, of the run) to the last;
   - the KV cache usage is back to its idle value (0: every block free or only cached);
   - every request ran to its length, or was CANCELLED (the ones it cancelled), or ended by its
     deadline (finish TIMEOUT after some tokens, or DEADLINE_EXCEEDED; the ones given a short
     one); nothing else.
Exit 0 when it passes, 1 when a check fails (each failure printed), 2 on a usage or start error.
Writes the samples and the verdict as JSON (--json). Loopback only; bounded in time and count.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_pb(out_dir):
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    if protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    *protos]) != 0:
        sys.exit("soak: protoc failed")
    sys.path.insert(0, str(out_dir))
    from ferry.v1 import generation_pb2, generation_pb2_grpc
    return generation_pb2, generation_pb2_grpc


def scrape(port):
    """name{labels} -> value of one service's /metrics (the fault tests use it too)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class Stack:
    def __init__(self, build, model, run_dir, extra):
        self.ready = run_dir / "stack.json"
        self.log = open(run_dir / "launch.log", "wb")
        self.proc = subprocess.Popen([str(build / "bin" / "ferry-launch"), "--model", str(model), "--port", "0",
                                      "--run-dir", str(run_dir), "--ready-file", str(self.ready),
                                      "--log-level", "warn", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while not self.ready.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                sys.exit(f"soak: the stack did not start; see {run_dir / 'launch.log'}")
            time.sleep(0.1)
        ports = json.loads(self.ready.read_text())
        self.gateway = f"127.0.0.1:{ports['gateway']['grpc_port']}"
        self.scheduler_metrics = ports["scheduler"]["metrics_port"]
        self.pids = {"gateway": ports["gateway"]["pid"], "scheduler": ports["scheduler"]["pid"]}
        for i, w in enumerate(ports["workers"]):
            self.pids[f"worker-{i}"] = w["pid"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Load:
    """Sends requests and records how each ended: (kind, status name)."""

    def __init__(self, pb, pb_grpc, gateway, args, rng):
        import grpc

        self.grpc, self.pb, self.args, self.rng = grpc, pb, args, rng
        self.stub = pb_grpc.GenerationStub(grpc.insecure_channel(gateway))
        self.lock = threading.Lock()
        self.outcomes = []
        self.mean_latency_s = 1.0  # until the probe measured it

    def one(self, kind, prompt, max_tokens, cancel_after, timeout_s):
        req = self.pb.GenerateRequest(token_ids=self.pb.TokenIds(ids=prompt), sampling=self.pb.SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0.0), lane=self.args.lane)
        status, finish = "OK", 0
        try:
            call = self.stub.GenerateStream(req, timeout=timeout_s)
            for i, chunk in enumerate(call):
                finish = chunk.finish_reason or finish
                if kind == "cancel" and i + 1 >= cancel_after:
                    call.cancel()
                    break
            if kind == "cancel" and status == "OK" and not finish:
                status = "CANCELLED" if call.code() in (None, self.grpc.StatusCode.CANCELLED) else call.code().name
        except self.grpc.RpcError as e:
            status = e.code().name
        if status == "OK":  # how it ended: LENGTH, or TIMEOUT when the server's deadline cut it
            status = self.pb.FinishReason.Name(finish).removeprefix("FINISH_REASON_") if finish else "NO_FINISH"
        with self.lock:
            self.outcomes.append((kind, status))

    def request(self, kind):
        a = self.args
        prompt = [self.rng.randrange(10, a.token_id_max) for _ in range(self.rng.randint(a.min_prompt, a.max_prompt))]
        max_tokens = self.rng.randint(a.min_output, a.max_output)
        cancel_after = self.rng.randint(1, max_tokens)
        # A deadline of 5-50% of the mean latency under load: it expires in the queue or mid-stream.
        timeout_s = self.rng.uniform(0.05, 0.5) * self.mean_latency_s if kind == "deadline" else a.request_timeout_s
        return kind, prompt, max_tokens, cancel_after, timeout_s


def probe_capacity(load, args):
    """Requests per second a closed loop of args.concurrency streams completes in args.probe_s; sets
    load.mean_latency_s, which the short deadlines are drawn against."""
    end = time.time() + args.probe_s
    done, latency = [0], [0.0]

    def worker():
        while time.time() < end:
            t0 = time.time()
            load.one(*load.request("ok"))
            latency[0] += time.time() - t0
            done[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    load.outcomes.clear()
    load.mean_latency_s = latency[0] / max(1, done[0])
    return done[0] / (time.time() - start)


def run(args):
    build = Path(args.build_dir)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ferry-soak-") as tmp:
        tmp = Path(tmp)
        (tmp / "pb").mkdir()
        pb, pb_grpc = load_pb(tmp / "pb")
        model = Path(args.model) if args.model else tmp / "model"
        if not args.model:
            subprocess.run([str(build / "bin" / "ferry-make-model"), "--preset", args.preset, "--seed", "1",
                            "--out", str(model)], check=True, capture_output=True)
        (tmp / "run").mkdir()
        extra = [f"--scheduler-arg={a}" for a in args.scheduler_arg] + [f"--worker-arg={a}" for a in args.worker_arg]
        stack = Stack(build, model, tmp / "run", extra)
        try:
            return soak(stack, pb, pb_grpc, args, rng)
        finally:
            stack.stop()


def soak(stack, pb, pb_grpc, args, rng):
    load = Load(pb, pb_grpc, stack.gateway, args, rng)
    idle_kv = scrape(stack.scheduler_metrics)["ferry_scheduler_kv_cache_usage_ratio"]
    capacity = probe_capacity(load, args)
    rate = args.load * capacity
    print(f"soak: capacity {capacity:.2f} requests/s, mean latency {load.mean_latency_s * 1e3:.0f} ms; sending "
          f"{rate:.2f}/s for {args.minutes} min", flush=True)
    samples, duration = [], args.minutes * 60.0
    start = time.time()
    next_sample = start
    with ThreadPoolExecutor(max_workers=args.max_in_flight) as pool:
        t = start
        while t - start < duration:
            t += rng.expovariate(rate)
            while time.time() < t:
                if time.time() >= next_sample:
                    samples.append(sample(stack, start))
                    next_sample += args.sample_s
                time.sleep(min(0.05, max(0.0, t - time.time())))
            u = rng.random()
            kind = "cancel" if u < args.cancel_share else "deadline" if u < args.cancel_share + args.deadline_share else "ok"
            pool.submit(load.one, *load.request(kind))
    # Every request has ended; the stack goes idle.
    deadline = time.time() + args.idle_timeout_s
    while scrape(stack.scheduler_metrics)["ferry_scheduler_kv_cache_usage_ratio"] != idle_kv and time.time() < deadline:
        time.sleep(0.5)
    samples.append(sample(stack, start))
    return verdict(args, samples, load.outcomes, idle_kv, capacity)


def sample(stack, start):
    m = scrape(stack.scheduler_metrics)
    return {"t_s": round(time.time() - start, 1), "kv_usage": m["ferry_scheduler_kv_cache_usage_ratio"],
            "rss_mb": {name: round(rss_mb(pid), 1) for name, pid in stack.pids.items()}}


def verdict(args, samples, outcomes, idle_kv, capacity):
    failures = []
    warm = [s for s in samples if s["t_s"] >= args.warmup * args.minutes * 60.0]
    first, last = (warm[0], warm[-1]) if warm else (samples[0], samples[-1])
    growth = {name: round(last["rss_mb"][name] - first["rss_mb"][name], 1) for name in first["rss_mb"]}
    for name, mb in growth.items():
        if mb > args.max_rss_growth_mb:
            failures.append(f"{name}: RSS grew {mb} MB after warm-up (limit {args.max_rss_growth_mb} MB)")
    if last["kv_usage"] != idle_kv:
        failures.append(f"KV cache usage {last['kv_usage']} after the load, not back to its idle {idle_kv}")
    allowed = {"ok": {"LENGTH"}, "cancel": {"LENGTH", "CANCELLED"}, "deadline": {"LENGTH", "TIMEOUT", "DEADLINE_EXCEEDED"}}
    counts, unexpected = {}, {}
    for kind, status in outcomes:
        counts[f"{kind}:{status}"] = counts.get(f"{kind}:{status}", 0) + 1
        if status not in allowed[kind]:
            unexpected[f"{kind}:{status}"] = unexpected.get(f"{kind}:{status}", 0) + 1
    if unexpected:
        failures.append(f"unexpected endings: {unexpected}")
    report = {"capacity_rps": capacity, "requests": len(outcomes), "outcomes": counts, "rss_growth_mb": growth,
              "idle_kv_usage": idle_kv, "samples": samples, "failures": failures, "passed": not failures}
    print(f"soak: {len(outcomes)} requests {counts}; RSS growth after warm-up {growth} MB; "
          f"KV usage at the end {last['kv_usage']} (idle {idle_kv})")
    for f in failures:
        print(f"soak: FAIL: {f}")
    print("soak: PASS" if not failures else "soak: FAILED", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if not failures else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--build-dir", default=os.environ.get("FERRY_BUILD_DIR", str(REPO / "build")))
    p.add_argument("--model", help="checkpoint folder (default: a random --preset one)")
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--load", type=float, default=0.7, help="share of the measured capacity sent")
    p.add_argument("--probe-s", type=float, default=30)
    p.add_argument("--concurrency", type=int, default=8, help="streams of the capacity probe")
    p.add_argument("--max-in-flight", type=int, default=64)
    p.add_argument("--cancel-share", type=float, default=0.20)
    p.add_argument("--deadline-share", type=float, default=0.05)
    p.add_argument("--request-timeout-s", type=float, default=300)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--min-output", type=int, default=8)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--token-id-max", type=int, default=2000)
    p.add_argument("--lane", default="batch", help="the batch lane queues up to 600 s: load spikes wait, not fail")
    p.add_argument("--sample-s", type=float, default=10)
    p.add_argument("--idle-timeout-s", type=float, default=60, help="how long the KV cache may take to drain")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the run before RSS is compared")
    p.add_argument("--max-rss-growth-mb", type=float, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scheduler-arg", action="append", default=[])
    p.add_argument("--worker-arg", action="append", default=[])
    p.add_argument("--json")
    args = p.parse_args()
    if args.minutes <= 0 or not 0 < args.load <= 1:
        p.error(f"--minutes {args.minutes} must be > 0 and --load {args.load} in (0, 1]")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
