#!/usr/bin/python3
"""Draws the loss curve of `numesh train --log FILE.csv` runs as PNG.

    scripts/plot_loss.py [--out DIR] FILE.csv [FILE.csv ...]

Each FILE (columns step,loss,lr,grad_norm,tokens_per_second,...) gives DIR/STEM_loss.png: the
loss against the step (log scale when it spans more than a factor of 10), with the learning
rate on the right axis. Several files resumed into one log (numesh train appends when it
resumes) plot as one curve.

Exit status: 0 charts written; 2 bad arguments or a FILE that is not such a CSV (the message
names the file, the line and what is wrong); 3 the Python module matplotlib is missing (Debian
package python3-matplotlib). Run with Debian's /usr/bin/python3.
"""
import argparse
import csv
import math
import os
import sys

PROG = "plot_loss.py"
COLUMNS = ("step", "loss", "lr")


def fail(message, status=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(status)


def read_log(path):
    """(steps, losses, lrs) of one log; fails naming the file and line of anything malformed."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail(f"{path}: cannot read it ({e.strerror})")
    if not rows or any(c not in rows[0] for c in COLUMNS):
        fail(f"{path}: not a numesh train log: the header must name the columns {', '.join(COLUMNS)}")
    index = {name: rows[0].index(name) for name in COLUMNS}
    steps, losses, lrs = [], [], []
    for line, row in enumerate(rows[1:], start=2):
        try:
            step, loss, lr = (float(row[index[c]]) for c in COLUMNS)
        except (ValueError, IndexError):
            fail(f"{path}: line {line} is not step,loss,lr numbers: {','.join(row)}")
        steps.append(step)
        losses.append(loss)
        lrs.append(lr)
    if not steps:
        fail(f"{path}: the log has no steps")
    return steps, losses, lrs


def main():
    parser = argparse.ArgumentParser(prog=PROG, description="Loss curves of numesh train logs.")
    parser.add_argument("files", nargs="+", help="numesh train --log CSV files")
    parser.add_argument("--out", default=".", help="folder for the PNG files (default: .)")
    args = parser.parse_args()
    logs = [(path, read_log(path)) for path in args.files]  # every input checked before plotting
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        fail(f"the Python module matplotlib is missing ({e}); install Debian's python3-matplotlib", 3)
    os.makedirs(args.out, exist_ok=True)
    for path, (steps, losses, lrs) in logs:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, losses, color="tab:blue", label="loss")
        finite = [x for x in losses if math.isfinite(x) and x > 0]
        if finite and max(finite) > 10 * min(finite):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (mean cross-entropy)", color="tab:blue")
        right = ax.twinx()
        right.plot(steps, lrs, color="tab:gray", linestyle="--", label="learning rate")
        right.set_ylabel("learning rate", color="tab:gray")
        ax.set_title(f"{os.path.basename(path)}: loss {losses[0]:.4g} -> {losses[-1]:.4g} in {len(steps)} steps")
        fig.tight_layout()
        out = os.path.join(args.out, os.path.splitext(os.path.basename(path))[0] + "_loss.png")
        fig.savefig(out, dpi=100)
        plt.close(fig)
        print(out)


if __name__ == "__main__":
    main()
