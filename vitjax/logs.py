"""Logging: absl logging for vitjax's own lines; the libraries' chatter hidden unless asked for.

Every vitjax command (`vitjax.main`, `vitjax.translate`, `vitjax.data.prepare`) calls `setup()`; library users
can call it too (a notebook shows nothing below WARNING otherwise). `--verbosity` (absl's flag) chooses:

    --verbosity=-1   warnings and errors only
    --verbosity=0    (default) vitjax's progress and results, and everyone's warnings and errors
    --verbosity=1    also the libraries' INFO lines (orbax, grain, tfds, jax) and vitjax's debug lines
    --verbosity=2    also the libraries' debug lines (thousands in a short run: every PNG chunk PIL reads, ...)

Lines read `HH:MM:SS message`; a warning or error says so and, when it comes from a library, which one.
In a run of several processes (vitjax.distributed sets them here), process 0 logs as one process would; the
others log only their warnings and errors, each line naming its process (`process 3: WARNING ...`), so that a
job's output holds one log, not one per process.
`Progress` reports on long loops (evaluation, decoding) that would otherwise be silent.
"""

from __future__ import annotations

import atexit
import contextlib
import logging as py_logging
import os
import sys
import threading
import time

from absl import logging

from vitjax.errors import is_write_failure_line, write_failure

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PROCESS = [0, 1]  # (this process's index, the processes): set_process()


def set_process(index: int, count: int) -> None:
  """This process's index among `count` (vitjax.distributed.initialize calls it)."""
  _PROCESS[:] = [index, count]


# a launcher's rank of this process, for what is said before jax.distributed knows it (a bad flag's error line)
_RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "JOB_COMPLETION_INDEX")


def is_quiet_process() -> bool:
  """Whether this process is one of several and not the first: it logs its warnings and errors only.

  Before vitjax.distributed has started, a --multihost process goes by its launcher's rank (SLURM, Open MPI, k8s).
  """
  if _PROCESS[1] > 1:
    return _PROCESS[0] != 0
  if "--multihost" in sys.argv:
    rank = next((os.environ[v] for v in _RANK_VARIABLES if os.environ.get(v)), "0")
    return rank != "0"
  return False


def process_prefix() -> str:
  """The prefix of a line written to stderr: "process N: " on process N > 0 of several processes, else ""."""
  return f"process {_PROCESS[0]}: " if _PROCESS[1] > 1 and _PROCESS[0] != 0 else ""


# Library warnings that say nothing a vitjax user can act on (shown at --verbosity=1).
_HARMLESS = (
  "OpenCV is not installed",
  "Given directory is read only",
  "Requested `tracked_metric`; did not provide metrics",  # a step saved between evaluations
)


def _from_vitjax(record: py_logging.LogRecord) -> bool:
  return record.pathname.startswith(_PACKAGE_DIR)


def _is_write_failure(record: py_logging.LogRecord) -> bool:

  text = str(record.msg) + (str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else "")
  return is_write_failure_line(text)


class _Filter(py_logging.Filter):
  """Which lines pass, by absl's verbosity.

  At verbosity <= 0 only vitjax's INFO lines pass; warnings and errors always do (but known-harmless ones); the
  libraries' INFO lines at 1, their debug lines at 2.
  """

  def filter(self, record: py_logging.LogRecord) -> bool:
    if is_quiet_process() and record.levelno < py_logging.WARNING:
      return False
    if record.levelno >= py_logging.WARNING:
      if not _from_vitjax(record) and _is_write_failure(record) and logging.get_verbosity() < 1:
        return False  # a library's account of a full disk: the trainer says it in one line (WorkdirUnwritable)
      return not str(record.msg).startswith(_HARMLESS) or logging.get_verbosity() >= 1
    verbosity = logging.get_verbosity()
    if _from_vitjax(record) or verbosity >= 2:
      return True
    return verbosity >= 1 and record.levelno >= py_logging.INFO


class _Formatter(py_logging.Formatter):
  def format(self, record: py_logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    msg = record.getMessage()
    if record.exc_info:
      msg += "\n" + self.formatException(record.exc_info)
    if record.levelno >= py_logging.WARNING:
      level = "ERROR" if record.levelno >= py_logging.ERROR else "WARNING"
      source = "" if _from_vitjax(record) else f" [{record.name if record.name != 'absl' else record.module}]"
      return f"{stamp} {process_prefix()}{level}{source} {msg}"
    if not _from_vitjax(record):
      return f"{stamp} [{record.name if record.name != 'absl' else record.module}] {msg}"
    return f"{stamp} {msg}"


_NOISE = "RuntimeError: Event loop is closed"


class _Stderr:
  """sys.stderr, less the tracebacks that end in `RuntimeError: Event loop is closed` (at verbosity < 1).

  After a failed checkpoint write orbax closes its asyncio loop, and tensorstore's callbacks for the writes still
  pending print one such traceback each from C++ (a full disk printed hundreds), from several threads at once, while
  the trainer says what happened in one line (vitjax.errors.WorkdirUnwritable). Each thread's writes are therefore
  read on their own: its lines pass as they end, a traceback it begins is held until its exception's line and then
  dropped if that line is the one above, written whole otherwise. So the other threads' lines, the trainer's own
  included, neither split a held traceback nor get caught in it (CI saw both: two tracebacks interleaved, and the
  full-disk line written in the middle of one).
  """

  _HEAD = "Traceback (most recent call last):"

  def __init__(self, stream):
    self.stream = stream
    self.threads = {}  # thread id -> [partial line, held traceback lines or None]

  def write(self, text: str) -> int:
    thread = threading.get_ident()
    state = self.threads.get(thread)
    if state is None:
      if logging.get_verbosity() >= 1:
        return self.stream.write(text)
      state = self.threads[thread] = ["", None]
    lines = (state[0] + text).split("\n")
    state[0] = lines.pop()
    for line in lines:
      self._line(state, line + "\n")
    partial = state[0]
    if partial and state[1] is None and not (self._HEAD.startswith(partial) or partial.startswith(self._HEAD)):
      self.stream.write(partial)  # an unfinished line that is no traceback: now, not at the next newline
      state[0] = ""
    if state == ["", None]:
      del self.threads[thread]
    return len(text)

  def _line(self, state: list, line: str) -> None:
    if state[1] is None and not line.startswith(self._HEAD):
      self.stream.write(line)
    elif state[1] is None:
      state[1] = [line]
    else:
      state[1].append(line)
      if not line.startswith((" ", "\t")):  # an exception's own line ends a traceback
        block, state[1] = state[1], None
        if line.strip() != _NOISE:
          self.stream.write("".join(block))

  def flush(self) -> None:
    self.stream.flush()

  def close(self) -> None:
    """At exit: what each thread holds goes out, but for a closed loop's traceback cut short."""
    held = ""
    for partial, block in list(self.threads.values()):
      lines = (block or []) + ([partial] if partial else [])
      frames = [line for line in lines if line.startswith("  File ")]
      if block and frames and all("asyncio" in line and "base_events.py" in line for line in frames):
        continue
      held += "".join(lines)
    self.threads.clear()
    try:
      self.stream.write(held)
      self.stream.flush()
    except (OSError, ValueError):  # the stream is gone already
      pass

  def __getattr__(self, name):
    return getattr(self.stream, name)


def _quiet_thread_excepthook(previous):
  """threading.excepthook, but silent at verbosity < 1 for a background writer that died of a full disk.

  A writer such as TensorBoard's; a disk full, over quota or read-only: the trainer's own write fails too and says it in
  one line.
  """

  def hook(args):

    if write_failure(args.exc_value) is not None and logging.get_verbosity() < 1:
      return
    previous(args)

  hook.vitjax = True
  return hook


def _quiet_unraisable_hook(previous):
  """sys.unraisablehook, but silent at verbosity < 1 for orbax's reads left behind when a checkpoint is corrupt.

  After one read of a corrupt checkpoint fails, orbax abandons the others; a coroutine that then fails when collected
  printed its traceback and the whole TensorStore spec (60 lines), while the trainer says what happened in one line.
  """

  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename and logging.get_verbosity() < 1:
      return
    previous(unraisable)

  hook.vitjax = True
  return hook


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
  if not isinstance(sys.stderr, _Stderr):
    sys.stderr = _Stderr(sys.stderr)
    atexit.register(sys.stderr.close)
  if not getattr(threading.excepthook, "vitjax", False):
    threading.excepthook = _quiet_thread_excepthook(threading.excepthook)
  if not getattr(sys.unraisablehook, "vitjax", False):
    sys.unraisablehook = _quiet_unraisable_hook(sys.unraisablehook)
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


@contextlib.contextmanager
def muted(startswith: str | None = None):
  """Within it, absl's logger drops its INFO and WARNING lines (errors pass), or only those starting `startswith`.

  For lines whose news the caller says itself, or that mislead.
  """
  drop = py_logging.Filter()
  if startswith is None:
    drop.filter = lambda record: record.levelno >= py_logging.ERROR
  else:
    drop.filter = lambda record: not str(record.msg).startswith(startswith)
  logger = py_logging.getLogger("absl")
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)


def plural(count: int, noun: str) -> str:
  """'1 metrics row', '3 metrics rows': the count and the noun, with an s unless the count is 1."""
  return f"{count} {noun}{'' if count == 1 else 's'}"


class Progress:
  """Progress of a loop over a known number of batches, reported only if the loop is slow.

  Silent for the first `after` seconds, then a line every `every` seconds: done / total, items per second (e.g.
  sentences), ETA, both from the batches after the first (which includes the compilation) once there are some.
  `done()` returns the elapsed seconds. For example::

      progress = Progress("eval valid", total=len(batches), unit="sentences")
      for b in batches:
        ...
        progress.update(items=len(b))
  """

  def __init__(self, what: str, total: int, unit: str = "examples", after: float = 5.0, every: float = 10.0):
    self.what, self.total, self.unit, self.after, self.every = what, total, unit, after, every
    self.start, self.last = time.time(), None
    self.count = self.items = 0
    self.first = None  # (time, items) once the first batch is done: it may include compilation

  def update(self, items: int = 0) -> None:
    """Counts one batch of `items` items and logs a progress line if one is due (never after the last batch)."""
    self.count += 1
    self.items += items
    now = time.time()
    if self.first is None:
      self.first = (now, self.items)
    due = now - self.start >= self.after if self.last is None else now - self.last >= self.every
    if due and self.count < self.total:
      self.last = now
      # the rate of the batches after the first, which compiled the loop's step: it said nothing of the others
      since, done, items = (now - self.first[0], self.count - 1, self.items - self.first[1])
      if done == 0 or since <= 0:  # the first batch alone
        since, done, items = now - self.start, self.count, self.items
      rate = f" | {items / since:.1f} {self.unit}/s" if items else ""
      eta = since / done * (self.total - self.count)
      logging.info("%s: %d/%d batches%s | ETA %s", self.what, self.count, self.total, rate, fmt_time(eta))

  def done(self) -> float:
    """The seconds since the Progress was created."""
    return time.time() - self.start
