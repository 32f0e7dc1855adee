"""Checkpoints, written: the training run's WORKDIR/checkpoints/STEP, kept by orbax's policies.

A step holds the TrainState, the data iterator's position and their checksums (vitjax.models.checkpoints: the format,
its reader and the integrity checks), written asynchronously and atomically. It is saved every `checkpoint_every`
steps, at every evaluation (after it, with its metrics) and at the end. Orbax's preservation policies keep the latest
`keep_checkpoints` steps plus the best evaluated one by `best` (config.best, 'max' or 'min' by its evaluator; a
non-finite evaluation is never best). A step is written once, except one whose evaluation a stop interrupted: it is
evaluated on resume and written again with its metrics.

A step that fails its checks on resume is named in one line and skipped: training resumes from the newest intact step
and moves the broken one to WORKDIR/corrupt/ (nothing is deleted).
"""

from __future__ import annotations

import os
import shutil
import time

import jax
import orbax.checkpoint as ocp
from absl import logging

from vitjax.mesh import sync
from vitjax.models import checkpoints as reader
from vitjax.models.checkpoints import (  # noqa: F401  (the trainer's names for the format)
  AVERAGED,
  CHECKPOINTS,
  CorruptCheckpoint,
  checksums,
  has_checkpoints,
  latest_step,
  text_checksum,
)


class Checkpoints(reader.Checkpoints):
  """A training run's WORKDIR/checkpoints: the reader's restore, and saving with orbax's keep and best policies.

  keep: how many latest steps to keep (and the best evaluated one besides). Corrupt steps found on restore are moved
  to WORKDIR/corrupt/.
  """

  read_only = False

  def __init__(self, workdir: str, best: str, best_mode: str, keep: int, subdir: str = CHECKPOINTS):
    self.keep = keep
    super().__init__(workdir, best, best_mode, subdir)

  def _options(self, best_fn) -> ocp.CheckpointManagerOptions:
    policy = ocp.checkpoint_managers.AnyPreservationPolicy(
      [
        ocp.checkpoint_managers.LatestN(n=self.keep),
        ocp.checkpoint_managers.BestN(
          get_metric_fn=best_fn, reverse=self.best_mode == "min", n=1, keep_checkpoints_without_metrics=False
        ),
      ]
    )
    return ocp.CheckpointManagerOptions(
      best_fn=best_fn, best_mode=self.best_mode, preservation_policy=policy, enable_async_checkpointing=True
    )

  def save(self, step: int, state, data_state: str, metrics: dict | None = None) -> None:
    """Starts writing step `step` (asynchronously) with its checksums.

    metrics: its evaluation (finite ones make it a candidate for `best`); None: not evaluated (a resume evaluates it if
    the step is an evaluation step).
    """
    sums = {"state": checksums(state), "data": text_checksum(data_state)}
    args = ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state), checksums=ocp.args.JsonSave(sums)
    )
    metrics = {k: float(v) for k, v in metrics.items()} if metrics else None
    self.manager.save(step, args=args, metrics=metrics)

  def _set_aside(self, step: int) -> None:
    """Moves a corrupt step out of checkpoints/ into WORKDIR/corrupt/.

    Training only: a new step of that number must not collide with it. Kept for inspection; nothing is deleted.
    """
    if jax.process_index() == 0:
      dst = os.path.join(self.workdir, "corrupt", f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), dst)
      logging.warning("moved the corrupt checkpoint %d to %s", step, dst)
    sync(f"set_aside_{step}")
    self.manager.reload()

  def wait(self) -> None:
    """Blocks until the asynchronous saves in flight are written."""
    self.manager.wait_until_finished()
