#!/usr/bin/env python3
"""Writes a ferry-sim trace (JSONL) of diurnal traffic whose lane mix shifts over the day.

The `diurnal` scenario (scenarios.cc) scales both lanes by one curve, so the request mix, and
with it the cap at the knee, stays the same all day. Here interactive chat follows the day
curve, 28 req/s x (1 - A cos(2 pi t / 120 s)), and batch documents its inverse, 12 req/s x
(1 + A cos(...)): bulk jobs run off-peak. Lengths and prefixes as MixedLanes() in scenarios.cc.
Used for docs/benchmarks/scheduler.md section 3d:

  python3 scheduler/sim/diurnal_mix_trace.py --seed 13 --out /tmp/diurnal_mix.jsonl
  build/bin/ferry-sim --compare --trace /tmp/diurnal_mix.jsonl --enable-prefix-caching \
      --slo-tpot-ms 2 --caps 8,12,16,20,24,28,32,36,40,44,48,52,56,60,64
"""
import argparse
import json
import math
import random

DURATION_S = 120.0
PERIOD_S = 120.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--amplitude", type=float, default=0.8, help="A: 0 keeps the mix fixed")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    def length(mean, sigma, lo, hi):  # log-normal with the given mean, clipped
        mu = math.log(mean) - sigma * sigma / 2
        return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))

    def arrivals(rate, peak):  # Poisson with a time-varying rate, by thinning
        t, times = 0.0, []
        while True:
            t += rng.expovariate(peak)
            if t >= DURATION_S:
                return times
            if rng.random() < rate(t) / peak:
                times.append(t)

    day = lambda t: 1 - args.amplitude * math.cos(2 * math.pi * t / PERIOD_S)
    requests = []
    for t in arrivals(lambda t: 28 * day(t), 28 * (1 + args.amplitude)):
        r = {"arrival_s": t, "prompt_tokens": length(400, 0.6, 16, 2048),
             "output_tokens": length(160, 0.7, 4, 1024), "lane": "interactive"}
        if rng.random() < 0.5:  # half share one of 4 system prompts of 128 tokens
            r["prefix_id"] = rng.randrange(4)
            r["prefix_tokens"] = min(128, r["prompt_tokens"])
        requests.append(r)
    for t in arrivals(lambda t: 12 * (2 - day(t)), 12 * (1 + args.amplitude)):
        requests.append({"arrival_s": t, "prompt_tokens": length(1200, 0.5, 128, 3072),
                         "output_tokens": length(300, 0.6, 16, 1024), "lane": "batch"})
    requests.sort(key=lambda r: r["arrival_s"])
    with open(args.out, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    print(f"{len(requests)} requests -> {args.out}")


if __name__ == "__main__":
    main()
