"""A frozen representation judged as papers judge one (vitjax.probe).

A linear probe, few-shot linear classifiers and weighted k-NN, fitted on the training split's features (the examples
training used, without the held-out 'valid'), the linear probe's regulariser chosen on 'valid', reported on the
evaluator's split. Features are the model's pooled representation (the input of its head; an MAE's encoder over all
patches), computed under jit over the mesh; the probes run on the host in float64.

Reports linear, knn, {N}shot and {N}shot_std (mean and deviation over `draws` draws) for N in shots, linear_l2.
Options: shots ((1, 5, 10, 25)), draws (5), knn_k (20), knn_temperature (0.07), seed (0: the few-shot draws),
fit_examples (None: the whole training split; else its first N).
"""

from __future__ import annotations

import jax

from vitjax import probe as probe_lib
from vitjax.errors import ConfigError
from vitjax.tasks.base import VALID

OPTIONS = {"shots": (1, 5, 10, 25), "draws": 5, "knn_k": 20, "knn_temperature": 0.07, "seed": 0, "fit_examples": None}


def metrics(options: dict) -> dict[str, str]:
  """The metrics this type reports, and which way is better.

  Returns:
    linear, knn, linear_l2, and Nshot and Nshot_std for each N of options["shots"].
  """
  shots = options["shots"] if isinstance(options["shots"], list | tuple) else (options["shots"],)
  out = {"linear": "max", "knn": "max", "linear_l2": "max"}
  for n in shots:
    out.update({f"{n}shot": "max", f"{n}shot_std": "min"})
  return out


def check(ev) -> None:
  """Checks the entry before anything is written.

  Checks that the task has image features, the split is not the training split, 'valid' and the split can be read,
  the probe options are valid and fit_examples is None or >= 1.

  Raises:
    ConfigError: naming config.evals.NAME and what is wrong.
  """
  what = f"config.evals.{ev.name}"
  if not hasattr(ev.task, "features"):
    raise ConfigError(f"{what}: the {ev.config.task} task has no image features to probe")
  fit = ev.config.data.train_split
  if ev.split == fit:
    raise ConfigError(f"{what}: split {fit!r} is the split the probes are fitted on; report on '{VALID}' or 'test'")
  for s in dict.fromkeys((VALID, ev.split)):
    ev.task.check_split(s, f"evals.{ev.name}.split")
  try:
    probe_lib.Options.of(ev.options, what)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  n = ev.options["fit_examples"]
  if n is not None and (not isinstance(n, int) or n < 1):
    raise ConfigError(f"{what}: fit_examples={n!r}; give a count >= 1, or None for the whole training split")


def run(ev, net, variables, stop=None, step=None) -> dict:
  """Fits the probes on the training split's features and reports them on the evaluator's split.

  Features of the training split (its first fit_examples), of 'valid' and of the evaluator's split (its first
  `ev.examples`) are computed over the mesh; the linear probe's regulariser is chosen on 'valid'. Arguments as in
  classification.run.

  Returns:
    The split's {"linear", "knn", "Nshot", "Nshot_std", ...} and the chosen "linear_l2".
  """
  del step
  fit = ev.config.data.train_split
  caps = {fit: ev.options["fit_examples"], **{s: ev.examples for s in (VALID, ev.split)}}
  with jax.set_mesh(net.mesh):
    feats = {s: ev.task.features(net.model, variables, s, net.batch_sharding, cap, stop) for s, cap in caps.items()}
  num_classes = ev.task.describe()["num_classes"]
  result = probe_lib.evaluate(feats, num_classes, probe_lib.Options.of(ev.options), fit, VALID)
  return {**result[ev.split], "linear_l2": result["linear_l2"]}
