"""Durations in any unit, resolved once into steps: the run's length, its warm-up and its cadences.

A duration field (`total_steps`, `schedule.warmup_steps`, `log_every`, `eval_every`, `checkpoint_every`) takes an
int of steps or a string with a unit: "500" or "500 steps", "2 epochs" (or "2ep", "0.5 epoch"), "60000 examples"
(or "60k ex"). An epoch is the training input's steps per epoch (what the data pipeline yields, not a figure a
config works out by hand); an example is one of the global batch, so examples need a fixed batch size
(translation batches by tokens). `num_epochs` and `schedule.warmup_epochs` remain, as the epoch forms of the run's
length and warm-up. `resolve()` turns them all into a `Durations` of steps, once, for the loop and the schedule.
"""

from __future__ import annotations

import dataclasses
import math
import re

from absl import logging

from vitjax.errors import ConfigError

CADENCES = ("log_every", "eval_every", "checkpoint_every")
FIELDS = ("total_steps", "schedule.warmup_steps", *CADENCES)  # a number of steps, or a text with its unit
_UNITS = {"": "steps", "st": "steps", "step": "steps", "steps": "steps", "ep": "epochs", "epoch": "epochs"}
_UNITS |= {"epochs": "epochs", "ex": "examples", "example": "examples", "examples": "examples"}
_FORM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([km]?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Durations:
  """Everything in steps."""

  total: int
  warmup: int
  log_every: int
  eval_every: int
  checkpoint_every: int


def parse(name: str, value) -> tuple[float, str]:
  """(amount, 'steps' | 'epochs' | 'examples') of a duration field's value; ConfigError naming the forms."""
  if isinstance(value, bool):
    value = None
  if isinstance(value, int | float):
    amount, unit = float(value), "steps"
  else:
    m = _FORM.match(str(value)) if value is not None else None
    unit = _UNITS.get(m[3].lower()) if m else None
    if unit is None:
      raise ConfigError(
        f"{name}={value!r}: give steps (500) or a duration with a unit: '500 steps', '2 epochs', '60000 examples'"
      )
    amount = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6}[m[2].lower()]
  if unit == "steps" and amount != int(amount):
    raise ConfigError(f"{name}={value!r}: a number of steps is a whole number")
  return amount, unit


def steps(name: str, value, steps_per_epoch: int, examples_per_step: int | None, rounding=round) -> int:
  """A duration in steps (`rounding` applies to epochs and examples)."""
  amount, unit = parse(name, value)
  if unit == "steps":
    return int(amount)
  if unit == "epochs":
    return int(rounding(amount * steps_per_epoch))
  if not examples_per_step:
    raise ConfigError(f"{name}={value!r}: this task's batches have no fixed number of examples; give steps or epochs")
  return int(rounding(amount / examples_per_step))


def check(config) -> None:
  """The duration fields parse and the cadences are positive (before any data is read)."""
  for key in CADENCES:
    amount, _ = parse(key, config[key])
    if amount <= 0:
      raise ConfigError(f"{key}={config[key]!r} must be at least 1 step (e.g. --config.{key}=500 or ='1 epoch')")
  for key, value, least in (
    ("total_steps", config.total_steps, 1),
    ("schedule.warmup_steps", config.schedule.warmup_steps, 0),
  ):
    if value is not None and parse(key, value)[0] < 0:  # (total_steps=0: the run's own line, once the data is known)
      raise ConfigError(f"{key}={value!r} must be {'at least 1' if least else '0 or more'}")


def total_steps(config, steps_per_epoch: int, examples_per_step: int | None = None) -> int:
  """The run's length in steps: total_steps (any unit) or num_epochs; ConfigError if neither or not positive."""
  if config.total_steps is None and config.num_epochs is None:
    raise ConfigError("set config.total_steps or config.num_epochs")
  if config.total_steps is not None:
    if config.num_epochs is not None:
      logging.info("total_steps=%s takes precedence over num_epochs=%g", config.total_steps, config.num_epochs)
    total = steps("total_steps", config.total_steps, steps_per_epoch, examples_per_step, math.ceil)
  else:
    total = int(math.ceil(config.num_epochs * steps_per_epoch))
  if total < 1:
    raise ConfigError(f"the run has {total} steps: set --config.total_steps or --config.num_epochs above 0")
  return total


def warmup_steps(config, total: int, steps_per_epoch: int, examples_per_step: int | None = None) -> int:
  """The schedule's warmup in steps, at most `total`.

  Args:
    config: the run's config: schedule.warmup_steps (a duration in any unit) if set, else schedule.warmup_epochs.
    total: the run's length in steps.
    steps_per_epoch: global batches per epoch.
    examples_per_step: the global batch size (None when batches are sized by tokens).

  Raises:
    ConfigError: a warmup in examples when batches have no fixed number of examples.
  """
  s = config.schedule
  if s.warmup_steps is not None:
    if s.warmup_epochs is not None:
      logging.info("schedule.warmup_steps=%s takes precedence over warmup_epochs=%g", s.warmup_steps, s.warmup_epochs)
    warmup = steps("schedule.warmup_steps", s.warmup_steps, steps_per_epoch, examples_per_step)
  else:
    warmup = int(round((s.warmup_epochs or 0) * steps_per_epoch))
  if warmup >= total > 0:
    logging.warning(
      "the warm-up (%d steps) is as long as the run (%d): cut to the run's length, it raises the learning rate to "
      "%d/%d of config.optim.lr at the last step, with no decay; shorten schedule.warmup_steps / warmup_epochs",
      warmup,
      total,
      total - 1,
      total,
    )
  return min(warmup, total)


def resolve(config, steps_per_epoch: int, examples_per_step: int | None = None) -> Durations:
  """Every duration of the config in steps (cadences at least 1)."""
  check(config)
  total = total_steps(config, steps_per_epoch, examples_per_step)
  cadence = {k: max(1, steps(k, config[k], steps_per_epoch, examples_per_step)) for k in CADENCES}
  return Durations(total, warmup_steps(config, total, steps_per_epoch, examples_per_step), **cadence)
