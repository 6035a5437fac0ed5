#!/usr/bin/python3
"""Draws the loss curves of one or more tpsp runs into a PNG.

    /usr/bin/python3 scripts/plot_metrics.py runs/a/metrics.jsonl [runs/b/metrics.jsonl ...] -o loss.png

Each run is a JSON-lines metrics file as `tpsp train` writes it
(logging.metrics); the training loss is drawn as a line, the validation loss
as dots. Needs Debian's python3-matplotlib.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    steps, losses, val_steps, val_losses = [], [], [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not a JSON line: {e}")
            steps.append(record["step"])
            losses.append(record["loss"])
            if "val_loss" in record:
                val_steps.append(record["step"])
                val_losses.append(record["val_loss"])
    if not steps:
        sys.exit(f"{path}: no metrics in the file")
    return steps, losses, val_steps, val_losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files, one per run")
    parser.add_argument("-o", "--output", default="loss.png", help="the PNG to write (default loss.png)")
    parser.add_argument("--labels", nargs="*", help="a name per run (default: the file's directory)")
    args = parser.parse_args()
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(m))) for m in args.metrics]
    if len(labels) != len(args.metrics):
        sys.exit("--labels: give one label per metrics file")

    fig, ax = plt.subplots(figsize=(8, 5))
    for path, label in zip(args.metrics, labels):
        steps, losses, val_steps, val_losses = read_metrics(path)
        line, = ax.plot(steps, losses, linewidth=1, alpha=0.8, label=f"{label} train")
        if val_steps:
            ax.plot(val_steps, val_losses, "o-", color=line.get_color(), markersize=4, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
