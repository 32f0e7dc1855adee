"""How a run ends other than by finishing, and the command line's exit status for each:

    0   finished (or already complete)
    2   ConfigError, DatasetNotPreparedError: input the user can fix; one "error: ..." line names the fix, and
        the workdir is left as it was
    3   Diverged: the loss, gradient norm or parameters stopped being finite; nothing non-finite was saved
    75  Preempted: SIGTERM or SIGINT; the step in flight was checkpointed; rerun the same command to resume.
        Also a multi-process run that lost a process (vitjax.distributed.PeerWatch): no new checkpoint; rerun
        every process to resume from the last one
    130, 143  a second SIGINT / SIGTERM: stopped at once, without a checkpoint

Anything else that escapes is a bug in vitjax and keeps its traceback.
"""


class ConfigError(ValueError):
  """A problem with the experiment's config, workdir or checkpoints; the message says how to fix it."""


class DatasetNotPreparedError(FileNotFoundError):
  """A dataset or text source is not installed or not prepared; the message gives the command that fixes it."""


USER_ERRORS = (ConfigError, DatasetNotPreparedError)


class Preempted(Exception):
  """SIGTERM or SIGINT stopped training after the step in flight was checkpointed: rerun the same command to
  resume. The command line exits with EXIT_PREEMPTED."""

  exit_code = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, to be retried


class Diverged(Exception):
  """The loss, gradient norm or parameters stopped being finite; nothing non-finite was checkpointed. The command
  line exits with EXIT_DIVERGED."""

  exit_code = 3


EXIT_PREEMPTED = Preempted.exit_code
EXIT_DIVERGED = Diverged.exit_code


def one_line(e: BaseException) -> str:
  """An error's message on one line (a command line prints it after "error: ")."""
  return " ".join(str(e).split())
