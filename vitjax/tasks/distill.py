"""Distillation: a frozen teacher, loaded from a trained run, whose outputs the student learns from (config.distill).

    c.distill.teacher = "workdirs/vit_s_fashion"   # a vitjax workdir or "hf:ORG/NAME"; "" (the default): none
    c.distill.checkpoint = "best"      # the teacher run's "best", "latest" or a step
    c.distill.loss = "soft"            # "soft": KL(teacher || student) at the temperature; "hard": its argmax
    c.distill.temperature = 1.0        # (the soft loss is scaled by its square)
    c.distill.weight = 1.0             # loss = (1 - weight) * the task's own loss + weight * the distillation loss
    c.distill.dtype = None             # the teacher's compute dtype: "float32", "bfloat16", "auto"; None: its own

The teacher sees the student's view: the batch after the task's device_batch (crops, flips, Mixup/CutMix shared), so
`loss="soft"` at temperature 1 with weight 1 is function matching (Beyer et al. 2022, big_vision's proj/distill).
A student with DeiT's distillation token (config.model.distill_token) learns the labels through its class token's
head and the teacher through its distillation token's; it predicts with their mean (DeiT's hard distillation:
`loss="hard"`, `weight=0.5`).
Its images are re-normalised with its own mean and std and resized to its own input size where these differ from the
student's (a grey student's images are repeated over a colour teacher's channels). It may be another family or size
than the student. Its forward runs inside the jitted step under stop_gradient: no backward, no optimizer state. Its
variables are an argument of that step (not constants in the program), laid out on the student's mesh by the student's
sharding rules, and never saved: a resumed run loads the teacher again. `train/agreement` is the share of the batch
where the student's argmax is the teacher's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax import config as config_lib
from vitjax import pretrained
from vitjax.errors import ConfigError
from vitjax.models import network as network_lib
from vitjax.tasks.classification import ImageClassification, hub_classifier

LOSSES = ("soft", "hard")


@dataclasses.dataclass
class Teacher:
  """A loaded teacher: its variables (on the student's mesh) and its forward from the student's images.

  forward(variables, images): float [B, H, W, C] as the student's device batch holds them -> the teacher's logits
  [B, K] (float32, no gradient); the images mapped to its normalisation, size and channels. A plain function: jit
  takes it as a static argument (the agreement evaluator).
  """

  forward: Callable
  variables: dict


def _forward(model, inputs: Callable) -> Callable:
  def forward(variables, images):
    out = model.apply(variables, inputs(images), train=False)
    out = out[0] if isinstance(out, tuple) else out
    return jax.lax.stop_gradient(out.astype(jnp.float32))

  return forward


def enabled(config) -> bool:
  """Whether config.distill names a teacher."""
  return bool(config.get("distill") and config.distill.get("teacher"))


def check(config) -> None:
  """ConfigError for distillation settings that cannot work (before anything is read or written)."""
  if not enabled(config):
    return
  d = config.distill
  if d.loss not in LOSSES:
    raise ConfigError(f"config.distill.loss={d.loss!r}: use one of {', '.join(LOSSES)}")
  t, w = d.temperature, d.weight
  if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
    raise ConfigError(
      f"config.distill.temperature={t!r} must be a positive number (e.g. 1.0, or 4.0 for softer targets)"
    )
  if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= 1:
    raise ConfigError(f"config.distill.weight={w!r} must be in [0, 1] (1: the teacher alone, 0.5: half the labels')")
  if config.task != "classification":
    raise ConfigError(f"config.distill.teacher: distillation trains image classifiers, not a {config.task!r} run")
  if d.get("dtype") is not None and d.dtype not in ("float32", "bfloat16", "auto"):
    raise ConfigError(
      f"config.distill.dtype={d.dtype!r}: use 'float32', 'bfloat16', 'auto' or None (the teacher's own)"
    )
  source = str(d.teacher)
  if source.split(":", 1)[0] in ("timm", "npz"):
    raise ConfigError(
      f"config.distill.teacher={source}: a teacher is a vitjax workdir or an hf: repository; a weights file has no "
      f"classes or preprocessing: fine-tune from it first (--config.init_from={source}) and give that run's workdir"
    )


def distill_loss(config, logits, teacher_logits):
  """(scalar loss, metrics) of student logits [B, K] against the teacher's [B, K], as config.distill says."""
  d = config.distill
  logits = logits.astype(jnp.float32)
  if d.loss == "hard":
    target = jax.nn.one_hot(teacher_logits.argmax(-1), logits.shape[-1])
    loss = -jnp.sum(target * jax.nn.log_softmax(logits), -1).mean()
  else:
    t = float(d.temperature)
    p = jax.nn.softmax(teacher_logits / t)
    kl = jnp.sum(p * (jax.nn.log_softmax(teacher_logits / t) - jax.nn.log_softmax(logits / t)), -1)
    loss = kl.mean() * t * t
  agreement = jnp.mean(logits.argmax(-1) == teacher_logits.argmax(-1))
  return loss, {"distill_loss": loss, "agreement": agreement}


def heads(out) -> tuple:
  """(the logits the labels train, the logits the teacher trains) of a model's (logits, intermediates).

  A ViT with DeiT's distillation token: its class token's head and its distillation token's ("logits_cls",
  "logits_dist"); any other model: its logits, twice.
  """
  logits, intermediates = out
  if isinstance(intermediates, dict) and "logits_dist" in intermediates:
    return intermediates["logits_cls"], intermediates["logits_dist"]
  return logits, logits


def blended(config, loss, metrics: dict, logits, teacher_logits):
  """(1 - weight) * the task's loss + weight * the distillation loss, and the metrics with task_loss and distill's."""
  distilled, more = distill_loss(config, logits, teacher_logits)
  w = float(config.distill.weight)
  return (1.0 - w) * loss + w * distilled, {**metrics, "task_loss": loss, **more}


def load(config, task, best_mode: Callable, source: str | None = None, checkpoint: str | None = None) -> Teacher | None:
  """The teacher config.distill names (or `source` at `checkpoint`), on the student task's mesh; None without one.

  best_mode: a run's config -> 'max' or 'min' for its config.best (vitjax.evaluators.best_mode, which ranks the
  teacher's checkpoints for checkpoint="best"). A hub repository ('hf:ORG/NAME[@REVISION]') is read as vitjax.load
  reads it. ConfigError (one line, before the student's workdir is written) for a teacher that is not a trained
  classifier, has no such checkpoint, or whose classes are not the student's.
  """
  if source is None:
    if not enabled(config):
      return None
    check(config)
    source = str(config.distill.teacher)
  checkpoint = config.distill.checkpoint if checkpoint is None else checkpoint
  key = (source, str(checkpoint), config.distill.get("dtype"))
  cache = getattr(task, "teachers", {})
  if key not in cache:  # (the step and an agreement evaluator share one copy)
    cache[key] = _load(config, task, best_mode, source, checkpoint)
  return cache[key]


def _load(config, task, best_mode: Callable, source: str, checkpoint) -> Teacher:
  what = f"config.distill.teacher={source}"
  if source.startswith("hf:"):  # a hub repository's classifier, as vitjax.load reads it
    if str(checkpoint) not in ("best", "latest"):
      raise ConfigError(
        f"{what}: a hub repository has one set of weights (checkpoint={checkpoint!r}); pin one with @REV"
      )
    tconfig, described, _, hub_variables = hub_classifier(source)
  else:
    source = os.path.abspath(os.path.expanduser(source))
    if not os.path.isfile(os.path.join(source, "config.json")):
      raise ConfigError(f"{what}: no vitjax run there (no config.json); give the workdir of a trained classifier")
    tconfig, described = config_lib.read_config(source), config_lib.read_task(source)
  if tconfig.task != "classification" or not described:
    raise ConfigError(f"{what}: a {tconfig.task!r} run; a teacher is a trained image classifier")
  student = task.describe()
  _check_classes(what, described, student)
  tconfig.mesh, tconfig.sharding, tconfig.sharding_rules = config.mesh, config.sharding, config.sharding_rules
  if config.distill.get("dtype") is not None:  # (its parameters stay float32; its forward in this dtype)
    tconfig.compute_dtype = config.distill.dtype
  ttask = ImageClassification(tconfig, source, described, task.layout)
  net = network_lib.network(tconfig, ttask.model_overrides(), ttask.example_inputs(), task.layout.mesh())
  if source.startswith("hf:"):
    step, variables = 0, pretrained.place(net, pretrained.at_input_size(net, hub_variables["params"], source), source)
  else:
    best = (tconfig.best, best_mode(tconfig))
    step, variables = pretrained.load(source, net, checkpoint, "params", best, tconfig.keep_checkpoints)
  inputs = _input_map(what, task.preprocess(), student, ttask.preprocess(), described)
  size = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(variables["params"]))
  logging.info("teacher %s: step %d, %s, %s parameters", source, step, tconfig.model.name, f"{size:,}")
  return Teacher(_forward(net.model, inputs), variables)


def _check_classes(what: str, teacher: dict, student: dict) -> None:
  tn, sn = teacher.get("num_classes"), student.get("num_classes")
  if tn != sn:
    raise ConfigError(
      f"{what}: the teacher has {tn} classes, the student's data {sn}; distil from a teacher trained on these classes"
    )
  tc, sc = teacher.get("class_names"), student.get("class_names")
  if tc and sc and list(tc) != list(sc):
    first = next(i for i, (a, b) in enumerate(zip(tc, sc)) if a != b)
    raise ConfigError(
      f"{what}: the teacher's classes are not the student's data's (class {first}: {tc[first]!r} there, "
      f"{sc[first]!r} here); distil from a teacher trained on these classes"
    )


def _input_map(what: str, spre, student: dict, tpre, teacher: dict) -> Callable:
  """The function from the student's normalised images to the teacher's (mean/std, size, channels)."""
  sc, tc = int(student["channels"]), int(teacher["channels"])
  if sc != tc and sc != 1:
    raise ConfigError(f"{what}: the teacher takes {tc}-channel images, the student's data has {sc}")
  size = tuple(teacher["image_size"])
  same_norm = (spre.mean, spre.std) == (tpre.mean, tpre.std)

  def to_unit(x):  # the student's normalisation undone: [0, 1]
    if spre.mean is None:
      return (x + 1.0) / 2.0
    return x * jnp.asarray(spre.std, x.dtype) + jnp.asarray(spre.mean, x.dtype)

  def inputs(x):
    if not same_norm or sc != tc:
      u = to_unit(x)
      if sc != tc:
        u = jnp.repeat(u, tc, axis=-1)
      x = _normalise(u, tpre)
    if tuple(x.shape[1:3]) != size:
      x = jax.image.resize(x, (x.shape[0], *size, x.shape[-1]), "bilinear", antialias=True)
    return x

  return inputs


def _normalise(u, pre):
  """[0, 1] images -> a Preprocess's normalisation (vitjax.data.device_ops.to_float's, in float)."""
  if pre.mean is None:
    return u * 2.0 - 1.0
  return (u - jnp.asarray(pre.mean, u.dtype)) / jnp.asarray(pre.std, u.dtype)
