"""Learning curves from one or more workdirs' metrics.jsonl, as a PNG.

    python experiments/plot.py workdirs/vit_digits --out experiments/results/vit_digits.png
    python experiments/plot.py workdirs/bible --metrics train/loss,eval/bleu --out experiments/results/bible.png

One panel per metric (default: train/loss and eval/accuracy), x = step, one line per workdir.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(workdir):
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "source" not in row:  # skip rows written by --mode=eval
        rows.append(row)
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("workdirs", nargs="+")
  ap.add_argument("--metrics", default="train/loss,eval/accuracy")
  ap.add_argument("--out", required=True)
  ap.add_argument("--title", default="")
  args = ap.parse_args()
  metrics = args.metrics.split(",")
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
  for wd in args.workdirs:
    rows = read(wd)
    for ax, m in zip(axes[0], metrics):
      pts = [(r["step"], r[m]) for r in rows if m in r]
      if pts:
        ax.plot(*zip(*pts), marker="o" if m.startswith("eval") else None, ms=3, label=os.path.basename(wd.rstrip("/")))
  for ax, m in zip(axes[0], metrics):
    ax.set_xlabel("step")
    ax.set_title(m)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  if args.title:
    fig.suptitle(args.title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
