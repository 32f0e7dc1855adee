"""Command line: decoding chosen on validation, a decode-only sweep of a trained translation run (no retraining).

    python -m vitjax.sweep.decode --workdir=W                                   # beam 1,2,4,8 x alpha 0..1.2
    python -m vitjax.sweep.decode --workdir=W --checkpoint=averaged --beam_sizes=4,8 --alphas=0.6,1.0
    python -m vitjax.sweep.decode --workdir=W --nowrite                        # report only

Every (beam_size, alpha) point is one trial of an Optuna study on a grid, in W/decode_sweep.db (or --storage):
the checkpoint translates the validation split (its first --limit pairs, if given) with that beam and length
penalty, and the trial's value is its BLEU. The model is loaded once and each beam size compiled once. Rerun the
same command after an interruption: finished points are kept. At the end W/decode_sweep.md holds the table, the
best point (highest validation BLEU; ties: the smaller beam, then the smaller alpha) is written into the options of
the run's translation evaluator that chooses best (config.evals.NAME.beam_size and .alpha, a row of
W/config_history.jsonl), which --mode=eval, vitjax.load and vitjax.translate then use,
and one line reports it beside the config's own point.

The study's name holds the workdir, the checkpoint and its step, the split and --limit: a newer "best" is a new
study. With --write (the default) the sweep holds the workdir's lock from the start. On several processes, process 0
keeps the study and every process translates.

Exit status: 0 done; 2 a problem you can fix (one "error: ..." line: not a translation run, a training run
holding the workdir, a grid value out of range).
"""

from __future__ import annotations

import dataclasses
import os

from absl import flags, logging

import vitjax
from vitjax import cli, evaluators
from vitjax import config as config_lib
from vitjax.decode import check_decoding
from vitjax.errors import ConfigError
from vitjax.sweep import study as study_lib
from vitjax.train import workdir as workdir_lib

flags.DEFINE_string("workdir", None, "the trained translation run", required=True)
flags.DEFINE_string("checkpoint", "best", "'best', 'latest', a step or 'averaged' (vitjax.average)")
flags.DEFINE_list("beam_sizes", ["1", "2", "4", "8"], "beam sizes to try")
flags.DEFINE_list("alphas", ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2"], "length penalties to try")
flags.DEFINE_string("split", "valid", "the split decoding is chosen on")
flags.DEFINE_integer("limit", None, "translate only the split's first N pairs (a quicker, noisier choice)")
flags.DEFINE_string("storage", None, "Optuna storage URL (default sqlite:///WORKDIR/decode_sweep.db)")
flags.DEFINE_bool("write", True, "write the best point into the decoding of the run's best evaluator")
FLAGS = flags.FLAGS


def grid(beam_sizes, alphas) -> list[tuple[int, float]]:
  """The points, checked: beam sizes >= 1, alphas >= 0 (vitjax.decode.check_decoding)."""
  try:
    beams, alphas = sorted({int(b) for b in beam_sizes}), sorted({float(a) for a in alphas})
  except ValueError as e:
    raise ConfigError(f"--beam_sizes / --alphas: {e}; give numbers, e.g. --beam_sizes=1,4 --alphas=0.6,1.0") from None
  if not beams or not alphas:
    raise ConfigError("give --beam_sizes and --alphas a value each at least (e.g. --beam_sizes=1,4 --alphas=0.6,1.0)")
  for key, values in (("beam_size", beams), ("alpha", alphas)):
    for v in values:
      check_decoding({key: v}, name=lambda k: f"--{k}s")
  return [(b, a) for b in beams for a in alphas]


def best_point(results: dict) -> tuple[int, float]:
  """The point of the highest BLEU; ties go to the smaller beam (cheaper), then the smaller alpha."""
  return max(results, key=lambda p: (round(results[p], 6), -p[0], -p[1]))


def sweep(workdir, checkpoint="best", points=(), split="valid", limit=None, storage=None, write=True) -> dict:
  """Runs the grid, resuming the study.

  Returns {"best": (beam, alpha), "bleu": {point: BLEU}, "before": the run's point (None unless it decodes with beam
  search), "written": whether the best went into its config}.
  """
  workdir = os.path.abspath(workdir)
  config_lib.read_config(workdir)  # a vitjax run's workdir (one line if not), before the lock is taken in it
  lock = workdir_lib.Lock(workdir)
  if write:
    lock.acquire()  # from the start: not beside a training run that writes the workdir (one line naming it)
  try:
    return _sweep(workdir, checkpoint, points, split, limit, storage, write)
  finally:
    if write:
      lock.release()


def _sweep(workdir, checkpoint, points, split, limit, storage, write) -> dict:
  """sweep() after its checks: each point decoded on the split, its BLEU kept in the study, the best written.

  Long: the grid's loop, its resume and its report in one sequence.
  """
  import jax
  import numpy as np
  from jax.experimental import multihost_utils

  trained = vitjax.load(workdir, checkpoint)
  if not hasattr(trained.task, "translate"):
    task = trained.config.task
    raise ConfigError(f"{workdir} is a {task} run: decode sweeps are for translation (config.task='translation')")

  name = str(trained.config.best).split("/")[0]
  entry = evaluators.entries(trained.config).get(name, {})
  if entry.get("type") != "translation":
    raise ConfigError(f"{workdir}: best={trained.config.best!r} is not a translation evaluator's metric")
  ev = evaluators.resolve(trained.config, trained.task, name, {**entry, "split": split, "examples": limit}, None)
  method, beam0, alpha0 = str(ev.options["method"]), int(ev.options["beam_size"]), float(ev.options["alpha"])
  before = (beam0, alpha0) if method == "beam" else None
  # Process 0 keeps the study (one record per point); every process translates. The name holds what the BLEU
  # depends on: the weights (the workdir, the checkpoint and its step), the split and its part.
  study, bleu = None, {}
  if jax.process_index() == 0:
    optuna = study_lib.optuna_module()
    study = optuna.create_study(
      study_name=f"decode {workdir} {checkpoint} step {trained.step} {split} {limit}",
      storage=study_lib.storage(storage or f"sqlite:///{os.path.join(workdir, 'decode_sweep.db')}"),
      direction="maximize",
      load_if_exists=True,
    )
    for t in study.trials:
      point = (t.user_attrs.get("beam_size"), t.user_attrs.get("alpha"))
      if t.state == optuna.trial.TrialState.COMPLETE:
        bleu[point] = t.value
      elif t.state == optuna.trial.TrialState.RUNNING:  # an interrupted run's: tried again below
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
  done = np.array([p in bleu for p in points], np.int32)
  done = multihost_utils.broadcast_one_to_all(done) if jax.process_count() > 1 else done
  todo = [p for p, d in zip(points, done, strict=True) if not d]
  logging.info("decode sweep of %s (%s): %d points, %d done before", workdir, checkpoint, len(points), len(bleu))
  for i, (beam, alpha) in enumerate(todo):
    trial = study.ask() if study is not None else None
    if trial is not None:
      trial.set_user_attr("beam_size", beam)
      trial.set_user_attr("alpha", alpha)
    point = dataclasses.replace(ev, options={**ev.options, "beam_size": beam, "alpha": alpha, "method": "beam"})
    with jax.set_mesh(trained.mesh):
      metrics = point.run(trained, trained.variables)
    bleu[(beam, alpha)] = metrics[f"{name}/bleu"]
    if trial is not None:
      study.tell(trial, bleu[(beam, alpha)])
    logging.info(
      "point %d/%d: beam %d, alpha %.2f | %s BLEU %.2f", i + 1, len(todo), beam, alpha, split, bleu[(beam, alpha)]
    )
  if jax.process_count() > 1:  # the points done before are known to process 0 only
    values = np.array([bleu.get(p, np.nan) for p in points], np.float64)
    bleu = dict(zip(points, map(float, multihost_utils.broadcast_one_to_all(values)), strict=True))
  results = {p: bleu[p] for p in points}
  best = best_point(results)
  _write_report(workdir, results, best, before, checkpoint, split, limit)
  if not write or best == before:
    return {"best": best, "bleu": results, "before": before, "written": False}
  name = str(trained.config.best).split("/")[0]
  changes = {"method": (method, "beam"), "beam_size": (beam0, best[0]), "alpha": (alpha0, best[1])}
  changes = {f"evals.{name}.{k}": v for k, v in changes.items() if v[0] != v[1]}
  workdir_lib.record_config_change(workdir, trained.step, changes)
  return {"best": best, "bleu": results, "before": before, "written": True}


def _write_report(workdir, results, best, before, checkpoint, split, limit) -> None:
  beams, alphas = sorted({b for b, _ in results}), sorted({a for _, a in results})
  lines = [
    f"# Decode sweep: {split} BLEU of checkpoint {checkpoint}" + (f" (its first {limit} pairs)" if limit else ""),
    "",
    "| beam \\ alpha | " + " | ".join(f"{a:g}" for a in alphas) + " |",
    "| --- |" + " --- |" * len(alphas),
  ]
  for b in beams:
    cells = []
    for a in alphas:
      v = results.get((b, a))
      cell = "" if v is None else f"{v:.2f}"
      cells.append(f"**{cell}**" if (b, a) == best else cell)
    lines.append(f"| {b} | " + " | ".join(cells) + " |")
  had = f"beam {before[0]}, alpha {before[1]:g}" if before else "another method than beam search"
  lines += ["", f"best: beam {best[0]}, alpha {best[1]:g}; the config had {had}", ""]

  workdir_lib.write_json(workdir, "decode_sweep.md", "\n".join(lines))


def main() -> None:
  """Command line entry: runs the decoding sweep of --workdir over --beam_sizes x --alphas.

  Prints the best point, whether it was written into the config, and how the config decoded before.
  """
  points = grid(FLAGS.beam_sizes, FLAGS.alphas)
  r = sweep(FLAGS.workdir, FLAGS.checkpoint, points, FLAGS.split, FLAGS.limit, FLAGS.storage, FLAGS.write)
  (b, a), before = r["best"], r["before"]
  if r["written"]:
    say = "written into the decode config"
  else:
    say = "the config's already" if (b, a) == before else "not written (--nowrite)"
  if before is None:
    had = "the config decodes without beam search"
  else:
    score = f"{r['bleu'][before]:.2f}" if before in r["bleu"] else "not in the grid"
    had = f"the config's beam {before[0]}, alpha {before[1]:g}: {score}"
  print(
    f"best decoding on {FLAGS.split}: beam {b}, alpha {a:g}, BLEU {r['bleu'][(b, a)]:.2f} ({say}); {had}", flush=True
  )


if __name__ == "__main__":
  cli.run(main)
