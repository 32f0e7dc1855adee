"""Per-class accuracy of a classifier, and its confusion matrix.

balanced_accuracy (the mean of the classes' recalls, what a skewed test set needs), worst_class_accuracy and, for each
class, accuracy_NAME (its recall; NAME is the class's name, or its index); the confusion matrix (rows: true class,
columns: predicted) goes to WORKDIR/NAME_confusion_SPLIT_STEP.json (STEP_ema for the moving average's).

This type is also the example of adding one (CONTRIBUTING.md): this file and its test in tests/test_evaluators.py,
nothing else. Options: none beyond the common ones (vitjax.evaluators), and `shift` as the classification
evaluator's.
"""

from __future__ import annotations

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from vitjax import paths
from vitjax.data import device_ops
from vitjax.evaluators import classification
from vitjax.tasks.base import check_stop

OPTIONS = {"shift": None}


def metrics(options: dict) -> dict[str, str]:
  """The metrics this type reports whatever the data: balanced_accuracy and worst_class_accuracy, both max.

  Each class's accuracy_NAME is reported besides, its name known only from the data.
  """
  del options  # (the per-class names depend on the data: they are reported, not chosen by)
  return {"balanced_accuracy": "max", "worst_class_accuracy": "max"}


def check(ev) -> None:
  """Checks the entry before anything is written, as the classification type does (check_classifier)."""
  classification.check_classifier(ev)


def run(ev, net, variables, stop=None, step=None) -> dict:
  """Each class's recall on the split, from its confusion matrix.

  With a `step` and a workdir, process 0 also writes the confusion matrix to WORKDIR/NAME_confusion_SPLIT_STEP.json
  (STEP: the training step, or averaged, init, imported; _ema after it for the moving average's).
  Arguments as in classification.run.

  Returns:
    {"balanced_accuracy", "worst_class_accuracy", "accuracy_NAME" for each class seen in the split}, NAME the class
    name with characters other than letters, digits and underscores replaced by underscores.
  """
  info = ev.task.describe()
  k, pre = info["num_classes"], ev.task.preprocess()
  confusion = None
  for batch in classification.batches(ev, net):
    check_stop(stop)
    counts = _step(net.model, variables, batch, pre.mean, pre.std, k)
    confusion = counts if confusion is None else confusion + counts
  confusion = np.asarray(jax.device_get(confusion)).astype(np.int64)
  seen = confusion.sum(1) > 0
  recall = np.diag(confusion)[seen] / confusion.sum(1)[seen]
  names = info.get("class_names") or [str(i) for i in range(k)]
  out = {"balanced_accuracy": float(recall.mean()), "worst_class_accuracy": float(recall.min())}
  for name, r in zip(np.asarray(names)[seen], recall):
    out[f"accuracy_{metric_name(str(name), out)}"] = float(r)
  if step is not None and ev.workdir and jax.process_index() == 0:
    ema = "_ema" if ev.weights == "ema" else ""  # one file per split, weights and what was evaluated
    path = os.path.join(ev.workdir, f"{ev.name}_confusion_{ev.split}_{step}{ema}.json")
    paths.write_text(path, json.dumps({"split": ev.split, "classes": list(names), "confusion": confusion.tolist()}))
  return out


def metric_name(class_name: str, taken) -> str:
  """A class name as a metric's suffix: letters (any script), digits and '_'; a name another class took gets '_2'.

  Before, any non-ASCII letter became '_': 猫, 犬 and 鳥 all became ``accuracy__``, one value for three classes.
  """
  base = re.sub(r"\W+", "_", class_name) or "_"
  name, n = base, 1
  while f"accuracy_{name}" in taken:
    n += 1
    name = f"{base}_{n}"
  return name


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _step(model, variables, batch, mean, std, num_classes):
  logits, _ = model.apply(variables, device_ops.to_float(batch["image"], mean, std), train=False)
  true = jax.nn.one_hot(batch["label"], num_classes) * batch["mask"][:, None].astype(jnp.float32)
  return true.T @ jax.nn.one_hot(logits.argmax(-1), num_classes)  # [true, predicted] counts
