"""Preemption: SIGTERM or SIGINT asks training to stop at the next safe point.

SIGTERM is what preemptible VMs, SLURM and Kubernetes send; SIGINT is Ctrl-C. At that point the step in flight finishes,
a checkpoint of that step is written and waited for, one line says so, and the process exits with
vitjax.errors.EXIT_PREEMPTED (75). An evaluation in progress is cut short (it runs again on resume). A second signal
stops the process at once (exit 128 + the signal's number), except a SIGTERM within REPEAT_S of the first: that is the
same request delivered twice, as clusters do (a sweep or launcher killed with SIGKILL sends its children their
parent-death signal once for each of its threads that hands them on; a scheduler may signal a job's processes and
also their process group), and it is ignored.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from vitjax import logs
from vitjax.mesh import agree

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 2.0  # a SIGTERM this soon after the first is a repeat of it, not a second request


def repeated(signum: int, first: int | None, first_at: float) -> bool:
  """Whether `signum` is the first signal `first` (received at time.monotonic() `first_at`) delivered again."""
  return signum == first == signal.SIGTERM and time.monotonic() - first_at < REPEAT_S


class StopRequest:
  """Installs the handlers while in a `with` block; `requested()` says whether a stop was asked for.

  On any process: all processes stop at the same step.
  """

  def __init__(self):
    self.signum = None
    self._at = 0.0  # time.monotonic() of the first signal
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if repeated(signum, self.signum, self._at):
      return
    if self.signum is not None:  # the second signal: no more waiting
      os.write(2, f"\n{logs.process_prefix()}{name} again: stopping now, without a checkpoint\n".encode())
      os._exit(128 + signum)
    self.signum, self._at = signum, time.monotonic()
    if not logs.is_quiet_process():  # (process 0's "stopped at step N" line speaks for them all)
      os.write(2, f"\n{name}: stopping after the step in flight is checkpointed\n".encode())

  @property
  def name(self) -> str:
    """The signal's name ("SIGTERM", ...), or "a signal to another process" when none reached this process."""
    return signal.Signals(self.signum).name if self.signum else "a signal to another process"

  @property
  def asked(self) -> bool:
    """Whether this process got a signal (no collective: combine it with mesh.agree)."""
    return self.signum is not None

  def requested(self) -> bool:
    """Whether any process got a signal (a collective on several processes)."""
    return agree(self.asked)[0]
