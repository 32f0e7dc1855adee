"""Learning curves for the results: vitjax.plot's, with training compute as an optional x axis.

    python experiments/plot.py workdirs/vit_digits --out experiments/results/vit_digits.png
    python experiments/plot.py workdirs/bible --metrics train/loss,eval/bleu --out experiments/results/bible.png

One panel per metric (default: train/loss and eval/accuracy), x = step, one line per workdir (for everyday use,
`python -m vitjax.plot`, which this calls). With --gflop_per_step (one value per workdir, the compiled step's FLOPs)
x is training compute in TFLOP instead, each workdir's curve starting at its --start_tflop (a fine-tuning run after
its pre-training's compute):

    python experiments/plot.py workdirs/mae workdirs/from_mae workdirs/scratch --labels "MAE,MAE then fine-tune,scratch" \\
      --metrics train/loss,eval/loss,eval/accuracy --gflop_per_step 7.60,13.19,13.19 --start_tflop 0,16.0,0 --out F.png
"""

import argparse
import os

from vitjax import plot


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
  n = len(args.workdirs)
  per_workdir = lambda s, default: [float(v) for v in s.split(",")] if s else [default] * n
  labels = args.labels.split(",") if args.labels else [os.path.basename(wd.rstrip("/")) for wd in args.workdirs]
  gflop, start = per_workdir(args.gflop_per_step, None), per_workdir(args.start_tflop, 0.0)
  if not (len(labels) == len(gflop) == len(start) == n):
    ap.error(f"--labels, --gflop_per_step and --start_tflop need one value per workdir ({n})")
  runs = [plot.read_run(wd, label) for wd, label in zip(args.workdirs, labels)]
  xs = [float if g is None else (lambda step, g=g, s0=s0: s0 + step * g / 1000) for g, s0 in zip(gflop, start)]
  xlabel = "step" if gflop[0] is None else "training compute (TFLOP)"
  print(f"wrote {plot.draw(runs, args.metrics.split(','), args.out, xs, xlabel, args.title)}")


if __name__ == "__main__":
  main()
