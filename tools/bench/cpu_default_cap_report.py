"""Table for tools/bench/cpu_default_cap.sh: per load, the best static cap's output tokens/s,
goodput and median TTFT beside the default controller's, and the ratios issue #52 asks for
(tokens/s >= 0.9x, goodput >= 0.95x of the best static cap's, median TTFT <= 1.5x)."""
import json
import os
import sys


def main(out):
    print("| load | static caps: output tok/s (goodput/s, median TTFT s) | best static | default: output tok/s "
          "(goodput/s, median TTFT s) | tok/s ratio | goodput ratio | median TTFT ratio | default's cap |")
    print("|---|---|---|---|---|---|---|---|")
    loads = [(x, x) for x in ("c1", "c4", "c16", "c64", "open2x")]
    loads += [(f"stated-{x}", x) for x in ("c16", "c64", "open2x")]  # targets stated: 1 s, 50 ms
    for load, static in loads:
        sweep = os.path.join(out, f"{static}-static", "sweep.json")
        default = os.path.join(out, f"{load}-default.json")
        if not (os.path.exists(sweep) and os.path.exists(default)):
            continue
        points = json.load(open(sweep))["points"]
        d = json.load(open(default))
        best = max(points, key=lambda p: p["output_throughput"])
        best_good = max(p["request_goodput"] or 0 for p in points)
        cells = ", ".join(f'{p["max_num_seqs"]}: {p["output_throughput"]:.1f} ({p["request_goodput"]:.2f}, '
                          f'{p["median_ttft_ms"] / 1000:.2f})' for p in points)
        ratio = lambda a, b: f"{a / b:.2f}" if b else ("1.00" if a == b else "inf")
        print(f'| {load} | {cells} | {best["max_num_seqs"]} | {d["output_throughput"]:.1f} '
              f'({d["request_goodput"]:.2f}, {d["median_ttft_ms"] / 1000:.2f}) | '
              f'{ratio(d["output_throughput"], best["output_throughput"])} | {ratio(d["request_goodput"], best_good)} | '
              f'{ratio(d["median_ttft_ms"], best["median_ttft_ms"])} | {d.get("max_num_seqs_metric")} |')


if __name__ == "__main__":
    main(sys.argv[1])
