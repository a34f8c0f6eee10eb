#!/usr/bin/env python3
"""End-to-end load through the whole stack (gateway -> scheduler -> worker).

Sends N requests of fixed prompt/output lengths with C in flight (closed loop)
and prints output tokens/s and per-request latency percentiles. Starts its own
stack with ferry-launch unless --target points at a running gateway.

  .venv/bin/python tools/bench/e2e_load.py --model models/qwen2.5-0.5b-random \
      --requests 64 --prompt-tokens 128 --output-tokens 64 --concurrency 16
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]


def load_stubs():
    out = Path(tempfile.mkdtemp(prefix="ferry-pb-"))
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    if protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--python_out={out}", f"--grpc_python_out={out}", *protos]):
        sys.exit("protoc failed")
    sys.path.insert(0, str(out))
    from ferry.v1 import generation_pb2, generation_pb2_grpc
    return generation_pb2, generation_pb2_grpc


def start_stack(args):
    """ferry-launch on args.model from args.build_dir with args.launch_arg; (process, its ready file's ports)."""
    run = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    ready = run / "stack.json"
    cmd = [str(Path(args.build_dir) / "bin" / "ferry-launch"), "--model", args.model, "--port", "0",
           "--run-dir", str(run), "--ready-file", str(ready), "--log-level", "warn", *args.launch_arg]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(run / "launch.log", "wb"))
    while not ready.exists():
        if proc.poll() is not None:
            sys.exit(f"ferry-launch failed; see {run / 'launch.log'}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())


def percentile(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint directory (starts a stack)")
    ap.add_argument("--target", help="gateway host:port of a running stack")
    ap.add_argument("--build-dir", default=os.environ.get("FERRY_BUILD_DIR", str(REPO / "build")))
    ap.add_argument("--launch-arg", action="append", default=[], help="extra ferry-launch flag (repeatable)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8000, help="prompt token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not (args.model or args.target):
        ap.error("give --model or --target")

    pb, pb_grpc = load_stubs()
    proc, target = None, args.target
    if not target:
        proc, ports = start_stack(args)
        target = f"127.0.0.1:{ports['gateway']['grpc_port']}"
    try:
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(target))
        rng = random.Random(args.seed)
        prompts = [[rng.randrange(10, args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]

        def one(ids):
            req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(
                max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True))
            start = time.perf_counter()
            ttft, n = None, 0
            for chunk in stub.GenerateStream(req, timeout=3600):
                if ttft is None and chunk.token_ids:
                    ttft = time.perf_counter() - start
                n += len(chunk.token_ids)
            return time.perf_counter() - start, ttft, n

        one(prompts[0][:8])  # warm up
        start = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            results = list(pool.map(one, prompts))
        wall = time.perf_counter() - start
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)

    latencies = [r[0] for r in results]
    ttfts = [r[1] for r in results]
    out_tokens = sum(r[2] for r in results)
    summary = {
        "requests": args.requests, "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
        "concurrency": args.concurrency, "wall_s": round(wall, 2),
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "total_tokens_per_s": round((out_tokens + args.requests * args.prompt_tokens) / wall, 1),
        "latency_s": {p: round(percentile(latencies, p), 3) for p in (50, 90, 99)},
        "ttft_s": {p: round(percentile(ttfts, p), 3) for p in (50, 90, 99)},
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
