"""Command line: learning curves of one or more runs from their metrics.jsonl, as an image.

    python -m vitjax.plot --workdir=workdirs/vit_digits                  # WORKDIR/curves.png: train/loss and `best`
    python -m vitjax.plot --workdir=W1,W2 --labels=scratch,pretrained --out=cmp.png --metrics=train/loss,eval/accuracy
    python -m vitjax.plot --workdir=W --x=examples                       # or hours (training time, train/elapsed_s)

One panel per metric, one line per run; evaluations are drawn with markers, and each run's `best` evaluation
(config.best, higher or lower is better as its evaluator says) with a star and its value in the legend. The
default metrics are train/loss and each run's config.best. A run still training can be plotted (its last,
half-written row is left out); rows written by --mode=eval are not part of the curve. The image's format follows
--out's suffix (.png, .pdf, .svg). (A sweep's report draws its trials' evaluations: SWEEP_DIR/curves.png.)

Exit status: 0 written; 2 a problem you can fix (one "error: ..." line: no such workdir, a metric no run has, an
--out that cannot be written); the runs are only read.

In Python, :func:`plot` does the same, and :func:`read_curves` gives a run's curves as {metric: [(step, value)]}.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from absl import flags

from vitjax import cli, paths
from vitjax.config import read_config
from vitjax.errors import ConfigError

FORMATS = (".png", ".pdf", ".svg")
XS = ("step", "examples", "hours")
CURVES_FILE = "curves.png"


def _define_flags() -> None:
  """The command line's flags, defined only when it runs (the module is also a library: importing it defines none)."""
  flags.DEFINE_list("workdir", None, "the runs, comma-separated", required=True)
  flags.DEFINE_list("metrics", None, "metrics to draw, e.g. train/loss,eval/accuracy (default: train/loss and best)")
  flags.DEFINE_list("labels", None, "one legend entry per workdir (default: their folder names)")
  flags.DEFINE_enum("x", "step", list(XS), "the x axis: step, examples (step x batch_size) or hours of training")
  flags.DEFINE_string(
    "out", None, f"the image to write ({', '.join(FORMATS)}; default: WORKDIR/curves.png for one run)"
  )
  flags.DEFINE_string("title", "", "a title above the panels")


FLAGS = flags.FLAGS


@dataclasses.dataclass
class Run:
  """One run's curves and what the plot needs of its config."""

  workdir: str
  label: str
  curves: dict  # metric -> [(step, value)], by step
  best: str  # config.best, e.g. "eval/accuracy"
  best_mode: str  # "max" or "min"
  batch_size: int


def read_curves(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """{metric: [(step, value), ...] by step} from WORKDIR/metrics.jsonl; the training rows only (not --mode=eval's).

  A step written twice (a session killed after its row, before its checkpoint, then resumed) keeps its last value;
  a line that does not parse (the one a running or killed process was writing) is left out.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ConfigError(f"{path} not found: is {workdir} the workdir of a vitjax run (one that has logged a step)?")
  by_metric: dict[str, dict[int, float]] = {}
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if not isinstance(row, dict) or "source" in row or not isinstance(row.get("step"), int):
        continue
      for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
          by_metric.setdefault(key, {})[row["step"]] = float(value)
  return {k: sorted(v.items()) for k, v in by_metric.items()}


def read_run(workdir: str, label: str) -> Run:
  """A run's curves (read_curves) and its config's best, best_mode and batch_size."""
  from vitjax import evaluators

  config = read_config(workdir)
  return Run(workdir, label, read_curves(workdir), str(config.best), evaluators.best_mode(config), config.batch_size)


def _x(run: Run, x: str):
  """A function from a step to its x value for this run."""
  if x == "step":
    return float
  if x == "examples":
    return lambda step: float(step * run.batch_size)
  timed = run.curves.get("train/elapsed_s", [])  # hours: the training time at each logged step, interpolated
  if not timed:
    raise ConfigError(f"--x=hours: {run.workdir}'s metrics.jsonl has no train/elapsed_s; use --x=step")
  steps, secs = [s for s, _ in timed], [t for _, t in timed]

  def hours(step):
    import numpy as np

    return float(np.interp(step, [0, *steps], [0.0, *secs])) / 3600

  return hours


def plot(
  workdirs: list[str],
  out: str,
  metrics: list[str] | None = None,
  labels: list[str] | None = None,
  x: str = "step",
  title: str = "",
) -> str:
  """Draws the runs' curves into `out` (see the module docstring); returns the path written.

  Raises ConfigError, before writing anything, for a workdir without metrics, a metric no run has, labels that
  do not match the workdirs, an --out that is not .png/.pdf/.svg or cannot be written.
  """
  if not workdirs:
    raise ConfigError("give the runs: --workdir=W[,W2,...]")
  if x not in XS:
    raise ConfigError(f"--x={x!r}: use one of {', '.join(XS)}")
  if os.path.splitext(out)[1].lower() not in FORMATS:
    raise ConfigError(f"--out={out}: give a file ending in {', '.join(FORMATS)}, e.g. --out=curves.png")
  if labels is not None and len(labels) != len(workdirs):
    raise ConfigError(f"--labels has {len(labels)} entries for {len(workdirs)} workdirs: give one label per workdir")
  names = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  runs = [read_run(os.path.abspath(w), name) for w, name in zip(workdirs, names)]
  paths.check_writable(out, "out", folder=False)
  if metrics is None:
    metrics = list(dict.fromkeys(["train/loss", *(r.best for r in runs)]))
  have = sorted({m for r in runs for m in r.curves})
  missing = [m for m in metrics if not any(m in r.curves for r in runs)]
  if missing:
    raise ConfigError(f"no run has the metric {missing[0]!r}; the runs' metrics: {', '.join(have)}")
  xlabel = {"step": "step", "examples": "examples seen", "hours": "hours of training"}[x]
  return draw(runs, metrics, out, [_x(r, x) for r in runs], xlabel, title)


def draw(runs: list[Run], metrics: list[str], out: str, xs=None, xlabel: str = "step", title: str = "") -> str:
  """Draws `runs` (see read_run) into `out`, one panel per metric; xs: a function step -> x per run (None: steps).

  Nothing is checked here: plot() checks its arguments first.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.5), squeeze=False)
  for i, (run, to_x) in enumerate(zip(runs, xs or [float] * len(runs))):
    color = f"C{i % 10}"
    for ax, metric in zip(axes[0], metrics):
      points = run.curves.get(metric)
      if not points:
        continue
      evaluation = not metric.startswith("train/")
      ax.plot([to_x(s) for s, _ in points], [v for _, v in points], color=color, lw=1.4,
              marker="o" if evaluation and len(points) <= 60 else None, ms=3, label=run.label)  # fmt: skip
      best = best_point(run) if metric == run.best else None
      if best is not None:
        step, value = best
        ax.plot([to_x(step)], [value], "*", ms=11, color=color, mec="black", mew=0.6,
                label=f"{run.label}: best {value:.4g} at step {step}")  # fmt: skip
  for ax, metric in zip(axes[0], metrics):
    ax.set_title(metric)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with paths.replacing(out) as f:
    fig.savefig(f, dpi=110, format=os.path.splitext(out)[1][1:] or "png")
  plt.close(fig)
  return out


def best_point(run: Run) -> tuple[int, float] | None:
  """(step, value) of the run's best evaluation by config.best (of equals the later, as the trainer's), or None."""
  finite = [(s, v) for s, v in run.curves.get(run.best, []) if math.isfinite(v)]
  if not finite:
    return None
  sign = 1 if run.best_mode == "max" else -1
  return max(finite, key=lambda p: (sign * p[1], p[0]))


def main() -> None:
  """Command line entry: draws --workdir's runs into --out."""
  workdirs = FLAGS.workdir
  out = FLAGS.out or (os.path.join(workdirs[0], CURVES_FILE) if len(workdirs) == 1 else None)
  if out is None:
    raise ConfigError(f"--workdir names {len(workdirs)} runs: say where the image goes, e.g. --out=curves.png")
  print(f"wrote {plot(workdirs, out, FLAGS.metrics, FLAGS.labels, FLAGS.x, FLAGS.title)}", flush=True)


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
