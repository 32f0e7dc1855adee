"""The guard against a diverging run: each step's train/nonfinite flag, read one step late, and config.on_nonfinite."""

from __future__ import annotations

import math

import jax
from absl import logging

from vitjax.errors import Diverged


def finite(metrics: dict) -> bool:
  """Whether every value is finite."""
  return all(math.isfinite(v) for v in metrics.values())


class NonfiniteGuard:
  """Reads each step's train/nonfinite flag, one step late unless asked now, and applies config.on_nonfinite."""

  def __init__(self, config, ckpts):
    self.config, self.ckpts = config, ckpts
    self.pending = None  # (step, metrics) not yet checked
    self.streak = self.skipped = 0

  def check_lagged(self, step: int, metrics: dict) -> None:
    """Checks the previous step's flag (no wait for this step's) and keeps this one for later."""
    previous, self.pending = self.pending, (step, metrics)
    if previous is not None:
      self._check(*previous)

  def check_now(self, step: int, metrics: dict) -> None:
    """Checks `step`'s flag now if it is still pending (before a save, a stop or a progress line)."""
    if self.pending is not None and self.pending[0] == step:
      self.pending = None
      self._check(step, metrics)

  def _check(self, step: int, metrics: dict) -> None:
    if float(metrics["train/nonfinite"]) == 0:
      self.streak = 0
      return
    values = jax.device_get(metrics)
    what = f"loss {values['train/loss']:.4g}, grad norm {values['train/grad_norm']:.4g}"
    self.streak += 1
    if self.config.on_nonfinite == "skip" and self.streak <= self.config.max_nonfinite_skips:
      self.skipped += 1
      logging.warning("step %d is not finite (%s): update skipped (%d in a row)", step, what, self.streak)
      return
    self.ckpts.wait()
    good = self.ckpts.latest_step()
    where = f"step {good} in {self.ckpts.directory}" if good is not None else "none yet"
    if self.config.on_nonfinite == "skip":
      why = f"more than max_nonfinite_skips={self.config.max_nonfinite_skips} non-finite steps in a row"
      fix = "or allow more skips with --config.max_nonfinite_skips"
    else:
      why, fix = "on_nonfinite='stop'", "or skip such steps with --config.on_nonfinite=skip"
    message = (
      f"step {step}: the loss, gradient norm or parameters are not finite ({what}); stopped ({why}), nothing "
      f"non-finite was saved. Newest good checkpoint: {where}. Lower --config.optim.lr (now "
      f"{self.config.optim.lr:g}), {fix}"
    )
    logging.error("%s", message)
    raise Diverged(message)
