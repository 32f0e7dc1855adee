"""How a run ends other than by finishing, and the command line's exit status for each.

The statuses::

    0   finished (or already complete)
    2   ConfigError, DatasetNotPreparedError: input the user can fix; one "error: ..." line names the fix, and
        the workdir is left as it was
    3   Diverged: the loss, gradient norm or parameters stopped being finite; nothing non-finite was saved
    74  WorkdirUnwritable: a write to the workdir failed for lack of space (or a read-only filesystem) during
        training; the half-written step was removed, the last good checkpoint is intact; free space and rerun
        the same command to resume
    75  Preempted: SIGTERM or SIGINT; the step in flight was checkpointed; rerun the same command to resume.
        Also a multi-process run that lost a process (vitjax.distributed.PeerWatch): no new checkpoint; rerun
        every process to resume from the last one. Also InputLost: a data worker process died (the out-of-memory
        killer) and the last step trained was checkpointed
    130, 143  a second SIGINT / SIGTERM: stopped at once, without a checkpoint. 130 also for Ctrl-C where
        training's handler is not installed (an evaluation, the other tools, a command's start): one line,
        "SIGINT: stopped"

Anything else that escapes is a bug in vitjax and keeps its traceback.
"""

import errno
import re
import signal


class ConfigError(ValueError):
  """A problem with the experiment's config, workdir or checkpoints; the message says how to fix it."""


class DatasetNotPreparedError(FileNotFoundError):
  """A dataset or text source is not installed or not prepared; the message gives the command that fixes it."""


USER_ERRORS = (ConfigError, DatasetNotPreparedError)


class Preempted(Exception):
  """SIGTERM or SIGINT stopped training after the step in flight was checkpointed.

  Rerun the same command to resume. The command line exits with EXIT_PREEMPTED.
  """

  exit_code = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, to be retried


class InputLost(Preempted):
  """A process that read the training batches died (a grain worker, killed: often the out-of-memory killer).

  The steps already trained were checkpointed (in a one-process run; with more, each process's save is collective,
  so the others stop as for a lost peer) and the run stopped. Rerun the same command to resume: it exits with
  EXIT_PREEMPTED, which a cluster script requeues.
  """


class Diverged(Exception):
  """The loss, gradient norm or parameters stopped being finite; nothing non-finite was checkpointed.

  The command line exits with EXIT_DIVERGED.
  """

  exit_code = 3


class WorkdirUnwritable(Exception):
  """Training could not write its workdir (no space left, a quota, a read-only filesystem).

  The half-written step was removed and the last good checkpoint kept. The command line exits with EXIT_UNWRITABLE,
  which a cluster script tells apart from EXIT_PREEMPTED: requeueing would fail the same way until space is freed.
  """

  exit_code = 74  # EX_IOERR (sysexits.h)


EXIT_PREEMPTED = Preempted.exit_code
EXIT_UNWRITABLE = WorkdirUnwritable.exit_code
EXIT_DIVERGED = Diverged.exit_code


# How the libraries word a failed write (orbax and tensorstore wrap the OS error in their own): what it means.
_WRITE_FAILURES = (
  ("No space left on device", "no space is left"),
  ("os_error_code='28'", "no space is left"),
  ("Disk quota exceeded", "the disk quota is exceeded"),
  ("os_error_code='122'", "the disk quota is exceeded"),
  ("Read-only file system", "the filesystem is read-only"),
  ("os_error_code='30'", "the filesystem is read-only"),
)
_WRITE_ERRNOS = {errno.ENOSPC: "no space is left", errno.EDQUOT: "the disk quota is exceeded", errno.EROFS:
                 "the filesystem is read-only"}  # fmt: skip


def write_failure(e: BaseException | None) -> str | None:
  """What made a write fail, if an exception says the disk is full, over quota or read-only; None for anything else.

  Any exception in the chain counts: the one given, or one it was raised from or during.
  """
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
      return _WRITE_ERRNOS[e.errno]
    found = next((why for marker, why in _WRITE_FAILURES if marker in str(e)), None)
    if found:
      return found
    e = e.__cause__ or e.__context__
  return None


# grain's words (grain/_src/python/dataset/transformations/process_prefetch.py) for a worker process that died
_LOST_WORKER = re.compile(r"Worker process was terminated unexpectedly with exit code (-?\d+)")


def lost_worker(e: BaseException) -> str | None:
  """What ended a grain worker process, if `e` is grain's report that one died; None for anything else.

  An error raised inside a worker is not such a report: it comes back as that error, with its own traceback.
  """
  found = _LOST_WORKER.search(str(e)) if isinstance(e, RuntimeError) else None
  if found is None:
    return None
  code = int(found.group(1))
  if code >= 0:
    return f"a grain worker process exited with status {code} (its own error is in the log above)"
  try:
    name = signal.Signals(-code).name
  except ValueError:
    name = f"signal {-code}"
  oom = " (what the out-of-memory killer sends: fewer data.worker_count, or more memory for the job)"
  return f"a grain worker process was killed by {name}" + (oom if -code == signal.SIGKILL else "")


def is_write_failure_line(text: str) -> bool:
  """Whether a library's log line reports such a failed write (vitjax.logs hides them: one line says it)."""
  return any(marker in text for marker, _ in _WRITE_FAILURES)


def one_line(e: BaseException) -> str:
  """An error's message on one line (a command line prints it after "error: ")."""
  return " ".join(str(e).split())
