#!/usr/bin/env python3
"""Held-out traces through the real services (issue #30): ferry-sim's goodput ratio against the live stack's.

For each chosen held-out trace-family member (scheduler/sim/trace_family.h) this

1. writes the member as a JSONL trace (ferry-sim --family-seed) and dilates it: arrivals, the preset's time
   terms and both SLOs x D, so a modelled step of 0.5-5 ms becomes D times longer and this machine's timer
   overshoot and the scheduler's time between steps are small beside it (docs/benchmarks/bench.md section 3);
2. asks ferry-sim for every static cap's goodput and each adaptive mode's on the dilated trace (the same
   virtual-time run the held-out evaluation does, at the dilated scale);
3. starts the real stack (ferry-launch: gateway, scheduler, worker with the sim backend sleeping the dilated
   cost model) once per mode and once at ferry-sim's best static cap, replays the trace open loop with
   ferry-bench, and counts the requests that met their lane's SLO from ferry-bench's per-request records;
4. prints, per trace and mode, goodput / best static goodput in ferry-sim and through the services, and the
   difference in percentage points. Exit status 1 when a difference exceeds --max-diff-pp.

The traces are chosen by a rule fixed before any was replayed: the held-out seeds in order, the first
three whose drawn load is at least --min-load (below it every cap serves the trace, and the ratio is 1
whatever the controller does), one per cell of CELLS.

    python3 tools/bench/replay_heldout.py --bin-dir build/bin --out-dir /tmp/replay
"""
import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HELD_OUT_SEEDS = range(4000001, 4000065)  # scheduler/sim/heldout.h kHeldOutSeedBegin, kHeldOutNumSeeds
PRESET = "rtx4090d-tp4"
MAX_NUM_SEQS = 64  # EvalMaxNumSeqs for rtx4090d-tp4
STATIC_CAPS = [1, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64]  # HeldOutOptions::static_caps <= 64
TTFT_SLO_MS = 1000.0
CELLS = [(2.5, True), (3.0, False), (4.0, True)]  # (TPOT SLO ms, prefix caching), one per chosen trace
BATCH_SLO_MS = (30000.0, 200.0)  # scheduler/sim/scenarios.cc StandardLanes: the batch lane's TTFT, TPOT
TIME_KEYS_X = ["fixed_s", "batched_step_s", "per_seq_s"]  # times: x D
TIME_KEYS_DIV = ["bandwidth_bytes_per_s", "peak_flops"]  # rates: / D


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True, **kw).stdout


def member_load(bin_dir, seed, out):
    """Writes member `seed` to `out` and returns its drawn load (ferry-sim prints the member's line)."""
    text = run([bin_dir / "ferry-sim", "--family-seed", seed, "--preset", PRESET, "--write-trace", out,
                "--max-num-seqs", MAX_NUM_SEQS])
    m = re.search(r"load ([0-9.]+) of", text)
    if not m:
        raise RuntimeError(f"ferry-sim printed no member line for seed {seed}:\n{text}")
    return float(m.group(1)), text.splitlines()[0]


def dilate(trace_in, trace_out, preset_out, d):
    lines = [json.loads(line) for line in Path(trace_in).read_text().splitlines() if line.strip()]
    with open(trace_out, "w") as f:
        for x in lines:
            x["arrival_s"] *= d
            f.write(json.dumps(x) + "\n")
    p = json.loads((REPO / "scheduler" / "sim" / "presets" / f"{PRESET}.json").read_text())
    for k in TIME_KEYS_X:
        p[k] *= d
    for k in TIME_KEYS_DIV:
        p[k] /= d
    p["name"] = f"{PRESET}-x{d:g}"
    p["_comment"] = f"{PRESET} with every time term x{d:g} (tools/bench/replay_heldout.py)"
    Path(preset_out).write_text(json.dumps(p, indent=2))
    return len(lines)


def sim_goodput(bin_dir, out_dir, trace, preset, tpot_ms, caching, d, modes):
    """Good requests per static cap and per adaptive mode in ferry-sim, counted from its per-request
    results by count_good, as the live runs are. Every lane's TTFT SLO is dilated, the batch lane's 30 s
    included (--lane-ttft-ms): it is the batch lane's first-token target and bounds how long the planner
    lets its queue wait. (ferry-sim's own count keeps the batch lane's 200 ms TPOT undilated; at d = 1 the
    two must agree, which is checked.)"""
    good = {}
    runs = [(f"static {c}", "static", c) for c in STATIC_CAPS] + [(m, m, MAX_NUM_SEQS) for m in modes]
    for name, mode, cap in runs:
        results = out_dir / f"sim-{Path(trace).stem}-{name.replace(' ', '-')}.jsonl"
        run([bin_dir / "ferry-sim", "--trace", trace, "--preset", preset, "--controller-mode", mode,
             "--max-num-seqs", cap, "--max-num-batched-tokens", 2048,  # the evaluation's, as the stack below
             "--slo-ttft-ms", TTFT_SLO_MS * d, "--slo-tpot-ms", tpot_ms * d,
             "--lane-ttft-ms", f"batch={BATCH_SLO_MS[0] * d:g}",
             "--enable-prefix-caching" if caching else "--no-enable-prefix-caching", "--write-results", results])
        rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        records = [{"status": "OK" if r["ttft_s"] is not None else "UNFINISHED", "lane": r["lane"], "send_s": 0,
                    "scheduled_s": 0, "ttft_ms": 1e3 * (r["ttft_s"] or 0), "tpot_ms": 1e3 * (r["tpot_s"] or 0)}
                   for r in rows]
        good[name] = count_good(records, tpot_ms, d)
        if d == 1 and good[name] != sum(r["good"] for r in rows):
            raise RuntimeError(f"count_good disagrees with ferry-sim on {results}")
    return good


def lanes_file(path):
    # The sim's lanes (StandardLanes): interactive above batch, nothing refused or timed out in a queue, so
    # the only difference from ferry-sim is the services themselves.
    lanes = [{"name": "interactive", "priority": 1, "max_queued": 0},
             {"name": "batch", "priority": 0, "max_queued": 0},
             {"name": "default", "priority": 0, "max_queued": 0}]
    Path(path).write_text(json.dumps({"lanes": lanes, "default": "default"}))


def model_dir(bin_dir, out_dir):
    """The tiny checkpoint: the sim backend reads its config and tokenizer and computes nothing."""
    model = out_dir / "model"
    if not (model / "config.json").exists():
        run([bin_dir / "ferry-make-model", "--preset", "tiny", "--seed", 1, "--out", model])
    return model


def replay(bin_dir, run_dir, model, trace, preset, mode, cap, tpot_ms, caching, d):
    """One live run; returns ferry-bench's per-request records."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lanes = run_dir / "lanes.json"
    lanes_file(lanes)
    ready = run_dir / "stack.json"
    ready.unlink(missing_ok=True)
    args = [bin_dir / "ferry-launch", "--model", model, "--port", 0, "--run-dir", run_dir, "--ready-file", ready,
            "--log-level", "warn", f"--gateway-arg=--lanes-file={lanes}",
            "--worker-arg=--backend=sim", f"--worker-arg=--cost-model={preset}", "--worker-arg=--sim-live-tokens=1000",
            # ferry-sim's max_model_len (scenarios.cc DefaultSchedulerConfig): the family's RAG prompts reach
            # 3,000 + 1,024 tokens, past the tiny config's 2,048 positions, which the sim backend never computes.
            "--worker-arg=--max-model-len=4096", "--worker-arg=--block-size=16",
            f"--scheduler-arg=--controller-mode={mode}", f"--scheduler-arg=--max-num-seqs={cap}",
            "--scheduler-arg=--max-num-batched-tokens=2048", "--scheduler-arg=--max-model-len=4096",
            f"--scheduler-arg=--slo-ttft-ms={TTFT_SLO_MS * d:g}", f"--scheduler-arg=--slo-tpot-ms={tpot_ms * d:g}",
            "--scheduler-arg=--slo-lane=interactive", "--scheduler-arg=--slo-percentile=95",
            # The first-token target of each lane the family's traces use, as ferry-sim sets them (its
            # dilated run gets the batch lane's too): the order of --serve-late-last, and the wait the
            # planner allows the batch lane. A lane named here without traffic would bind that wait.
            f"--scheduler-arg=--lane-ttft-ms=interactive={TTFT_SLO_MS * d:g}",
            f"--scheduler-arg=--lane-ttft-ms=batch={BATCH_SLO_MS[0] * d:g}",
            "--scheduler-arg=--" + ("" if caching else "no-") + "enable-prefix-caching"]
    log = open(run_dir / "launch.log", "wb")
    proc = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not ready.exists():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"stack did not start: {run_dir / 'launch.log'}")
            time.sleep(0.1)
        time.sleep(0.5)  # the ready file is written once; let it be complete
        records = run_dir / "requests.jsonl"
        run([bin_dir / "ferry-bench", "run", "--stack-file", ready, "--trace", trace, "--num-requests", 10**7,
             "--max-concurrency", 100000,  # ferry-sim admits every arrival
             "--request-timeout-s", 3600, "--no-progress", "--json", run_dir / "bench.json",
             "--requests-jsonl", records])
        return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def count_good(records, tpot_ms, d):
    """Requests that met their lane's SLO, as ferry-sim counts them (report.cc MeetsSlo): TTFT from the
    request's due time (ferry-sim's arrival; a late send counts against the service) and TPOT =
    (E2EL - TTFT) / (output tokens - 1)."""
    good = 0
    for r in records:
        if r["status"] != "OK":
            continue
        ttft_slo, tpot_slo = BATCH_SLO_MS if r["lane"] == "batch" else (TTFT_SLO_MS, tpot_ms)
        late_ms = (r["send_s"] - r["scheduled_s"]) * 1e3
        ttft = late_ms + r.get("ttft_ms", float("inf"))
        tpot = r.get("tpot_ms", 0.0)  # one output token: no TPOT, as ferry-sim's 0
        good += ttft <= ttft_slo * d and tpot <= tpot_slo * d
    return good


def choose_seeds(bin_dir, out_dir, min_load, count):
    chosen = []
    for seed in HELD_OUT_SEEDS:
        raw = out_dir / f"member-{seed}.jsonl"
        load, line = member_load(bin_dir, seed, raw)
        if load >= min_load:
            chosen.append((seed, raw, line))
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"fewer than {count} held-out members with load >= {min_load}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", type=Path, default=REPO / "build" / "bin")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--dilation", type=float, default=3.0, help="every time x this (arrivals, steps, SLOs)")
    ap.add_argument("--modes", default="goodput", help="adaptive modes to replay, comma-separated")
    ap.add_argument("--min-load", type=float, default=0.9)
    ap.add_argument("--max-diff-pp", type=float, default=5.0)
    ap.add_argument("--sim-only", action="store_true", help="choose the traces and print ferry-sim's ratios only")
    ap.add_argument("--only-seed", type=int, default=0,
                    help="of the chosen traces, replay only this seed's (a rerun after a controller change)")
    a = ap.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir, d = a.bin_dir.resolve(), a.dilation
    model = model_dir(bin_dir, a.out_dir)
    modes = [m for m in a.modes.split(",") if m]
    rows, worst = [], 0.0
    for (seed, raw, line), (tpot_ms, caching) in zip(choose_seeds(bin_dir, a.out_dir, a.min_load, len(CELLS)), CELLS):
        if a.only_seed and seed != a.only_seed:
            continue
        print(f"== {line}; TPOT SLO {tpot_ms} ms, prefix caching {'on' if caching else 'off'}", flush=True)
        trace, preset = a.out_dir / f"trace-{seed}-x{d:g}.jsonl", a.out_dir / f"preset-x{d:g}.json"
        n = dilate(raw, trace, preset, d)
        undilated = sim_goodput(bin_dir, a.out_dir, raw, REPO / "scheduler" / "sim" / "presets" / f"{PRESET}.json",
                                tpot_ms, caching, 1.0, modes)
        sim = sim_goodput(bin_dir, a.out_dir, trace, preset, tpot_ms, caching, d, modes)
        best_cap = min(STATIC_CAPS, key=lambda c: (-sim[f"static {c}"], c))
        best = sim[f"static {best_cap}"]
        if a.sim_only:
            print("   ferry-sim good: " + ", ".join(f"{k} {v}" for k, v in sim.items()), flush=True)
            continue
        live = {}
        for name, mode, cap in [(f"static {best_cap}", "static", best_cap)] + [(m, m, MAX_NUM_SEQS) for m in modes]:
            t0 = time.time()
            records = replay(bin_dir, a.out_dir / f"run-{seed}-{name.replace(' ', '-')}", model, trace, preset,
                             mode, cap, tpot_ms, caching, d)
            live[name] = count_good(records, tpot_ms, d)
            failed = sum(r["status"] != "OK" for r in records)
            print(f"   live {name}: {live[name]} of {len(records)} good, {failed} failed ({time.time() - t0:.0f} s)",
                  flush=True)
        for m in modes:
            sim_ratio, live_ratio = sim[m] / best, live[m] / live[f"static {best_cap}"]
            diff = 100 * (live_ratio - sim_ratio)
            worst = max(worst, abs(diff))
            rows.append((seed, tpot_ms, caching, n, best_cap, m, undilated[m] / max(1, max(
                undilated[f"static {c}"] for c in STATIC_CAPS)), sim_ratio, live_ratio, diff,
                sim[m], best, live[m], live[f"static {best_cap}"]))
    print(f"\nDilation x{d:g}; preset {PRESET}; TTFT SLO {TTFT_SLO_MS:g} ms (batch lane {BATCH_SLO_MS[0]:g} / "
          f"{BATCH_SLO_MS[1]:g} ms), times x{d:g} in the runs")
    print("| seed | TPOT SLO ms | caching | requests | best static cap (sim) | mode | ferry-sim ratio (undilated) "
          "| ferry-sim ratio | live ratio | live - sim (pp) | sim good: mode / best static | live good: mode / static |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (seed, tpot, caching, n, cap, m, und, sr, lr, diff, sg, sb, lg, lb) in rows:
        print(f"| {seed} | {tpot:g} | {'on' if caching else 'off'} | {n} | {cap} | {m} | {und:.3f} | {sr:.3f} "
              f"| {lr:.3f} | {diff:+.1f} | {sg} / {sb} | {lg} / {lb} |")
    print(f"\nlargest |live - sim|: {worst:.1f} pp (limit {a.max_diff_pp:g})")
    return 0 if worst <= a.max_diff_pp else 1


if __name__ == "__main__":
    sys.exit(main())
