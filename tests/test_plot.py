"""python -m vitjax.plot: a run's (or several runs') curves from metrics.jsonl, as an image.

The workdirs are written here as the trainer writes them (config.json, metrics.jsonl), with what a real one can hold:
a step logged twice across a kill, --mode=eval rows, a half-written last line."""

import json
import os

import pytest
import train_helpers as th

from vitjax import plot
from vitjax.config import default_config
from vitjax.errors import ConfigError


def _workdir(path, rows, best="eval/accuracy", tail=""):
  os.makedirs(path)
  config = default_config()
  config.best = best
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json())
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
    f.write(tail)
  return str(path)


ROWS = [
  {"step": 1, "train/loss": 2.3, "train/elapsed_s": 10.0},
  {"step": 50, "train/loss": 1.5, "train/elapsed_s": 20.0},
  {"step": 50, "eval/accuracy": 0.70, "eval/loss": 0.9},
  {"step": 100, "train/loss": 1.2, "train/elapsed_s": 30.0},  # written, then the process was killed ...
  {"step": 100, "train/loss": 1.1, "train/elapsed_s": 31.0},  # ... and the resumed session wrote it again
  {"step": 100, "eval/accuracy": 0.80, "eval/loss": 0.6},
  {"step": 150, "eval/accuracy": 0.80, "eval/loss": 0.7},
  {"step": 100, "source": "checkpoint", "eval/accuracy": 0.99},  # a --mode=eval row: not on the curve
]


def test_curves_read_as_the_trainer_wrote_them_and_the_star_is_the_trainers_best(tmp_path):
  w = _workdir(tmp_path / "w", ROWS, tail='{"step": 200, "train/lo')  # a line the killed process was writing
  curves = plot.read_curves(w)
  assert curves["train/loss"] == [(1, 2.3), (50, 1.5), (100, 1.1)]
  assert curves["eval/accuracy"] == [(50, 0.7), (100, 0.8), (150, 0.8)]
  assert plot.best_point(plot.read_run(w, "w")) == (150, 0.8)  # of equals the later, as checkpoints.best keeps it
  lowest = plot.read_run(_workdir(tmp_path / "l", ROWS, best="eval/loss"), "l")
  assert lowest.best_mode == "min" and plot.best_point(lowest) == (100, 0.6)

  proc = th.check_ok(th.run_module("plot", f"--workdir={w}"))
  out = os.path.join(w, "curves.png")
  assert proc.stdout.strip() == f"wrote {out}"
  with open(out, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  for x in ("examples", "hours"):  # every x axis draws; an svg is an svg
    svg = str(tmp_path / f"{x}.svg")
    plot.plot([w, w], svg, ["train/loss", "eval/loss"], ["a", "b"], x=x)
    assert "<svg" in open(svg).read(500)
  xs = plot._x(plot.read_run(w, "w"), "hours")
  assert xs(100) == pytest.approx(31.0 / 3600) and xs(75) == pytest.approx(25.5 / 3600)


def test_what_cannot_be_drawn_is_one_line_exit_2_and_nothing_is_written(tmp_path):
  w = _workdir(tmp_path / "w", ROWS)
  (tmp_path / "s.png").mkdir()  # a folder named like an image
  before = th.snapshot(str(tmp_path))
  cases = [
    ([f"--workdir={tmp_path / 'nothing'}"], "nothing/config.json not found: is"),
    ([f"--workdir={w}", "--metrics=eval/bleu"], "no run has the metric 'eval/bleu'; the runs' metrics: eval/accuracy"),
    ([f"--workdir={w},{w}"], "names 2 runs: say where the image goes, e.g. --out=curves.png"),
    ([f"--workdir={w},{w}", "--labels=a", "--out=x.png"], "--labels has 1 entries for 2 workdirs"),
    ([f"--workdir={w}", f"--out={tmp_path}/c.jpg"], "give a file ending in .png, .pdf, .svg"),
    ([f"--workdir={w}", f"--out={tmp_path}/s.png"], "is a folder; give a file path"),
    ([], "--workdir"),
  ]
  for args, words in cases:
    th.assert_refused(th.run_module("plot", *args), [words])
  assert th.snapshot(str(tmp_path)) == before
  with pytest.raises(ConfigError, match="--x='epochs': use one of step, examples, hours"):
    plot.plot([w], str(tmp_path / "c.png"), x="epochs")


def test_examples_axis_is_steps_times_the_batch_and_a_non_finite_evaluation_is_never_the_best(tmp_path):
  """--x=examples puts a step at step x config.batch_size; a NaN evaluation (a diverged step) gets no star, as the
  trainer's `best` checkpoint never keeps one."""
  rows = [{"step": 10, "eval/accuracy": float("nan")}, {"step": 20, "eval/accuracy": 0.5}, {"step": 30, "note": "x"}]
  run = plot.read_run(_workdir(tmp_path / "w", rows), "w")
  assert plot._x(run, "examples")(20) == 20.0 * default_config().batch_size and plot._x(run, "step")(20) == 20.0
  assert plot.best_point(run) == (20, 0.5)
  only_nan = plot.read_run(_workdir(tmp_path / "n", rows[:1]), "n")
  assert plot.best_point(only_nan) is None
