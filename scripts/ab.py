#!/usr/bin/env python3
"""Compare two pto builds on `pto bench dag`, in pairs of runs close in time.

On a shared virtual machine the speed of the CPUs drifts by up to a factor of two within
minutes, so medians of separate runs mostly measure the drift. Each round here runs the old
build, the new one, the new one again and the old one again (ABBA: a linear drift cancels),
one pattern at a time, and reports the per-round ratio new/old: its median, its quartiles and
in how many rounds the new build was faster.

    scripts/ab.py OLD_PTO NEW_PTO [--rounds 16] [--patterns chain,fan,diamond] [--tasks 200000]

Prints one JSON line per pattern (`"bench":"dag_ab"`).
"""

import argparse
import json
import statistics
import subprocess
import sys


def run(pto, pattern, tasks):
    try:
        out = subprocess.run(
            [pto, "bench", "dag", "--json", "--pattern", pattern, "--reps", "1", "--tasks", str(tasks)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"cannot run {pto}: {e}")
    if out.returncode != 0:
        sys.exit(f"{pto} bench dag --pattern {pattern} failed: {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        j = json.loads(line)
        if j.get("bench") == "dag" and j.get("pattern") == pattern:
            return j["ns_per_task"]
    sys.exit(f"{pto} printed no dag line for {pattern}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", help="the baseline pto binary")
    p.add_argument("new", help="the pto binary to compare with it")
    p.add_argument("--rounds", type=int, default=16, help="ABBA rounds per pattern (default 16)")
    p.add_argument("--patterns", default="chain,fan,diamond", help="dag patterns (default chain,fan,diamond)")
    p.add_argument("--tasks", type=int, default=200000, help="tasks per run (default 200000)")
    a = p.parse_args()
    if a.rounds < 1 or a.tasks < 1:
        p.error("--rounds and --tasks must be at least 1")
    for pattern in a.patterns.split(","):
        old, new, ratios = [], [], []
        for _ in range(a.rounds):
            o1 = run(a.old, pattern, a.tasks)
            n1 = run(a.new, pattern, a.tasks)
            n2 = run(a.new, pattern, a.tasks)
            o2 = run(a.old, pattern, a.tasks)
            old += [o1, o2]
            new += [n1, n2]
            ratios.append((n1 + n2) / (o1 + o2))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(json.dumps({
            "bench": "dag_ab",
            "pattern": pattern,
            "rounds": a.rounds,
            "old_median_ns": round(statistics.median(old), 1),
            "new_median_ns": round(statistics.median(new), 1),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_quartiles": [round(q[0], 3), round(q[2], 3)],
            "new_faster_rounds": sum(r < 1 for r in ratios),
        }), flush=True)


if __name__ == "__main__":
    main()
