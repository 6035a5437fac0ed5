#!/usr/bin/python3
"""Renders the last step of one or more tpsp traces (logging.trace) into a PNG:
one row of lanes per trace, for every rank a compute lane and a
communication lane, so that overlap (or its absence) can be seen.

    /usr/bin/python3 scripts/plot_trace.py off.json on.json -o trace.png [--labels "overlap off" "overlap on"]

Needs Debian's python3-matplotlib.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def last_step(path):
    """Events of the last traced step, as {rank: {tid: [(start_ms, dur_ms, name)]}}, and its length."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"] == "step" and e["pid"] == 0]
    if not steps:
        sys.exit(f"{path}: no step in the trace")
    step = max(steps, key=lambda e: e["ts"])
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    lanes = {}
    for e in events:
        if e["name"] == "step" or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
            continue
        lanes.setdefault(e["pid"], {}).setdefault(e["tid"], []).append(((e["ts"] - t0) / 1e3, e["dur"] / 1e3, e["name"]))
    return lanes, (t1 - t0) / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("-o", "--output", default="trace.png")
    parser.add_argument("--labels", nargs="*")
    args = parser.parse_args()
    labels = args.labels or [os.path.splitext(os.path.basename(t))[0] for t in args.traces]
    fig, axes = plt.subplots(len(args.traces), 1, figsize=(12, 2.2 * len(args.traces)), squeeze=False)
    for ax, path, label in zip(axes[:, 0], args.traces, labels):
        lanes, length = last_step(path)
        ticks, names = [], []
        y = 0
        for rank in sorted(lanes):
            for tid, lane_name, color in ((0, "compute", "tab:blue"), (1, "comm", "tab:orange")):
                spans = [(start, dur) for start, dur, _ in lanes[rank].get(tid, [])]
                ax.broken_barh(spans, (y, 0.8), color=color)
                ticks.append(y + 0.4)
                names.append(f"rank {rank} {lane_name}")
                y += 1
        ax.set_yticks(ticks)
        ax.set_yticklabels(names)
        ax.set_xlim(0, length)
        ax.set_title(f"{label}: one step, {length:.0f} ms", fontsize=10)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("ms into the step")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
