"""Tasks: what differs between image classification, masked-image pre-training and translation.

Behind one interface (`Task`, in vitjax.tasks.base), so that one trainer serves them all. A task knows its data, the
model's inputs, its loss, its evaluation and what prediction needs; the trainer knows the mesh, the optimizer,
checkpoints and reporting.

    task = vitjax.tasks.get(config, workdir)   # config.task: "classification" | "translation" | "mae"
    net = vitjax.tasks.network(config, task)   # its model, mesh and variables' layout (vitjax.models.network)
"""

from __future__ import annotations

from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError
from vitjax.models import network as network_lib
from vitjax.tasks.base import Task, TrainInput, check_batch, cross_entropy
from vitjax.tasks.classification import ImageClassification
from vitjax.tasks.mae import MaskedImageModeling
from vitjax.tasks.translation import Translation

TASKS = {"classification": ImageClassification, "translation": Translation, "mae": MaskedImageModeling}


def get(config, workdir: str, described: dict | None = None, layout: mesh_lib.Layout | None = None) -> Task:
  """The task named by config.task.

  described: a trained run's WORKDIR/task.json (prediction without data); layout: config.mesh as the caller resolved it
  (vitjax.mesh.Layout; None: the task resolves it).
  """
  name = config.task
  if name not in TASKS:
    raise ConfigError(f"unknown task {name!r}; use one of {sorted(TASKS)}")
  return TASKS[name](config, workdir, described, layout)


def network(config, task: Task) -> network_lib.Network:
  """The Network of a config for a task: the task's overrides and example inputs, on its layout's mesh.

  What prediction, evaluation and training build their model from (vitjax.models.network.network).
  """
  return network_lib.network(config, task.model_overrides(), task.example_inputs(), task.layout.mesh())


__all__ = [
  "ImageClassification",
  "MaskedImageModeling",
  "TASKS",
  "Task",
  "TrainInput",
  "Translation",
  "check_batch",
  "cross_entropy",
  "get",
  "network",
]
