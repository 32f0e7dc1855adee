"""Logging: absl logging for vitjax's own lines; the libraries' chatter hidden unless asked for.

Every vitjax command (`vitjax.main`, `vitjax.translate`, `vitjax.data.prepare`) calls `setup()`; library users
can call it too (a notebook shows nothing below WARNING otherwise). `--verbosity` (absl's flag) chooses:

    --verbosity=-1   warnings and errors only
    --verbosity=0    (default) vitjax's progress and results, and everyone's warnings and errors
    --verbosity=1    also the libraries' INFO lines (orbax, grain, tfds, jax) and vitjax's debug lines

Lines read `HH:MM:SS message`; a warning or error says so and, when it comes from a library, which one.
`Progress` reports on long loops (evaluation, decoding) that would otherwise be silent.
"""

from __future__ import annotations

import logging as py_logging
import os
import sys
import time

from absl import logging

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Library warnings that say nothing a vitjax user can act on (shown at --verbosity=1).
_HARMLESS = (
  "OpenCV is not installed",
  "Given directory is read only",
  "Requested `tracked_metric`; did not provide metrics",  # a step saved between evaluations
)


def _from_vitjax(record: py_logging.LogRecord) -> bool:
  return record.pathname.startswith(_PACKAGE_DIR)


class _Filter(py_logging.Filter):
  """At verbosity <= 0 only vitjax's INFO lines pass; warnings and errors always do (but known-harmless ones)."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    if record.levelno >= py_logging.WARNING:
      return not str(record.msg).startswith(_HARMLESS) or logging.get_verbosity() >= 1
    return _from_vitjax(record) or logging.get_verbosity() >= 1


class _Formatter(py_logging.Formatter):
  def format(self, record: py_logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    msg = record.getMessage()
    if record.exc_info:
      msg += "\n" + self.formatException(record.exc_info)
    if record.levelno >= py_logging.WARNING:
      level = "ERROR" if record.levelno >= py_logging.ERROR else "WARNING"
      source = "" if _from_vitjax(record) else f" [{record.name if record.name != 'absl' else record.module}]"
      return f"{stamp} {level}{source} {msg}"
    if not _from_vitjax(record):
      return f"{stamp} [{record.name if record.name != 'absl' else record.module}] {msg}"
    return f"{stamp} {msg}"


def setup(verbosity: int | None = None) -> None:
  """Routes Python and absl logging through one handler on stderr with vitjax's filter and format.

  verbosity: None keeps absl's (the --verbosity flag, 0 by default). Idempotent.
  """
  from absl import flags

  if not flags.FLAGS.is_parsed():  # outside absl.app (argparse, notebooks): absl's defaults, and no
    flags.FLAGS.mark_as_parsed()  # "Logging before flag parsing" warning
  if verbosity is not None:
    logging.set_verbosity(verbosity)
  logging.use_absl_handler()
  py_logging.captureWarnings(True)  # Python warnings as log lines, through the same filter and format
  handler = logging.get_absl_handler()
  handler.setFormatter(_Formatter())
  if not any(isinstance(f, _Filter) for f in handler.filters):
    handler.addFilter(_Filter())
  handler.python_handler.stream = sys.stderr
  if logging.get_verbosity() < 1:
    for name in ("jax._src.xla_bridge", "jax._src.compiler", "jax._src.dispatch"):
      py_logging.getLogger(name).setLevel(py_logging.WARNING)
    try:  # tqdm bars from tfds (preparing a dataset) are noise in a log
      import tensorflow_datasets as tfds

      tfds.disable_progress_bar()
    except ImportError:
      pass


def fmt_time(seconds: float) -> str:
  """'1h05m', '3m07s', '42s'; '?' for NaN or infinity."""
  if seconds != seconds or seconds in (float("inf"), float("-inf")):
    return "?"
  s = max(int(seconds), 0)
  if s >= 3600:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
  """Progress of a loop over a known number of batches, reported only if the loop is slow.

  Silent for the first `after` seconds, then a line every `every` seconds: done / total, items per second (e.g.
  sentences), ETA. `done()` returns the elapsed seconds.

      progress = Progress("eval valid", total=len(batches), unit="sentences")
      for b in batches:
        ...
        progress.update(items=len(b))
  """

  def __init__(self, what: str, total: int, unit: str = "examples", after: float = 5.0, every: float = 10.0):
    self.what, self.total, self.unit, self.after, self.every = what, total, unit, after, every
    self.start, self.last = time.time(), None
    self.count = self.items = 0

  def update(self, items: int = 0) -> None:
    self.count += 1
    self.items += items
    now = time.time()
    due = now - self.start >= self.after if self.last is None else now - self.last >= self.every
    if due and self.count < self.total:
      self.last = now
      elapsed = now - self.start
      rate = f" | {self.items / elapsed:.1f} {self.unit}/s" if self.items else ""
      eta = elapsed / self.count * (self.total - self.count)
      logging.info("%s: %d/%d batches%s | ETA %s", self.what, self.count, self.total, rate, fmt_time(eta))

  def done(self) -> float:
    return time.time() - self.start
