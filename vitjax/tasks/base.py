"""The task interface, and the pieces every task shares (loss, batch checks).

A task is what differs between image classification, masked-image pre-training (MAE) and translation: its data, the model's inputs and the
attributes the data decides, the loss, and what prediction needs. What a run measures is not the task's: evaluators
(vitjax.evaluators) read the task's evaluation batches and compute their metrics themselves. The trainer (vitjax.train)
holds the rest and never asks which task it runs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError

VALID = "valid"  # the validation split's name: held out of the training split, or the dataset's own


class EvaluationInterrupted(Exception):
  """An evaluation stopped between batches because training was asked to stop (vitjax.train.preemption)."""


def check_stop(stop) -> None:
  """Raises EvaluationInterrupted if `stop` (a callable or None) says so; evaluators call it between batches."""
  if stop is not None and stop():
    raise EvaluationInterrupted()


@dataclasses.dataclass
class TrainInput:
  """This process's training batches and what the trainer needs to know about them.

  Attributes:
    batches: an endless iterator of process-local numpy batches (dicts holding at least the task's `batch_keys`)
      with get_state() / set_state() (grain's bytes, or a JSON-able dict).
    num_examples: training examples in the split (all processes).
    steps_per_epoch: global batches per pass over the data.
    examples_per_step: the global batch size, or None when batches are sized by tokens.
    name: what the log calls the data ("digits", "bible en-es").
    on_device: the batches are global arrays already on the devices, made there (vitjax.data.resident), not
      process-local numpy batches.
  """

  batches: Iterator[dict]
  num_examples: int
  steps_per_epoch: int
  examples_per_step: int | None = None
  name: str = ""
  on_device: bool = False

  def state(self) -> str:
    """The iterator's position as text (for the checkpoint): the batch after it is the next one read."""
    s = self.batches.get_state()
    return s.decode() if isinstance(s, bytes) else json.dumps(s)

  def restore(self, state: str) -> None:
    """Puts the iterator back at `state`, a text that state() returned."""
    if isinstance(self.batches.get_state(), bytes):
      self.batches.set_state(state.encode())
    else:
      self.batches.set_state(json.loads(state))


@runtime_checkable
class Task(Protocol):
  """What the trainer asks of a task.

  Built as `Task(config, workdir, described, layout)` (vitjax.tasks.get); nothing may be written before check().

  batch_keys: keys of a training batch that go to the devices.
  layout: the devices' layout (vitjax.mesh.Layout, config.mesh resolved once), which batches must split over.
  """

  batch_keys: tuple[str, ...]
  layout: mesh_lib.Layout

  def check(self) -> None:
    """Validates the config against the data and the devices (ConfigError); runs once, before any write."""

  def model_overrides(self) -> dict:
    """Model attributes the data decides (vocabulary size, ...), applied over config.model."""

  def example_inputs(self) -> tuple:
    """Batch-1 model inputs for model.init (shapes and dtypes only matter)."""

  def describe(self) -> dict:
    """What prediction needs beyond config.json (classes, image size, normalisation, tokenizer file).

    The trainer writes it to WORKDIR/task.json so that vitjax.load works without the dataset.
    """

  def train_input(self) -> TrainInput:
    """This process's training batches."""

  def device_batch(self, batch: dict, key: jax.Array) -> dict:
    """Batch-level work on the devices inside the jitted training step, on the whole global batch.

    Before any micro-batching (normalising uint8 images, Mixup/CutMix); `key` is the step's PRNG key (a function of the
    seed and the step only).
    """

  def model_inputs(self, batch: dict) -> tuple:
    """Positional model inputs from a (device) batch."""

  def loss(self, logits: jax.Array, batch: dict) -> tuple[jax.Array, dict]:
    """(scalar loss, {name: scalar}) of one batch: means over the batch's examples, or over its "tokens".

    A "tokens" entry is what the loss and the other metrics are means over (translation: the target tokens): with
    gradient accumulation the micro-batches are weighted by it, so that the step is the full batch's, and it is
    summed; without one the micro-batches weigh the same.
    """

  def check_split(self, split: str, what: str) -> None:
    """ConfigError naming the setting `what` if the data has no split `split`."""

  def eval_batches(self, split: str, limit: int | None = None):
    """A split's evaluation data for its evaluators (vitjax.evaluators): its first `limit` examples (None: all).

    Its form is the task's (image batches; translation's pairs and batches), as evaluators are written for tasks.
    """


def cross_entropy(logits, labels, num_classes: int, smoothing: float = 0.0):
  """Label-smoothed cross-entropy. labels: int [...] or soft [..., K]; logits [..., K] -> [...]."""
  targets = jax.nn.one_hot(labels, num_classes) if labels.ndim == logits.ndim - 1 else labels
  if smoothing:
    targets = targets * (1.0 - smoothing) + smoothing / num_classes
  return -jnp.sum(targets * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


def check_batch(batch_size: int, what: str, layout: mesh_lib.Layout, accum: int = 1) -> None:
  """A global batch (each of `accum` micro-batches) must split evenly over the layout's batch axes and processes."""
  shards, procs = layout.batch_shards, jax.process_count()
  n = shards * accum
  if batch_size < 1:
    raise ConfigError(f"{what}={batch_size} must be positive (e.g. --config.{what}={max(n, 8)})")
  if batch_size % n:
    lo, hi = (batch_size // n) * n, (batch_size // n + 1) * n
    where = f"the {shards} batch shards (data x fsdp of config.mesh)"
    if shards == jax.device_count():
      where = f"the {shards} devices"
    if accum > 1:
      where += f" times optim.accum_steps={accum}"
    raise ConfigError(
      f"{what}={batch_size} is not divisible by {where}; use a multiple of {n} "
      f"(e.g. --config.{what}={hi}{f' or {lo}' if lo else ''})"
    )
  if batch_size % procs:
    raise ConfigError(f"{what}={batch_size} is not divisible by the {procs} processes")
