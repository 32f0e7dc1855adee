"""Image classification: loss, top-1 and top-k accuracy and, with calibration_bins > 0, the expected calibration error.

The expected calibration error (ece) is the gap between confidence and accuracy over equal-width confidence bins,
weighted by their shares.

Options: top_k (5: reported as top5), calibration_bins (0: no ece), shift (None, or a distribution shift applied to
the images before preprocessing, vitjax.data.shifts: 'rotate:30', 'noise:0.2', 'contrast:0.3', 'blur:1.5').
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vitjax import mesh as mesh_lib
from vitjax.data import device_ops, shifts
from vitjax.errors import ConfigError
from vitjax.tasks.base import check_stop, cross_entropy

OPTIONS = {"top_k": 5, "calibration_bins": 0, "shift": None}


def metrics(options: dict) -> dict[str, str]:
  """The metrics this type reports, and which way is better.

  Returns:
    accuracy, topK (K = options["top_k"]), loss, examples, and ece when options["calibration_bins"] > 0.
  """
  out = {"accuracy": "max", f"top{options['top_k']}": "max", "loss": "min", "examples": "max"}
  return {**out, "ece": "min"} if options["calibration_bins"] else out


def check(ev) -> None:
  """Checks the entry before anything is written.

  Checks what check_classifier checks, top_k an integer >= 1 and calibration_bins an integer >= 0.

  Raises:
    ConfigError: naming config.evals.NAME and the bad value.
  """
  what = f"config.evals.{ev.name}"
  check_classifier(ev)
  if not isinstance(ev.options["top_k"], int) or ev.options["top_k"] < 1:
    raise ConfigError(f"{what}: top_k={ev.options['top_k']!r} must be an integer >= 1")
  if not isinstance(ev.options["calibration_bins"], int) or ev.options["calibration_bins"] < 0:
    raise ConfigError(f"{what}: calibration_bins={ev.options['calibration_bins']!r} must be an integer >= 0")


def check_classifier(ev) -> None:
  """What an evaluator of a classifier's images needs: a classification run, a readable split, a valid `shift` option.

  Checked for this type and for per_class.
  """
  what = f"config.evals.{ev.name}"
  if not hasattr(ev.task, "eval_batches") or ev.config.task != "classification":
    raise ConfigError(f"{what}: type {ev.type!r} evaluates a classifier, not a {ev.config.task!r} run")
  try:
    shifts.parse(ev.options.get("shift"))
  except ValueError as e:
    raise ConfigError(f"{what}: {e}") from None
  ev.task.check_split(ev.split, f"evals.{ev.name}.split")


def batches(ev, net):
  """The split's global batches (image, label, mask) on the mesh, shifted if the options say so.

  The examples' cap and the stop request between batches as every evaluator has them. ConfigError for an empty split.
  """
  shift = shifts.parse(ev.options.get("shift"))
  empty = True
  for batch in ev.task.eval_batches(ev.split, ev.examples):
    if shift is not None:
      batch = {**batch, "image": shift(batch["image"])}
    empty = False
    yield mesh_lib.to_global(batch, net.batch_sharding, ("image", "label", "mask"))
  if empty:
    raise ConfigError(f"config.evals.{ev.name}: split {ev.split!r} has no examples to evaluate")


def run(ev, net, variables, stop=None, step=None) -> dict:
  """Evaluates `variables` on the evaluator's split.

  Args:
    ev: the Evaluator.
    net: the model on its mesh (model, batch_sharding).
    variables: what model.apply takes.
    stop: a callable asked between batches (EvaluationInterrupted when it says stop), or None.
    step: the training step (unused).

  Returns:
    {"loss", "accuracy", "topK"} averaged over the split's examples (padding rows excluded), "examples" their
    count, and "ece" with calibration_bins > 0.
  """
  del step
  top_k, bins = ev.options["top_k"], ev.options["calibration_bins"]
  pre = ev.task.preprocess()
  sums = None
  for batch in batches(ev, net):
    check_stop(stop)
    out = _step(net.model, variables, batch, pre.mean, pre.std, top_k, bins)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.device_get(sums)
  n = float(sums["count"])
  out = {
    "loss": float(sums["loss_sum"] / n),
    "accuracy": float(sums["correct"] / n),
    f"top{top_k}": float(sums["correct_k"] / n),
    "examples": n,
  }
  if bins:
    out["ece"] = float(np.abs(np.asarray(sums["conf_sum"]) - np.asarray(sums["hit_sum"])).sum() / n)
  return out


def label_rank(logits, labels):
  """The label's rank among the logits [B, K], 0 for the top: top-k holds it when rank < k.

  Ties are ranked as argmax ranks them (the lowest class first), so top-1 is the accuracy: an untrained model's
  equal logits score top-5 only for labels 0-4 (counting every tie for the label gave it 1.0).
  """
  labels = labels[:, None].astype(jnp.int32)
  label_logit = jnp.take_along_axis(logits, labels, axis=-1)
  before = jnp.arange(logits.shape[-1])[None, :] < labels
  return jnp.sum(logits > label_logit, axis=-1) + jnp.sum((logits == label_logit) & before, axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5, 6))
def _step(model, variables, batch, mean, std, top_k, bins):
  logits, _ = model.apply(variables, device_ops.to_float(batch["image"], mean, std), train=False)
  mask = batch["mask"].astype(jnp.float32)
  labels = batch["label"]
  rank = label_rank(logits, labels)
  hit = (logits.argmax(-1) == labels) * mask
  out = {
    "loss_sum": jnp.sum(cross_entropy(logits, labels, logits.shape[-1]) * mask),
    "correct": jnp.sum(hit),
    "correct_k": jnp.sum((rank < top_k) * mask),
    "count": jnp.sum(mask),
  }
  if bins:
    conf = jax.nn.softmax(logits.astype(jnp.float32)).max(-1)
    which = jnp.clip((conf * bins).astype(jnp.int32), 0, bins - 1)
    onehot = jax.nn.one_hot(which, bins) * mask[:, None]
    out["conf_sum"] = jnp.sum(onehot * conf[:, None], 0)
    out["hit_sum"] = jnp.sum(onehot * hit[:, None], 0)
  return out
