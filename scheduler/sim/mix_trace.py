#!/usr/bin/env python3
"""Writes a ferry-sim trace (JSONL) of one or more lanes with log-normal prompt and output lengths.

For request mixes that the named scenarios (scenarios.cc) do not cover. Each --lane is
  name:share:prompt_mean:prompt_sigma:output_mean:output_sigma:prefix_share:prefix_tokens
(log-normal lengths with that mean and log-space sigma, prompts clamped to [16, 3000] tokens and
outputs to [4, 1024]; `prefix_share` of the lane's requests open with one of 4 shared prefixes of
`prefix_tokens`). Arrivals are Poisson, or gamma gaps with coefficient of variation --cv
(--arrival bursty). Used for docs/benchmarks/scheduler.md sections 3e and 3f, for example the
seed's benchmark mix (512-token prompts, 128-token answers) at 72 req/s:

  python3 scheduler/sim/mix_trace.py --seed 11 --request-rate 72 \
      --lane interactive:1:512:0.5:128:0.0001:0:0 --out /tmp/s72.jsonl
  build/bin/ferry-sim --compare --trace /tmp/s72.jsonl --enable-prefix-caching \
      --slo-tpot-ms 2.5 --caps 8,12,16,20,24,28,32,36,40,44,48,52,56,60,64
"""
import argparse
import json
import math
import random


def parse_lane(spec):
    fields = spec.split(":")
    if len(fields) != 8:
        raise SystemExit(f"--lane {spec!r}: expected 8 ':'-separated fields, got {len(fields)}")
    name, share, pm, ps, om, osig, pshare, ptokens = fields
    return (name, float(share), float(pm), float(ps), float(om), float(osig), float(pshare),
            int(ptokens))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--request-rate", type=float, default=40, help="mean arrivals per second")
    parser.add_argument("--dur", type=float, default=120, help="seconds of arrivals")
    parser.add_argument("--arrival", choices=["poisson", "bursty"], default="poisson")
    parser.add_argument("--cv", type=float, default=3, help="bursty: CV of the gaps")
    parser.add_argument("--lane", action="append", required=True, type=parse_lane)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    def length(mean, sigma, lo, hi):
        mu = math.log(mean) - sigma * sigma / 2  # the log-normal's mean is `mean`
        return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))

    total_share = sum(lane[1] for lane in args.lane)
    t = 0.0
    requests = []
    while True:
        if args.arrival == "poisson":
            t += rng.expovariate(args.request_rate)
        else:
            k = 1 / (args.cv ** 2)
            t += rng.gammavariate(k, 1 / (args.request_rate * k))
        if t >= args.dur:
            break
        x = rng.random() * total_share
        for lane in args.lane:
            x -= lane[1]
            if x <= 0:
                break
        name, _, pm, ps, om, osig, pshare, ptokens = lane
        r = {"arrival_s": t, "prompt_tokens": length(pm, ps, 16, 3000),
             "output_tokens": length(om, osig, 4, 1024), "lane": name}
        if pshare > 0 and rng.random() < pshare:
            r["prefix_id"] = rng.randrange(4)
            r["prefix_tokens"] = min(ptokens, r["prompt_tokens"])
        requests.append(r)
    with open(args.out, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    print(len(requests))


if __name__ == "__main__":
    main()
