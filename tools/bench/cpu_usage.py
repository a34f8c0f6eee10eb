#!/usr/bin/env python3
"""CPU time each process of a local Ferry stack spends while a command runs (Linux /proc).

  python3 tools/bench/cpu_usage.py /tmp/stack.json -- build/bin/ferry-bench run --stack-file /tmp/stack.json ...

Prints the command's output, then the wall time, how busy the whole machine was, and the CPU
seconds (and share of one core) of the gateway, the scheduler, each worker and the command itself:
on a small machine this tells whether the serving processes or the machine were the bottleneck.
"""
import json
import os
import resource
import subprocess
import sys
import time


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def machine_ticks():
    values = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(values), values[3] + values[4]  # all, idle + iowait


def main():
    if "--" not in sys.argv[2:]:
        sys.exit(__doc__)
    stack = json.load(open(sys.argv[1]))
    command = sys.argv[sys.argv.index("--") + 1:]
    pids = {"gateway": stack["gateway"]["pid"], "scheduler": stack["scheduler"]["pid"]}
    for i, w in enumerate(stack.get("workers", [])):
        pids[f"worker-{i}"] = w["pid"]
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    all0, idle0 = machine_ticks()
    t0 = time.time()
    proc = subprocess.run(command)
    wall = time.time() - t0
    all1, idle1 = machine_ticks()
    busy = 1 - (idle1 - idle0) / max(1, all1 - all0)
    print(f"wall {wall:.1f} s; machine busy {busy * 100:.0f}% of {os.cpu_count()} cores")
    for name, pid in pids.items():
        used = cpu_seconds(pid) - before[name]
        print(f"{name}: {used:.1f} CPU-s = {used / wall * 100:.0f}% of one core")
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = child.ru_utime + child.ru_stime
    print(f"{os.path.basename(command[0])}: {used:.1f} CPU-s = {used / wall * 100:.0f}% of one core")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
