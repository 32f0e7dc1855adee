"""Command line: decoding chosen on validation, a decode-only sweep of a trained translation run (no retraining).

    python -m vitjax.sweep.decode --workdir=W                                   # beam 1,2,4,8 x alpha 0..1.2
    python -m vitjax.sweep.decode --workdir=W --checkpoint=averaged --beam_sizes=4,8 --alphas=0.6,1.0
    python -m vitjax.sweep.decode --workdir=W --no_write                        # report only

Every (beam_size, alpha) point is one trial of an Optuna study on a grid, in W/decode_sweep.db (or --storage):
the checkpoint translates the validation split (its first --limit pairs, if given) with that beam and length
penalty, and the trial's value is its BLEU. The model is loaded once and each beam size compiled once. Rerun the
same command after an interruption: finished points are kept. At the end W/decode_sweep.md holds the table, the
best point (highest validation BLEU; ties: the smaller beam, then the smaller alpha) is written into the run's
decode config (a row of W/config_history.jsonl, which --mode=eval, vitjax.load and vitjax.translate then use),
and one line reports it beside the config's own point.

Exit status: 0 done; 2 a problem you can fix (one "error: ..." line: not a translation run, a training run
holding the workdir, a grid value out of range).
"""

from __future__ import annotations

import os

from absl import flags, logging

from vitjax import cli

flags.DEFINE_string("workdir", None, "the trained translation run", required=True)
flags.DEFINE_string("checkpoint", "best", "'best', 'latest', a step or 'averaged' (vitjax.average)")
flags.DEFINE_list("beam_sizes", ["1", "2", "4", "8"], "beam sizes to try")
flags.DEFINE_list("alphas", ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2"], "length penalties to try")
flags.DEFINE_string("split", "valid", "the split decoding is chosen on")
flags.DEFINE_integer("limit", None, "translate only the split's first N pairs (a quicker, noisier choice)")
flags.DEFINE_string("storage", None, "Optuna storage URL (default sqlite:///WORKDIR/decode_sweep.db)")
flags.DEFINE_bool("write", True, "write the best point into the run's decode config")
FLAGS = flags.FLAGS


def grid(beam_sizes, alphas) -> list[tuple[int, float]]:
  """The points, checked: beam sizes >= 1, alphas >= 0."""
  from vitjax.errors import ConfigError

  try:
    beams, alphas = sorted({int(b) for b in beam_sizes}), sorted({float(a) for a in alphas})
  except ValueError as e:
    raise ConfigError(f"--beam_sizes / --alphas: {e}; give numbers, e.g. --beam_sizes=1,4 --alphas=0.6,1.0") from None
  if not beams or not alphas or beams[0] < 1 or alphas[0] < 0:
    raise ConfigError("--beam_sizes must be integers >= 1 and --alphas numbers >= 0 (e.g. --beam_sizes=1,4)")
  return [(b, a) for b in beams for a in alphas]


def best_point(results: dict) -> tuple[int, float]:
  """The point of the highest BLEU; ties go to the smaller beam (cheaper), then the smaller alpha."""
  return max(results, key=lambda p: (round(results[p], 6), -p[0], -p[1]))


def sweep(workdir, checkpoint="best", points=(), split="valid", limit=None, storage=None, write=True) -> dict:
  """Runs the grid, resuming the study; returns {"best": (beam, alpha), "bleu": {point: BLEU}, "before": the
  run's point, "written": whether the best was written into its decode config}."""
  import jax

  import vitjax
  from vitjax.errors import ConfigError
  from vitjax.sweep import study as study_lib
  from vitjax.train import workdir as workdir_lib

  workdir = os.path.abspath(workdir)
  trained = vitjax.load(workdir, checkpoint)
  if not hasattr(trained.task, "translate"):
    task = trained.config.get("task", "classification")
    raise ConfigError(f"{workdir} is a {task} run: decode sweeps are for translation (config.task='translation')")
  decode = trained.task.config.decode
  before = (int(decode.beam_size), float(decode.alpha))
  optuna = study_lib.optuna_module()
  url = storage or f"sqlite:///{os.path.join(workdir, 'decode_sweep.db')}"
  study = optuna.create_study(
    study_name=f"decode {checkpoint} {split} {limit}",
    storage=study_lib.storage(url),
    direction="maximize",
    load_if_exists=True,
  )
  bleu = {}
  for t in study.trials:
    point = (t.params.get("beam_size"), t.params.get("alpha"))
    if t.state == optuna.trial.TrialState.COMPLETE:
      bleu[point] = t.value
    elif t.state == optuna.trial.TrialState.RUNNING:  # an interrupted run's: tried again below
      study.tell(t.number, state=optuna.trial.TrialState.FAIL)
  space = {
    "beam_size": optuna.distributions.CategoricalDistribution(sorted({b for b, _ in points})),
    "alpha": optuna.distributions.CategoricalDistribution(sorted({a for _, a in points})),
  }
  todo = [p for p in points if p not in bleu]
  logging.info("decode sweep of %s (%s): %d points, %d done before", workdir, checkpoint, len(points), len(bleu))
  for i, (beam, alpha) in enumerate(todo):
    study.enqueue_trial({"beam_size": beam, "alpha": alpha})
    trial = study.ask(space)
    decode.beam_size, decode.alpha, decode.method = beam, alpha, "beam"
    with jax.set_mesh(trained.mesh):
      metrics = trained.task.evaluate(trained.model, trained.variables, split, trained.sharding, limit=limit)
    bleu[(beam, alpha)] = metrics["eval/bleu"]
    study.tell(trial, metrics["eval/bleu"])
    logging.info(
      "point %d/%d: beam %d, alpha %.2f | %s BLEU %.2f", i + 1, len(todo), beam, alpha, split, bleu[(beam, alpha)]
    )
  results = {p: bleu[p] for p in points}
  best = best_point(results)
  _write_report(workdir, results, best, before, checkpoint, split, limit)
  written = False
  if write and best != before:
    lock = workdir_lib.Lock(workdir)
    lock.acquire()  # not while a training run writes the workdir: one line naming it
    try:
      changes = {"decode.beam_size": (before[0], best[0]), "decode.alpha": (before[1], best[1])}
      workdir_lib.record_config_change(workdir, trained.step, {k: v for k, v in changes.items() if v[0] != v[1]})
    finally:
      lock.release()
    written = True
  return {"best": best, "bleu": results, "before": before, "written": written}


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
  lines += ["", f"best: beam {best[0]}, alpha {best[1]:g}; the config had beam {before[0]}, alpha {before[1]:g}", ""]
  from vitjax.train import workdir as workdir_lib

  workdir_lib.write_json(workdir, "decode_sweep.md", "\n".join(lines))


def main() -> None:
  points = grid(FLAGS.beam_sizes, FLAGS.alphas)
  r = sweep(FLAGS.workdir, FLAGS.checkpoint, points, FLAGS.split, FLAGS.limit, FLAGS.storage, FLAGS.write)
  (b, a), (b0, a0) = r["best"], r["before"]
  say = (
    "written into the decode config"
    if r["written"]
    else ("the config's already" if (b, a) == (b0, a0) else "not written (--no_write)")
  )
  print(
    f"best decoding on {FLAGS.split}: beam {b}, alpha {a:g}, BLEU {r['bleu'][(b, a)]:.2f} ({say}); the config's "
    f"beam {b0}, alpha {a0:g}: " + (f"{r['bleu'][(b0, a0)]:.2f}" if (b0, a0) in r["bleu"] else "not in the grid"),
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main)
