#!/usr/bin/env python3
"""A run's loss curve against a reference curve made on the CPU.

    python3 scripts/loss_curve.py make METRICS.jsonl OUT.json --how "the command that made it"
    python3 scripts/loss_curve.py compare REFERENCE.json METRICS.jsonl [--tolerance 0.02]
    python3 scripts/loss_curve.py resumed WHOLE.jsonl RESUMED.jsonl --from STEP [--tolerance T]

`make` keeps the per-step training losses and the validation losses of a
metrics file (logging.metrics) with the command that produced them.
`compare` checks another run of the same config and steps (the GPU check's
bf16 run) against it: the mean training loss of each window of 20 steps
and every validation loss must agree within `tolerance`, relative. Windows,
not single steps: two runs on the same batches see the same data, but bf16
rounding moves single steps more than their means. Prints one line per
window and exits 1 if any is out of tolerance or the run stopped early.
`resumed` checks a run resumed from the save at step STEP against the run
that was never interrupted: its first step (the same weights and batch: the
"next loss") and the mean of all its steps must agree within `tolerance`.
"""
import argparse
import json
import sys

WINDOW = 20


def read_metrics(path):
    losses, val = {}, {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record:
                losses[record["step"]] = record["loss"]
            if "val_loss" in record:
                val[record["step"]] = record["val_loss"]
    return losses, val


def make(args):
    losses, val = read_metrics(args.metrics)
    steps = sorted(losses)
    reference = {
        "how": args.how,
        "steps": len(steps),
        "loss": [losses[s] for s in steps],
        "val_loss": {str(s): v for s, v in sorted(val.items())},
    }
    with open(args.out, "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    print(f"loss_curve: {len(steps)} steps and {len(val)} validation losses written to {args.out}")
    return 0


def compare(args):
    with open(args.reference) as f:
        reference = json.load(f)
    losses, val = read_metrics(args.metrics)
    steps = reference["steps"]
    if sorted(losses) != list(range(1, steps + 1)):
        print(f"loss_curve: the run logged steps {min(losses, default=0)}..{max(losses, default=0)}, "
              f"the reference 1..{steps}: not the same run")
        return 1
    rows, bad = [], 0
    for start in range(0, steps, WINDOW):
        end = min(start + WINDOW, steps)
        cpu = sum(reference["loss"][start:end]) / (end - start)
        run = sum(losses[s] for s in range(start + 1, end + 1)) / (end - start)
        rows.append((f"train loss, steps {start + 1}-{end}", cpu, run))
    for step, cpu in reference["val_loss"].items():
        if int(step) not in val:
            print(f"loss_curve: the run has no validation loss at step {step}")
            return 1
        rows.append((f"val loss, step {step}", cpu, val[int(step)]))
    print(f"{'':28s} {'reference':>10s} {'this run':>10s} {'relative':>9s}")
    for name, cpu, run in rows:
        relative = abs(run - cpu) / abs(cpu)
        verdict = "" if relative <= args.tolerance else f"  > {args.tolerance:g}"
        bad += relative > args.tolerance
        print(f"{name:28s} {cpu:10.4f} {run:10.4f} {relative:9.4f}{verdict}")
    print(f"loss_curve: {len(rows) - bad} of {len(rows)} within {args.tolerance:g} of the reference "
          f"({reference['how']})")
    return 1 if bad else 0


def resumed(args):
    whole, _ = read_metrics(args.whole)
    run, _ = read_metrics(args.resumed)
    steps = sorted(run)
    if not steps or steps[0] != args.start + 1 or any(s not in whole for s in steps):
        print(f"loss_curve: the resumed run logged steps {steps[0] if steps else 0}..{steps[-1] if steps else 0}, "
              f"expected {args.start + 1}.. within the whole run's {min(whole, default=0)}..{max(whole, default=0)}")
        return 1
    first = steps[0]
    rows = [(f"loss at step {first} (the next loss)", whole[first], run[first]),
            (f"mean loss, steps {first}-{steps[-1]}", sum(whole[s] for s in steps) / len(steps),
             sum(run[s] for s in steps) / len(steps))]
    bad = 0
    print(f"{'':36s} {'whole run':>10s} {'resumed':>10s} {'relative':>9s}")
    for name, want, got in rows:
        relative = abs(got - want) / abs(want)
        bad += relative > args.tolerance
        print(f"{name:36s} {want:10.6f} {got:10.6f} {relative:9.2e}"
              + ("" if relative <= args.tolerance else f"  > {args.tolerance:g}"))
    print(f"loss_curve: {len(rows) - bad} of {len(rows)} within {args.tolerance:g} of the run never interrupted")
    return 1 if bad else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("make")
    m.add_argument("metrics")
    m.add_argument("out")
    m.add_argument("--how", required=True)
    c = commands.add_parser("compare")
    c.add_argument("reference")
    c.add_argument("metrics")
    c.add_argument("--tolerance", type=float, default=0.02)
    r = commands.add_parser("resumed")
    r.add_argument("whole")
    r.add_argument("resumed")
    r.add_argument("--from", dest="start", type=int, required=True)
    r.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args()
    return {"make": make, "compare": compare, "resumed": resumed}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
