#!/usr/bin/env python3
"""Renders one panel of deploy/grafana/ferry.json to a PNG from a live Prometheus, the way Grafana
would draw it (same queries, same legends), for docs and for checking the dashboard without Grafana.

    python3 deploy/grafana/render_panel.py --prometheus http://127.0.0.1:9090 \\
        --panel "Time to first token" --minutes 10 --out ttft.png

Variables: $namespace, $replica and $lane are ".*" (All) unless given with --var name=regex;
$__rate_interval is --rate-interval (default 1m). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

DASHBOARD = Path(__file__).with_name("ferry.json")


def find_panel(dashboard: dict, title: str) -> dict:
    for panel in dashboard["panels"]:
        if panel.get("title") == title:
            return panel
    raise SystemExit(f"no panel titled {title!r} in {DASHBOARD}")


def substitute(expr: str, variables: dict, rate_interval: str) -> str:
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return expr


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    out = fmt or "{{__name__}}"
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    while "{{" in out:  # labels the series does not have
        start = out.index("{{")
        out = out[:start] + out[out.index("}}", start) + 2:]
    return " ".join(out.split()) or "value"


def render(panel: dict, series: list, unit: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime

    scale, label = {"s": (1000.0, "ms"), "percentunit": (100.0, "%"), "bytes": (2.0 ** -20, "MiB")}.get(unit, (1.0, ""))
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    for name, points in series:
        xs = [datetime.fromtimestamp(t) for t, _ in points]
        ax.plot(xs, [v * scale for _, v in points], label=name, linewidth=1.6)
    ax.set_title(panel["title"], loc="left", fontsize=12, fontweight="bold")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.set_ylim(bottom=0)
    if series:  # below the plot, as Grafana's list legend
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.1), fontsize=8, ncol=3, frameon=False)
    if panel.get("description"):
        fig.text(0.01, 0.01, panel["description"], fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--panel", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--end", type=float, default=None, help="unix time (default: now)")
    parser.add_argument("--step", type=float, default=None, help="seconds (default: range / 200)")
    parser.add_argument("--rate-interval", default="1m")
    parser.add_argument("--var", action="append", default=[], help="name=regex, e.g. lane=interactive")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    args = parser.parse_args()

    variables = {"namespace": ".*", "replica": ".*", "lane": ".*"}
    variables.update(dict(v.split("=", 1) for v in args.var))
    panel = find_panel(json.loads(args.dashboard.read_text()), args.panel)
    end = args.end or time.time()
    start = end - args.minutes * 60
    step = args.step or max(1.0, (end - start) / 200)
    series = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], variables, args.rate_interval)
        for result in query_range(args.prometheus, expr, start, end, step):
            points = [(float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf", "-Inf")]
            if points:
                series.append((legend(target.get("legendFormat", ""), result["metric"]), points))
    series.sort(key=lambda s: s[0])
    render(panel, series, panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""), args.out)
    print(f"wrote {args.out}: {len(series)} series")


if __name__ == "__main__":
    main()
