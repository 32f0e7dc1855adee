"""Learning curves from one or more workdirs' metrics.jsonl, as a PNG.

    python experiments/plot.py workdirs/vit_digits --out experiments/results/vit_digits.png
    python experiments/plot.py workdirs/bible --metrics train/loss,eval/bleu --out experiments/results/bible.png

One panel per metric (default: train/loss and eval/accuracy), x = step, one line per workdir.
With --gflop_per_step (one value per workdir, the compiled step's FLOPs) x is training compute in TFLOP instead,
each workdir's curve starting at its --start_tflop (a fine-tuning run after its pre-training's compute):

    python experiments/plot.py workdirs/mae workdirs/from_mae workdirs/scratch --labels "MAE,MAE then fine-tune,scratch" \
      --metrics train/loss,eval/loss,eval/accuracy --gflop_per_step 7.60,13.19,13.19 --start_tflop 0,16.0,0 --out F.png
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
  ap.add_argument("--labels", default="", help="comma-separated legend entries, one per workdir (default: names)")
  ap.add_argument("--gflop_per_step", default="", help="comma-separated, one per workdir: x in TFLOP")
  ap.add_argument("--start_tflop", default="", help="comma-separated, one per workdir: where each curve starts")
  args = ap.parse_args()
  metrics = args.metrics.split(",")
  n = len(args.workdirs)
  per_workdir = lambda s, default: [float(v) for v in s.split(",")] if s else [default] * n
  labels = args.labels.split(",") if args.labels else [os.path.basename(wd.rstrip("/")) for wd in args.workdirs]
  gflop, start = per_workdir(args.gflop_per_step, None), per_workdir(args.start_tflop, 0.0)
  if not (len(labels) == len(gflop) == len(start) == n):
    ap.error(f"--labels, --gflop_per_step and --start_tflop need one value per workdir ({n})")
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
  for i, (wd, label, g, s0) in enumerate(zip(args.workdirs, labels, gflop, start)):
    rows = read(wd)
    x = (lambda step: step) if g is None else (lambda step, g=g, s0=s0: s0 + step * g / 1000)
    for ax, m in zip(axes[0], metrics):
      pts = [(x(r["step"]), r[m]) for r in rows if m in r]
      if pts:
        ax.plot(*zip(*pts), marker="o" if m.startswith("eval") else None, ms=3, label=label, color=f"C{i}")
  for ax, m in zip(axes[0], metrics):
    ax.set_xlabel("step" if gflop[0] is None else "training compute (TFLOP)")
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
