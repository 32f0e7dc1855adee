"""Student-teacher agreement: how often the run's argmax is its teacher's, beside both accuracies.

    config.evals.agree = dict(type="agreement", split="test")      # the teacher of config.distill
    config.evals.agree = dict(type="agreement", teacher="workdirs/vit_s_fashion", checkpoint="latest")

Options: teacher (a trained classifier's workdir; None: config.distill.teacher), checkpoint (the teacher's; None:
config.distill.checkpoint). The teacher sees each image as the run's model does, mapped to its own normalisation and
size (vitjax.tasks.distill); it is loaded once per task (the training step's copy where it distils from the same teacher), when the evaluator is checked, and a teacher that cannot be loaded
is refused then, before anything is written.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vitjax import evaluators
from vitjax.data import device_ops
from vitjax.errors import ConfigError
from vitjax.evaluators import classification
from vitjax.tasks import distill
from vitjax.tasks.base import check_stop

OPTIONS = {"teacher": None, "checkpoint": None}


def metrics(options: dict) -> dict[str, str]:
  """Agreement (the share of examples where the two argmaxes are equal), accuracy, teacher_accuracy, examples."""
  del options
  return {"agreement": "max", "accuracy": "max", "teacher_accuracy": "max", "examples": "max"}


def check(ev) -> None:
  """A classification run with a teacher (the option or config.distill.teacher) that loads and has the run's classes.

  Raises:
    ConfigError: naming config.evals.NAME, or the teacher and the fix.
  """
  classification.check_classifier(ev)
  if not (ev.options["teacher"] or distill.enabled(ev.config)):
    raise ConfigError(
      f"config.evals.{ev.name}: type 'agreement' compares the run with a teacher: set --config.distill.teacher or "
      "this entry's teacher=WORKDIR"
    )
  teacher(ev)


def teacher(ev) -> distill.Teacher:
  """The evaluator's teacher (loaded once per task: the training step's own, where it distils from the same)."""
  source, checkpoint = ev.options["teacher"], ev.options["checkpoint"]
  if source is None:
    distill.check(ev.config)
    source = str(ev.config.distill.teacher)
  return distill.load(ev.config, ev.task, evaluators.best_mode, source, checkpoint)


def run(ev, net, variables, stop=None, step=None) -> dict:
  """The agreement of `variables` with the teacher on the evaluator's split (padding rows excluded).

  Returns:
    {"agreement", "accuracy", "teacher_accuracy", "examples"}.
  """
  del step
  t = teacher(ev)
  pre = ev.task.preprocess()
  sums = None
  for batch in classification.batches(ev, net):
    check_stop(stop)
    out = _step(net.model, t.forward, variables, t.variables, batch, pre.mean, pre.std)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.device_get(sums)
  n = float(sums["count"])
  return {
    "agreement": float(sums["agree"] / n),
    "accuracy": float(sums["correct"] / n),
    "teacher_accuracy": float(sums["teacher_correct"] / n),
    "examples": n,
  }


@functools.partial(jax.jit, static_argnums=(0, 1, 5, 6))
def _step(model, teacher, variables, teacher_variables, batch, mean, std):
  images = device_ops.to_float(batch["image"], mean, std)
  logits, _ = model.apply(variables, images, train=False)
  teacher_logits = teacher(teacher_variables, images)
  mask = batch["mask"].astype(jnp.float32)
  pred, tpred = logits.argmax(-1), teacher_logits.argmax(-1)
  return {
    "agree": jnp.sum((pred == tpred) * mask),
    "correct": jnp.sum((pred == batch["label"]) * mask),
    "teacher_correct": jnp.sum((tpred == batch["label"]) * mask),
    "count": jnp.sum(mask),
  }
